package dp

import (
	"encoding/json"
	"math"
	"os"
	"strconv"
	"testing"
)

type published struct {
	RDP []struct {
		Source string    `json:"source"`
		Q      float64   `json:"q"`
		Z      float64   `json:"z"`
		Steps  float64   `json:"steps"`
		Orders []float64 `json:"orders"`
		Want   []float64 `json:"want"`
		Tol    float64   `json:"tol"`
	} `json:"rdp"`
	Epsilon []struct {
		Source     string  `json:"source"`
		Orders     string  `json:"orders"`
		Conversion string  `json:"conversion"`
		Q          float64 `json:"q"`
		Z          float64 `json:"z"`
		Steps      float64 `json:"steps"`
		Delta      float64 `json:"delta"`
		Want       float64 `json:"want"`
		WantOrder  float64 `json:"want_order"`
		Tol        float64 `json:"tol"`
	} `json:"epsilon"`
	Conversion []struct {
		Source    string  `json:"source"`
		OrdFrom   int     `json:"orders_from"`
		OrdTo     int     `json:"orders_to"`
		RDP       float64 `json:"rdp"`
		Delta     float64 `json:"delta"`
		Want      float64 `json:"want"`
		WantOrder float64 `json:"want_order"`
		Tol       float64 `json:"tol"`
	} `json:"conversion"`
	Gaussian []struct {
		Source string  `json:"source"`
		Z      float64 `json:"z"`
		Delta  float64 `json:"delta"`
		Want   float64 `json:"want"`
		Tol    float64 `json:"tol"`
	} `json:"gaussian"`
	Calibrate []struct {
		Source string  `json:"source"`
		Eps    float64 `json:"eps"`
		Delta  float64 `json:"delta"`
		Q      float64 `json:"q"`
		Steps  int     `json:"steps"`
		Want   float64 `json:"want"`
		Tol    float64 `json:"tol"`
	} `json:"calibrate"`
}

func loadPublished(t *testing.T) published {
	t.Helper()
	b, err := os.ReadFile("testdata/published.json")
	if err != nil {
		t.Fatal(err)
	}
	var p published
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	if len(p.RDP) == 0 || len(p.Epsilon) == 0 || len(p.Conversion) == 0 || len(p.Gaussian) == 0 || len(p.Calibrate) == 0 {
		t.Fatal("testdata/published.json lost a section")
	}
	return p
}

// near reports |got - want| <= tol and that got rounded to 3 significant
// digits is want rounded to 3 significant digits (the precision the
// published tables give).
func near(got, want, tol float64) bool {
	return math.Abs(got-want) <= tol && sig3(got) == sig3(want)
}

func sig3(x float64) string { return strconv.FormatFloat(x, 'e', 2, 64) }

// The accountant reproduces TensorFlow Privacy's, Opacus's and Abadi et
// al.'s published numbers (testdata/published.json names each source).
func TestPublished(t *testing.T) {
	p := loadPublished(t)
	for _, c := range p.RDP {
		for i, o := range c.Orders {
			if got := c.Steps * RDP(c.Q, c.Z, o); !near(got, c.Want[i], c.Tol) {
				t.Errorf("RDP(q=%v, z=%v, order %v) x %v = %.10g, want %v\n  source: %s", c.Q, c.Z, o, c.Steps, got, c.Want[i], c.Source)
			}
		}
	}
	if got := RDP(0.01, 2.5, math.Inf(1)); !math.IsInf(got, 1) {
		t.Errorf("RDP at order +Inf = %v, want +Inf", got)
	}
	for _, c := range p.Epsilon {
		orders := DefaultOrders()
		if c.Orders == "opacus" {
			orders = OpacusOrders()
		}
		rdp := make([]float64, len(orders))
		for i, o := range orders {
			rdp[i] = c.Steps * RDP(c.Q, c.Z, o)
		}
		conv := Epsilon
		if c.Conversion == "classic" {
			conv = EpsilonClassic
		}
		got, order := conv(orders, rdp, c.Delta)
		if !near(got, c.Want, c.Tol) || (c.WantOrder != 0 && order != c.WantOrder) {
			t.Errorf("epsilon(q=%v, z=%v, %v steps, delta %v) = %.12g at order %v, want %v (order %v)\n  source: %s",
				c.Q, c.Z, c.Steps, c.Delta, got, order, c.Want, c.WantOrder, c.Source)
		}
	}
	for _, c := range p.Conversion {
		var orders, rdp []float64
		for a := c.OrdFrom; a <= c.OrdTo; a++ {
			orders = append(orders, float64(a))
			rdp = append(rdp, c.RDP)
		}
		if got, order := Epsilon(orders, rdp, c.Delta); !near(got, c.Want, c.Tol) || order != c.WantOrder {
			t.Errorf("Epsilon(constant %v) = %.12g at order %v, want %v at %v\n  source: %s", c.RDP, got, order, c.Want, c.WantOrder, c.Source)
		}
	}
	for _, c := range p.Gaussian {
		var orders, rdp []float64
		for i := 1000; i < 100000; i++ {
			a := 0.001 * float64(i)
			orders = append(orders, a)
			rdp = append(rdp, RDP(1, c.Z, a))
		}
		if got, _ := Epsilon(orders, rdp, c.Delta); !near(got, c.Want, c.Tol) {
			t.Errorf("Gaussian z=%v: epsilon %.12g, want %v\n  source: %s", c.Z, got, c.Want, c.Source)
		}
	}
	for _, c := range p.Calibrate {
		z, err := CalibrateNoise(c.Eps, c.Delta, c.Q, c.Steps, 0.01, OpacusOrders())
		if err != nil || !near(z, c.Want, c.Tol) {
			t.Errorf("CalibrateNoise(eps %v, q %v, %d steps) = %v, %v; want %v\n  source: %s", c.Eps, c.Q, c.Steps, z, err, c.Want, c.Source)
		}
		if e := EpsilonAfter(c.Q, z, c.Steps, c.Delta, OpacusOrders()); e > c.Eps {
			t.Errorf("CalibrateNoise's z = %v spends %v > %v", z, e, c.Eps)
		}
	}
}

// An independent check of the series: A_alpha = E_{x ~ N(0, z^2)} [(1 - q +
// q exp((2x - 1) / (2 z^2)))^alpha] by numerical integration (the
// definition TensorFlow Privacy's test_compute_log_a_equals_mp integrates
// with mpmath), at integer and fractional orders.
func TestRDPMatchesIntegral(t *testing.T) {
	for _, c := range []struct{ q, z, alpha float64 }{
		{0.01, 1, 2}, {0.01, 1, 2.5}, {0.1, 2, 5}, {0.1, 2, 5.5}, {0.04, 1.5, 8}, {0.04, 1.5, 8.3},
		{0.5, 3, 3.7}, {0.001, 0.8, 1.5}, {0.2, 1.1, 12}, {0.2, 1.1, 11.9},
	} {
		got := RDP(c.q, c.z, c.alpha) * (c.alpha - 1) // log A
		want := math.Log(integrateA(c.q, c.z, c.alpha))
		if math.Abs(got-want) > 1e-6*math.Max(1, math.Abs(want)) {
			t.Errorf("log A(q=%v, z=%v, alpha=%v) = %.12g, integral %.12g", c.q, c.z, c.alpha, got, want)
		}
	}
}

// integrateA integrates in log space with the trapezoid rule on a fine grid
// wide enough for the integrand's mass.
func integrateA(q, z, alpha float64) float64 {
	lo, hi := -40*z, 40*z+alpha
	n := 400000
	h := (hi - lo) / float64(n)
	var sum float64
	for i := 0; i <= n; i++ {
		x := lo + float64(i)*h
		l := -x*x/(2*z*z) - math.Log(z*math.Sqrt(2*math.Pi)) +
			alpha*logAdd(math.Log1p(-q), math.Log(q)+(2*x-1)/(2*z*z))
		w := 1.0
		if i == 0 || i == n {
			w = 0.5
		}
		sum += w * math.Exp(l)
	}
	return sum * h
}

// RDP is continuous across integer orders (the two series agree) and grows
// with the order; the classic conversion is never tighter.
func TestRDPShape(t *testing.T) {
	for _, q := range []float64{1e-4, 0.01, 0.1, 0.5, 0.99} {
		for _, z := range []float64{0.5, 1, 4} {
			prev := 0.0
			for _, a := range DefaultOrders() {
				r := RDP(q, z, a)
				if !(r >= prev*(1-1e-9)) {
					t.Errorf("RDP(q=%v, z=%v) falls from %v to %v at order %v", q, z, prev, r, a)
				}
				prev = r
			}
			for _, a := range []float64{2, 5, 20} {
				x, y := RDP(q, z, a), RDP(q, z, a+1e-9)
				if math.Abs(x-y) > 1e-6*math.Max(x, 1e-12) {
					t.Errorf("RDP(q=%v, z=%v) jumps at order %v: %v vs %v", q, z, a, x, y)
				}
			}
			orders := DefaultOrders()
			rdp := make([]float64, len(orders))
			for i, o := range orders {
				rdp[i] = 100 * RDP(q, z, o)
			}
			e, _ := Epsilon(orders, rdp, 1e-5)
			ec, _ := EpsilonClassic(orders, rdp, 1e-5)
			if e > ec {
				t.Errorf("q=%v z=%v: improved conversion %v above classic %v", q, z, e, ec)
			}
		}
	}
}

package serveropt

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

// TestStepHandComputed checks each optimiser against steps computed by
// hand from the paper's update rules (Reddi et al. 2021, Algorithm 2;
// FedAvgM as Hsu et al.): two rounds on two coordinates, so that the
// second step exercises the carried state.
func TestStepHandComputed(t *testing.T) {
	const tau2 = 1e-6 // tau^2 = v_{-1}
	// Round 1: x = (1, -2), aggregate (1.5, -2): Delta = (0.5, 0).
	// Round 2: from x1, aggregate x1 + (0.1, -1): Delta = (0.1, -1).
	tests := []struct {
		name string
		p    Params
		// want x1 and x2, from the rules written out.
		x1, x2 [2]float64
		m2, v2 [2]float64
	}{
		// sgd: x += lr Delta, no moment (SCAFFOLD's eta_g).
		{"sgd", Params{Kind: SGD, LR: 0.5, Beta1: 0.9},
			[2]float64{1 + 0.5*0.5, -2},
			[2]float64{1.25 + 0.5*0.1, -2 + 0.5*(-1)},
			[2]float64{}, [2]float64{}},
		{"avgm", Params{Kind: AvgM, LR: 1, Beta1: 0.9},
			[2]float64{1 + 0.5, -2},
			[2]float64{1.5 + (0.9*0.5 + 0.1), -2 + (0.9*0 - 1)},
			[2]float64{0.9*0.5 + 0.1, -1}, [2]float64{}},
		{"avgm lr 0.5", Params{Kind: AvgM, LR: 0.5, Beta1: 0.5},
			[2]float64{1 + 0.25, -2},
			[2]float64{1.25 + 0.5*(0.25+0.1), -2 + 0.5*(-1)},
			[2]float64{0.5*0.5 + 0.1, -1}, [2]float64{}},
		{"adagrad", Params{Kind: Adagrad, LR: 0.01, Beta1: 0.9, Tau: 1e-3},
			[2]float64{1 + 0.01*0.05/(math.Sqrt(tau2+0.25)+1e-3), -2 + 0},
			[2]float64{
				1 + 0.01*0.05/(math.Sqrt(tau2+0.25)+1e-3) + 0.01*(0.9*0.05+0.1*0.1)/(math.Sqrt(tau2+0.25+0.01)+1e-3),
				-2 + 0.01*(-0.1)/(math.Sqrt(tau2+1)+1e-3)},
			[2]float64{0.9*0.05 + 0.1*0.1, -0.1}, [2]float64{tau2 + 0.25 + 0.01, tau2 + 1}},
		{"adam", Params{Kind: Adam, LR: 0.01, Beta1: 0.9, Beta2: 0.99, Tau: 1e-3},
			[2]float64{1 + 0.01*0.05/(math.Sqrt(0.99*tau2+0.01*0.25)+1e-3), -2},
			[2]float64{
				1 + 0.01*0.05/(math.Sqrt(0.99*tau2+0.01*0.25)+1e-3) + 0.01*(0.9*0.05+0.1*0.1)/(math.Sqrt(0.99*(0.99*tau2+0.01*0.25)+0.01*0.01)+1e-3),
				-2 + 0.01*(-0.1)/(math.Sqrt(0.99*0.99*tau2+0.01*1)+1e-3)},
			[2]float64{0.9*0.05 + 0.1*0.1, -0.1}, [2]float64{0.99*(0.99*tau2+0.01*0.25) + 0.01*0.01, 0.99*0.99*tau2 + 0.01}},
		// Yogi: v < Delta^2 in both rounds, so v grows by (1-beta2)
		// Delta^2 each time (coordinate 2, round 1: Delta = 0, v stays);
		// TestYogiShrinks has v > Delta^2.
		{"yogi", Params{Kind: Yogi, LR: 0.01, Beta1: 0.9, Beta2: 0.99, Tau: 1e-3},
			[2]float64{1 + 0.01*0.05/(math.Sqrt(tau2+0.0025)+1e-3), -2},
			[2]float64{
				1 + 0.01*0.05/(math.Sqrt(tau2+0.0025)+1e-3) + 0.01*(0.9*0.05+0.1*0.1)/(math.Sqrt(tau2+0.0025+0.01*0.01)+1e-3),
				-2 + 0.01*(-0.1)/(math.Sqrt(tau2+0.01*1)+1e-3)},
			[2]float64{0.9*0.05 + 0.1*0.1, -0.1}, [2]float64{tau2 + 0.0025 + 0.0001, tau2 + 0.01}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.p.Validate(); err != nil {
				t.Fatal(err)
			}
			var st State
			x := []float64{1, -2}
			x1 := make([]float64, 2)
			if err := Step(tc.p, &st, x, []float64{1.5, -2}, x1); err != nil {
				t.Fatal(err)
			}
			near(t, "x1", x1, tc.x1[:])
			x2 := make([]float64, 2)
			if err := Step(tc.p, &st, x1, []float64{x1[0] + 0.1, x1[1] - 1}, x2); err != nil {
				t.Fatal(err)
			}
			near(t, "x2", x2, tc.x2[:])
			if tc.p.Kind == SGD {
				if st.M != nil {
					t.Errorf("sgd keeps a first moment: %v", st.M)
				}
			} else {
				near(t, "m", st.M, tc.m2[:])
			}
			if tc.p.Adaptive() {
				near(t, "v", st.V, tc.v2[:])
			} else if st.V != nil {
				t.Errorf("avgm keeps a second moment: %v", st.V)
			}
			if st.T != 2 {
				t.Errorf("T = %d, want 2", st.T)
			}
		})
	}
}

// TestYogiShrinks: with v above Delta^2, Yogi takes (1-beta2) Delta^2
// off v (an additive change), where Adam multiplies v by beta2.
func TestYogiShrinks(t *testing.T) {
	for _, tc := range []struct {
		k Kind
		v float64
	}{{Yogi, 1 - 0.01*0.01}, {Adam, 0.99*1 + 0.01*0.01}} {
		p := Params{Kind: tc.k, LR: 0.01, Beta1: 0.9, Beta2: 0.99, Tau: 1e-3}
		st := State{T: 1, M: []float64{0}, V: []float64{1}}
		out := make([]float64, 1)
		if err := Step(p, &st, []float64{0}, []float64{0.1}, out); err != nil {
			t.Fatal(err)
		}
		near(t, string(tc.k)+" v", st.V, []float64{tc.v})
		near(t, string(tc.k)+" x", out, []float64{0.01 * 0.01 / (math.Sqrt(tc.v) + 1e-3)})
	}
}

func near(t *testing.T, what string, got, want []float64) {
	t.Helper()
	for i := range want {
		if d := math.Abs(got[i] - want[i]); d > 1e-12*max(1, math.Abs(want[i])) {
			t.Errorf("%s[%d] = %.17g, want %.17g", what, i, got[i], want[i])
		}
	}
}

// TestAdaptiveStepSize: Adam's first step moves every coordinate with a
// pseudo-gradient much larger than tau by about lr (1-beta1)/sqrt(1-beta2)
// whatever its scale: the adaptivity the paper is about.
func TestAdaptiveStepSize(t *testing.T) {
	p := Defaults(Adam)
	for _, delta := range []float64{1, -10, 1e3, -1e3} {
		var st State
		out := make([]float64, 1)
		if err := Step(p, &st, []float64{0}, []float64{delta}, out); err != nil {
			t.Fatal(err)
		}
		want := math.Copysign(p.LR*(1-p.Beta1)/math.Sqrt(1-p.Beta2), delta)
		if math.Abs(out[0]-want) > 0.02*math.Abs(want) {
			t.Errorf("delta %g: step %g, want about %g", delta, out[0], want)
		}
	}
}

// TestStepDeterministic: the same inputs give the same bits, and a state
// that went through Marshal/Unmarshal continues bit for bit (a restart
// from the checkpoint).
func TestStepDeterministic(t *testing.T) {
	for _, k := range []Kind{SGD, AvgM, Adagrad, Adam, Yogi} {
		p := Defaults(k)
		run := func(restartAt int) []float64 {
			var st State
			x := []float64{0.3, -0.7, 2}
			for r := range 6 {
				if r == restartAt {
					var err error
					if st, err = Unmarshal(st.Marshal(), len(x)); err != nil {
						t.Fatal(err)
					}
				}
				a := []float64{x[0] + 0.1*float64(r), x[1] - 0.3, x[2] * 0.9}
				if err := Step(p, &st, x, a, a); err != nil { // out aliases a
					t.Fatal(err)
				}
				x = a
			}
			return x
		}
		want := run(-1)
		for at := 1; at < 6; at++ {
			got := run(at)
			for i := range want {
				if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
					t.Fatalf("%s: restart before step %d: x[%d] = %v, want %v", k, at, i, got[i], want[i])
				}
			}
		}
	}
}

func TestStepRefusals(t *testing.T) {
	p := Defaults(Adam)
	st := State{T: 1, M: []float64{0}, V: []float64{1}}
	out := make([]float64, 2)
	if err := Step(p, &st, []float64{0, 0}, []float64{1, 1}, out); err == nil {
		t.Error("a state of another dimension was accepted")
	}
	var fresh State
	err := Step(p, &fresh, []float64{0}, []float64{math.Inf(1)}, out[:1])
	if !errors.Is(err, ErrNonFinite) {
		t.Errorf("infinite aggregate: %v, want ErrNonFinite", err)
	}
	if fresh.T != 0 || fresh.M != nil {
		t.Errorf("a failed step changed the state: %+v", fresh)
	}
	if err := Step(Params{Kind: None}, &fresh, []float64{0}, []float64{1}, out[:1]); err == nil {
		t.Error("none took a step")
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		p  Params
		ok bool
	}{
		{Params{}, true},
		{Params{Kind: None}, true},
		{Defaults(AvgM), true},
		{Defaults(Yogi), true},
		{Params{Kind: AvgM, LR: 1, Beta1: 0}, true},
		{Params{Kind: "lamb", LR: 1}, false},
		{Params{Kind: SGD, LR: 0.5}, true},
		{Params{Kind: SGD, LR: 0}, false},
		{Params{Kind: Adam, LR: -1, Beta1: 0.9, Beta2: 0.99, Tau: 1e-3}, false},
		{Params{Kind: Adam, LR: math.NaN(), Beta1: 0.9, Beta2: 0.99, Tau: 1e-3}, false},
		{Params{Kind: Adam, LR: 0.1, Beta1: 1, Beta2: 0.99, Tau: 1e-3}, false},
		{Params{Kind: Adam, LR: 0.1, Beta1: 0.9, Beta2: 1, Tau: 1e-3}, false},
		{Params{Kind: Yogi, LR: 0.1, Beta1: 0.9, Beta2: 0.99, Tau: 0}, false},
		{Params{Kind: Adagrad, LR: 0.1, Beta1: 0.9, Tau: math.Inf(1)}, false},
	}
	for _, tc := range tests {
		if err := tc.p.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: %v, want ok %v", tc.p, err, tc.ok)
		}
	}
	if got := Defaults(Adam).String(); got != "adam:lr=0.01:beta1=0.9:beta2=0.99:tau=0.001" {
		t.Errorf("String = %q", got)
	}
	if got := Defaults(AvgM).String(); got != "avgm:lr=1:beta1=0.9" {
		t.Errorf("String = %q", got)
	}
	if got := (Params{Kind: SGD, LR: 0.5, Beta1: 0.9}).String(); got != "sgd:lr=0.5" {
		t.Errorf("String = %q", got)
	}
}

func TestUnmarshalRefuses(t *testing.T) {
	st := State{T: 3, M: []float64{1, 2}, V: []float64{3, 4}}
	b := st.Marshal()
	for _, tc := range []struct {
		name string
		b    []byte
		dim  int
	}{
		{"truncated", b[:len(b)-1], 2},
		{"trailing", append(bytes.Clone(b), 0), 2},
		{"other dim", b, 3},
		{"short", b[:5], 2},
	} {
		if _, err := Unmarshal(tc.b, tc.dim); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	got, err := Unmarshal(b, 2)
	if err != nil || got.T != 3 || got.M[1] != 2 || got.V[0] != 3 {
		t.Errorf("round trip: %+v, %v", got, err)
	}
	if z, err := Unmarshal(nil, 2); err != nil || z.T != 0 {
		t.Errorf("empty: %+v, %v", z, err)
	}
}

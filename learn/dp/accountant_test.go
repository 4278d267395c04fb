package dp

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// Rounds with different q and z compose by adding RDP: the accountant's
// running vector equals the sum of per-segment RDP, and round-trips through
// JSON (the aggregator's round log).
func TestAccountantComposes(t *testing.T) {
	// tensorflow/privacy rdp_accountant_test.py,
	// test_compute_heterogeneous_rdp_different_sampling_probabilities:
	// q = 0 then q = 1 at z = 10, order 20 -> 0.1.
	h := NewAccountant([]float64{20})
	if err := h.Step(0, 10); err != nil {
		t.Fatal(err)
	}
	if err := h.Step(1, 10); err != nil {
		t.Fatal(err)
	}
	if math.Abs(h.RDP[0]-0.1) > 1e-15 {
		t.Errorf("heterogeneous RDP %v, want 0.1", h.RDP[0])
	}

	a := NewAccountant(nil)
	segs := []struct {
		q, z float64
		n    int
	}{{0.1, 1.1, 30}, {0.05, 1.1, 20}, {0.1, 2, 10}}
	want := make([]float64, len(a.Orders))
	for _, s := range segs {
		for range s.n {
			if err := a.Step(s.q, s.z); err != nil {
				t.Fatal(err)
			}
		}
		for i, o := range a.Orders {
			want[i] += float64(s.n) * RDP(s.q, s.z, o)
		}
	}
	for i := range want {
		if math.Abs(a.RDP[i]-want[i]) > 1e-9*want[i] {
			t.Fatalf("order %v: running RDP %v, want %v", a.Orders[i], a.RDP[i], want[i])
		}
	}
	if a.Rounds != 60 {
		t.Errorf("Rounds = %d", a.Rounds)
	}
	b, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	var back Accountant
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	e1, o1 := a.Epsilon(1e-5)
	e2, o2 := back.Epsilon(1e-5)
	if e1 != e2 || o1 != o2 || back.Rounds != a.Rounds {
		t.Errorf("JSON round trip: %v at %v vs %v at %v", e1, o1, e2, o2)
	}
	// Epsilon grows with every round.
	c := NewAccountant(nil)
	prev := 0.0
	for r := 0; r < 50; r++ {
		if err := c.Step(0.1, 1); err != nil {
			t.Fatal(err)
		}
		e, _ := c.Epsilon(1e-5)
		if !(e > prev) {
			t.Fatalf("round %d: epsilon %v not above %v", r+1, e, prev)
		}
		prev = e
	}
}

func TestAccountantRejects(t *testing.T) {
	a := NewAccountant(nil)
	for _, c := range []struct{ q, z float64 }{{-0.1, 1}, {1.1, 1}, {math.NaN(), 1}, {0.1, 0}, {0.1, -1}, {0.1, math.Inf(1)}, {0.1, math.NaN()}} {
		if err := a.Step(c.q, c.z); err == nil {
			t.Errorf("Step(%v, %v) accepted", c.q, c.z)
		}
	}
	if a.Rounds != 0 || slices.ContainsFunc(a.RDP, func(r float64) bool { return r != 0 }) {
		t.Error("a refused step was charged")
	}
	bad := &Accountant{Orders: []float64{2, 3}, RDP: []float64{0}}
	if err := bad.Step(0.1, 1); err == nil {
		t.Error("a damaged accountant stepped")
	}
}

// RoundsWithin finds the exact boundary: T rounds fit, T+1 do not.
func TestRoundsWithin(t *testing.T) {
	for _, c := range []struct{ eps, delta, q, z float64 }{
		{3, 1e-5, 0.1, 1.1}, {8, 1e-5, 0.1, 1.0}, {8, 1e-5, 0.01, 1.0}, {8, 1e-5, 0.04, 1.5}, {2, 1e-5, 1, 5},
	} {
		n, err := RoundsWithin(c.eps, c.delta, c.q, c.z)
		if err != nil {
			t.Fatal(err)
		}
		if n < 1 {
			t.Fatalf("%+v: %d rounds", c, n)
		}
		if e := EpsilonAfter(c.q, c.z, n, c.delta, nil); e > c.eps {
			t.Errorf("%+v: %d rounds spend %v", c, n, e)
		}
		if e := EpsilonAfter(c.q, c.z, n+1, c.delta, nil); e <= c.eps {
			t.Errorf("%+v: %d rounds fit but %d also do (%v)", c, n, n+1, e)
		}
	}
	if n, err := RoundsWithin(0.01, 1e-5, 1, 0.5); err != nil || n != 0 {
		t.Errorf("a budget too small for one round: %d, %v", n, err)
	}
	if n, err := RoundsWithin(1, 1e-5, 0, 1); err != nil || n != MaxRounds {
		t.Errorf("q = 0: %d, %v", n, err)
	}
	for _, c := range [][4]float64{{0, 1e-5, 0.1, 1}, {1, 0, 0.1, 1}, {1, 1, 0.1, 1}, {1, 1e-5, 2, 1}, {1, 1e-5, 0.1, 0}} {
		if _, err := RoundsWithin(c[0], c[1], c[2], c[3]); err == nil {
			t.Errorf("RoundsWithin%v accepted", c)
		}
	}
}

// CalibrateNoise meets the budget, within its tolerance, for docs/privacy.md's
// targets; impossible budgets and bad arguments are errors.
func TestCalibrateNoise(t *testing.T) {
	for _, eps := range []float64{1, 3, 8} {
		for _, q := range []float64{0.1, 0.3, 1} {
			z, err := CalibrateNoise(eps, 1e-5, q, 200, 0.01, nil)
			if err != nil {
				t.Fatal(err)
			}
			e := EpsilonAfter(q, z, 200, 1e-5, nil)
			if e > eps || eps-e > 0.01 {
				t.Errorf("eps %v q %v: z = %v spends %v", eps, q, z, e)
			}
		}
	}
	if _, err := CalibrateNoise(1e-9, 1e-5, 1, 1000000, 0.01, nil); err != ErrBudgetTooSmall {
		t.Errorf("impossible budget: %v", err)
	}
	for _, c := range []struct {
		eps, delta, q float64
		t             int
		tol           float64
	}{{0, 1e-5, 0.1, 10, 0.01}, {1, 1e-5, 0, 10, 0.01}, {1, 1e-5, 0.1, 0, 0.01}, {1, 1e-5, 0.1, 10, 0}} {
		if _, err := CalibrateNoise(c.eps, c.delta, c.q, c.t, c.tol, nil); err == nil {
			t.Errorf("CalibrateNoise(%+v) accepted", c)
		}
	}
}

// The table of the report (the figures of docs/privacy.md's design): epsilon at delta =
// 1e-5 after 100, 500 and 1000 rounds, K = 10 of N = 100 sites (q = 0.1) and
// 10 of 1000 (q = 0.01), z = 1.0 and 1.1; and the z that reaches epsilon =
// 1, 3, 8 after 100 rounds at q = 0.1. Run: go test -run TestEpsilonTable -v ./learn/dp/
func TestEpsilonTable(t *testing.T) {
	var b strings.Builder
	b.WriteString("\n| q | z | 100 rounds | 500 rounds | 1000 rounds |\n|---|---|---|---|---|\n")
	for _, q := range []float64{0.1, 0.01} {
		for _, z := range []float64{1.0, 1.1} {
			fmt.Fprintf(&b, "| %v | %v |", q, z)
			prev := 0.0
			for _, rounds := range []int{100, 500, 1000} {
				e := EpsilonAfter(q, z, rounds, 1e-5, nil)
				if !(e > prev) {
					t.Errorf("q %v z %v: epsilon %v after %d rounds not above %v", q, z, e, rounds, prev)
				}
				prev = e
				fmt.Fprintf(&b, " %.3g |", e)
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("\n| target epsilon (q = 0.1, 100 rounds) | z |\n|---|---|\n")
	for _, eps := range []float64{1, 3, 8} {
		z, err := CalibrateNoise(eps, 1e-5, 0.1, 100, 0.001, nil)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "| %v | %.4g |\n", eps, z)
	}
	t.Log(b.String())
}

// The accountant's cost per round: one Step over the 154 default orders,
// with a new q every round (the worst case: nothing is reused) and with the
// same (q, z) as the round before.
func BenchmarkAccountantStep(b *testing.B) {
	a := NewAccountant(nil)
	rng := rand.New(rand.NewPCG(1, 2))
	for b.Loop() {
		if err := a.Step(0.05+0.1*rng.Float64(), 1.1); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAccountantStepRepeated(b *testing.B) {
	a := NewAccountant(nil)
	for b.Loop() {
		if err := a.Step(0.1, 1.1); err != nil {
			b.Fatal(err)
		}
	}
}

// Epsilon from the running vector, what the aggregator reports each round.
func BenchmarkAccountantEpsilon(b *testing.B) {
	a := NewAccountant(nil)
	for range 100 {
		if err := a.Step(0.1, 1.1); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		a.Epsilon(1e-5)
	}
}

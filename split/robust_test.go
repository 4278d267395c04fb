package split

import (
	"math"
	"strings"
	"testing"
)

// runFederation runs FedSplit with exact proxes for iters rounds; attack,
// when set, replaces client 0's state at the server after each client step.
// It returns x and the number of server steps that left someone out.
func runFederation(t *testing.T, cs []client, iters int, mult float64, attack func(x, zNew []float64) []float64) ([]float64, int, bool) {
	t.Helper()
	const d = 5
	p := Params{Step: 0.5, Relax: 1}
	m := len(cs)
	total, x, zs := start(cs, d)
	screened, identical := 0, true
	for it := 0; it < iters; it++ {
		for j, c := range cs {
			zNew, _, err := ClientStep(x, zs[j], ClientStepSize(p.Step, m, float64(c.n)/total), p, c.prox)
			if err != nil {
				t.Fatal(err)
			}
			if j == 0 && attack != nil {
				zNew = attack(x, zNew)
			}
			zs[j] = zNew
		}
		plain, err := ServerStep(nil, zs)
		if err != nil {
			t.Fatal(err)
		}
		next, out, err := RobustServerStep(nil, zs, x, mult)
		if err != nil {
			t.Fatal(err)
		}
		if len(out) > 0 {
			screened++
		}
		for i := range next {
			if math.Float64bits(next[i]) != math.Float64bits(plain[i]) {
				identical = false
			}
		}
		x = next
	}
	return x, screened, identical
}

func maxDist(a, b []float64) float64 {
	var d float64
	for i := range a {
		d = math.Max(d, math.Abs(a[i]-b[i]))
	}
	return d
}

// Honest sites (heterogeneous, unequal sizes): the robust step never
// leaves anyone out, is the plain mean bit for bit at every round, and so
// converges to the pooled optimum exactly as FedSplit does.
func TestRobustStepHonestIsExact(t *testing.T) {
	cs := federation(3, 8, 5, 0.1)
	x, screened, identical := runFederation(t, cs, 400, DefaultMult, nil)
	if screened != 0 || !identical {
		t.Fatalf("honest run: %d screened steps, bit-identical to the mean: %v", screened, identical)
	}
	if d := maxDist(x, pooledOptimum(cs, 5)); d > 1e-10 {
		t.Fatalf("max |x - x*| = %.3e", d)
	}
}

// One site publishing x + 1000 (z_j - x) every round: the plain mean is
// dragged away for good; the robust step leaves the site out of every step
// and x converges to the optimum of the honest sites' pooled objective.
func TestRobustStepBoundsAPoisoner(t *testing.T) {
	cs := federation(3, 8, 5, 0.1)
	attack := func(x, z []float64) []float64 {
		out := make([]float64, len(z))
		for i := range z {
			out[i] = x[i] + 1000*(z[i]-x[i])
		}
		return out
	}
	x, screened, _ := runFederation(t, cs, 400, DefaultMult, attack)
	if screened != 400 {
		t.Fatalf("the poisoner was left out of %d of 400 steps", screened)
	}
	// The honest optimum with the honest sites' weights n_j / n (the sum
	// over the honest sites of p_j grad f_j = 0).
	want := pooledOptimum(cs[1:], 5)
	if d := maxDist(x, want); d > 1e-8 {
		t.Fatalf("robust: max |x - x*_honest| = %.3e, want <= 1e-8", d)
	}
	plain, _, _ := runFederation(t, cs, 50, math.Inf(1), attack)
	if d := maxDist(plain, want); !(d > 1) {
		t.Fatalf("the plain mean under attack ended %.3e from the honest optimum: the attack does nothing?", d)
	}
}

func TestParseServerStep(t *testing.T) {
	for _, tt := range []struct {
		spec string
		want float64
		err  string
	}{
		{"fedsplit-robust", DefaultMult, ""},
		{"fedsplit-robust:mult=5", 5, ""},
		{"fedsplit-mean", math.Inf(1), ""},
		{"fedsplit-robust:mult=0.5", 0, "mult"},
		{"fedsplit-robust:mult=x", 0, "mult"},
		{"normbound:mult=3", 0, "FedSplit family takes"},
		{"median", 0, "FedSplit family takes"},
	} {
		got, err := ParseServerStep(tt.spec)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s: err %v, want %q", tt.spec, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s = %v, %v; want %v", tt.spec, got, err, tt.want)
		}
	}
}

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

// attackScales are the poisoners of the measurement below: one site of four
// scaling every update it sends, or alternating hostile and honest rounds.
var attackScales = []struct {
	name  string
	scale func(round int) float64
}{
	{"x0.5", func(int) float64 { return 0.5 }},
	{"x-1", func(int) float64 { return -1 }},
	{"x1.5", func(int) float64 { return 1.5 }},
	{"x3", func(int) float64 { return 3 }},
	{"x10", func(int) float64 { return 10 }},
	{"x1000", func(int) float64 { return 1000 }},
	{"x1000 odd rounds", func(t int) float64 { return map[bool]float64{true: 1000, false: 1}[t%2 == 1] }},
	{"x3 odd rounds", func(t int) float64 { return map[bool]float64{true: 3, false: 1}[t%2 == 1] }},
}

// protocolRun runs FedSplit with exact proxes and the robust server step
// (mult; +Inf: the plain mean), site 0 scaling the update it sends as the
// attacking agent does (agent/attack_on.go through uplink.Update.Tamper):
// the delta against the server's copy of its z_j is multiplied, its own
// z_j stays honest, and its record of the copy follows what it sent, so
// the copy moves r <- r + s (z - r). A copy the downlink cannot carry is
// refused (out_of_range) and the site's next update is against x. It
// returns the final x (nil once a step was not finite) and the number of
// steps that left each site out.
func protocolRun(t *testing.T, cs []client, rounds int, mult float64, scale func(int) float64) ([]float64, []int) {
	t.Helper()
	const d = 5
	p := Params{Step: 0.5, Relax: 1}
	m := len(cs)
	total, x, zs := start(cs, d)
	copies := make([][]float64, m) // the server's copy r_j (nil: none)
	left := make([]int, m)
	for it := 1; it <= rounds; it++ {
		for j, c := range cs {
			zNew, _, err := ClientStep(x, zs[j], ClientStepSize(p.Step, m, float64(c.n)/total), p, c.prox)
			if err != nil {
				t.Fatal(err)
			}
			zs[j] = zNew
			base := copies[j]
			if base == nil {
				base = x
			}
			s := 1.0
			if j == 0 && scale != nil {
				s = scale(it)
			}
			r := make([]float64, d)
			for i := range r {
				r[i] = base[i] + (zNew[i]-base[i])*s
				if !(math.Abs(r[i]) <= math.MaxFloat32) {
					r = nil
					break
				}
			}
			if r != nil || copies[j] == nil {
				copies[j] = r
			}
		}
		var list [][]float64
		var ids []int
		for j, r := range copies {
			if r != nil {
				list, ids = append(list, r), append(ids, j)
			}
		}
		next, out, err := RobustServerStep(nil, list, x, mult)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range out {
			left[ids[k]]++
		}
		for _, v := range next {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, left
			}
		}
		x = next
	}
	return x, left
}

func relDist(a, b []float64) float64 {
	if a == nil {
		return math.Inf(1)
	}
	var num, den float64
	for i := range a {
		num += (a[i] - b[i]) * (a[i] - b[i])
		den += b[i] * b[i]
	}
	return math.Sqrt(num / den)
}

// TestRobustStepAgainstScaledUpdates measures the robust step against one
// poisoning site of four (mildly heterogeneous sites of 400-800 rows): the
// final model's distance from the honest federation's (all four honest)
// and from the honest three's optimum (the attacker's data left out),
// relative to their norms, and how often each site was left out. It
// asserts what README.md claims under "One far poisoner cannot break FedSplit":
// x10 and x1000 every round are left out of >= 95 % of the steps and x
// converges to the honest three's optimum; x0.5, x1.5 and x3 in odd rounds
// (relaxations of the same operator) end on the honest federation's model;
// no honest site is ever left out. The rest is logged, not asserted,
// because the distance screen does NOT stop it: x-1 (every seed) and x3
// (some seeds) are never outliers and the model overflows, and x1000 in
// odd rounds gets in through its honest rounds' catch-up.
func TestRobustStepAgainstScaledUpdates(t *testing.T) {
	const rounds = 200
	for _, seed := range []uint64{1, 2, 3} {
		cs := federationSized(seed, 4, 5, 0.1, 0.2, 400, 400)
		honest, _ := protocolRun(t, cs, rounds, DefaultMult, nil)
		three := pooledOptimum(cs[1:], 5)
		for _, at := range attackScales {
			x, left := protocolRun(t, cs, rounds, DefaultMult, at.scale)
			plain, _ := protocolRun(t, cs, rounds, math.Inf(1), at.scale)
			dist, dist3 := relDist(x, honest), relDist(x, three)
			t.Logf("seed %d %-17s robust: %.2e from the honest model, %.2e from the honest three's (plain mean %.2e); attacker left out of %d, honest sites of %v of %d steps",
				seed, at.name, dist, dist3, relDist(plain, honest), left[0], left[1:], rounds)
			for j := 1; j < len(cs); j++ {
				if left[j] > 0 {
					t.Errorf("seed %d %s: honest site %d left out of %d of %d steps", seed, at.name, j, left[j], rounds)
				}
			}
			switch at.name {
			case "x10", "x1000":
				if left[0] < rounds*95/100 || !(dist3 <= 1e-6) {
					t.Errorf("seed %d %s: left out of %d steps, %.3g from the honest three's optimum", seed, at.name, left[0], dist3)
				}
			case "x0.5", "x1.5", "x3 odd rounds":
				if !(dist <= 1e-6) {
					t.Errorf("seed %d %s: %.3g from the honest model", seed, at.name, dist)
				}
			}
		}
	}
}

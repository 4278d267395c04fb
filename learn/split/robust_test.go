package split

import (
	"math"
	"strings"
	"testing"
)

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
	{"x-1 odd rounds", func(t int) float64 { return map[bool]float64{true: -1, false: 1}[t%2 == 1] }},
}

// fedRun is what protocolRun measured.
type fedRun struct {
	x         []float64 // the final model; nil once a step was not finite
	clipped   []int     // the rounds each site was clipped in
	aside     []int     // the rounds each site was left out of the mean
	identical bool      // every step bit for bit the plain mean of the copies
	diverging int       // the steps the divergence watch reported diverging
}

// protocolRun runs FedSplit with exact proxes for rounds rounds under the
// bounded step (mult; +Inf: the plain mean), site 0 scaling the update it
// sends by scale(round) as the attacking agent does (node/agent/attack_on.go,
// through uplink.Update.Tamper): the delta against the server's copy of
// its z_j is multiplied, its own z_j stays honest, and its record of the
// copy follows what it sent, so the copy moves r <- r + s (z - r). A copy
// the downlink cannot carry is refused (out_of_range): nothing is stored
// and the site's next update is against x.
func protocolRun(t *testing.T, cs []client, rounds int, mult float64, scale func(int) float64) fedRun {
	t.Helper()
	const d = 5
	p := Params{Step: 0.5, Relax: 1}
	m := len(cs)
	total, x, zs := start(cs, d)
	run := fedRun{clipped: make([]int, m), aside: make([]int, m), identical: true}
	record := make([][]float64, m) // each site's record of its copy (nil: none)
	copies := make([][]float64, m) // the server's copies r_j
	states := make([]SiteState, m)
	var ref float64
	var w Watch
	for it := 1; it <= rounds; it++ {
		var in []SiteInput
		var ids []int
		for j, c := range cs {
			zNew, _, err := ClientStep(x, zs[j], ClientStepSize(p.Step, m, float64(c.n)/total), p, c.prox)
			if err != nil {
				t.Fatal(err)
			}
			zs[j] = zNew
			base, reset := record[j], false
			if base == nil {
				base, reset = x, true
			}
			s := 1.0
			if j == 0 && scale != nil {
				s = scale(it)
			}
			delta := make([]float64, d)
			r := make([]float64, d)
			refused := false
			for i := range r {
				delta[i] = (zNew[i] - base[i]) * s
				r[i] = base[i] + delta[i]
				refused = refused || !(math.Abs(r[i]) <= math.MaxFloat32)
			}
			if refused {
				record[j] = nil
				delta = nil
			} else {
				record[j], copies[j] = r, r
			}
			if copies[j] != nil {
				in = append(in, SiteInput{Z: copies[j], Delta: delta, Reset: reset, State: states[j]})
				ids = append(ids, j)
			}
		}
		zl := make([][]float64, len(in))
		for k := range in {
			zl[k] = in[k].Z
		}
		plain, err := ServerStep(nil, zl)
		if err != nil {
			t.Fatal(err)
		}
		next, rep, err := BoundedStep(nil, x, in, mult, ref, w)
		if err != nil {
			return run // not finite: run.x stays nil
		}
		ref, w = rep.Ref, rep.Watch
		if rep.Diverging {
			run.diverging++
		}
		for k, r := range rep.Sites {
			j := ids[k]
			states[j] = r.State
			if r.Clipped {
				run.clipped[j]++
			}
			if r.State.Aside {
				run.aside[j]++
			}
		}
		for i := range next {
			if math.Float64bits(next[i]) != math.Float64bits(plain[i]) {
				run.identical = false
			}
		}
		x = next
	}
	run.x = x
	return run
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

// Honest sites, unequal sizes (5-45 rows), heterogeneous data (feature
// shifts of 0.5 and 2 standard deviations: honest steps up to 50 times the
// median late in a run): the pooled optimum is reached to 1e-4 in 400
// rounds in every case (measured worst 1.3e-6, where sites were set aside), and where nobody was clipped the step is the plain
// mean bit for bit. A site clipped now and then catches up. A site whose
// own steps keep outgrowing its allowance is set aside for a while
// (measured worst case: one site of eight in 4 of 400 rounds, seed 4,
// shifts 2; asserted below 10 %).
func TestRobustStepHonestIsExact(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4, 5} {
		for _, hetero := range []float64{0.5, 2} {
			cs := federationSized(seed, 8, 5, 0.1, hetero, 5, 40)
			run := protocolRun(t, cs, 400, DefaultMult, nil)
			d := maxDist(run.x, pooledOptimum(cs, 5))
			t.Logf("seed %d, shifts %.1f: clipped %v, set aside %v of 400 rounds; max |x - x*| = %.2e", seed, hetero, run.clipped, run.aside, d)
			clipped := 0
			for j := range cs {
				clipped += run.clipped[j]
				if run.aside[j] > 400/10 {
					t.Errorf("seed %d, shifts %.1f: honest site %d set aside in %d of 400 rounds", seed, hetero, j, run.aside[j])
				}
			}
			if run.diverging > 0 {
				t.Errorf("seed %d, shifts %.1f: the divergence watch fired in %d steps of an honest federation", seed, hetero, run.diverging)
			}
			if clipped == 0 && !run.identical {
				t.Errorf("seed %d, shifts %.1f: nobody clipped, and not bit for bit the plain mean", seed, hetero)
			}
			if !(d <= 1e-4) {
				t.Errorf("seed %d, shifts %.1f: max |x - x*| = %.3e", seed, hetero, d)
			}
		}
	}
}

// TestRobustStepAgainstScaledUpdates: one poisoning site of four (mildly
// heterogeneous sites of 400-800 rows), every scale of the acceptance test.
// It measures the final model's distance from the honest federation's (all
// four honest, same data) relative to its norm, and from the honest three's
// optimum (the attacker's data left out), and how often each site was
// clipped or set aside, and asserts docs/aggregators.md's table (under "One
// poisoning site and FedSplit"): within 2 % of the honest
// federation's model or of the honest three's optimum, and no honest site
// set aside in more than 5 % of the rounds (clipped is logged: a clipped
// honest site catches up, nothing it sent is lost). The plain mean under
// the same attack is logged (broken for every scale but 0.5, 1.5).
func TestRobustStepAgainstScaledUpdates(t *testing.T) {
	const rounds = 200
	for _, seed := range []uint64{1, 2, 3} {
		cs := federationSized(seed, 4, 5, 0.1, 0.2, 400, 400)
		honest := protocolRun(t, cs, rounds, DefaultMult, nil)
		three := pooledOptimum(cs[1:], 5)
		for _, at := range attackScales {
			run := protocolRun(t, cs, rounds, DefaultMult, at.scale)
			plain := protocolRun(t, cs, rounds, math.Inf(1), at.scale)
			dist, dist3 := relDist(run.x, honest.x), relDist(run.x, three)
			t.Logf("seed %d %-17s bounded: %.2e from the honest model, %.2e from the honest three's (plain mean %.2e); attacker clipped %d, aside %d; honest clipped %v, aside %v of %d rounds",
				seed, at.name, dist, dist3, relDist(plain.x, honest.x), run.clipped[0], run.aside[0], run.clipped[1:], run.aside[1:], rounds)
			for j := 1; j < len(cs); j++ {
				if n := run.aside[j]; n > rounds/20 {
					t.Errorf("seed %d %s: honest site %d clipped in %d, set aside in %d of %d rounds", seed, at.name, j, run.clipped[j], run.aside[j], rounds)
				}
			}
			if !(min(dist, dist3) <= 0.02) {
				t.Errorf("seed %d %s: %.3g from the honest model, %.3g from the honest three's", seed, at.name, dist, dist3)
			}
		}
	}
	// Strongly heterogeneous sites of 5-45 rows (docs/aggregators.md's "What the bound
	// cannot tell apart"): x1.5 and x3 in odd rounds stay within every
	// honest site's spread and drove the iterate to 1e20 in seed 2 (as
	// the plain mean does) until the divergence watch set the poisoner
	// aside; asserted like the mild case but for x-1 in odd rounds, which
	// never makes the iterate grow and is within the honest spread
	// (measured 4.8e-2 from the honest model, seed 3: logged only).
	for _, seed := range []uint64{1, 2, 3} {
		cs := federationSized(seed, 4, 5, 0.1, 2, 5, 40)
		honest := protocolRun(t, cs, rounds, DefaultMult, nil)
		three := pooledOptimum(cs[1:], 5)
		for _, at := range attackScales {
			run := protocolRun(t, cs, rounds, DefaultMult, at.scale)
			plain := protocolRun(t, cs, rounds, math.Inf(1), at.scale)
			dist, dist3 := relDist(run.x, honest.x), relDist(run.x, three)
			t.Logf("heterogeneous seed %d %-17s bounded: %.2e from the honest model, %.2e from the honest three's (plain mean %.2e); attacker clipped %d, aside %d; honest aside %v",
				seed, at.name, dist, dist3, relDist(plain.x, honest.x), run.clipped[0], run.aside[0], run.aside[1:])
			for j := 1; j < len(cs); j++ {
				if n := run.aside[j]; n > rounds/20 {
					t.Errorf("heterogeneous seed %d %s: honest site %d set aside in %d of %d rounds", seed, at.name, j, n, rounds)
				}
			}
			if at.name != "x-1 odd rounds" && !(min(dist, dist3) <= 0.02) {
				t.Errorf("heterogeneous seed %d %s: %.3g from the honest model, %.3g from the honest three's", seed, at.name, dist, dist3)
			}
		}
	}
}

func maxDist(a, b []float64) float64 {
	if a == nil {
		return math.Inf(1)
	}
	var d float64
	for i := range a {
		d = math.Max(d, math.Abs(a[i]-b[i]))
	}
	return d
}

package aggregate

import (
	"fmt"
	"math"
	"slices"
	"testing"
)

func cands(n int) []Candidate {
	c := make([]Candidate, n)
	for i := range c {
		c[i] = Candidate{ID: fmt.Sprintf("id%02d", i), Samples: 1 + i, Loss: float64(i + 1)}
	}
	return c
}

func selectors() []Selector {
	return []Selector{Uniform{}, BySamples{}, ByLoss{Power: 1, Explore: 0.1}, NewWindow()}
}

// TestSelectorsContract: distinct valid indices, min(k, n) of them, every
// candidate when k >= n, none when k <= 0, for every selector, including
// candidates with zero samples and unknown losses.
func TestSelectorsContract(t *testing.T) {
	rng := newRand(61)
	for _, s := range selectors() {
		for _, n := range []int{0, 1, 2, 5, 17} {
			for _, k := range []int{-1, 0, 1, 2, 4, 5, 16, 17, 30} {
				for round := range 4 {
					cs := cands(n)
					if round%2 == 1 {
						for i := range cs {
							cs[i].Samples, cs[i].Loss = 0, math.NaN()
						}
					}
					got := s.Select(round, cs, k, rng)
					want := min(max(k, 0), n)
					if len(got) != want {
						t.Fatalf("%s n=%d k=%d: %d picked, want %d", s.Name(), n, k, len(got), want)
					}
					seen := map[int]bool{}
					for _, i := range got {
						if i < 0 || i >= n || seen[i] {
							t.Fatalf("%s n=%d k=%d: bad or repeated index in %v", s.Name(), n, k, got)
						}
						seen[i] = true
					}
				}
			}
		}
	}
}

// TestWindowCoversEveryClientOncePerPass: the concatenated selections are a
// sequence of permutations of the clients, for k dividing n or not.
func TestWindowCoversEveryClientOncePerPass(t *testing.T) {
	for _, k := range []int{1, 3, 4, 7, 10} {
		const n = 10
		w := NewWindow()
		rng := newRand(uint64(k))
		cs := cands(n)
		var stream []int
		for round := range 40 {
			stream = append(stream, w.Select(round, cs, k, rng)...)
		}
		for p := 0; p+n <= len(stream); p += n {
			pass := slices.Clone(stream[p : p+n])
			slices.Sort(pass)
			if !slices.Equal(pass, seq(n)) {
				t.Fatalf("k = %d: pass %d is %v", k, p/n, stream[p:p+n])
			}
		}
		// Passes are reshuffled: not all the same order.
		if k < n && slices.Equal(stream[:n], stream[n:2*n]) && slices.Equal(stream[:n], stream[2*n:3*n]) {
			t.Fatalf("k = %d: the order is never reshuffled", k)
		}
	}
}

// TestWindowArrivalsAndDepartures: clients that leave are skipped and taken
// when back within the pass; newcomers join the current pass; no client is
// taken twice in a pass while it is present throughout.
func TestWindowArrivalsAndDepartures(t *testing.T) {
	w := NewWindow()
	rng := newRand(62)
	all := cands(8)
	ids := func(cs []Candidate, idx []int) []string {
		var s []string
		for _, i := range idx {
			s = append(s, cs[i].ID)
		}
		return s
	}
	// Round 0: all 8 present, take 2.
	r0 := ids(all, w.Select(0, all, 2, rng))
	due := w.Remaining()
	if len(due) != 6 {
		t.Fatalf("remaining %v", due)
	}
	// Round 1: the next due client is away; it must not be picked, and must
	// stay due.
	away := due[0]
	present := slices.DeleteFunc(slices.Clone(all), func(c Candidate) bool { return c.ID == away })
	r1 := ids(present, w.Select(1, present, 2, rng))
	if slices.Contains(r1, away) || !slices.Contains(w.Remaining(), away) {
		t.Fatalf("absent client picked or dropped: %v, remaining %v", r1, w.Remaining())
	}
	if !slices.Equal(r1, due[1:3]) {
		t.Fatalf("round 1 took %v, want the next present %v", r1, due[1:3])
	}
	// Round 2: it is back, plus a newcomer; both come before the pass ends.
	back := append(slices.Clone(all), Candidate{ID: "new", Samples: 1, Loss: math.NaN()})
	var rest []string
	for round := 2; len(rest) < 5; round++ {
		got := ids(back, w.Select(round, back, 1, rng))
		rest = append(rest, got...)
	}
	// The pass: r0 (2) + r1 (2) + 5 more = the 8 originals and the newcomer.
	pass := append(append(append([]string{}, r0...), r1...), rest...)
	slices.Sort(pass)
	want := []string{"id00", "id01", "id02", "id03", "id04", "id05", "id06", "id07", "new"}
	if !slices.Equal(pass, want) {
		t.Fatalf("pass with arrivals and departures: %v", pass)
	}
	// A client gone for the rest of the pass misses it; the pass still ends.
	w2 := NewWindow()
	first := ids(all, w2.Select(0, all, 4, rng))
	leftover := w2.Remaining()
	gone := leftover[3]
	fewer := slices.DeleteFunc(slices.Clone(all), func(c Candidate) bool { return c.ID == gone })
	second := ids(fewer, w2.Select(1, fewer, 3, rng)) // the other 3 due
	third := ids(fewer, w2.Select(2, fewer, 7, rng))  // new pass over the 7
	if slices.Contains(second, gone) || len(third) != 7 || len(first) != 4 {
		t.Fatalf("%v %v %v", first, second, third)
	}
}

// TestWindowIndependentOfCandidateOrder: the same clients in another order
// give the same selected ids.
func TestWindowIndependentOfCandidateOrder(t *testing.T) {
	a, b := NewWindow(), NewWindow()
	ra, rb := newRand(63), newRand(63)
	cs := cands(9)
	for round := range 10 {
		perm := newRand(uint64(round)).Perm(len(cs))
		pc := make([]Candidate, len(cs))
		for i, p := range perm {
			pc[i] = cs[p]
		}
		ga, gb := a.Select(round, cs, 4, ra), b.Select(round, pc, 4, rb)
		for i := range ga {
			if cs[ga[i]].ID != pc[gb[i]].ID {
				t.Fatalf("round %d: %v vs %v", round, ga, gb)
			}
		}
	}
}

// TestByLossFavoursHighLoss: over many seeded draws the selection frequency
// rises with the loss, clients with unknown loss are picked as often as the
// highest-loss client, and zero-loss clients are still picked (explore).
func TestByLossFavoursHighLoss(t *testing.T) {
	const n, k, rounds = 8, 2, 20000
	cs := make([]Candidate, n)
	for i := range cs {
		cs[i] = Candidate{ID: fmt.Sprint(i), Loss: float64(i)} // 0 .. 7
	}
	cs[n-1].Loss = math.NaN() // unknown
	rng := newRand(64)
	count := make([]float64, n)
	s := ByLoss{Power: 1, Explore: 0.1}
	for r := range rounds {
		for _, i := range s.Select(r, cs, k, rng) {
			count[i]++
		}
	}
	for i := 1; i < n-1; i++ {
		if !(count[i] > count[i-1]) {
			t.Fatalf("frequency not increasing with loss: %v", count)
		}
	}
	if count[0] == 0 {
		t.Fatalf("zero-loss client never picked: %v", count)
	}
	// Unknown loss weighs like the highest known loss (6): within 5 %.
	if math.Abs(count[n-1]-count[n-2]) > 0.05*count[n-2] {
		t.Fatalf("unknown-loss client picked %v times, top known %v", count[n-1], count[n-2])
	}
	// No known loss at all: uniform.
	for i := range cs {
		cs[i].Loss = math.NaN()
	}
	clear(count)
	for r := range rounds {
		for _, i := range s.Select(r, cs, k, rng) {
			count[i]++
		}
	}
	for _, c := range count {
		if math.Abs(c-rounds*k/n) > 0.06*rounds*k/n {
			t.Fatalf("all unknown: not uniform: %v", count)
		}
	}
}

// TestDrawWeightedUnbiased: successive draws without replacement follow the
// remaining weights (regression: picked entries marked -1 were summed into
// the total, biasing later draws towards the first unpicked index).
func TestDrawWeightedUnbiased(t *testing.T) {
	rng := newRand(65)
	const rounds = 30000
	count := make([]float64, 3)
	for range rounds {
		for _, i := range drawWeighted([]float64{1, 1, 1}, 2, rng) {
			count[i]++
		}
	}
	for _, c := range count {
		if math.Abs(c/rounds-2.0/3) > 0.015 {
			t.Fatalf("equal weights, k = 2: frequencies %v", count)
		}
	}
	// Weights 1:3, k = 1: 1/4 and 3/4; NaN, Inf and negative weights count
	// as zero.
	clear(count)
	for range rounds {
		count[drawWeighted([]float64{1, 3, math.NaN()}, 1, rng)[0]]++
	}
	if math.Abs(count[0]/rounds-0.25) > 0.015 || count[2] != 0 {
		t.Fatalf("weights 1:3: %v", count)
	}
	if got := drawWeighted([]float64{math.Inf(1), -1, 0}, 2, rng); len(got) != 2 || got[0] == got[1] {
		t.Fatalf("degenerate weights: %v", got)
	}
	if got := drawWeighted([]float64{math.MaxFloat64, math.MaxFloat64, 1}, 2, rng); slices.Contains(got, 2) {
		t.Fatalf("overflowing total: %v", got)
	}
}

func TestBySamplesProportional(t *testing.T) {
	rng := newRand(66)
	cs := []Candidate{{ID: "a", Samples: 10}, {ID: "b", Samples: 30}, {ID: "c", Samples: 0}}
	count := make([]float64, 3)
	const rounds = 20000
	for r := range rounds {
		count[BySamples{}.Select(r, cs, 1, rng)[0]]++
	}
	if math.Abs(count[1]/rounds-0.75) > 0.015 || count[2] != 0 {
		t.Fatalf("frequencies %v", count)
	}
}

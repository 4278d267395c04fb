package aggregate

import (
	"math"
	"math/rand/v2"
	"slices"
)

// ByLoss is the loss-based selection pi_loss of seeds/003 sec. 5.2: clients
// with a higher recent loss are more likely to be picked. The paper names an
// importance weight v_k and "a selection probability function" without
// giving either formula; here
//
//	v_k = (L_k / L_max)^Power          (L_k the client's last loss, clamped at 0)
//	P(k) ∝ v_k + Explore * mean(v)      (k drawn without replacement)
//
// so the probability rises with the loss, is invariant to the loss's unit
// (dividing by the largest known loss also rules out overflow), and Explore
// keeps clients whose loss is 0 selectable.
//
// Unknown losses: a client that has never reported (Loss NaN) gets v_k = 1,
// the weight of the highest known loss, so new clients are picked as eagerly
// as the worst-fitted known ones and every client soon has a loss. A loss of
// +Inf (a diverged client) also counts as the highest known loss. When no
// client has a known positive loss the selection is uniform.
type ByLoss struct {
	Power   float64 // >= 0 (NewSelector's default: 1)
	Explore float64 // >= 0 (NewSelector's default: 0.1)
}

func (b ByLoss) Name() string {
	return "loss:power=" + ftoa(b.Power) + ":explore=" + ftoa(b.Explore)
}

func (b ByLoss) Select(_ int, cands []Candidate, k int, rng *rand.Rand) []int {
	if k <= 0 {
		return []int{}
	}
	if k >= len(cands) {
		return seq(len(cands))
	}
	var lmax float64
	for _, c := range cands {
		if c.Loss > 0 && !math.IsInf(c.Loss, 1) {
			lmax = max(lmax, c.Loss)
		}
	}
	w := make([]float64, len(cands))
	var mean float64
	for i, c := range cands {
		switch {
		case lmax == 0:
			w[i] = 1
		case math.IsNaN(c.Loss) || math.IsInf(c.Loss, 1):
			w[i] = 1
		case c.Loss > 0:
			w[i] = math.Pow(c.Loss/lmax, b.Power)
		}
		mean += w[i]
	}
	mean /= float64(len(w))
	for i := range w {
		w[i] += b.Explore * mean
	}
	return drawWeighted(w, k, rng)
}

// Window is SimProx's sliding-window selection (seeds/000, sec. IV.A): the
// clients are put in a random order and each round takes the next k of it,
// so that every client takes part once per pass; when a pass is exhausted a
// new random order is drawn.
//
// Clients coming and going between rounds: the window is kept over client
// ids, not indices. A candidate not yet in the current pass (a newcomer) is
// inserted at a random position among the clients still to come in this
// pass. A client of the pass that is absent when its turn comes is skipped
// but stays due: it is taken as soon as it is back, within the same pass. A
// pass ends when none of its remaining clients is present; the clients still
// due then (absent for the rest of the pass) miss it. When a pass ends
// mid-round the next pass is drawn over the current candidates with the ones
// already taken this round placed last, so a round never picks a client
// twice and each pass still contains every client once. Newcomers are
// ordered by id before being shuffled, so the selected ids do not depend on
// the order of cands.
type Window struct {
	due  []string        // the current pass's clients still to come, in order
	pass map[string]bool // every client of the current pass (taken or due)
}

// NewWindow returns a sliding-window selector with no history.
func NewWindow() *Window { return &Window{pass: map[string]bool{}} }

func (*Window) Name() string { return "window" }

func (w *Window) Select(_ int, cands []Candidate, k int, rng *rand.Rand) []int {
	if w.pass == nil {
		w.pass = map[string]bool{}
	}
	if k <= 0 {
		return []int{}
	}
	index := map[string]int{}
	var ids []string // distinct ids, sorted
	for i, c := range cands {
		if _, dup := index[c.ID]; !dup {
			index[c.ID] = i
			ids = append(ids, c.ID)
		}
	}
	slices.Sort(ids)
	// Newcomers join the rest of the current pass at random positions.
	for _, id := range ids {
		if !w.pass[id] {
			w.pass[id] = true
			pos := rng.IntN(len(w.due) + 1)
			w.due = slices.Insert(w.due, pos, id)
		}
	}
	taken := map[string]bool{}
	var picked []int
	take := func() {
		rest := w.due[:0]
		for _, id := range w.due {
			if i, ok := index[id]; ok && !taken[id] && len(picked) < k {
				taken[id] = true
				picked = append(picked, i)
				continue
			}
			rest = append(rest, id)
		}
		w.due = rest
	}
	// newPass draws a new order over the present clients, the ones already
	// taken this round last.
	newPass := func() {
		var fresh, last []string
		for _, id := range ids {
			if taken[id] {
				last = append(last, id)
			} else {
				fresh = append(fresh, id)
			}
		}
		rng.Shuffle(len(fresh), func(a, b int) { fresh[a], fresh[b] = fresh[b], fresh[a] })
		rng.Shuffle(len(last), func(a, b int) { last[a], last[b] = last[b], last[a] })
		w.due = append(fresh, last...)
		clear(w.pass)
		for _, id := range ids {
			w.pass[id] = true
		}
	}
	if !w.anyPresent(index) {
		newPass() // the previous pass is over (or this is the first round)
	}
	take()
	if len(picked) < k {
		// The pass ran out mid-round: continue in a new one.
		newPass()
		take()
	}
	if k >= len(cands) && len(picked) < len(cands) {
		// Duplicate ids: the interface promises every index when k >= n.
		seen := map[int]bool{}
		for _, i := range picked {
			seen[i] = true
		}
		for i := range cands {
			if !seen[i] {
				picked = append(picked, i)
			}
		}
	}
	return picked
}

// anyPresent reports whether a client still due in this pass is a candidate.
func (w *Window) anyPresent(index map[string]int) bool {
	for _, id := range w.due {
		if _, ok := index[id]; ok {
			return true
		}
	}
	return false
}

// Remaining returns the ids still due in the current pass, in order (for
// logging and tests).
func (w *Window) Remaining() []string { return slices.Clone(w.due) }

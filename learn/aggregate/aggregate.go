// Package aggregate owns the server-side strategies that turn client vectors
// into the next global model (FedAvg, FedProx mean, FedSplit mean, and the
// papers' similarity-based and robust aggregators) and the client selection
// policies. It is pure: randomness comes from the *rand.Rand it is handed,
// state lives in the aggregator or selector value.
//
// Aggregators: FedAvg, Mean, SimProx (seeds/000), FedSim (cosine weighting,
// seeds/001), FedSimCluster (seeds/002) with Sketch for the anchor gradient,
// FedSiam (seeds/004), Median, TrimmedMean, NormBound (wraps any other).
// Selectors: Uniform, BySamples, ByLoss (seeds/003), Window (seeds/000).
// PNI is seeds/002's non-IID index. NewAggregator and NewSelector build them
// from spec strings (see registry.go for the grammar).
//
// Every aggregator returns a finite model for finite input: vectors are
// scaled by powers of two before sums of squares, convex combinations are
// guarded against rounding past the float64 range, and exponentials are
// taken in the log domain.
package aggregate

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Update is one client's contribution to a round.
type Update struct {
	Client  string    // client id
	Params  []float64 // the client's model w_k (FedSplit: its z_j)
	Samples int       // n_k, the client's training sample count
	// AnchorGrad is grad f_k at the round's anchor, or a sketch of it
	// (optional; FedSim clustering needs it).
	AnchorGrad []float64
	// Loss is the client's local loss at the received global model
	// (optional; NaN when unknown).
	Loss float64
}

// Report says what an aggregation did.
type Report struct {
	// Weights are the coefficients given to each update, in input order
	// (nil for aggregators that are not a weighted mean, e.g. the median).
	Weights []float64
	// Metrics are aggregator-specific figures (e.g. FedSim's avg_similarity).
	Metrics map[string]float64
	// Clusters is the cluster index of each update, in input order (only
	// clustering aggregators set it; clusters are numbered 0, 1, ... in the
	// order of their first member after sorting updates by client id).
	Clusters []int
	// Capped are the sites whose sample count FedAvg's cap lowered.
	Capped []Capped
}

// Aggregator combines client vectors into the next global model.
//
// global is the current global model (read only); out receives the result and
// has the same length. Implementations may keep small state between rounds
// (SimProx remembers each client's previous model) and are not safe for
// concurrent use.
type Aggregator interface {
	Name() string
	Aggregate(global []float64, ups []Update, out []float64) (Report, error)
}

// Stateful is implemented by aggregators whose result depends on the rounds
// they aggregated before (SimProx remembers each client's previous model).
// Their state is rebuilt after a restart by aggregating the stored rounds
// again, in order: Aggregate is deterministic, so the state comes back
// exactly.
type Stateful interface {
	Stateful() bool
}

// IsStateful reports whether a keeps state between rounds.
func IsStateful(a Aggregator) bool {
	s, ok := a.(Stateful)
	return ok && s.Stateful()
}

// Errors shared by the aggregators.
var (
	ErrNoUpdates = errors.New("aggregate: no updates")
	ErrDim       = errors.New("aggregate: dimension mismatch")
	ErrNonFinite = errors.New("aggregate: non-finite value")
	ErrSamples   = errors.New("aggregate: negative sample count")
	// ErrNoAnchorGrad: the clustered FedSim needs every update's AnchorGrad.
	ErrNoAnchorGrad = errors.New("aggregate: missing anchor gradient")
)

func errNegSamples(u Update) error {
	return fmt.Errorf("%w: update %s has %d", ErrSamples, u.Client, u.Samples)
}

// check validates that every update has len(global) finite parameters and
// that the global model itself is finite.
func check(global []float64, ups []Update, out []float64) error {
	if len(ups) == 0 {
		return ErrNoUpdates
	}
	if err := CheckGlobal(global, out); err != nil {
		return err
	}
	for k, u := range ups {
		if err := checkParams(k, u, len(global)); err != nil {
			return err
		}
	}
	return nil
}

// CheckGlobal is Aggregate's check of the global model (finite) and of out
// (its length), the part of check a streamed aggregation (Sum) makes
// before its first update.
func CheckGlobal(global, out []float64) error {
	if len(out) != len(global) {
		return fmt.Errorf("%w: out has %d, global has %d", ErrDim, len(out), len(global))
	}
	if !allFinite(global) {
		return fmt.Errorf("%w in the global model", ErrNonFinite)
	}
	return nil
}

// weightedSum writes sum_k w_k u_k.Params into out. The weights must be
// non-negative and sum to 1 (every aggregator here produces a convex
// combination): then the exact result lies within the inputs' range, and a
// coordinate that rounded past the largest float64 is recomputed at half scale
// and clamped into that range, so finite inputs always give a finite output.
// It is Sum over updates held in memory (the same loops, the same order).
func weightedSum(ups []Update, w []float64, out []float64) {
	s := NewSum(out)
	for k, u := range ups {
		s.add(w[k], u.Params)
	}
	if s.Overflowed() {
		for k, u := range ups {
			s.Redo(w[k], u.Params)
		}
		s.Finish()
	}
}

// FedAvg is the sample-weighted mean sum_k (n_k/n) w_k.
//
// Cap, when >= 1, bounds the weight a site can claim with its self-reported
// sample count: no n_k counts for more than Cap x the median count of the
// round's other sites. A site's weight is then at most
// Cap m_k / (Cap m_k + sum_{j != k} n_j), m_k the others' median: Cap/(Cap+K-1)
// when the others report alike, and never more than Cap/(Cap+ceil((K-1)/2))
// (at least half of the others count m_k or more), whatever it claims, also
// from its very first message (one site claiming 2e9 samples took the whole
// FedAvg weight). The median is the others', not the round's: with two
// sites, the round's median is half the liar's claim. It changes nothing
// while every count is within Cap x the others' median (a lone site has no
// others and is never capped); a federation whose sites genuinely differ
// more than that trades the exact sample weighting for the bound.
// NewAggregator's "fedavg" has Cap DefaultFedAvgCap; "fedavg:cap=0" turns it
// off.
type FedAvg struct{ Cap float64 }

// DefaultFedAvgCap is the cap of "fedavg" (see FedAvg): no site counts for
// more than three times the median sample count of the others.
const DefaultFedAvgCap = 3

func (a FedAvg) Name() string {
	switch {
	case a.Cap == DefaultFedAvgCap:
		return "fedavg"
	case a.Cap >= 1:
		return fmt.Sprintf("fedavg:cap=%g", a.Cap)
	}
	return "fedavg:cap=0"
}

func (a FedAvg) Aggregate(global []float64, ups []Update, out []float64) (Report, error) {
	if err := check(global, ups, out); err != nil {
		return Report{}, err
	}
	rep, err := a.Weights(ups)
	if err != nil {
		return Report{}, err
	}
	weightedSum(ups, rep.Weights, out)
	return rep, nil
}

// Weights is FedAvg's coefficients n_k/n for the updates' sample counts,
// after the cap (Summable).
func (a FedAvg) Weights(ups []Update) (Report, error) {
	if len(ups) == 0 {
		return Report{}, ErrNoUpdates
	}
	var capped []Capped
	if a.Cap >= 1 {
		ups, capped = CapSamples(ups, a.Cap)
	}
	w, err := sampleWeights(ups)
	if err != nil {
		return Report{}, err
	}
	rep := Report{Weights: w, Capped: capped}
	if len(capped) > 0 {
		rep.Metrics = map[string]float64{"samples_capped": float64(len(capped))}
	}
	return rep, nil
}

// Capped is a site whose sample count FedAvg's cap lowered in a round.
type Capped struct {
	Client           string
	Claimed, Counted int
}

// CapSamples returns ups with every sample count above mult x the median
// count of the other updates lowered to it (a copy when anything changes)
// and the counts it lowered, in input order. The limits are computed from
// the counts as given, not as lowered.
func CapSamples(ups []Update, mult float64) ([]Update, []Capped) {
	if len(ups) < 2 {
		return ups, nil
	}
	sorted := make([]int, len(ups))
	for k, u := range ups {
		sorted[k] = u.Samples
	}
	slices.Sort(sorted)
	others := make([]int, 0, len(ups)-1)
	var out []Update
	var capped []Capped
	for k, u := range ups {
		// The others' counts: the sorted counts less one copy of u's.
		i, _ := slices.BinarySearch(sorted, u.Samples)
		others = append(append(others[:0], sorted[:i]...), sorted[i+1:]...)
		med := float64(others[len(others)/2])
		if len(others)%2 == 0 {
			med = (float64(others[len(others)/2-1]) + float64(others[len(others)/2])) / 2
		}
		limit := int(min(mult*med, math.MaxInt32))
		if u.Samples > limit {
			if out == nil {
				out = slices.Clone(ups)
			}
			out[k].Samples = limit
			capped = append(capped, Capped{Client: u.Client, Claimed: u.Samples, Counted: limit})
		}
	}
	if out == nil {
		return ups, nil
	}
	return out, capped
}

// Mean is the uniform mean (1/K) sum_k w_k: the FedProx paper's aggregation,
// and FedSplit's server step when handed every known client's latest z.
type Mean struct{ Label string }

func (m Mean) Name() string {
	if m.Label != "" {
		return m.Label
	}
	return "mean"
}

func (m Mean) Aggregate(global []float64, ups []Update, out []float64) (Report, error) {
	if err := check(global, ups, out); err != nil {
		return Report{}, err
	}
	rep, err := m.Weights(ups)
	if err != nil {
		return Report{}, err
	}
	weightedSum(ups, rep.Weights, out)
	return rep, nil
}

// Weights is the uniform mean's coefficients 1/K (Summable).
func (Mean) Weights(ups []Update) (Report, error) {
	if len(ups) == 0 {
		return Report{}, ErrNoUpdates
	}
	w := make([]float64, len(ups))
	for k := range w {
		w[k] = 1 / float64(len(ups))
	}
	return Report{Weights: w}, nil
}

// Candidate is a client available for selection.
type Candidate struct {
	ID      string
	Samples int
	// Loss is the client's most recently reported local loss (NaN when it
	// has never reported).
	Loss float64
}

// Selector picks k of the candidates for a round and returns their indices
// into cands (distinct, in selection order). When k >= len(cands) every
// candidate is selected. Selectors may keep state between rounds and are not
// safe for concurrent use.
type Selector interface {
	Name() string
	Select(round int, cands []Candidate, k int, rng *rand.Rand) []int
}

// Uniform selects k candidates uniformly without replacement.
type Uniform struct{}

func (Uniform) Name() string { return "uniform" }

func (Uniform) Select(_ int, cands []Candidate, k int, rng *rand.Rand) []int {
	if k <= 0 {
		return []int{}
	}
	if k >= len(cands) {
		return seq(len(cands))
	}
	return rng.Perm(len(cands))[:k]
}

// BySamples selects k distinct candidates with probability proportional to
// their sample counts (successive draws without replacement).
type BySamples struct{}

func (BySamples) Name() string { return "samples" }

func (BySamples) Select(_ int, cands []Candidate, k int, rng *rand.Rand) []int {
	w := make([]float64, len(cands))
	for i, c := range cands {
		w[i] = float64(max(c.Samples, 0))
	}
	return drawWeighted(w, k, rng)
}

// drawWeighted draws min(k, len(w)) distinct indices, each draw with
// probability proportional to the remaining weights; zero weights are drawn
// uniformly once positive weight is exhausted. Negative, NaN and infinite
// weights count as zero; weights are rescaled by their maximum first so that
// their total cannot overflow.
func drawWeighted(w []float64, k int, rng *rand.Rand) []int {
	if k <= 0 {
		return []int{}
	}
	if k >= len(w) {
		return seq(len(w))
	}
	w = append([]float64(nil), w...)
	var mx float64
	for i, v := range w {
		if !(v > 0) || math.IsInf(v, 0) {
			w[i] = 0
		}
		mx = max(mx, w[i])
	}
	if mx > 0 {
		for i := range w {
			w[i] /= mx
		}
	}
	picked := make([]int, 0, k)
	for len(picked) < k {
		var total float64
		for _, v := range w {
			if v > 0 { // picked entries are marked -1
				total += v
			}
		}
		if !(total > 0) {
			// No weight left: fill uniformly from the unpicked.
			var rest []int
			for i, v := range w {
				if v >= 0 {
					rest = append(rest, i)
				}
			}
			rng.Shuffle(len(rest), func(a, b int) { rest[a], rest[b] = rest[b], rest[a] })
			picked = append(picked, rest[:k-len(picked)]...)
			break
		}
		idx := walkWeights(w, rng.Float64()*total)
		picked = append(picked, idx)
		w[idx] = -1 // mark picked
	}
	return picked
}

// walkWeights lays the positive weights end to end and returns the index
// of the one r falls in (r in [0, their total)); the last positive one when
// rounding leaves r beyond the end, -1 when none is positive.
func walkWeights(w []float64, r float64) int {
	idx := -1
	for i, v := range w {
		if v <= 0 {
			continue
		}
		idx = i
		r -= v
		if r < 0 {
			break
		}
	}
	return idx
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

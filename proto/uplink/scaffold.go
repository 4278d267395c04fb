package uplink

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/edgefl/edgefl/learn/quant"
)

// SCAFFOLD (Karimireddy et al. 2020, option II control variates), the
// rules both sides share. The server holds the control variate c, each
// site its own c_i (zero until its first update is counted). A site's local
// SGD steps are y <- y - lr (g_i(y) - c_i + c) (the solver's Shift is
// c - c_i); after K steps taken (partial work: the steps actually taken)
//
//	c_i+ = c_i - c + (x - y) / (K lr)
//
// and the site sends delta y = y - x (the FedProx family's DELTA, with its
// error feedback) and delta c = c_i+ - c_i (ControlDelta), both through the
// round's uplink codec. delta c has no residual: the site adds the decoded
// delta c to its c_i (EncodeControl), so its c_i is always what the
// aggregator has counted, and the invariant c = (1/N) sum_i c_i holds
// exactly on both sides whatever the codec drops. The server's step is
// x <- mean_k (x + delta y_k) (the global learning rate 1; the server
// optimiser sgd, learn/serveropt, makes it x + eta_g mean_k delta y_k) and
// c <- c + (1/N) sum_k delta c_k (NextControl), N the sites known to the
// aggregator.

// ErrControl is wrapped by a SCAFFOLD update whose control delta is
// missing or does not decode to the model's dimension.
var ErrControl = errors.New("uplink: bad control delta")

// Shift is the solver's gradient shift c - c_i; ci nil (or of another
// length: a variate of another model) counts as zero.
func Shift(c, ci []float64) []float64 {
	s := make([]float64, len(c))
	for k := range s {
		s[k] = c[k]
		if len(ci) == len(c) {
			s[k] -= ci[k]
		}
	}
	return s
}

// ControlDelta is delta c = c_i+ - c_i = (x - y) / (K lr) - c after
// steps = K SGD steps of rate lr from x to y. No step taken (K = 0: the
// solve stopped before its first mini-batch): nothing was learnt about
// the local gradient, and delta c is zero.
func ControlDelta(c, x, y []float64, steps int, lr float64) ([]float64, error) {
	n := len(x)
	if len(c) != n || len(y) != n {
		return nil, fmt.Errorf("uplink: control delta: c %d, x %d, y %d values", len(c), n, len(y))
	}
	d := make([]float64, n)
	if steps <= 0 {
		return d, nil
	}
	if !(lr > 0) {
		return nil, fmt.Errorf("uplink: control delta: learning rate %v, want > 0", lr)
	}
	kl := float64(steps) * lr
	for k := range d {
		d[k] = (x[k]-y[k])/kl - c[k]
		if math.IsNaN(d[k]) || math.IsInf(d[k], 0) {
			return nil, fmt.Errorf("uplink: control delta: value %d is %v", k, d[k])
		}
	}
	return d, nil
}

// EncodeControl encodes delta c with codec cd (drawing from rng: qsgd
// only) and returns the frame, and the site's new c_i: ci (nil: zero)
// plus the delta as the aggregator decodes it.
func EncodeControl(cd *quant.Codec, ci, delta []float64, rng *rand.Rand) (payload []byte, next []float64, err error) {
	if payload, err = cd.Encode(nil, delta, nil, rng); err != nil {
		return nil, nil, fmt.Errorf("uplink: encode the control delta with %s: %w", cd, err)
	}
	d, err := cd.Decode(payload, nil)
	if err != nil || len(d) != len(delta) {
		return nil, nil, fmt.Errorf("uplink: decode own control delta (%d values): %w", len(d), err)
	}
	next = make([]float64, len(d))
	for k := range next {
		next[k] = d[k]
		if len(ci) == len(d) {
			next[k] = ci[k] + d[k]
		}
	}
	return payload, next, nil
}

// NextControl is the server's new c: c + (1/n) sum of deltas, summed in
// the order given (callers sort by site id: a deterministic sum), n the
// sites known to the aggregator (n < len(deltas) counts as len(deltas)).
// c is not modified. It is ControlSum over deltas held in memory.
func NextControl(c []float64, deltas [][]float64, n int) ([]float64, error) {
	cs := NewControlSum(len(c))
	for _, d := range deltas {
		if err := cs.Add(d); err != nil {
			return nil, err
		}
	}
	return cs.Next(c, n)
}

// ControlSum is NextControl's sum of control deltas taken one at a time
// (a streamed close holds one decoded delta, not K), in the order added.
type ControlSum struct {
	sum []float64
	n   int
}

// NewControlSum starts the sum of control deltas of dim values.
func NewControlSum(dim int) *ControlSum { return &ControlSum{sum: make([]float64, dim)} }

// Add adds the next control delta.
func (s *ControlSum) Add(d []float64) error {
	if len(d) != len(s.sum) {
		return fmt.Errorf("%w: update %d has %d values, the model %d", ErrControl, s.n, len(d), len(s.sum))
	}
	for k, v := range d {
		s.sum[k] += v
	}
	s.n++
	return nil
}

// Next is c + (1/n) times the sum, n the sites known to the aggregator
// (at least the deltas added); c is not modified.
func (s *ControlSum) Next(c []float64, n int) ([]float64, error) {
	if len(c) != len(s.sum) {
		return nil, fmt.Errorf("%w: c has %d values, the deltas %d", ErrControl, len(c), len(s.sum))
	}
	n = max(n, s.n)
	out := make([]float64, len(c))
	copy(out, c)
	if s.n == 0 {
		return out, nil
	}
	for k := range out {
		out[k] += s.sum[k] / float64(n)
		if math.IsNaN(out[k]) || math.IsInf(out[k], 0) {
			return nil, fmt.Errorf("%w: the control variate's value %d is %v", ErrControl, k, out[k])
		}
	}
	return out, nil
}

package uplink

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"

	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/proto/secagg"
)

// The FedSplit family under secure aggregation runs in sum mode (sum.go;
// docs/privacy.md, "FedSplit under secure aggregation"): the aggregator
// keeps S and m and adds the secure sum of the sites' quantised deltas; a
// site keeps z_j and its record c_j. The "delivered" vector is the ring
// quantiser's: a site's input is its delta z_j - c_j (a join: z_j minus x
// on the quantiser's grid) quantised to integers of 2^-f; the aggregator
// learns only the sum of the inputs of U3.
//
// The accounting is in integers of 2^-f (f the scale bits), so that S and
// every site's record stay exactly consistent without DP: a join's base is
// x rounded to the grid (SecAggGrid), each delivered input is an integer
// of 2^-f, so S, every record c_j and every delivered value is an integer
// multiple of 2^-f, and as long as |S| stays below 2^(53-f) per coordinate
// (checked: SecAggSumClose) float64 adds them exactly, in any order:
//
//	S = sum over the counted sites of c_j, bit for bit,
//
// where c_j = xg(join round) + the site's delivered inputs, advanced by
// uplink.Advance on the round's accepted UPDATE receipt. So x = S/m is the
// mean of the records, every record is within the quantiser's resolution
// of its z_j plus what clipping held back (fed back by the next delta), and
// FedSplit without DP reaches its optimum to the quantiser's resolution.
//
// Under distributed DP the delivered vector also holds the site's noise
// share and the stochastic rounding of noisy values: they stay in S and
// are never fed back (a record that took in its own noise would send its
// negation the next round, and the rounds' noises would cancel in S). The
// record then advances by the clipped delta (plus xg for a join) only, as
// under central DP (the noise is S's, not the sites'); S is still on the
// grid, the records are not, and S - sum c_j is the noise and rounding, as
// in the central mode.

// SecAggGrid is x rounded to the quantiser's grid of 2^-ScaleBits (half to
// even): the base of a join and what the aggregator adds to S for it.
func SecAggGrid(q secagg.Quantizer, x []float64) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = math.Ldexp(math.RoundToEven(math.Ldexp(v, q.ScaleBits)), -q.ScaleBits)
	}
	return out
}

// SecAggDP is a site's distributed-DP noise share in sum mode (nil: no DP):
// the delta is clipped to L2 norm Clip less the rounding's sqrt(d) 2^-f,
// then N(0, Std^2) per coordinate from Noise is added before quantising
// (as SecAggNoisyInput).
type SecAggDP struct {
	Clip, Std float64
	Noise     *rand.Rand
}

// SecAggSumInput is a sum-mode site's input to the secure sum of round
// u.Round: z_j - c_j (u.Record), or z_j - SecAggGrid(x) for a join,
// clipped (and noised) under d, quantised with stochastic rounding from
// rnd; and what it adds to the site's record once the round's sum is
// confirmed to hold it (Pending: the dequantised input, plus the grid x
// for a join; under DP the clipped delta, see above). u.Clip is not used.
func SecAggSumInput(q secagg.Quantizer, u SumUpdate, d *SecAggDP, rnd io.Reader) ([]uint32, Pending, error) {
	join := u.Record == nil
	var xg []float64
	if join {
		xg = SecAggGrid(q, u.Global)
		u.Global = xg
	}
	u.Clip = 0
	delta, _, _, err := SumDelta(u)
	if err != nil {
		return nil, Pending{}, err
	}
	if u.Tamper != nil {
		u.Tamper(delta)
	}
	if d == nil {
		in, err := q.Quantize(delta, rnd)
		if err != nil {
			return nil, Pending{}, wrapErr("uplink", err)
		}
		p, err := PendingOf(join, xg, q.Dequantize(in))
		return in, p, err
	}
	c := d.Clip - math.Sqrt(float64(len(delta)))*math.Ldexp(1, -q.ScaleBits)
	if !(c > 0) {
		return nil, Pending{}, fmt.Errorf("uplink: the clip norm %g is below the rounding's %g at scale 2^%d: raise the scale or the clip", d.Clip, d.Clip-c, q.ScaleBits)
	}
	if _, err := dp.Clip(delta, c); err != nil {
		return nil, Pending{}, wrapErr("uplink: clip the update", err)
	}
	in, err := q.Quantize(delta, rnd)
	if err != nil {
		return nil, Pending{}, wrapErr("uplink", err)
	}
	// The record advances by the rounded contribution, as without noise:
	// the rounding error stays in z_j - c_j and is sent again.
	p, err := PendingOf(join, xg, q.Dequantize(in))
	if err != nil {
		return nil, Pending{}, err
	}
	if err := AddRingNoise(q, in, d.Std, d.Noise); err != nil {
		return nil, Pending{}, err
	}
	return in, p, nil
}

// SecAggSumClose is the aggregator's close of round in sum mode under
// secure aggregation: every joiner counted with x on the grid, the
// dequantised ring sum of U3's inputs added to S (SumState.Add), the next
// global model S/m returned. It refuses an S off the grid or one whose
// integers of 2^-f would leave float64's exact range (|S| < 2^(53-f) per
// coordinate), so that S stays exactly the sum of the sites' records.
func SecAggSumClose(q secagg.Quantizer, st *SumState, round uint64, x []float64, sum []uint32, joins []Joiner) ([]float64, error) {
	if len(sum) != len(x) {
		return nil, fmt.Errorf("uplink: secagg sum of %d values against a global model of %d", len(sum), len(x))
	}
	xg, d := SecAggGrid(q, x), q.Dequantize(sum)
	limit := math.Ldexp(1, 53-q.ScaleBits)
	j := float64(len(joins))
	for i := range x {
		bound := j*math.Abs(xg[i]) + math.Abs(d[i])
		if i < len(st.S) {
			s := st.S[i]
			if v := math.Ldexp(s, q.ScaleBits); v != math.Trunc(v) {
				return nil, fmt.Errorf("uplink: the aggregator's sum is off the 2^-%d grid at %d (%v): it is not this run's", q.ScaleBits, i, s)
			}
			bound += math.Abs(s)
		}
		if !(bound < limit) {
			return nil, fmt.Errorf("uplink: the sum reaches %g at %d, beyond 2^%d, where float64 no longer holds every integer of 2^-%d: lower --secagg-scale-bits", bound, i, 53-q.ScaleBits, q.ScaleBits)
		}
	}
	return st.Add(round, xg, d, joins)
}

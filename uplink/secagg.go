package uplink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/edgefl/edgefl/secagg"
	"github.com/edgefl/edgefl/wire"
)

// Secure aggregation's rules (docs/secagg.md, "Wire" and "Aggregation"), in
// one place for the agent, the aggregator and simulate:
//
//   - the session every key and message of a round's secure aggregation is
//     bound to: run id, round and attempt (SecAggSession);
//   - the protocol's configuration and quantiser from the announcement
//     (SecAggSetup);
//   - what a site masks: its update w - x, each coordinate clipped to
//     [-clip, clip] and quantised to Z_{2^32} at scale 2^scale_bits with
//     stochastic rounding (SecAggInput); the aggregator never sees it;
//   - what the aggregator makes of the unmasked sum over U3: the uniform
//     mean x + (sum / 2^scale_bits) / |U3| (SecAggMean). Uniform weights
//     because a sample-weighted mean would need each site's weight, which
//     either leaks its sample count or needs a second summed coordinate
//     and a bound on the weights; the FedProx family's fixed point with
//     uniform weights minimises the unweighted sum of the sites' losses
//     (README, "Secure aggregation").

// ErrSecAggSplit refuses the FedSplit family under secure aggregation until
// its "sum mode" (the aggregator keeps sum_j z_j; docs/secagg.md,
// "Composition") exists.
var ErrSecAggSplit = errors.New("secure aggregation (--secagg) supports the FedProx family (fedavg, fedprox) only: the FedSplit family needs the aggregator's sum mode of z_j (docs/secagg.md, \"Composition\"), not built yet")

// SecAggSession is the session of a round's secure aggregation: every key
// is derived with it as the HKDF salt, so no message or share of one
// session opens in another.
func SecAggSession(runID string, round uint64, attempt uint32) []byte {
	b := append([]byte("edgefl-secagg/1/"), runID...)
	b = append(b, 0)
	b = binary.BigEndian.AppendUint64(b, round)
	return binary.BigEndian.AppendUint32(b, attempt)
}

// SecAggSetup is the protocol configuration and the quantiser a round's
// spec announces for a model of dim parameters; it refuses a spec whose
// sum could wrap or whose threshold the protocol refuses.
func SecAggSetup(sp *wire.SecAggSpec, dim int) (secagg.Config, secagg.Quantizer, error) {
	if sp == nil {
		return secagg.Config{}, secagg.Quantizer{}, errors.New("uplink: no secagg spec")
	}
	cfg := secagg.Config{Threshold: int(sp.Threshold), Degree: int(sp.Degree), Dim: dim}
	copy(cfg.GraphSeed[:], sp.GraphSeed)
	if err := cfg.Validate(); err != nil {
		return cfg, secagg.Quantizer{}, err
	}
	q, err := secagg.NewQuantizer(sp.Clip, int(sp.ScaleBits), int(sp.MaxSites))
	return cfg, q, err
}

// SecAggScaleBits is the finest scale a run with clip and k sites per
// round can announce (secagg.MaxScaleBitsFor, capped at 30 bits: below
// 2^-30 the float32 downlink rounds it away anyway).
func SecAggScaleBits(clip float64, k int) (int, error) {
	sb, err := secagg.MaxScaleBitsFor(clip, k)
	return min(sb, 30), err
}

// SecAggInput is a site's input to the secure sum: its update sent - global
// (w - x), clipped per coordinate and quantised with stochastic rounding
// drawn from rnd (crypto/rand in production; simulate and the tests that
// compare with it give a seeded stream).
func SecAggInput(q secagg.Quantizer, sent, global []float64, rnd io.Reader) ([]uint32, error) {
	if len(sent) != len(global) {
		return nil, fmt.Errorf("uplink: secagg input of %d values against a global model of %d", len(sent), len(global))
	}
	d := make([]float64, len(sent))
	for i := range sent {
		d[i] = sent[i] - global[i]
		if math.IsInf(d[i], 0) {
			return nil, fmt.Errorf("uplink: secagg input: value %d is infinite", i)
		}
	}
	return q.Quantize(d, rnd)
}

// SecAggMean is the next global model from the unmasked sum of n sites'
// inputs: global + Dequantize(sum) / n (uniform weights).
func SecAggMean(q secagg.Quantizer, global []float64, sum []uint32, n int) ([]float64, error) {
	switch {
	case len(sum) != len(global):
		return nil, fmt.Errorf("uplink: secagg sum of %d values against a global model of %d", len(sum), len(global))
	case n < 1 || n > q.MaxSites:
		return nil, fmt.Errorf("uplink: secagg sum of %d inputs, want 1..%d", n, q.MaxSites)
	}
	d := q.Dequantize(sum)
	out := make([]float64, len(global))
	for i := range out {
		out[i] = global[i] + d[i]/float64(n)
	}
	return out, nil
}

// SecAggPlainSum is the ring sum of plain inputs: what the unmasked sum
// over the same sites is, exactly (simulate computes it this way).
func SecAggPlainSum(inputs [][]uint32, dim int) []uint32 {
	sum := make([]uint32, dim)
	for _, in := range inputs {
		secagg.AddRing(sum, in)
	}
	return sum
}

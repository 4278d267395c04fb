package uplink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"

	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/proto/secagg"
	"github.com/edgefl/edgefl/proto/wire"
)

// Secure aggregation's rules (docs/privacy.md, "Wire" and "Aggregation"), in
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
//     (docs/privacy.md, "Using --secagg").

// ErrSecAggSplit refuses the FedSplit family under secure aggregation
// outside sum mode (RoundAnnouncement.split_sum): the aggregator would need
// each site's z_j, which it never sees (docs/privacy.md, "FedSplit under
// secure aggregation").
var ErrSecAggSplit = errors.New("secure aggregation (--secagg) runs the FedSplit family only in sum mode (split_sum) (hint: docs/privacy.md, \"FedSplit under secure aggregation\")")

// ErrSecAggSelector refuses every selector but uniform under secure
// aggregation: a secure sum needs at least its threshold t of the round's
// sites, fixed by the round's size K (a Poisson round of random size may
// fall below it), and the sites send no losses to rank them by. The
// selection is not private under --secagg anyway: the KeyList on the round
// topic names the sites that advertised keys (docs/privacy.md, "Threat
// models").
var ErrSecAggSelector = errors.New("secure aggregation (--secagg) selects exactly K sites uniformly: its threshold is fixed by K (hint: use uniform, the default under --secagg)")

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

// Distributed differential privacy under secure aggregation
// (docs/privacy.md, "Threat models"; `--dp distributed --secagg`): each
// site clips its update to L2 norm C - sqrt(d) 2^-f, rounds it to the grid
// 2^-f (stochastic rounding adds less than 2^-f per coordinate, so the
// rounded contribution stays within C: docs/privacy.md's first remedy), and
// adds to every ring element its share of the noise, a discrete Gaussian
// N_Z(0, (z C 2^f)^2 / k) (AddRingNoise), k = t - c (SecAggNoiseShares: t
// the secagg threshold, the fewest inputs a sum holds, c the colluding
// sites the guarantee holds against, who know their own shares). The ring
// sum is then the sites' rounded contributions plus a sum of at least t
// independent discrete Gaussians, at least k of them unknown to the
// aggregator and any c sites:
// the distributed discrete Gaussian mechanism of Kairouz, Liu & Steinke
// 2021, whose RDP bound is the continuous Gaussian's at z plus tau d, which
// CheckSecAggDP and AddRingNoise keep below 1e-12 (dp.CheckDistributedShare).
// The noise does not depend on the data, and the modular wrap, the
// dequantisation and the aggregator's mean (the sum over U3 divided by
// |U3|, public: it chose U3) are post-processing of that sum. The
// quantiser's range, the clip plus six standard deviations of a share
// (SecAggDPRange), only sets the headroom: the K noised inputs' sum stays
// far inside it. Caveat: the accountant's subsampling amplification does
// not hold against the aggregator, which knows who took part.

// SecAggDPRange is the quantiser's per-coordinate range under distributed
// DP: C plus six standard deviations of one site's share (shares =
// SecAggNoiseShares).
func SecAggDPRange(clip, noise float64, shares int) float64 {
	return clip + 6*dp.SiteStd(noise, clip, shares)
}

// CheckSecAggDP refuses a distributed-DP quantiser whose noise share (noise
// multiplier z, clip C, k = SecAggNoiseShares shares) is too few grid steps for a model of any
// size up to 2^31 coordinates (AddRingNoise's check, made once at start by
// the aggregator and simulate so that no site's round fails on it).
func CheckSecAggDP(q secagg.Quantizer, clip, noise float64, shares int) error {
	if err := dp.CheckDistributedShare(math.Ldexp(dp.SiteStd(noise, clip, shares), q.ScaleBits), q.MaxSites, math.MaxInt32); err != nil {
		return wrapErr("uplink", err)
	}
	return nil
}

// SecAggNoisyInput is a site's input under distributed DP: sent - global
// clipped to L2 norm clip - sqrt(d) 2^-f, plus N(0, std^2) on every
// coordinate from noise (dp.NoiseRand of the site's secret key), quantised
// with stochastic rounding from rnd.
func SecAggNoisyInput(q secagg.Quantizer, sent, global []float64, clip, std float64, noise *rand.Rand, rnd io.Reader) ([]uint32, error) {
	if len(sent) != len(global) {
		return nil, fmt.Errorf("uplink: secagg input of %d values against a global model of %d", len(sent), len(global))
	}
	d := make([]float64, len(sent))
	for i := range sent {
		d[i] = sent[i] - global[i]
	}
	c := clip - math.Sqrt(float64(len(d)))*math.Ldexp(1, -q.ScaleBits)
	if !(c > 0) {
		return nil, fmt.Errorf("uplink: the clip norm %g is below the rounding's %g at scale 2^%d: raise the scale or the clip", clip, clip-c, q.ScaleBits)
	}
	if _, err := dp.Clip(d, c); err != nil {
		return nil, wrapErr("uplink: clip the update", err)
	}
	in, err := q.Quantize(d, rnd)
	if err != nil {
		return nil, err
	}
	if err := AddRingNoise(q, in, std, noise); err != nil {
		return nil, err
	}
	return in, nil
}

// AddRingNoise adds to every ring element of in a draw of the discrete
// Gaussian of std real units, std 2^f grid steps (dp.DiscreteGaussian),
// modulo the ring: the distributed mode's noise share, added after the
// clipped update was rounded to the grid (docs/privacy.md, "Distributed
// DP"). It refuses a share too coarse for the sum of q.MaxSites of them to
// be close to one discrete Gaussian (dp.CheckDistributedShare). A std of 0
// adds nothing (tests of the rounding alone; --dp's noise is never 0).
func AddRingNoise(q secagg.Quantizer, in []uint32, std float64, noise *rand.Rand) error {
	if std == 0 {
		return nil
	}
	sigma := math.Ldexp(std, q.ScaleBits)
	if err := dp.CheckDistributedShare(sigma, q.MaxSites, len(in)); err != nil {
		return wrapErr("uplink", err)
	}
	g, err := dp.NewDiscreteGaussian(sigma, noise)
	if err != nil {
		return wrapErr("uplink", err)
	}
	for i := range in {
		in[i] += uint32(g.Draw()) // two's complement: modulo 2^32
	}
	return nil
}

// SecAggNoiseShares is the distributed mode's noise_shares: the number k of
// site shares, each N_Z(0, (z C)^2 / k), that must carry the full noise z
// C. Every sum the aggregator can unmask holds at least t inputs (the
// secagg threshold), and a site knows its own share, so c colluding sites
// can subtract c shares from it: k = t - c leaves z C in any such sum after
// that. k < 1 is refused: c colluders could then remove all the noise of a
// sum of t inputs.
func SecAggNoiseShares(threshold, colluders int) (int, error) {
	if colluders < 0 {
		return 0, fmt.Errorf("uplink: collusion bound %d: want >= 0", colluders)
	}
	if k := threshold - colluders; k >= 1 {
		return k, nil
	}
	return 0, fmt.Errorf("uplink: distributed DP against %d colluders needs a secagg threshold >= %d, got %d (hint: raise --secagg-threshold or --per-round, or lower --dp-colluders)", colluders, colluders+1, threshold)
}

// SecAggThreshold is the secagg threshold of a round of k sites: t when
// given (> 0), else secagg.DefaultThreshold(k), and always more than k/2
// (secagg.Config's rule for the complete graph).
func SecAggThreshold(k, t int) int {
	if t > 0 {
		return t
	}
	return max(secagg.DefaultThreshold(k), k/2+1)
}

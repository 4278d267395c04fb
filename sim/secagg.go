package sim

import (
	"fmt"
	"io"

	"github.com/edgefl/edgefl/dp"
	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/secagg"
	"github.com/edgefl/edgefl/uplink"
)

// Secure aggregation in simulate (Config.SecAgg): what the daemons compute
// (docs/secagg.md, "Aggregation"). Each participating client's input is its
// update quantised by uplink.SecAggInput, the aggregator's unmasked sum is
// exactly the ring sum of the inputs (the pairwise and self masks cancel in
// Z_2^32; secagg's TestExactSumWithDropouts), and the next global model is
// uplink.SecAggMean of that sum: the same function of the same integers as
// the aggregator's, so a live federation whose sites draw their rounding
// from the same streams ends each round with the same model bit for bit
// (TestSimMatchesLive). The protocol's messages are not simulated.

// secAggQuantizer is the run's quantiser (nil without --secagg); a zero
// ScaleBits becomes the finest that cannot wrap, as the aggregator's.
func secAggQuantizer(cfg *Config) (*secagg.Quantizer, error) {
	sa := cfg.SecAgg
	if sa == nil {
		return nil, nil
	}
	if d := cfg.DP; d != nil {
		// As the aggregator: the range holds the clip and the noise's
		// tail (uplink.SecAggDPRange).
		c := *sa
		c.Clip, cfg.SecAgg = uplink.SecAggDPRange(d.Clip, d.Noise, uplink.SecAggThreshold(cfg.PerRound, sa.Threshold)), &c
		sa = &c
	}
	if sa.ScaleBits == 0 {
		sb, err := uplink.SecAggScaleBits(sa.Clip, cfg.PerRound)
		if err != nil {
			return nil, fmt.Errorf("--secagg: %w", err)
		}
		c := *sa
		c.ScaleBits, cfg.SecAgg = sb, &c
		sa = &c
	}
	q, err := secagg.NewQuantizer(sa.Clip, sa.ScaleBits, cfg.PerRound)
	if err != nil {
		return nil, fmt.Errorf("--secagg: %w", err)
	}
	return &q, nil
}

// secAggRand is client's stochastic rounding in round t: the run's SecAgg
// stream (a site draws from crypto/rand; the live test gives both the same
// stream).
func (e *env) secAggRand(client, t int) io.Reader {
	if f := e.cfg.secAggRand; f != nil {
		return f(e.fed.Clients[client].ID, client, t)
	}
	return streams.Reader(streams.Of(e.cfg.Seed, streams.SecAgg, t, client))
}

// secAggStep is round t's server step under --secagg: the uniform mean of
// the ring sum of the participants' inputs.
func (e *env) secAggStep(s *algoState, t int, jobs []job, outs []outcome, row *Round) error {
	var inputs [][]uint32
	var ids []string
	var trace map[string][]uint32
	if e.cfg.traceSecAgg != nil {
		trace = map[string][]uint32{}
	}
	for i, j := range jobs {
		if outs[i].input == nil {
			continue
		}
		inputs = append(inputs, outs[i].input)
		ids = append(ids, e.fed.Clients[j.client].ID)
		if trace != nil {
			trace[e.fed.Clients[j.client].ID] = outs[i].input
		}
	}
	// A masked input costs 4 bytes per parameter, as fp32 (the protocol's
	// keys and shares are not counted here).
	row.BytesUp = int64(4 * len(s.x) * len(inputs))
	if trace != nil {
		e.cfg.traceSecAgg(s.a.Label, t, trace)
	}
	if len(inputs) == 0 {
		return nil
	}
	next, err := uplink.SecAggMean(*e.sq, s.x, uplink.SecAggPlainSum(inputs, len(s.x)), len(inputs))
	if err != nil {
		return fmt.Errorf("round %d: %w", t, err)
	}
	s.x = next
	if s.acc != nil {
		// Distributed DP: the noise is in the sum; the accountant is
		// charged as in the central mode, and each contributor's round
		// counted for the per-site figure (the one that holds against the
		// aggregator and the sites: the selection is public under
		// --secagg, docs/privacy.md "Threat models").
		return s.account(e.cfg.DP, t, ids, row)
	}
	return nil
}

// secAggInput is client's input in round t: its quantised update, under
// distributed DP with its noise share from its own key (siteNoiseKey),
// as a site computes it (agent/secagg.go secAggInput).
func (e *env) secAggInput(client, t int, sent, x []float64) ([]uint32, error) {
	d := e.cfg.DP
	if d == nil {
		return uplink.SecAggInput(*e.sq, sent, x, e.secAggRand(client, t))
	}
	std := dp.SiteStd(d.Noise, d.Clip, uplink.SecAggThreshold(e.cfg.PerRound, e.cfg.SecAgg.Threshold))
	return uplink.SecAggNoisyInput(*e.sq, sent, x, d.Clip, std, dp.NoiseRand(e.siteNoiseKey(client), uint64(t)), e.secAggRand(client, t))
}

// siteNoiseKey is client's distributed-DP noise key: a site draws its own
// from crypto/rand; simulate derives one per client from --dp-noise-seed
// (dp.TestKey: reproducible, public, for simulation only).
func (e *env) siteNoiseKey(client int) [32]byte {
	return SiteNoiseKey(e.cfg, client)
}

// SiteNoiseKey is the distributed-DP noise key simulate gives client
// index (tests give a live site the same).
func SiteNoiseKey(cfg Config, client int) [32]byte {
	seed := cfg.DPNoiseSeed
	if seed == 0 {
		seed = cfg.Seed
	}
	return dp.TestKey(seed*1_000_003 + uint64(client) + 1)
}

package sim

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/proto/secagg"
	"github.com/edgefl/edgefl/proto/uplink"
)

// Secure aggregation in simulate (Config.SecAgg): what the daemons compute
// (docs/privacy.md, "Aggregation"). Each participating client's input is its
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
		// tail (uplink.SecAggDPRange) of a share sized for the colluders.
		shares, err := secAggNoiseShares(cfg)
		if err != nil {
			return nil, err
		}
		c := *sa
		c.Clip, cfg.SecAgg = uplink.SecAggDPRange(d.Clip, d.Noise, shares), &c
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
	if d := cfg.DP; d != nil {
		shares, err := secAggNoiseShares(cfg)
		if err != nil {
			return nil, err
		}
		if err := uplink.CheckSecAggDP(q, d.Clip, d.Noise, shares); err != nil {
			return nil, fmt.Errorf("--secagg: %w", err)
		}
	}
	return &q, nil
}

// secAggNoiseShares is the announcement's noise_shares under distributed
// DP, as the aggregator's (uplink.SecAggNoiseShares of the threshold and
// the collusion bound).
func secAggNoiseShares(cfg *Config) (int, error) {
	k, err := uplink.SecAggNoiseShares(uplink.SecAggThreshold(cfg.PerRound, cfg.SecAgg.Threshold), cfg.DP.Colluders)
	if err != nil {
		return 0, fmt.Errorf("--secagg: %w", err)
	}
	return k, nil
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
	sum := uplink.SecAggPlainSum(inputs, len(s.x))
	var next []float64
	var err error
	if s.sum != nil {
		next, err = e.secAggSumStep(s, t, jobs, outs, sum, row)
	} else {
		next, err = uplink.SecAggMean(*e.sq, s.x, sum, len(inputs))
		if err == nil {
			// The optimiser steps on the secure sum's mean, as the
			// aggregator (post-processing of what it learns anyway).
			err = s.optStep(t, next)
		}
	}
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

// secAggSumStep is sum mode's close under secure aggregation, as the
// aggregator's (uplink.SecAggSumClose with the round's joiners), then each
// contributor's record advanced as its UPDATE receipt advances it at a
// site (uplink.Advance): every input of a simulated round is in its sum.
func (e *env) secAggSumStep(s *algoState, t int, jobs []job, outs []outcome, sum []uint32, row *Round) ([]float64, error) {
	var joins []uplink.Joiner
	for i, j := range jobs {
		if p := outs[i].sumPen; outs[i].input != nil && p != nil && p.Join {
			joins = append(joins, uplink.Joiner{Client: e.fed.Clients[j.client].ID})
		}
	}
	slices.SortFunc(joins, func(a, b uplink.Joiner) int { return strings.Compare(a.Client, b.Client) })
	next, err := uplink.SecAggSumClose(*e.sq, s.sum, uint64(t), s.x, sum, joins)
	if err != nil {
		return nil, err
	}
	for i, j := range jobs {
		if p := outs[i].sumPen; outs[i].input != nil && p != nil {
			if s.rec[j.client], err = uplink.Advance(s.rec[j.client], uint64(t), *p); err != nil {
				return nil, err
			}
		}
	}
	row.Metrics = map[string]float64{"split_counted": float64(s.sum.M), "split_joined": float64(len(joins))}
	return next, nil
}

// secAggInput is client's input in round t: its quantised update, under
// distributed DP with its noise share from its own key (siteNoiseKey),
// as a site computes it (node/agent/secagg.go secAggInput); in sum mode (the
// FedSplit family) its delta against its record and what the input adds
// to that record once it is in a sum (uplink.SecAggSumInput). s.rec is
// only read here (the round's step advances it).
func (e *env) secAggInput(s *algoState, client, t int, sent, x []float64) ([]uint32, *uplink.Pending, error) {
	d := e.cfg.DP
	var sd *uplink.SecAggDP
	if d != nil {
		shares, err := secAggNoiseShares(&e.cfg)
		if err != nil {
			return nil, nil, err
		}
		std := dp.SiteStd(d.Noise, d.Clip, shares)
		sd = &uplink.SecAggDP{Clip: d.Clip, Std: std, Noise: dp.NoiseRand(e.siteNoiseKey(client), uint64(t))}
	}
	if s.sum != nil {
		in, p, err := uplink.SecAggSumInput(*e.sq, uplink.SumUpdate{Round: uint64(t), Z: sent, Global: x, Record: s.rec[client]}, sd, e.secAggRand(client, t))
		return in, &p, err
	}
	if sd == nil {
		in, err := uplink.SecAggInput(*e.sq, sent, x, e.secAggRand(client, t))
		return in, nil, err
	}
	in, err := uplink.SecAggNoisyInput(*e.sq, sent, x, sd.Clip, sd.Std, sd.Noise, e.secAggRand(client, t))
	return in, nil, err
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

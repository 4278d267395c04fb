package main

import (
	"flag"
	"time"

	"github.com/edgefl/edgefl/node/aggregator"
)

// secAggFlags are the secure-aggregation flags of run, demo and simulate
// (docs/privacy.md, "Using --secagg").
type secAggFlags struct {
	on        bool
	clip      float64
	scaleBits int
	threshold int
	timeout   time.Duration
}

func (s *secAggFlags) register(fs *flag.FlagSet, daemon bool) {
	fs.BoolVar(&s.on, "secagg", false, "secure aggregation (docs/privacy.md): the aggregator learns only the sum of the sites' quantised updates, never one site's; FedProx family (fedavg, fedprox: the uniform mean of the sum) and FedSplit family in sum mode (fedsplit, fedproxsplit: the aggregator keeps only the sum of the sites' contributions and adds the secure sum of their quantised deltas), uniform selection (published), codec fp32; refused with robust aggregators and server steps, other selectors, top-k/dct codecs, anchor gradients, --schema and --dp central (--dp distributed composes with it)")
	fs.Float64Var(&s.clip, "secagg-clip", 1, "with --secagg: each coordinate of a site's update w - x is clipped to [-`R`, R] before it is quantised (the norm bound is this client-side clipping)")
	fs.IntVar(&s.scaleBits, "secagg-scale-bits", 0, "with --secagg: the quantiser's fixed-point scale 2^`B` (0: the finest that cannot wrap with --per-round sites, at most 30)")
	fs.IntVar(&s.threshold, "secagg-threshold", 0, "with --secagg: the threshold `t` (0: ceil(2K/3), more than K/2); the advertise phase needs t sites and so does each later phase, or the session aborts and a new one is drawn")
	if daemon {
		fs.DurationVar(&s.timeout, "secagg-timeout", aggregator.DefaultSecAggTimeout, "with --secagg: the deadline of each phase after the sites advertise their keys (share keys, masked input, with signing sites the consistency round, unmask)")
	}
}

// settings is the run's secure aggregation (nil: off).
func (s *secAggFlags) settings() *aggregator.SecAggConfig {
	if !s.on {
		return nil
	}
	return &aggregator.SecAggConfig{Clip: s.clip, ScaleBits: s.scaleBits, Threshold: s.threshold, Timeout: s.timeout}
}

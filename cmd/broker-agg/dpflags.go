package main

import (
	"errors"
	"flag"
	"fmt"
	"strconv"

	"github.com/edgefl/edgefl/learn/dp"
)

// dpFlags are the differential-privacy flags of run, demo and simulate
// (docs/privacy.md, "Using --dp").
type dpFlags struct {
	mode                       string
	clip, noise, delta, budget float64
	rounds                     int
	// Adaptive clipping: the target quantile (0: a fixed clip norm), the
	// learning rate and the clip bits' noise (0: K/20).
	quantile, clipLR, bitNoise float64
	// fixedRounds: rounds close at their deadline (run and demo only:
	// simulate has no clock); on by default under --dp central, and
	// --dp-fixed-rounds=false makes the accountant charge every round at
	// q = 1 (dp.Config.EarlyClose). live: the command has the flag.
	fixedRounds optBool
	live        bool
	// colluders: the distributed mode's collusion bound c.
	colluders int
}

// optBool is a boolean flag that knows whether it was given: true unless
// set otherwise.
type optBool struct{ set, off bool }

func (b *optBool) String() string {
	if b != nil && b.off {
		return "false"
	}
	return "true"
}

func (b *optBool) Set(v string) error {
	on, err := strconv.ParseBool(v)
	if err != nil {
		return err
	}
	b.set, b.off = true, !on
	return nil
}

// IsBoolFlag lets --dp-fixed-rounds stand alone for true.
func (b *optBool) IsBoolFlag() bool { return true }

// on is the flag's value (true by default).
func (b optBool) on() bool { return !b.off }

// register adds the flags to fs: calibrates adds --dp-rounds and the
// calibration of --dp-noise, live (run, demo) --dp-fixed-rounds.
func (d *dpFlags) register(fs *flag.FlagSet, calibrates, live bool) {
	fs.StringVar(&d.mode, "dp", "off", "client-level differential privacy: off | central (the aggregator clips every update to --dp-clip and adds Gaussian noise of std --dp-noise x --dp-clip to their sum; the FedSplit family runs in sum mode: the aggregator keeps only the sum of the sites' contributions and counts every site registered when round 1 is drawn from round 1 on; the selection is poisson (uniform is refused), drawn from a secret key, and each selected site is told privately; rounds are fixed-length by default (--dp-fixed-rounds); the total sample count is not announced; it reports epsilon and the largest per-site epsilon without amplification; with --schema the schema must declare its preprocessing, and bundles record the guarantee instead of the sites' evaluation; docs/privacy.md) | distributed (with --secagg: each site adds its share N(0, (z C)^2/(t - c)) of the noise to its clipped update before masking, t the secagg threshold, c --dp-colluders; uniform selection, published, and the accountant charges every round at q = 1: no amplification is claimed against an aggregator that knows who took part; docs/privacy.md \"Threat models\")")
	fs.Float64Var(&d.clip, "dp-clip", 1, "with --dp: the L2 norm `C` every site's update is clipped to")
	noise := "with --dp: the noise multiplier `z` (the noise on the sum of clipped updates has std z*C)"
	if calibrates {
		noise += "; 0: calibrated so that --dp-rounds rounds spend --dp-epsilon"
	}
	fs.Float64Var(&d.noise, "dp-noise", 0, noise)
	fs.Float64Var(&d.delta, "dp-delta", 1e-5, "with --dp: the delta of the (epsilon, delta) guarantee")
	fs.Float64Var(&d.budget, "dp-epsilon", 0, "with --dp: the privacy budget; the run stops (as at --rounds) before a round that would exceed it (simulate and demo refuse to start when even one round would); 0: none")
	if calibrates {
		fs.IntVar(&d.rounds, "dp-rounds", 0, "with --dp and --dp-epsilon but no --dp-noise: the rounds the calibrated noise must cover (0: --rounds)")
	}
	fs.Float64Var(&d.quantile, "dp-clip-quantile", 0, "with --dp: adaptive clipping (Andrew et al. 2021) to this target `quantile` of the update norms, in (0, 1), e.g. 0.5: every update carries its clip bit, the aggregator noises their sum and moves the clip norm each round from --dp-clip; the bits' cost is inside --dp-noise (the updates get the larger noise multiplier (z^-2 - (2 sigma_b)^-2)^-1/2); 0: a fixed clip norm")
	fs.Float64Var(&d.clipLR, "dp-clip-lr", 0.2, "with --dp-clip-quantile: the clip norm's geometric learning `rate` eta_C (C <- C exp(-eta_C (b - quantile)))")
	fs.Float64Var(&d.bitNoise, "dp-clip-bit-noise", 0, "with --dp-clip-quantile: `sigma_b`, the std of the noise on the sum of clip bits; must exceed --dp-noise / 2 (0: K/20, K the sites per round)")
	d.live = live
	fs.IntVar(&d.colluders, "dp-colluders", 1, "with --dp distributed: the collusion bound `c`, how many sites besides the aggregator the guarantee holds against: every site knows its own noise share, so each share is N(0, (z C)^2/(t - c)) and any sum of at least t inputs less c sites' shares still carries std z*C; t - c must be at least 1 (0: against the aggregator and the broker only, shares of (z C)^2/t)")
	if live {
		fs.Var(&d.fixedRounds, "dp-fixed-rounds", "with --dp central (on by default): every round closes at its deadline (--round-timeout), never when the last invited site has reported, so that when rounds end tells nobody how many sites were drawn; every round then lasts --round-timeout: set it to what the slowest site needs. --dp-fixed-rounds=false closes a round once every invited site has reported (an empty draw at once), which tells observers the draw's size, so every round is then charged at q = 1: epsilon is the unamplified figure (docs/privacy.md \"Round timing\")")
	}
}

// config is the run's DP configuration (nil: off). q is the sampling rate
// the calibration of --dp-noise assumes and rounds the run's --rounds
// (q <= 0: no calibration); k is the sites per round (the default clip-bit
// noise is k/20).
func (d *dpFlags) config(q float64, rounds, k int) (*dp.Config, error) {
	mode, err := dp.ParseMode(d.mode)
	switch {
	case err != nil:
		return nil, fmt.Errorf("--dp: %w", err)
	case mode == 0 && d.fixedRounds.set && d.fixedRounds.on():
		return nil, errors.New("--dp-fixed-rounds needs --dp central: it hides how many sites a private selection drew")
	case mode == 0:
		return nil, nil
	}
	c := &dp.Config{Clip: d.clip, Noise: d.noise, Delta: d.delta, Budget: d.budget, Distributed: mode == dp.Distributed}
	switch {
	case mode == dp.Distributed:
		c.FixedRounds = d.fixedRounds.set && d.fixedRounds.on() // refused by Validate
		c.Colluders = d.colluders
	case d.live:
		// Central, live: fixed-length rounds unless turned off, and then
		// the unamplified charge (simulate has no round timing).
		c.FixedRounds, c.EarlyClose = d.fixedRounds.on(), !d.fixedRounds.on()
	}
	if d.quantile != 0 {
		c.Adaptive = &dp.Adaptive{Quantile: d.quantile, LR: d.clipLR, BitNoise: d.bitNoise}
		if c.Adaptive.BitNoise == 0 {
			c.Adaptive.BitNoise = float64(k) / 20
		}
	}
	if q > 0 {
		q = c.ChargedRate(q) // the distributed mode claims no amplification
	}
	if c.Noise == 0 {
		if q <= 0 || c.Budget == 0 {
			return nil, errors.New("--dp needs --dp-noise z (the noise multiplier)")
		}
		if d.rounds > 0 {
			rounds = d.rounds
		}
		if c.Noise, err = dp.CalibrateNoise(c.Budget, c.Delta, q, rounds, 1e-3, nil); err != nil {
			return nil, fmt.Errorf("--dp-epsilon %g over %d rounds at q = %g: %w", c.Budget, rounds, q, err)
		}
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("--dp: %w", err)
	}
	if q > 0 {
		if ok, eps, err := c.Within(nil, q); err != nil {
			return nil, fmt.Errorf("--dp: %w", err)
		} else if !ok {
			return nil, fmt.Errorf("--dp-epsilon %g: even one round (q = %g, z = %g) spends epsilon %.4g", c.Budget, q, c.Noise, eps)
		}
	}
	return c, nil
}

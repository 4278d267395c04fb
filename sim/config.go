// Package sim owns `broker-agg simulate`: many virtual clients in one process,
// trained with the same proxsolver, split and aggregate code as the daemons,
// on the same data, partition, selection sequence and seed for every algorithm
// of a run, with per-round results written as JSON, CSV and a plot.
package sim

import (
	"errors"
	"fmt"
	"github.com/edgefl/edgefl/learn/split"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/edgefl/edgefl/learn/aggregate"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/serveropt"
	"github.com/edgefl/edgefl/proto/round"
	"github.com/edgefl/edgefl/proto/secagg"
	"github.com/edgefl/edgefl/proto/uplink"
)

// Algorithm families.
const (
	FedAvg       = "fedavg"       // local SGD, sample-weighted mean, stragglers dropped
	FedProx      = "fedprox"      // gamma-inexact prox solve, partial work kept, uniform mean
	FedSplit     = "fedsplit"     // FedSplit with exact prox (L-BFGS to round.SimulateSplitGamma unless gamma is given, no work budget)
	FedProxSplit = "fedproxsplit" // FedSplit whose prox is the budgeted gamma-inexact FedProx solve
)

// Config is one simulation run.
type Config struct {
	Dataset     string  `json:"dataset"`
	Partition   string  `json:"partition"`
	Clients     int     `json:"clients"`
	PerRound    int     `json:"per_round"`
	Algos       []Algo  `json:"algos"`
	Rounds      int     `json:"rounds"`
	Seed        uint64  `json:"seed"`
	Model       string  `json:"model"`
	Hidden      int     `json:"hidden,omitempty"`
	Activation  string  `json:"activation,omitempty"`
	L2          float64 `json:"l2"`
	Standardize string  `json:"standardize"`
	TestFrac    float64 `json:"test_fraction"`
	Select      string  `json:"select"`
	Stragglers  float64 `json:"stragglers"`
	// Defaults for every algorithm (overridable per algorithm).
	Local Local `json:"local"`
	// SplitGamma is fedsplit's target inexactness unless its --algo item
	// says gamma= (0: Local's): fedsplit is the exact reference, its prox
	// solved to the solver's precision (round.SimulateSplitGamma) unless
	// --gamma is given. The CLI sets it to 0 when --gamma is given.
	SplitGamma float64 `json:"-"`
	// ServerOpt is the server optimiser of the FedAvg/FedProx families
	// (--server-opt; zero: none), overridable per algorithm.
	ServerOpt serveropt.Params `json:"server_opt,omitempty"`
	// Codec is the uplink codec spec ("" = none: exact float64 vectors).
	Codec string `json:"codec,omitempty"`
	// Downlink is the codec of the global model broadcast ("" = exact); the
	// aggregator then applies the model it broadcast.
	Downlink string `json:"downlink,omitempty"`
	// OptimumTol is the gradient-norm tolerance of the centralised optimum.
	OptimumTol float64 `json:"optimum_tol"`
	// Faulty clients (the first Faulty of the federation) take part in every
	// round and send their delta scaled by FaultyScale.
	Faulty      int     `json:"faulty,omitempty"`
	FaultyScale float64 `json:"faulty_scale,omitempty"`
	// FaultyEvery: a faulty client scales its delta only in the rounds t
	// with t mod FaultyEvery = 1 (2: the odd rounds, honest in the
	// others); 0 or 1: in every round.
	FaultyEvery int `json:"faulty_every,omitempty"`
	// EvalEvery evaluates the global model every EvalEvery rounds and at the
	// last one (0 or 1: every round); the other rows have null metrics.
	EvalEvery int `json:"eval_every,omitempty"`
	// OptimumEvals caps the gradient evaluations of the optimum's L-BFGS.
	OptimumEvals int  `json:"optimum_evals"`
	SaveModels   bool `json:"save_models"`
	// OptimumCache is a directory where centralised optima are kept, keyed
	// by everything they depend on, so repeated runs on the same data skip
	// the L-BFGS solve ("" = no cache).
	OptimumCache string `json:"-"`
	Workers      int    `json:"-"`
	// Schema is a federation schema file: the data (--dataset csv:PATH)
	// is read by it and goes through the daemons' pipeline (package
	// sitedata): per-site statistics, the federation's transform, and a
	// federated evaluation on each site's held-out rows.
	Schema string `json:"schema,omitempty"`
	// SiteColumn names the column of each row's site (--partition
	// natural with Schema).
	SiteColumn string `json:"site_column,omitempty"`
	// EvalDataset is a CSV of held-out rows (csv:PATH, with Schema and
	// SiteColumn): each site evaluates on its rows of it and trains on
	// every one of its rows of Dataset, the schema's holdout not applied,
	// as a site whose agent has eval_data set.
	EvalDataset string `json:"eval_dataset,omitempty"`

	// DP is central differential privacy (docs/privacy.md; nil: off):
	// every site's update clipped to DP.Clip through package uplink, the
	// noisy mean of uplink.NoisyMean with noise from dp.TestKey(DPNoiseSeed)
	// (reproducible; a live federation draws a secret key), the accountant
	// with q = PerRound/Clients, and the run stopped before a round that
	// would exceed DP.Budget.
	DP          *dp.Config `json:"dp,omitempty"`
	DPNoiseSeed uint64     `json:"dp_noise_seed,omitempty"`

	// SecAgg is secure aggregation (docs/privacy.md; nil: off): each
	// client's update quantised as a site quantises it
	// (uplink.SecAggInput, stochastic rounding from the run's SecAgg
	// stream), the ring sum of the round's inputs, and the uniform mean
	// of uplink.SecAggMean, as the aggregator computes it from the
	// unmasked sum (masks cancel exactly, so simulate sums the inputs).
	SecAgg *SecAgg `json:"secagg,omitempty"`

	// trace, when set (tests), is called after each round with the uplink
	// frames the server received, by client id, and the next global model
	// as the clients will decode it. It must not keep or change them.
	trace func(algo string, round int, frames map[string]*uplink.Frame, x []float64)
	// siteSeed, when set (tests), draws client i's SGD order and codec
	// noise from the site streams of an agent with seed *siteSeed + i and
	// the client's id (streams.Site), as localfed seeds its agents: SGD
	// then matches the daemons bit for bit, not only in distribution.
	siteSeed *uint64
	// traceSecAgg, when set (tests), is called after each round of a
	// --secagg run with each client's quantised input.
	traceSecAgg func(algo string, round int, inputs map[string][]uint32)
	// initModel, when set (tests), draws the initial global model of a
	// model instead of its InitParams from the run's Init stream (the
	// daemon's --init model draws from its own stream).
	initModel func(m model.Model) []float64
	// secAggRand, when set (tests), replaces the run's SecAgg stream of
	// client (its id and index) in round.
	secAggRand func(client string, index, round int) io.Reader
}

// SecAgg are secure aggregation's settings (--secagg-clip,
// --secagg-scale-bits; the threshold only matters to the daemons' dropout
// handling).
type SecAgg struct {
	Clip      float64 `json:"clip"`
	ScaleBits int     `json:"scale_bits"`
	// Threshold is the secagg threshold t (0: uplink.SecAggThreshold's
	// default); with DP.Distributed each site's noise share is sized for
	// it.
	Threshold int `json:"threshold,omitempty"`
}

// Local are the per-algorithm training parameters: the daemons' type
// (package round), with its one Validate.
type Local = round.Params

// Algo is one entry of --algo: a family, its local knobs and its aggregator.
type Algo struct {
	Label  string `json:"label"`
	Family string `json:"family"`
	// Agg is the aggregator spec for the FedAvg/FedProx families (the
	// FedSplit families always average every known client's latest z).
	Agg   string `json:"aggregator"`
	Local Local  `json:"local"`
	// ServerOpt is the algorithm's server optimiser (--algo's server-*
	// keys; nil: Config.ServerOpt).
	ServerOpt *serveropt.Params `json:"server_opt,omitempty"`
	// Contrast is the contrastive local objective of moon and fedsiam-da
	// (model.ContrastMOON, model.ContrastFedSiam; "": none): Local.Mu is
	// then its weight, and the local solve has no proximal term.
	Contrast string `json:"contrast,omitempty"`
}

// DefaultConfig returns the defaults the CLI documents.
func DefaultConfig() Config {
	return Config{
		Dataset: "synthetic:1,1", Partition: "natural", Clients: 30, PerRound: 10,
		Rounds: 100, Seed: 1, Model: "logreg", Hidden: 64, Activation: "relu",
		TestFrac: 0.1, OptimumTol: 1e-10, OptimumEvals: 3000,
		Local: round.Simulate.Params, SplitGamma: round.SimulateSplitGamma,
	}
}

// algoKeys are the per-algorithm options; anything else is handed to the
// aggregator spec.
var algoKeys = map[string]bool{"solver": true, "mu": true, "gamma": true, "epochs": true, "batch": true, "lr": true, "step": true, "relax": true, "label": true}

// ParseAlgos parses --algo: a comma-separated list of NAME[:key=value...],
// where NAME is fedavg, fedprox, fedsplit, fedproxsplit, or an aggregator name
// (then the FedProx local solve feeds that aggregator). def supplies the
// knobs not overridden. isAgg reports whether a name is a known aggregator.
func ParseAlgos(list string, def Local, splitGamma float64, isAgg func(name string) bool) ([]Algo, error) {
	var out []Algo
	seen := map[string]bool{}
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		a, err := parseAlgo(item, def, splitGamma, isAgg)
		if err != nil {
			return nil, err
		}
		if seen[a.Label] {
			return nil, fmt.Errorf("--algo: %q listed twice (give one a label=NAME)", a.Label)
		}
		seen[a.Label] = true
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, errors.New("--algo: no algorithm given")
	}
	return out, nil
}

// parseAlgo parses one item of --algo, NAME[:key=value...]: its family and
// aggregator, its local knobs, and the options left for the aggregator.
func parseAlgo(item string, def Local, splitGamma float64, isAgg func(name string) bool) (Algo, error) {
	parts := strings.Split(item, ":")
	a, err := algoFamily(parts[0], def, isAgg)
	if err != nil {
		return Algo{}, err
	}
	opts, serverKV := splitServerKeys(parts[1:])
	so, err := parseServerOpt(serverKV)
	if err != nil {
		return Algo{}, fmt.Errorf("--algo %q: %w", item, err)
	}
	a.ServerOpt = so
	aggOpts, gammaSet, err := a.setLocal(item, opts)
	if err != nil {
		return Algo{}, err
	}
	if a.Family == FedSplit && !gammaSet && splitGamma > 0 {
		a.Local.Gamma = splitGamma
	}
	if err := a.setAggOptions(item, aggOpts); err != nil {
		return Algo{}, err
	}
	if a.Label == "" {
		a.Label = item
	}
	return a, nil
}

// solved are the local parameters a's sites solve with: FedSplit, the
// exact reference, always with L-BFGS (whatever solver= says); what the
// results and the bundle record.
func (a Algo) solved() Local {
	p := a.Local
	if a.Family == FedSplit {
		p.Solver = proxsolver.LBFGS
	}
	return p
}

// algoFamily returns the Algo for an algorithm name with def's knobs: its
// family and aggregator (an aggregator name is FedProx feeding it).
func algoFamily(name string, def Local, isAgg func(name string) bool) (Algo, error) {
	a := Algo{Family: name, Local: def}
	switch a.Family {
	case FedAvg:
		// FedAvg is defined by its local SGD without a proximal term.
		a.Agg, a.Local.Mu, a.Local.Solver = "fedavg", 0, proxsolver.SGD
	case FedProx:
		a.Agg = "mean"
	case FedSplit, FedProxSplit:
		a.Agg = split.StepRobust
	case Scaffold:
		// Local SGD shifted by c - c_i, no proximal term; the server's
		// model step is the uniform mean (scaffold.go).
		a.Agg, a.Local.Mu, a.Local.Solver = "mean", 0, proxsolver.SGD
	case model.AlgoMOON, model.AlgoFedSiamDA:
		// The daemon's rule (aggregator.family): the FedProx family's
		// handling of partial work, MOON into FedAvg's mean, FedSiam-DA
		// into its dual aggregation.
		a.Contrast, a.Family, a.Agg = model.ContrastKindOf(name), FedProx, "fedavg"
		if name == model.AlgoFedSiamDA {
			a.Agg = "fedsiam"
		}
		if a.Contrast == model.ContrastMOON && a.Local.Tau == 0 {
			a.Local.Tau = model.DefaultTau
		}
	default:
		if isAgg == nil || !isAgg(a.Family) {
			return a, fmt.Errorf("--algo: unknown algorithm %q (want fedavg, fedprox, fedsplit, fedproxsplit, scaffold, moon, fedsiam-da or an aggregator name)", a.Family)
		}
		a.Agg, a.Family = a.Family, FedProx
	}
	return a, nil
}

// setLocal sets the per-algorithm options of opts (key=value) on a and
// returns the others, which are the aggregator's.
func (a *Algo) setLocal(item string, opts []string) (aggOpts []string, gammaSet bool, err error) {
	for _, kv := range opts {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, false, fmt.Errorf("--algo %q: option %q is not key=value", item, kv)
		}
		if !algoKeys[k] && !(k == "tau" && a.Contrast == model.ContrastMOON) {
			aggOpts = append(aggOpts, kv)
			continue
		}
		if (a.Family == FedAvg || a.Family == Scaffold) && k == "mu" {
			return nil, false, fmt.Errorf("--algo %q: %s has no proximal term (use fedprox:mu=...)", item, a.Family)
		}
		if k == "gamma" {
			gammaSet = true
		}
		if err := setLocal(&a.Local, k, v, &a.Label); err != nil {
			return nil, false, fmt.Errorf("--algo %q: %w", item, err)
		}
	}
	return aggOpts, gammaSet, nil
}

// setAggOptions applies the aggregator's options: the FedSplit server
// step's mult=M, FedAvg's cap=M, or an aggregator's own options (none
// for fedsplit, fedavg and fedprox's mean).
func (a *Algo) setAggOptions(item string, aggOpts []string) error {
	if len(aggOpts) == 0 {
		return nil
	}
	if a.Family == FedSplit || a.Family == FedProxSplit {
		// The server step's one option: mult=M, or mult=off for the
		// plain mean.
		if len(aggOpts) != 1 || !strings.HasPrefix(aggOpts[0], "mult=") {
			return fmt.Errorf("--algo %q: unknown option(s) %s (want solver, mu, gamma, epochs, batch, lr, step, relax, label, mult)", item, strings.Join(aggOpts, ", "))
		}
		a.Agg = split.StepRobust + ":" + aggOpts[0]
		if aggOpts[0] == "mult=off" {
			a.Agg = split.StepMean
		}
		if _, err := split.ParseServerStep(a.Agg); err != nil {
			return fmt.Errorf("--algo %q: %w", item, err)
		}
		return nil
	}
	if a.Family == FedAvg {
		// FedAvg's one option: its sample cap, cap=M (cap=0: off),
		// as the daemon's --aggregator fedavg:cap=M.
		if len(aggOpts) != 1 || !strings.HasPrefix(aggOpts[0], "cap=") {
			return fmt.Errorf("--algo %q: unknown option(s) %s (want solver, gamma, epochs, batch, lr, label, cap)", item, strings.Join(aggOpts, ", "))
		}
		a.Agg = "fedavg:" + aggOpts[0]
		return nil
	}
	if a.Family == FedSplit || a.Family == FedProxSplit || a.Agg == "fedavg" || a.Agg == "mean" {
		return fmt.Errorf("--algo %q: unknown option(s) %s (want solver, mu, gamma, epochs, batch, lr, step, relax, label)", item, strings.Join(aggOpts, ", "))
	}
	a.Agg += ":" + strings.Join(aggOpts, ":")
	return nil
}

func setLocal(l *Local, k, v string, label *string) error {
	if k == "label" {
		*label = v
		return nil
	}
	if k == "solver" {
		l.Solver = v
		return nil
	}
	if k == "epochs" || k == "batch" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("%s=%q: want a whole number", k, v)
		}
		if k == "epochs" {
			l.MaxEpochs = n
		} else {
			l.Batch = n
		}
		return nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return fmt.Errorf("%s=%q: want a number", k, v)
	}
	switch k {
	case "mu":
		l.Mu = f
	case "tau":
		l.Tau = f
	case "gamma":
		l.Gamma = f
	case "lr":
		l.LR = f
	case "step":
		l.Step = f
	case "relax":
		l.Relax = f
	}
	return nil
}

// Validate checks the run configuration, naming the flag at fault.
func (c Config) Validate() error {
	// With a schema, 0 clients means one per site (natural) and 0 per
	// round means every client.
	schemaRun := c.Schema != ""
	switch {
	case c.Clients < 1 && !(schemaRun && c.Clients == 0):
		return fmt.Errorf("--clients: want at least 1, got %d", c.Clients)
	case c.PerRound < 1 && !(schemaRun && c.PerRound == 0):
		return fmt.Errorf("--per-round: want at least 1, got %d", c.PerRound)
	case c.Rounds < 1:
		return fmt.Errorf("--rounds: want at least 1, got %d", c.Rounds)
	case !(c.L2 >= 0) || math.IsInf(c.L2, 0):
		return fmt.Errorf("--l2: want a number >= 0, got %v", c.L2)
	case !(c.Stragglers >= 0 && c.Stragglers <= 1):
		return fmt.Errorf("--stragglers: want a rate in [0, 1], got %v", c.Stragglers)
	case !(c.TestFrac >= 0 && c.TestFrac < 1):
		return fmt.Errorf("--test-fraction: want a number in [0, 1), got %v", c.TestFrac)
	case c.Faulty < 0 || c.Faulty > c.Clients:
		return fmt.Errorf("--faulty: want 0..%d clients, got %d", c.Clients, c.Faulty)
	case c.Faulty > 0 && (math.IsNaN(c.FaultyScale) || math.IsInf(c.FaultyScale, 0)):
		return fmt.Errorf("--faulty-scale: want a finite number, got %v", c.FaultyScale)
	case c.FaultyEvery < 0:
		return fmt.Errorf("--faulty-every: want 0 (every round) or more, got %d", c.FaultyEvery)
	case c.OptimumEvals < 1:
		return fmt.Errorf("--optimum-evals: want at least 1, got %d", c.OptimumEvals)
	case !(c.OptimumTol > 0):
		return fmt.Errorf("--optimum-tol: want a number > 0, got %v", c.OptimumTol)
	case len(c.Algos) == 0:
		return errors.New("--algo: no algorithm given")
	}
	for _, a := range c.Algos {
		if err := a.Local.Validate(a.Family); err != nil {
			return fmt.Errorf("algorithm %s: %w", a.Label, err)
		}
		// Nothing but the epochs bounds a simulated client's budgeted
		// solve: simulate has no round deadline.
		if a.Family != FedSplit && a.Local.MaxEpochs < 1 {
			return fmt.Errorf("algorithm %s: --epochs: want at least 1, got %d", a.Label, a.Local.MaxEpochs)
		}
	}
	if err := c.validateSecAgg(); err != nil {
		return err
	}
	if err := c.validateServerOpt(); err != nil {
		return err
	}
	if err := c.validateScaffold(); err != nil {
		return err
	}
	return c.validateDP()
}

// validateSecAgg refuses what --secagg cannot cover, as the aggregator
// does (node/aggregator/server_secagg.go).
func (c Config) validateSecAgg() error {
	sa := c.SecAgg
	if sa == nil {
		return nil
	}
	switch {
	case c.Schema != "":
		return errors.New("--secagg with --schema: the per-site statistics and evaluation reports are not summed securely")
	case c.DP != nil && !c.DP.Distributed:
		return errors.New("--secagg with --dp central: the aggregator cannot re-clip what it cannot see (use --dp distributed)")
	case c.Codec != "" && c.Codec != "fp32":
		return fmt.Errorf("--secagg with --codec %s: under --secagg a site's update is its ring-quantised vector; leave --codec empty or fp32", c.Codec)
	case c.PerRound < 2:
		return errors.New("--secagg needs --per-round >= 2 (a sum of one site is that site's update)")
	}
	if t := uplink.SecAggThreshold(c.PerRound, sa.Threshold); t > c.PerRound || 2*t <= c.PerRound {
		return fmt.Errorf("--secagg threshold %d: want more than half of --per-round %d and at most it", t, c.PerRound)
	}
	if _, err := secagg.NewQuantizer(sa.Clip, sa.ScaleBits, c.PerRound); err != nil {
		return fmt.Errorf("--secagg: %w", err)
	}
	for _, a := range c.Algos {
		if a.Family == FedSplit || a.Family == FedProxSplit {
			// Sum mode (docs/privacy.md, "FedSplit under secure
			// aggregation"): the server step is S/m.
			if a.Agg != split.StepRobust && a.Agg != split.StepMean {
				return fmt.Errorf("--secagg, algorithm %s: %w", a.Label, uplink.ErrSplitRobustDP)
			}
			continue
		}
		if a.Agg != "" && a.Agg != "fedavg" && a.Agg != "mean" {
			return fmt.Errorf("--secagg, algorithm %s: aggregator %q needs the individual updates; under --secagg only their sum is known (fedavg and mean become its uniform mean)", a.Label, a.Agg)
		}
	}
	if c.Select != "" && c.Select != "uniform" {
		return fmt.Errorf("--secagg with --select %s: %w", c.Select, uplink.ErrSecAggSelector)
	}
	return nil
}

// validateDP refuses what --dp cannot cover (docs/privacy.md, "What the
// guarantee covers" and "Sampling rate").
func (c Config) validateDP() error {
	if c.DP == nil {
		return nil
	}
	if err := c.DP.Validate(); err != nil {
		return fmt.Errorf("--dp: %w", err)
	}
	switch {
	case c.DP.Distributed && c.SecAgg == nil:
		return fmt.Errorf("--dp distributed: %w", dp.ErrDistributed)
	case c.Faulty > 0:
		return errors.New("--dp with --faulty: faulty clients take part in every round, outside the accountant's sampling rate")
	}
	for _, a := range c.Algos {
		agg := a.Agg
		if a.Family == FedSplit || a.Family == FedProxSplit {
			// Sum mode (docs/privacy.md, "FedSplit"): the server step is
			// S/m; a screening factor asks for the robust step, which
			// needs each z_j.
			if agg != split.StepRobust && agg != split.StepMean {
				return fmt.Errorf("--dp, algorithm %s: %w", a.Label, uplink.ErrSplitRobustDP)
			}
			agg = ""
		}
		if err := aggregate.CheckDP(agg, c.Select, !c.DP.Distributed && c.SecAgg == nil); err != nil {
			return fmt.Errorf("--dp, algorithm %s: %w", a.Label, err)
		}
	}
	return nil
}

// faultyScale is the scale faulty client c applies to its delta in round t;
// false: c is honest in round t.
func (c *Config) faultyScale(client, t int) (float64, bool) {
	if client >= c.Faulty || (c.FaultyEvery > 1 && t%c.FaultyEvery != 1) {
		return 1, false
	}
	return c.FaultyScale, true
}

package sim

import (
	"context"
	"fmt"
	"slices"

	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/quant"
)

// checkContrast refuses the contrastive algorithms (moon, fedsiam-da) where
// they do not compose, as the daemon does (aggregator.checkContrast): they
// need the MLP's representation layer, and run without DP and secure
// aggregation.
func checkContrast(cfg Config) error {
	for _, a := range cfg.Algos {
		if a.Contrast == "" {
			continue
		}
		switch {
		case cfg.Model != model.KindMLP:
			return fmt.Errorf("--algo %s needs a representation layer: model %s has none (use --model mlp)", a.Label, cfg.Model)
		case cfg.DP != nil:
			return fmt.Errorf("--algo %s does not compose with --dp", a.Label)
		case cfg.SecAgg != nil:
			return fmt.Errorf("--algo %s does not compose with --secagg", a.Label)
		}
		c := model.ContrastConfig{Kind: a.Contrast, Mu: a.Local.Mu, Tau: a.Local.Tau}
		if err := c.Validate(); err != nil {
			return fmt.Errorf("--algo %s: %w", a.Label, err)
		}
	}
	return nil
}

// initial is the initial global model of m: its InitParams from the run's
// Init stream (or the test hook's).
func (e *env) initial(m model.Model) []float64 {
	if e.cfg.initModel != nil {
		return e.cfg.initModel(m)
	}
	return m.InitParams(streams.Of(e.cfg.Seed, streams.Init, 0, 0))
}

// algoModel is the model algorithm a trains: the run's, or FedSiam-DA's
// with its prediction head (model.ContrastSpec, the daemons' rule), whose
// initial global model then replaces s.x. The head's parameters follow the
// classifier's, so e.classifier evaluates the run's model on the prefix.
func (e *env) algoModel(a Algo, s *algoState) (model.Model, error) {
	s.local = map[int][]float64{}
	spec := model.ContrastSpec(a.Contrast, e.spec)
	if spec == e.spec {
		return e.pooledM, nil
	}
	m, err := model.New(spec)
	if err != nil {
		return nil, fmt.Errorf("--model: %w", err)
	}
	s.x = e.initial(m)
	return m, nil
}

// classifier is the part of a global model the run's model evaluates: all
// of it, but for FedSiam-DA's prediction head.
func (e *env) classifier(x []float64) []float64 {
	return x[:e.pooledM.NumParams()]
}

// contrastWork is a client's local solve under a contrastive objective:
// the site's rule (agent.contrastModel): against the global model x and
// its last local model prev (x when it has none), no proximal term.
func (e *env) contrastWork(ctx context.Context, m model.Model, a Algo, j job, x, prev []float64, t int) outcome {
	c := e.fed.Clients[j.client]
	rng := streams.Of(e.cfg.Seed, streams.Solve, t, j.client)
	if e.cfg.siteSeed != nil {
		rng = streams.Site(*e.cfg.siteSeed+uint64(j.client), c.ID, uint64(t), streams.SiteSolve)
	}
	cfg := proxsolver.Config{Solver: a.Local.Solver, Gamma: a.Local.Gamma, LR: a.Local.LR, Batch: a.Local.Batch}
	if prev == nil {
		prev = x
	}
	cm, err := model.NewContrastive(m, model.ContrastConfig{Kind: a.Contrast, Mu: a.Local.Mu, Tau: a.Local.Tau}, x, prev)
	if err != nil {
		return outcome{err: err}
	}
	w, rep, err := proxsolver.Solve(ctx, cm, c.Train, x, nil, cfg, proxsolver.Budget{MaxEpochs: j.epochs}, rng)
	return outcome{params: w, rep: rep, err: err, local: slices.Clone(w)}
}

// downlinked is x as the downlink codec c carries it: the aggregator's rule
// for the initial model (its downlinked), without randomness.
func downlinked(c *quant.Codec, x []float64) ([]float64, error) {
	f, err := c.Encode(nil, x, nil, nil)
	if err != nil {
		return nil, err
	}
	return c.Decode(f, nil)
}

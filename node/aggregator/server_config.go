package aggregator

import (
	"fmt"
	"strings"

	"github.com/edgefl/edgefl/data/prep"
	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/learn/aggregate"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/learn/split"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/proto/wire"
)

// Validate checks the configuration as NewServer will use it (with its
// defaults), without side effects: nothing is opened, created or written.
// The error wraps ErrConfig and names the setting. NewServer calls it
// first; a command may call it before doing anything else.
func (cfg ServerConfig) Validate() error {
	cfg.defaults()
	_, err := cfg.derive()
	return err
}

// derived is what a valid configuration determines before anything is
// opened: the algorithm family and its server step or aggregator, the
// selector, the parameters as sent (fedavg's mu is 0) and the
// coordinator's policy.
type derived struct {
	topics  wire.Topics
	fam     string
	aggSpec string
	screen  float64              // the FedSplit family's screening factor
	agg     aggregate.Aggregator // nil for the FedSplit family
	params  Params
	coord   coordinator.Config
	sum     bool // the FedSplit family in sum mode (server_sum.go)
}

// derive validates cfg (defaults applied) and returns what it determines.
// It is pure: Validate and NewServer share it.
func (cfg *ServerConfig) derive() (derived, error) {
	var d derived
	var err error
	if d.topics, err = wire.ForFederation(cfg.Federation); err != nil {
		return d, fmt.Errorf("%w: federation: %w", coordinator.ErrConfig, err)
	}
	if err := wire.ValidID(cfg.ClientID); err != nil {
		return d, fmt.Errorf("%w: client id: %w", coordinator.ErrConfig, err)
	}
	switch {
	case cfg.BrokerURL == "":
		return d, fmt.Errorf("%w: no broker URL", coordinator.ErrConfig)
	case cfg.StatePath == "":
		return d, fmt.Errorf("%w: no state file", coordinator.ErrConfig)
	case cfg.K < 1:
		return d, fmt.Errorf("%w: K = %d, want >= 1", coordinator.ErrConfig, cfg.K)
	case !(cfg.QuorumFraction > 0 && cfg.QuorumFraction <= 1):
		return d, fmt.Errorf("%w: quorum fraction %v, want (0, 1]", coordinator.ErrConfig, cfg.QuorumFraction)
	}
	if err := cfg.deriveAlgorithm(&d); err != nil {
		return d, err
	}
	if err := cfg.checkParams(&d); err != nil {
		return d, err
	}
	sel, err := aggregate.NewSelector(cfg.Selector)
	if err != nil {
		return d, fmt.Errorf("%w: selector: %w", coordinator.ErrConfig, err)
	}
	if cfg.Init != InitZeros && cfg.Init != InitModel {
		return d, fmt.Errorf("%w: init %q (want %s or %s)", coordinator.ErrConfig, cfg.Init, InitZeros, InitModel)
	}
	if _, err := quant.Parse(cfg.Codec); err != nil {
		return d, fmt.Errorf("%w: codec: %w", coordinator.ErrConfig, err)
	}
	if dl, err := quant.Parse(cfg.Downlink); err != nil || !(dl.Lossless() || dl.String() == "fp16") {
		return d, fmt.Errorf("%w: downlink codec %q: want fp32 or fp16 (the global model is sent whole, not as a delta)", coordinator.ErrConfig, cfg.Downlink)
	}
	if err := cfg.checkModel(); err != nil {
		return d, err
	}
	fed := cfg.Schema != nil
	d.coord = coordinator.Config{
		K: cfg.K, Quorum: coordinator.QuorumOf(cfg.K, cfg.QuorumFraction), RoundTimeout: cfg.RoundTimeout,
		Extension: cfg.Extension, MaxReselections: cfg.MaxReselections, Settle: cfg.Settle, Expected: cfg.Roster,
		Rounds: cfg.Rounds, Seed: cfg.Seed, Selector: sel, StoreLate: isSplit(d.fam),
		Statistics: fed, StatsSites: cfg.StatsSites, DeclaredTransform: fed && cfg.Schema.Declared(), Evaluate: fed, EvalEvery: cfg.EvalEvery,
		StopPatience: cfg.StopPatience, StopTol: cfg.StopTol, StopDelta: cfg.StopDelta,
	}
	if err := cfg.checkContrast(); err != nil {
		return d, err
	}
	if err := cfg.checkDP(&d); err != nil {
		return d, err
	}
	if err := cfg.checkSecAgg(&d); err != nil {
		return d, err
	}
	if err := cfg.checkServerOpt(&d); err != nil {
		return d, err
	}
	if err := cfg.scaffoldConfig(&d); err != nil {
		return d, err
	}
	return d, d.coord.Validate()
}

// deriveAlgorithm sets the family and its server step (FedSplit) or
// aggregator (the FedProx family).
func (cfg *ServerConfig) deriveAlgorithm(d *derived) error {
	var err error
	if d.fam, d.aggSpec, err = family(cfg.Algorithm); err != nil {
		return err
	}
	if cfg.Aggregator != "" {
		d.aggSpec = cfg.Aggregator
	}
	if isSplit(d.fam) {
		if d.screen, err = split.ParseServerStep(d.aggSpec); err != nil {
			return fmt.Errorf("%w: aggregator: %w", coordinator.ErrConfig, err)
		}
		return nil
	}
	if strings.HasPrefix(d.aggSpec, "fedsplit") {
		return fmt.Errorf("%w: aggregator %q is a FedSplit server step; the %s family takes an update aggregator (%s)",
			coordinator.ErrConfig, d.aggSpec, d.fam, strings.Join(aggregate.Names(), ", "))
	}
	if d.agg, err = aggregate.NewAggregator(d.aggSpec, cfg.Seed); err != nil {
		return fmt.Errorf("%w: aggregator: %w", coordinator.ErrConfig, err)
	}
	return nil
}

// checkParams checks the algorithm's parameters (round.Params.Validate)
// and sets d.params as announced (fedavg's mu is 0).
func (cfg *ServerConfig) checkParams(d *derived) error {
	if err := cfg.Params.Validate(d.fam); err != nil {
		return fmt.Errorf("%w: %w", coordinator.ErrConfig, err)
	}
	d.params = cfg.Params.Effective(d.fam)
	return nil
}

// checkModel checks the model against the codec and the evaluation data,
// or, with a schema, the schema and the model flags against its task (with
// a stand-in transform: no statistics exist yet).
func (cfg *ServerConfig) checkModel() error {
	if sc := cfg.Schema; sc != nil {
		if err := cfg.SchemaConfig.Validate(); err != nil {
			return err
		}
		m := operatorModel(cfg.Model)
		if _, err := sitedata.ModelSpec(sc, &prep.Transform{Outputs: 1}, m.Kind, m.Hidden, m.Activation, m.L2); err != nil {
			return fmt.Errorf("%w: model: %w", coordinator.ErrConfig, err)
		}
		if cfg.Eval != nil {
			return fmt.Errorf("%w: with a schema, evaluation data is read by the schema (EvalTable), not given as model data", coordinator.ErrConfig)
		}
		return nil
	}
	if _, err := newModel(cfg.Model, cfg.Codec); err != nil {
		return err
	}
	if ev := cfg.Eval; ev != nil {
		if err := ev.Validate(); err != nil {
			return fmt.Errorf("%w: evaluation data: %w", coordinator.ErrConfig, err)
		}
		if ev.D != cfg.Model.Inputs {
			return fmt.Errorf("%w: evaluation data has %d features, the model %d inputs", coordinator.ErrConfig, ev.D, cfg.Model.Inputs)
		}
		if err := model.CheckTargets(cfg.Model, *ev); err != nil {
			return fmt.Errorf("%w: evaluation data: %w", coordinator.ErrConfig, err)
		}
	}
	return nil
}

// newModel creates the model of spec and checks that the uplink codec
// covers its parameters.
func newModel(spec model.Spec, codec string) (model.Model, error) {
	m, err := model.New(spec)
	if err != nil {
		return nil, fmt.Errorf("%w: model: %w", coordinator.ErrConfig, err)
	}
	dim := m.NumParams()
	if c, err := quant.Parse(codec); err != nil {
		return nil, fmt.Errorf("%w: codec: %w", coordinator.ErrConfig, err)
	} else if c.MinDim() > dim {
		return nil, fmt.Errorf("%w: codec %s covers %d parameters, the %s model has %d", coordinator.ErrConfig, c, c.MinDim(), spec.Kind, dim)
	}
	return m, nil
}

package aggregator

import (
	"fmt"

	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
)

// contrastDefaults gives MOON its default temperature.
func (c *ServerConfig) contrastDefaults() {
	if c.Algorithm == model.AlgoMOON && c.Params.Tau == 0 {
		c.Params.Tau = model.DefaultTau
	}
}

// checkContrast refuses what the contrastive algorithms (moon, fedsiam-da)
// do not compose with: a model without a representation layer (they need
// the MLP's hidden layer), differential privacy (the clip and the noise are
// calibrated for the FedAvg/FedProx update, and the previous local model
// the objective keeps is outside the accounting) and secure aggregation
// (fedsiam-da's dual aggregation needs each site's model; moon is refused
// with it so that both stay one rule). A temperature is MOON's only.
func (cfg *ServerConfig) checkContrast() error {
	kind := model.ContrastKindOf(cfg.Algorithm)
	if kind == "" {
		if cfg.Params.Tau != 0 {
			return fmt.Errorf("%w: tau is MOON's temperature: only with algorithm moon", coordinator.ErrConfig)
		}
		return nil
	}
	switch {
	case cfg.Model.Kind != model.KindMLP:
		return fmt.Errorf("%w: %s needs a representation layer: model %s has none (use mlp)", coordinator.ErrConfig, cfg.Algorithm, cfg.Model.Kind)
	case cfg.DP != nil:
		return fmt.Errorf("%w: %s does not compose with differential privacy", coordinator.ErrConfig, cfg.Algorithm)
	case cfg.SecAgg != nil:
		return fmt.Errorf("%w: %s does not compose with secure aggregation", coordinator.ErrConfig, cfg.Algorithm)
	case kind != model.ContrastMOON && cfg.Params.Tau != 0:
		return fmt.Errorf("%w: tau is MOON's temperature: only with algorithm moon", coordinator.ErrConfig)
	}
	c := model.ContrastConfig{Kind: kind, Mu: cfg.Params.Mu, Tau: cfg.Params.Tau}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("%w: %w", coordinator.ErrConfig, err)
	}
	return nil
}

package agent

import (
	"errors"
	"fmt"

	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/wire"
)

// contrastConfig sets p's contrastive objective from a MOON or FedSiam-DA
// announcement: mu is the contrastive weight (the local solve has no
// proximal term), tau MOON's temperature. They compose with neither
// differential privacy nor secure aggregation (the aggregator refuses those
// runs; a site refuses such an announcement too).
func contrastConfig(ann *wire.RoundAnnouncement, p *prepared) error {
	kind := p.task.Contrast
	if kind == "" {
		return nil
	}
	if ann.Dp != nil || ann.Secagg != nil {
		return fmt.Errorf("%s: not with differential privacy or secure aggregation", ann.Algorithm)
	}
	p.contrast = model.ContrastConfig{Kind: kind, Mu: ann.Params.GetMu(), Tau: ann.Params.GetTau()}
	p.work.Solver.Mu = 0
	return p.contrast.Validate()
}

// contrastModel makes p's model the contrastive objective against the
// round's global model and the site's previous local model (the global
// model when the site has none in this run).
func contrastModel(v StoreView, p *prepared) error {
	if p.contrast.Kind == "" {
		return nil
	}
	prev, err := v.Residual(edgestore.ResidualLocal)
	switch {
	case errors.Is(err, storage.ErrNotFound):
		prev = p.x
	case err != nil:
		return diskErrAt(v, roundErr(p.round, err))
	case len(prev) != len(p.x):
		return fmt.Errorf("agent: round %d: stored local model has dimension %d, the model %d: state file %s belongs to another model",
			p.round, len(prev), len(p.x), v.Path())
	}
	c, err := model.NewContrastive(p.m, p.contrast, p.x, prev)
	if err != nil {
		return bad(p.round, "%v", err)
	}
	p.m = c
	return nil
}

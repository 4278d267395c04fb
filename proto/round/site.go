package round

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/learn/sketch"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// The site's side of a round announcement, the one door the agent's core
// goes through to the math below it (ARCHITECTURE.md, "Core and shell"):
// Open checks the announcement's model, global model, uplink codec and
// parameters against the site's data, Work.Solve does the work, Encode
// (or EncodeSum) turns its result into the update frame, AnchorGrad the
// anchor's gradient into what the round's sketch asks for. Control goes
// down from here and returns; nothing below calls back up.

// Task is a checked announcement's work at one site: the model it trains,
// the global model x decoded, the uplink codec and the resolved
// parameters (Prepare).
type Task struct {
	Spec  model.Spec
	Model model.Model
	X     []float64
	Codec *quant.Codec
	// CodecName and Lossless are the codec's name on the wire and whether
	// it loses nothing (no error-feedback residual then).
	CodecName string
	Lossless  bool
	Work      Work
	// Contrast is the kind of the algorithm's contrastive objective (MOON,
	// FedSiam-DA; "": none): model.ContrastKindOf.
	Contrast string
}

// Open checks everything about ann that can be checked against a site's
// training data d before anything is written: the model (ModelSpec), that
// d fits it, the global model's dimension and frame, the uplink codec, and
// the round's parameters (Prepare, with device's overrides). Its errors
// name what is wrong; the caller says which round.
func Open(ann *wire.RoundAnnouncement, d model.Data, device Params) (Task, error) {
	var t Task
	spec, err := ModelSpec(ann)
	if err != nil {
		return t, err
	}
	t.Spec, t.Contrast = spec, model.ContrastKindOf(ann.Algorithm)
	if t.Model, err = model.New(spec); err != nil {
		return t, err
	}
	if err := model.CheckTargets(spec, d); err != nil {
		return t, fmt.Errorf("this site's data do not fit the announced model: %w", err)
	}
	dim := t.Model.NumParams()
	if int64(ann.Global.GetDimension()) != int64(dim) {
		return t, fmt.Errorf("global model has dimension %d, the %s model has %d parameters", ann.Global.GetDimension(), spec.Kind, dim)
	}
	c, err := quant.ParseWithLimits(ann.UplinkCodec, quant.Limits{MaxDim: dim})
	if err != nil {
		return t, fmt.Errorf("uplink codec: %w", err)
	}
	if c.MinDim() > dim {
		return t, fmt.Errorf("uplink codec %s covers %d parameters, the %s model has %d", c, c.MinDim(), spec.Kind, dim)
	}
	t.Codec, t.CodecName, t.Lossless = c, c.String(), c.Lossless()
	info, err := quant.Inspect(ann.Global.GetPayload())
	if err != nil {
		return t, fmt.Errorf("global model frame: %w", err)
	}
	if info.Dim != dim {
		return t, fmt.Errorf("global model frame has dimension %d, want %d", info.Dim, dim)
	}
	if t.X, err = c.Decode(ann.Global.GetPayload(), nil); err != nil {
		return t, fmt.Errorf("global model frame: %w", err)
	}
	if len(t.X) != dim { // Inspect and Decode agree; belt and braces
		return t, fmt.Errorf("global model decodes to %d values, want %d", len(t.X), dim)
	}
	p, pop := FromWire(ann)
	if t.Work, err = Prepare(ann.Algorithm, p, pop, device, d.N); err != nil {
		return t, err
	}
	return t, nil
}

// CheckBudget checks a solve's budget before anything is written.
func CheckBudget(b proxsolver.Budget) error { return b.Validate() }

// Rand is a site's random stream s of a round (streams.Site): the solver's
// and the codec's, seeded by the site's seed and id.
func Rand(seed uint64, clientID string, round uint64, s streams.SiteStream) *rand.Rand {
	return streams.Site(seed, clientID, round, s)
}

// Encode is a site's update frame (uplink.Encode) with the task's codec.
func (t *Task) Encode(u uplink.Update, rng *rand.Rand) (uplink.Frame, error) {
	return uplink.Encode(t.Codec, u, rng)
}

// EncodeSum is a sum-mode site's update frame (uplink.EncodeSum).
func (t *Task) EncodeSum(u uplink.SumUpdate, rng *rand.Rand) (uplink.Frame, error) {
	return uplink.EncodeSum(t.Codec, u, rng)
}

// AnchorGrad is what a round's SketchSpec s asks for of the gradient g at
// the anchor: g itself (dimension 0) or its seeded random projection; nil
// for a non-finite or empty gradient, and (long) for a sketch longer than
// the gradient, refused (it would cost dimension x len(g) for nothing).
func AnchorGrad(g []float64, s *wire.SketchSpec) (v []float64, long bool) {
	for _, x := range g {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, false
		}
	}
	switch {
	case len(g) == 0:
		return nil, false
	case s.Dimension == 0:
		return slices.Clone(g), false
	case int(s.Dimension) > len(g):
		return nil, true
	}
	return sketch.Of(g, int(s.Dimension), s.Seed), false
}

// ModelSpec is the model an announcement trains: its model spec, with
// FedSiam-DA's prediction head when its algorithm is fedsiam-da
// (model.ContrastSpec, the rule the aggregator and simulate follow).
func ModelSpec(ann *wire.RoundAnnouncement) (model.Spec, error) {
	s, err := modelSpec(ann.Model)
	return model.ContrastSpec(model.ContrastKindOf(ann.Algorithm), s), err
}

// modelSpec converts the announced model. The wire form allows several
// hidden layers; the models have at most one.
func modelSpec(s *wire.ModelSpec) (model.Spec, error) {
	if s == nil {
		return model.Spec{}, errors.New("no model")
	}
	kind := s.Kind
	switch kind { // the wire schema's comment spells two kinds differently
	case "binlogreg":
		kind = model.KindBinaryLogReg
	case "linreg":
		kind = model.KindLinear
	}
	if int64(s.Inputs) > model.MaxParams || int64(s.Classes) > model.MaxParams {
		return model.Spec{}, fmt.Errorf("model %s: %d inputs, %d classes: beyond %d parameters", kind, s.Inputs, s.Classes, model.MaxParams)
	}
	spec := model.Spec{Kind: kind, Inputs: int(s.Inputs), Classes: int(s.Classes), Activation: s.Activation, L2: s.L2}
	switch len(s.Hidden) {
	case 0:
	case 1:
		if int64(s.Hidden[0]) > model.MaxParams {
			return model.Spec{}, fmt.Errorf("model %s: %d hidden units", kind, s.Hidden[0])
		}
		spec.Hidden = int(s.Hidden[0])
	default:
		return model.Spec{}, fmt.Errorf("model %s: %d hidden layers, this agent supports one", kind, len(s.Hidden))
	}
	return spec, nil
}

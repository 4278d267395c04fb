package aggregator

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/edgefl/edgefl/node/aggstore"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/prep"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/internal/metrics"
	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/learn/evaluate"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/wire"
)

// The shell's part of the schema-run protocol: a run with a federation
// schema. The coordinator decides (coordinator_fed.go); this file validates
// the sites' statistics and evaluation reports, stores them before their
// receipts, fits the preprocessing and creates the model, combines the
// evaluation reports, writes the bundles and announces the statistics
// phase and the end.

// LatestBundle is the file name of the latest bundle in the state
// directory; FinalBundle the default --final-model of a run with a schema.
const (
	LatestBundle = "latest.bundle.json"
	FinalBundle  = "final.bundle.json"
)

// decoder is what the MQTT callbacks decode with; it changes once, when the
// model is created after the statistics phase.
type decoder struct {
	dim    int // 0: no model yet
	lim    wire.Limits
	codecs *sync.Pool // *quant.Codec
}

// inStats and inEval are a decoded, validated SiteStatistics and
// EvalReport on their way to the loop.
type inStats struct {
	msg *wire.SiteStatistics
	raw []byte
}

type inEval struct {
	msg *wire.EvalReport
	raw []byte
	rep evaluate.Report
}

// fitRecord is the stored fit (storage AggStore.PutFit): everything a
// bundle needs besides the model's parameters and the evaluation, so that
// `broker-agg export` makes one from the state file alone.
type fitRecord struct {
	Schema    json.RawMessage   `json:"schema"`    // canonical
	Transform json.RawMessage   `json:"transform"` // prep.Transform
	Model     model.Spec        `json:"model"`
	Sites     []string          `json:"sites"` // whose statistics were combined
	Rows      int64             `json:"rows"`  // pooled training rows
	Algorithm string            `json:"algorithm"`
	Params    map[string]string `json:"params,omitempty"`
	FittedAt  time.Time         `json:"fitted_at"`

	schema *schema.Schema
	tr     *prep.Transform
}

// parseFit decodes and checks a stored fit record.
func parseFit(b []byte) (*fitRecord, error) {
	var r fitRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%w: the fit record: %w", storage.ErrCorrupt, err)
	}
	var err error
	if r.schema, err = schema.Parse(r.Schema); err != nil {
		return nil, fmt.Errorf("%w: the fit record's schema: %w", storage.ErrCorrupt, err)
	}
	r.tr = new(prep.Transform)
	if err := json.Unmarshal(r.Transform, r.tr); err != nil {
		return nil, fmt.Errorf("%w: the fit record's transform: %w", storage.ErrCorrupt, err)
	}
	if err := r.tr.Validate(r.schema); err != nil {
		return nil, fmt.Errorf("%w: the fit record's transform: %w", storage.ErrCorrupt, err)
	}
	if _, err := model.New(r.Model); err != nil || r.Model.Inputs != r.tr.Outputs {
		return nil, fmt.Errorf("%w: the fit record's model %+v (transform outputs %d): %v", storage.ErrCorrupt, r.Model, r.tr.Outputs, err)
	}
	return &r, nil
}

// SchemaConfig is the schema run's configuration (ServerConfig embeds
// it): the federation schema and its phases.
type SchemaConfig struct {
	// Schema, when set, is the federation schema: the run
	// starts with a statistics phase, the model's inputs and classes come
	// from the schema and the fitted preprocessing (Model's Kind, Hidden,
	// Activation and L2 are the operator's; Inputs and Classes are
	// ignored), and the sites evaluate the global model on their held-out
	// rows every EvalEvery rounds (0: only at the end) and at the end.
	Schema *schema.Schema
	// StatsSites closes the statistics phase at that many sites (default
	// K); see Config.StatsSites.
	StatsSites int
	EvalEvery  int
	// StatsReview stops the run before round 1 when the statistics
	// review has findings (stats_review.go).
	StatsReview bool
	// EvalTable is --eval-data read with the Schema: evaluated, with the
	// federation's preprocessing, after every aggregation (as Eval is
	// without a schema).
	EvalTable *schema.Table
}

// Validate checks the schema on its own; checkModel checks it against the
// model flags.
func (c SchemaConfig) Validate() error {
	if c.Schema == nil {
		return nil
	}
	if err := c.Schema.Validate(); err != nil {
		return fmt.Errorf("%w: schema: %w", coordinator.ErrConfig, err)
	}
	return nil
}

// schemaRun is the shell's schema run component (federated preprocessing
// and evaluation): its configuration (SchemaConfig), the schema's
// canonical JSON, the fitted preprocessing once fitted, the run spec last
// published, the statistics or evaluation report being proposed, the
// latest federated evaluation, its restore (loadFit, restoreEvalView) and
// its status section (statusInto). Loop-owned unless noted. Without a
// schema it is off (on) and its counters stay at zero.
type schemaRun struct {
	cfg        SchemaConfig
	schemaJSON []byte     // the schema's canonical JSON (nil: no schema)
	fit        *fitRecord // the fitted preprocessing (nil until fitted)
	runSpec    []byte     // the run spec this process last published on the run topic
	// specStale: the broker connection was (re)made since, and a broker
	// restarted without its retained messages has lost the run spec: the
	// next announcement publishes it again (set by onConnect).
	specStale  atomic.Bool
	pendStats  *inStats
	pendEval   *inEval
	stored     bool            // this batch stored the pending message (false: a copy)
	evalLogged int             // the last eval round logged and bundled
	lateNoted  map[string]bool // sites told of as not in the preprocessing (noteLateJoiner)

	evalView *EvalStatus // under Server.mu

	statsRejected, evalsRejected metrics.LabeledCounter
	statsStored, evalsStored     metrics.LabeledCounter // by "stored" / "duplicate"
}

func newSchemaRun(cfg SchemaConfig) *schemaRun {
	f := &schemaRun{cfg: cfg}
	if cfg.Schema != nil {
		f.schemaJSON = cfg.Schema.Canonical()
	}
	return f
}

// on reports whether the run has a federation schema.
func (f *schemaRun) on() bool { return f.cfg.Schema != nil }

// schema is the federation schema (nil: none).
func (f *schemaRun) schema() *schema.Schema { return f.cfg.Schema }

// canonical is the schema's canonical JSON, as announced.
func (f *schemaRun) canonical() []byte { return f.schemaJSON }

// fitted is the fitted preprocessing (nil until fitted, or without a
// schema).
func (f *schemaRun) fitted() *fitRecord { return f.fit }

// evalEvery is how often the sites evaluate the global model (0: only at
// the end).
func (f *schemaRun) evalEvery() int { return f.cfg.EvalEvery }

// stopsForReview reports whether findings of the statistics review stop
// the run before round 1 (--stats-review).
func (f *schemaRun) stopsForReview() bool { return f.cfg.StatsReview }

// adopt makes rec the run's fit and returns the evaluation data
// (SchemaConfig.EvalTable) with its preprocessing applied (nil without).
func (f *schemaRun) adopt(rec *fitRecord) *model.Data {
	f.fit = rec
	if t := f.cfg.EvalTable; t != nil {
		d := rec.tr.Apply(t, nil)
		return &d
	}
	return nil
}

// loadFit reads the stored fit of the round log at path (nil, nil when
// none is stored), checked against the run's schema digest.
func (f *schemaRun) loadFit(store *aggstore.AggStore, path, digest string) (*fitRecord, error) {
	b, err := store.Fit()
	if errors.Is(err, storage.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return checkFit(b, path, digest)
}

// checkFit parses a stored fit and checks it is of the run's schema.
func checkFit(b []byte, path, digest string) (*fitRecord, error) {
	rec, err := parseFit(b)
	if err != nil {
		return nil, fmt.Errorf("aggregator: %s: %w", path, err)
	}
	if rec.schema.Digest() != digest {
		return nil, fmt.Errorf("%w: %s: the stored fit is of schema %s, the run's is %s", storage.ErrCorrupt, path, rec.schema.Digest(), digest)
	}
	return rec, nil
}

// restoreEvalView reads the latest federated evaluation back, for the
// metrics until the next.
func (f *schemaRun) restoreEvalView(store *aggstore.AggStore, lim wire.Limits) {
	if rs, err := store.EvalRounds(); err == nil && len(rs) > 0 {
		if fig, err := evalFigures(store, f.fit.schema, int(rs[len(rs)-1]), lim); err == nil {
			f.evalView = fig
		}
	}
}

// proposeStats makes in the message being proposed; done forgets it.
func (f *schemaRun) proposeStats(in *inStats) (done func()) {
	f.pendStats, f.stored = in, false
	return func() { f.pendStats = nil }
}

// proposeEval makes in the message being proposed; done forgets it.
func (f *schemaRun) proposeEval(in *inEval) (done func()) {
	f.pendEval, f.stored = in, false
	return func() { f.pendEval = nil }
}

// proposedStats is the statistics being proposed (nil when none).
func (f *schemaRun) proposedStats() *inStats { return f.pendStats }

// proposedEval is the evaluation report being proposed (nil when none).
func (f *schemaRun) proposedEval() *inEval { return f.pendEval }

// setStored records whether the proposed message was stored now (false: a
// copy stored earlier).
func (f *schemaRun) setStored(stored bool) { f.stored = stored }

// storedNow reports whether the proposed message was stored now.
func (f *schemaRun) storedNow() bool { return f.stored }

// countStats and countEval count statistics and evaluation reports
// answered by result ("stored", "duplicate"); rejectStats and rejectEval
// those rejected, by reason. Safe from any goroutine.
func (f *schemaRun) countStats(result string)  { f.statsStored.Inc(result) }
func (f *schemaRun) countEval(result string)   { f.evalsStored.Inc(result) }
func (f *schemaRun) rejectStats(reason string) { f.statsRejected.Inc(reason) }
func (f *schemaRun) rejectEval(reason string)  { f.evalsRejected.Inc(reason) }

// hasEvalData reports whether the operator gave evaluation data read with
// the schema (SchemaConfig.EvalTable).
func (f *schemaRun) hasEvalData() bool { return f.cfg.EvalTable != nil }

// lateJoiner reports whether id is a site online whose statistics are not
// in the fit, the first time it is asked about it.
func (f *schemaRun) lateJoiner(id string) bool {
	if f.fit == nil || len(f.fit.Sites) == 0 || slices.Contains(f.fit.Sites, id) || f.lateNoted[id] {
		return false
	}
	if f.lateNoted == nil {
		f.lateNoted = map[string]bool{}
	}
	f.lateNoted[id] = true
	return true
}

// newEval reports whether eval round e is one to log and bundle (once per
// eval round, after the fit), and marks it so.
func (f *schemaRun) newEval(e int) bool {
	if f.fit == nil || e < 1 || e <= f.evalLogged {
		return false
	}
	f.evalLogged = e
	return true
}

// specChanged reports whether the run spec b differs from the one last
// published (or the broker may have lost it), and remembers it.
func (f *schemaRun) specChanged(b []byte) bool {
	if f.specStale.Swap(false) {
		f.runSpec = nil
	}
	if bytes.Equal(b, f.runSpec) {
		return false
	}
	f.runSpec = b
	return true
}

// setEvalView shows fig as the latest federated evaluation (the caller
// holds Server.mu).
func (f *schemaRun) setEvalView(fig *EvalStatus) { f.evalView = fig }

// connected notes a new broker connection: the run spec is published again
// with the next announcement. Safe from any goroutine.
func (f *schemaRun) connected() { f.specStale.Store(true) }

// statusInto fills the schema run's part of the view (the caller holds
// Server.mu).
func (f *schemaRun) statusInto(v *ServerView) {
	v.Evaluation = f.evalView
	v.StatsStored, v.StatsRejected = f.statsStored.Snapshot(), f.statsRejected.Snapshot()
	v.EvalsStored, v.EvalsRejected = f.evalsStored.Snapshot(), f.evalsRejected.Snapshot()
}

func orNone(d string) string {
	if d == "" {
		return "(none)"
	}
	return d
}

// operatorModel is the part of the model the operator chooses with a
// schema (the schema decides the rest).
func operatorModel(spec model.Spec) model.Spec {
	m := model.Spec{Kind: spec.Kind, L2: spec.L2}
	if m.Kind == model.KindMLP {
		m.Hidden, m.Activation = spec.Hidden, spec.Activation
	}
	return m
}

// setModel creates the model and everything whose size depends on it.
func (s *Server) setModel(spec model.Spec) error {
	// FedSiam-DA's model carries its prediction head (the sites follow the
	// same rule from the announced algorithm).
	spec = model.ContrastSpec(model.ContrastKindOf(s.cfg.Algorithm), spec)
	m, err := newModel(spec, s.cfg.Codec)
	if err != nil {
		return err
	}
	dim := m.NumParams()
	lim := wire.Limits{MaxMessageBytes: s.cfg.MaxMessageBytes, MaxDimension: dim}
	qlim := quant.Limits{MaxDim: dim, MaxFrame: s.cfg.MaxMessageBytes}
	loopQ, err := quant.ParseWithLimits("fp32", qlim)
	if err != nil {
		return fmt.Errorf("aggregator: codec: %w", err)
	}
	down, err := quant.ParseWithLimits(s.cfg.Downlink, qlim)
	if err != nil {
		return fmt.Errorf("aggregator: downlink codec: %w", err)
	}
	s.model, s.spec, s.dim, s.lim, s.qlim, s.loopQ, s.down = m, spec, dim, lim, qlim, loopQ, down
	pool := &sync.Pool{New: func() any {
		c, _ := quant.ParseWithLimits("fp32", qlim) // the same spec parsed above
		return c
	}}
	s.dec.Store(&decoder{dim: dim, lim: lim, codecs: pool})
	return nil
}

// restoreFreshFed starts a new round log with a schema: round 1 opens in
// the statistics phase, without a model.
func (s *Server) restoreFreshFed() error {
	s.stored.RunID = crand.Text()
	if err := s.newNoiseKey(); err != nil {
		return err
	}
	s.conf, _ = json.Marshal(s.stored)
	st, err := s.coord.MarshalState()
	if err != nil {
		return err
	}
	if err := s.store.OpenRound(aggstore.Round{Number: 1, OpenedAt: s.clock.Now(), Config: s.conf, State: st}, nil); err != nil {
		return err
	}
	s.storeR, s.lastSt, s.fresh = 1, st, true
	first := "statistics phase first"
	if s.fed.schema().Declared() {
		first = "the schema declares the preprocessing: no statistics phase"
	}
	s.log.Info("new round log with a federation schema: "+first, "state", s.cfg.StatePath, "federation", s.cfg.Federation,
		"algorithm", s.cfg.Algorithm, "model", s.cfg.Model.Kind, "schema", s.stored.SchemaDigest, "run_id", s.stored.RunID)
	return nil
}

// restoreFit loads the stored fit, if any, and re-creates the model from it.
func (s *Server) restoreFit() error {
	rec, err := s.fed.loadFit(s.store, s.cfg.StatePath, s.stored.SchemaDigest)
	if err != nil || rec == nil {
		return err
	}
	if err := s.useFit(rec); err != nil {
		return err
	}
	s.fed.restoreEvalView(s.store, s.lim)
	return nil
}

// useFit creates the model of the fit rec and makes it the run's.
func (s *Server) useFit(rec *fitRecord) error {
	if err := s.setModel(rec.Model); err != nil {
		return err
	}
	if d := s.fed.adopt(rec); d != nil {
		s.eval = d
	}
	return nil
}

// fitTransform carries out FitTransform: combine the sites' statistics, fit
// the preprocessing, create the model and its initial parameters, store
// them in one transaction (or find them stored: a restart), then step
// TransformFitted.
func (s *Server) fitTransform(ctx context.Context, d coordinator.FitTransform) error {
	if s.fed.fitted() == nil {
		b, err := s.store.Fit()
		switch {
		case err == nil:
			s.log.Info("the preprocessing was fitted before a restart; using the stored fit")
			rec, err := checkFit(b, s.cfg.StatePath, s.stored.SchemaDigest)
			if err != nil {
				return err
			}
			if err := s.useFit(rec); err != nil {
				return err
			}
		case errors.Is(err, storage.ErrNotFound):
			if err := s.newFit(d); err != nil {
				return err
			}
		default:
			return fmt.Errorf("aggregator: %w", err)
		}
		x0, err := s.store.Checkpoint(1)
		if err != nil {
			return fmt.Errorf("aggregator: the initial model: %w", err)
		}
		if len(x0) != s.dim {
			return fmt.Errorf("aggregator: the initial model has %d values, the model %d", len(x0), s.dim)
		}
		s.global, s.globalR, s.frame = x0, 1, nil
		// The sites online now whose statistics are not in the fit.
		if recs, err := s.store.Clients(); err == nil {
			for _, r := range recs {
				if r.Online {
					s.noteLateJoiner(r.ID)
				}
			}
		}
	}
	if stop, err := s.reviewStatistics(); stop || err != nil {
		return err // --stats-review: round 1 is not announced
	}
	return s.step(ctx, coordinator.TransformFitted{At: s.clock.Now()})
}

// noteLateJoiner logs, once per site and run, that an online site's
// statistics are not among those the preprocessing was fitted from (it
// joined after the statistics phase, or its statistics came late or were
// refused): it trains and evaluates with a preprocessing its own rows
// shaped none of. Status and the console mark it (not_in_preprocessing),
// the bundle's provenance lists the sites that did shape it.
func (s *Server) noteLateJoiner(id string) {
	if !s.fed.lateJoiner(id) {
		return
	}
	s.log.Warn("a site whose statistics are not in the federation's preprocessing: it uses the one fitted on the other sites' rows", "hint", "it joined after the statistics phase, or its statistics came late or were refused",
		"client", id, "statistics_sites", s.fed.fitted().Sites)
}

func (s *Server) newFit(d coordinator.FitTransform) error {
	sc := s.fed.schema()
	if sc.Declared() {
		tr, err := prep.Declared(sc)
		if err != nil {
			return fmt.Errorf("aggregator: the schema's declared preprocessing: %w", err)
		}
		return s.storeFit(d, tr, 0)
	}
	recs, err := s.store.Statistics()
	if err != nil {
		return fmt.Errorf("aggregator: %w", err)
	}
	want := map[string]bool{}
	for _, id := range d.Sites {
		want[id] = true
	}
	var list []*prep.Stats
	var rows int64
	for _, r := range recs {
		if !want[r.ClientID] {
			continue
		}
		m, err := wire.DecodeStatistics(r.Msg, s.lim)
		if err != nil {
			return fmt.Errorf("aggregator: stored statistics of %q: %w", r.ClientID, err)
		}
		st, err := decodeStats(sc, m.Stats)
		if err != nil {
			return fmt.Errorf("aggregator: stored statistics of %q: %w", r.ClientID, err)
		}
		list = append(list, st)
		rows += st.Rows
	}
	if len(list) != len(d.Sites) {
		return fmt.Errorf("aggregator: %d statistics sites but %d stored statistics", len(d.Sites), len(list))
	}
	fail := func(what string, err error) error {
		return fmt.Errorf("aggregator: the federation's statistics cannot be %s (start a new run with a corrected schema): %w", what, err)
	}
	pooled, err := prep.Combine(sc, list)
	if err != nil {
		return fail("combined", err)
	}
	tr, err := sitedata.Fit(sc, pooled)
	if err != nil {
		return fail("fitted", err)
	}
	return s.storeFit(d, tr, rows)
}

// storeFit creates the model the transform tr implies and its initial
// parameters and stores them with the fit (rows: the pooled training rows,
// 0 for a declared transform).
func (s *Server) storeFit(d coordinator.FitTransform, tr *prep.Transform, rows int64) error {
	sc := s.fed.schema()
	fail := func(what string, err error) error {
		return fmt.Errorf("aggregator: the federation's preprocessing cannot be %s (start a new run with a corrected schema): %w", what, err)
	}
	op := operatorModel(s.cfg.Model)
	spec, err := sitedata.ModelSpec(sc, tr, op.Kind, op.Hidden, op.Activation, op.L2)
	if err != nil {
		return fail("given a model", err)
	}
	if err := s.setModel(spec); err != nil {
		return err
	}
	x0 := make([]float64, s.dim)
	if s.cfg.Init == InitModel {
		x0 = s.model.InitParams(streams.ModelInit(s.cfg.InitSeed))
	}
	if x0, err = s.downlinked(x0); err != nil {
		return err
	}
	trJSON, err := json.Marshal(tr)
	if err != nil {
		return fmt.Errorf("aggregator: encode the transform: %w", err)
	}
	rec := fitRecord{Schema: s.fed.canonical(), Transform: trJSON, Model: spec, Sites: slices.Clone(d.Sites), Rows: rows,
		Algorithm: s.cfg.Algorithm, Params: s.bundleParams(), FittedAt: s.clock.Now().UTC()}
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("aggregator: encode the fit: %w", err)
	}
	if err := s.store.PutFit(b, x0); err != nil {
		s.storageErrors.Add(1)
		return fmt.Errorf("aggregator: %w", err)
	}
	stored, err := checkFit(b, s.cfg.StatePath, s.stored.SchemaDigest)
	if err != nil {
		return err
	}
	if err := s.useFit(stored); err != nil {
		return err
	}
	what := "federation preprocessing fitted"
	if sc.Declared() {
		what = "federation preprocessing declared by the schema"
	}
	s.log.Info(what, "sites", d.Sites, "rows", rows, "inputs", tr.Outputs,
		"standardize", tr.Standardize, "model", spec.Kind, "classes", spec.Classes, "dimension", s.dim)
	return nil
}

// bundleParams are the algorithm's parameters in a bundle's provenance.
func (s *Server) bundleParams() map[string]string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	p := s.cfg.Params
	m := map[string]string{
		"aggregator": s.aggSpec, "mu": f(p.Mu), "solver": p.Solver, "gamma": f(p.Gamma), "lr": f(p.LR),
		"batch": strconv.Itoa(p.Batch), "max_epochs": strconv.Itoa(p.MaxEpochs), "l2": f(s.cfg.Model.L2),
		"codec": s.cfg.Codec, "downlink": s.cfg.Downlink, "per_round": strconv.Itoa(s.cfg.K),
		"quorum_fraction": f(s.cfg.QuorumFraction), "seed": strconv.FormatUint(s.cfg.Seed, 10), "rounds": strconv.Itoa(s.cfg.Rounds),
		"selector": s.cfg.Selector, "init": s.cfg.Init,
	}
	if isSplit(s.fam) {
		m["step"], m["relax"] = f(p.Step), f(p.Relax)
	}
	if o := s.opt.params; o.On() {
		m["server_opt"] = o.String()
	}
	return m
}

// decodeStats decodes a site's statistics strictly and checks them against
// the schema.
func decodeStats(sc *schema.Schema, b []byte) (*prep.Stats, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var st prep.Stats
	if err := dec.Decode(&st); err != nil {
		return nil, fmt.Errorf("statistics JSON: %w", err)
	}
	if err := st.Validate(sc); err != nil {
		return nil, err
	}
	return &st, nil
}

// decodeReport decodes an evaluation report strictly and checks it is one
// a site of this schema can have sent.
func decodeReport(sc *schema.Schema, b []byte) (evaluate.Report, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var r evaluate.Report
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("report JSON: %w", err)
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case r.N < 0:
		return r, fmt.Errorf("n = %d", r.N)
	case !finite(r.Loss) || r.Loss < 0 || !finite(r.Accuracy) || !finite(r.BalancedAccuracy) || !finite(r.RMSE) || !finite(r.SSE) ||
		!finite(r.LabelMean) || !finite(r.LabelM2):
		return r, errors.New("a figure is not finite or negative")
	case r.AUC != nil && !(*r.AUC >= 0 && *r.AUC <= 1):
		return r, errors.New("auc outside [0, 1]")
	case r.R2 != nil && !finite(*r.R2):
		return r, errors.New("r2 is not finite")
	}
	k := sc.NumClasses()
	if k == 0 {
		if r.Confusion != nil {
			return r, errors.New("a confusion matrix for a regression task")
		}
		return r, nil
	}
	if r.N > 0 && len(r.Confusion) != k {
		return r, fmt.Errorf("a confusion matrix of %d classes, the schema has %d", len(r.Confusion), k)
	}
	var sum int64
	for _, row := range r.Confusion {
		if len(row) != k {
			return r, errors.New("the confusion matrix is not square")
		}
		for _, c := range row {
			if c < 0 {
				return r, errors.New("a negative count in the confusion matrix")
			}
			sum += c
		}
	}
	if sum != r.N {
		return r, fmt.Errorf("the confusion matrix counts %d rows, n = %d", sum, r.N)
	}
	return r, nil
}

// handleStatistics validates a site's statistics in the callback's
// goroutine and hands them to the loop.
func (s *Server) handleStatistics(m *wire.SiteStatistics, raw []byte) bool {
	bad := func(code wire.ReceiptCode, reason, detail string) bool {
		return s.refuseFedEarly(wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, m.ClientId, 0, code, reason, detail)
	}
	switch {
	case s.fedRefused(wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, m.ClientId, 0, m.RunId):
		return true
	case m.SchemaDigest != s.stored.SchemaDigest:
		return bad(wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE, "schema_mismatch",
			fmt.Sprintf("the site read its data with schema %s, the federation's is %s", m.SchemaDigest, s.stored.SchemaDigest))
	}
	if _, err := decodeStats(s.fed.schema(), m.Stats); err != nil {
		return bad(wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE, "bad_statistics", err.Error())
	}
	return s.submit(&request{stats: &inStats{msg: m, raw: raw}})
}

// fedRefused refuses (refuseFedEarly) statistics or an evaluation report
// that no schema run takes, or that is for another run (runID), and says
// whether it did.
func (s *Server) fedRefused(subject wire.ReceiptSubject, client string, round uint64, runID string) bool {
	what := "statistics"
	if subject == wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION {
		what = "an evaluation report"
	}
	switch {
	case !s.fed.on():
		return s.refuseFedEarly(subject, client, round, wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE, "no_schema", "this federation has no schema")
	case runID != s.stored.RunID:
		return s.refuseFedEarly(subject, client, round, wire.ReceiptCode_RECEIPT_CODE_STALE_ROUND, "run_mismatch",
			fmt.Sprintf("%s for run %q, this run is %q", what, runID, s.stored.RunID))
	}
	return false
}

// refuseFedEarly counts, logs and receipts statistics (subject STATISTICS)
// or an evaluation report refused in the callback, before the loop; it
// reports the message dealt with.
func (s *Server) refuseFedEarly(subject wire.ReceiptSubject, client string, round uint64, code wire.ReceiptCode, reason, detail string) bool {
	count, what, msg := s.fed.rejectStats, "statistics", "statistics rejected"
	args := []any{"client", client}
	if subject == wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION {
		count, what, msg = s.fed.rejectEval, "evaluation", "evaluation report rejected"
		args = append(args, "round", round)
	}
	count(reason)
	s.hist.reject(client, what+"/"+reason)
	s.notify()
	s.log.Warn(msg, append(args, "reason", reason, "detail", detail)...)
	s.receiptFed(client, round, subject, false, code, reason+": "+detail, time.Time{})
	return true
}

// handleEval validates an evaluation report like handleStatistics.
func (s *Server) handleEval(m *wire.EvalReport, raw []byte) bool {
	const subject = wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION
	if s.fedRefused(subject, m.ClientId, m.Round, m.RunId) {
		return true
	}
	rep, err := decodeReport(s.fed.schema(), m.Report)
	if err != nil {
		return s.refuseFedEarly(subject, m.ClientId, m.Round, wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE, "bad_report", err.Error())
	}
	return s.submit(&request{eval: &inEval{msg: m, raw: raw, rep: rep}})
}

func (s *Server) onStatistics(ctx context.Context, in *inStats) error {
	defer s.fed.proposeStats(in)()
	return s.propose(ctx, statisticsEvent(in.msg, s.clock.Now()), nil, s.storeFed, s.refuseFed)
}

// statisticsEvent is the coordinator's event of a stored SiteStatistics,
// live and on replay alike: its training rows are the site's sample count
// (prep.Stats.Rows; the statistics were validated before they were stored).
func statisticsEvent(m *wire.SiteStatistics, at time.Time) coordinator.StatisticsArrived {
	var st struct {
		Rows int64 `json:"rows"`
	}
	_ = json.Unmarshal(m.Stats, &st) // validated when received: a malformed one counts 0 (the status's count stands)
	return coordinator.StatisticsArrived{Client: m.ClientId, Samples: int(min(max(st.Rows, 0), math.MaxInt32)), At: at}
}

func (s *Server) onEval(ctx context.Context, in *inEval) error {
	defer s.fed.proposeEval(in)()
	return s.propose(ctx, evalEvent(in.msg, s.clock.Now()), nil, s.storeFed, s.refuseFed)
}

// evalEvent is the coordinator's event for an evaluation report received
// (or, on restart, stored) at at.
func evalEvent(m *wire.EvalReport, at time.Time) coordinator.EvalArrived {
	return coordinator.EvalArrived{Client: m.ClientId, Round: int(min(m.Round, math.MaxInt32)), At: at} // a future round either way
}

// errNotGiven: the coordinator accepted a message the shell did not hand
// it (a bug: the loop stops).
var errNotGiven = errors.New("aggregator: coordinator accepted a message it was not given")

// storeFed stores accepted statistics or an evaluation report (the
// proposal, before the state and the receipt) and returns its replay log
// index: 0 for a copy stored earlier.
func (s *Server) storeFed(d coordinator.Decision, now time.Time) (index uint64, err error) {
	switch d := d.(type) {
	case coordinator.AcceptStatistics:
		if in := s.fed.proposedStats(); in != nil && in.msg.ClientId == d.Client {
			index, err = s.store.PutStatistics(d.Client, now, in.raw)
			s.fed.setStored(index > 0)
			return index, err
		}
	case coordinator.AcceptEval:
		if in := s.fed.proposedEval(); in != nil && in.msg.ClientId == d.Client && in.msg.Round == uint64(d.Round) {
			index, err = s.store.PutEval(uint64(d.Round), d.Client, now, in.raw)
			s.fed.setStored(index > 0)
			return index, err
		}
	}
	return 0, fmt.Errorf("%w: %#v", errNotGiven, d)
}

// refuseFed answers statistics or an evaluation report that could not be
// stored with an INTERNAL receipt (the site retries).
func (s *Server) refuseFed(err error) error {
	if errors.Is(err, errNotGiven) {
		return err
	}
	var (
		client  string
		round   uint64
		subject wire.ReceiptSubject
	)
	if in := s.fed.proposedStats(); in != nil {
		client, subject = in.msg.ClientId, wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS
	} else if in := s.fed.proposedEval(); in != nil {
		client, round, subject = in.msg.ClientId, in.msg.Round, wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION
	}
	s.storageErrors.Add(1)
	s.log.Error("storing a site's message; rejecting it for a retry", "client", client, "subject", subject, "err", err)
	s.receiptFed(client, round, subject, false, wire.ReceiptCode_RECEIPT_CODE_INTERNAL, "server could not store it; retry", time.Time{})
	return nil
}

// answerFed logs and receipts the coordinator's answer to statistics or an
// evaluation report.
func (s *Server) answerFed(d coordinator.Decision, storedAt time.Time) {
	dup := wire.ReceiptCode_RECEIPT_CODE_DUPLICATE
	const (
		subStats = wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS
		subEval  = wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION
	)
	switch d := d.(type) {
	case coordinator.AcceptStatistics:
		code, what := wire.ReceiptCode_RECEIPT_CODE_STORED, "stored"
		if !s.fed.storedNow() {
			code, what = dup, "duplicate"
		}
		s.fed.countStats(what)
		args := []any{"client", d.Client, "sites", len(s.coord.StatisticsSites())}
		if in := s.fed.proposedStats(); in != nil {
			args = append(args, "bytes", len(in.raw)) // the whole message, envelope included
		}
		s.log.Info("statistics "+what, args...)
		s.receiptFed(d.Client, 0, subStats, true, code, "", storedAt)
	case coordinator.RejectStatistics:
		if d.Reason == coordinator.Duplicate {
			s.fed.countStats("duplicate")
			s.log.Info("duplicate statistics ignored", "client", d.Client)
			s.receiptFed(d.Client, 0, subStats, true, dup, "duplicate: stored earlier", s.clock.Now())
			return
		}
		s.fed.rejectStats(d.Reason.String())
		s.hist.reject(d.Client, "statistics/"+d.Reason.String())
		detail := d.Reason.String()
		if d.Reason == coordinator.StaleRound {
			detail = "stale_round: the statistics phase is over"
		}
		s.log.Warn("statistics rejected", "client", d.Client, "reason", d.Reason.String(), "phase", s.coord.Phase())
		s.receiptFed(d.Client, 0, subStats, false, receiptCodes[d.Reason], detail, time.Time{})
	case coordinator.AcceptEval:
		code, what := wire.ReceiptCode_RECEIPT_CODE_STORED, "stored"
		if !s.fed.storedNow() {
			code, what = dup, "duplicate"
		}
		s.fed.countEval(what)
		args := []any{"client", d.Client, "round", d.Round}
		if in := s.fed.proposedEval(); in != nil {
			args = append(args, "n", in.rep.N, "loss", in.rep.Loss)
		}
		s.log.Info("evaluation report "+what, args...)
		if s.fed.stored {
			s.lateEval(d.Round)
		}
		s.receiptFed(d.Client, uint64(d.Round), subEval, true, code, "", storedAt)
	case coordinator.RejectEval:
		s.fed.rejectEval(d.Reason.String())
		s.hist.reject(d.Client, "evaluation/"+d.Reason.String())
		s.log.Warn("evaluation report rejected", "client", d.Client, "round", d.Round, "reason", d.Reason.String(), "current_round", s.coord.Round())
		s.receiptFed(d.Client, uint64(max(d.Round, 0)), subEval, false, receiptCodes[d.Reason], d.Reason.String(), time.Time{})
	}
}

// receiptFed publishes a receipt for statistics or an evaluation report.
func (s *Server) receiptFed(client string, round uint64, subject wire.ReceiptSubject, accepted bool, code wire.ReceiptCode, reason string, storedAt time.Time) {
	s.sendReceipt(&wire.Receipt{ClientId: client, Round: round, Accepted: accepted, Reason: reason, Code: code, Subject: subject}, storedAt, "receipt")
}

// announceStatistics publishes the retained statistics-phase announcement.
func (s *Server) announceStatistics(deadline time.Time) error {
	a := &wire.RoundAnnouncement{
		Federation: s.cfg.Federation, Round: 0, Algorithm: s.cfg.Algorithm, Phase: wire.Phase_PHASE_STATISTICS,
		Schema: s.fed.canonical(), DeadlineUnixMs: deadline.UnixMilli(), CreatedAtUnixMs: s.clock.Now().UnixMilli(), RunId: s.stored.RunID,
	}
	if err := s.publishRunSpec(a); err != nil {
		return err
	}
	b, err := wire.Encode(a)
	if err != nil {
		return fmt.Errorf("aggregator: encode the statistics announcement: %w", err)
	}
	s.log.Info("statistics phase announced", "schema", s.stored.SchemaDigest, "deadline", deadline.UTC().Format(time.RFC3339), "bytes", len(b))
	s.publish(s.topics.Round(), true, b, "statistics announcement")
	return nil
}

// announceFinish announces the end of the run and asks for the final
// evaluation.
func (s *Server) announceFinish(d coordinator.Finish) error {
	s.log.Info("the run has ended: waiting for the sites' evaluation of the final model", "rounds", d.Rounds, "reason", d.Reason,
		"deadline", d.Deadline.UTC().Format(time.RFC3339))
	return s.announceFinished(d.Rounds, d.Deadline, nil, false)
}

// announceFinished publishes the retained PHASE_FINISHED announcement:
// the final model (the checkpoint of round rounds+1), with a schema the
// request for its evaluation, and the final bundle once there is one.
// last (the run's final message) waits for the broker to acknowledge it,
// so that it is with the broker before Finished lets the daemon exit.
func (s *Server) announceFinished(rounds int, deadline time.Time, bun []byte, last bool) error {
	a, err := s.announcement(s.globalR, nil, deadline)
	if err != nil {
		return err
	}
	a.Round, a.Phase, a.Selected, a.Bundle = uint64(rounds), wire.Phase_PHASE_FINISHED, nil, bun
	a.Secagg = nil // the run is over: no session
	a.Evaluate, a.EvalRound = s.fed.fitted() != nil, 0
	if s.fed.fitted() != nil {
		a.EvalRound = uint32(rounds)
	}
	if deadline.IsZero() {
		a.DeadlineUnixMs = 0
	}
	if err := s.publishRunSpec(a); err != nil {
		return err
	}
	b, err := wire.Encode(a)
	if err != nil {
		return fmt.Errorf("aggregator: encode the final announcement: %w", err)
	}
	s.log.Info("end of the run announced", "rounds", rounds, "bundle_bytes", len(bun), "bytes", len(b))
	if !last {
		s.publish(s.topics.Round(), true, b, "final announcement")
		return nil
	}
	tok := s.client.Publish(s.topics.Round(), 1, true, b)
	limit := s.clock.NewTimer(finalAckWait)
	defer limit.Stop()
	select {
	case <-tok.Done():
		if err := tok.Error(); err != nil {
			s.publishErrors.Add(1)
			s.log.Error("publish failed", "what", "final announcement", "topic", s.topics.Round(), "err", err)
		}
	case <-limit.C():
		s.log.Warn("the broker has not acknowledged the final announcement; finishing without its acknowledgement", "waited", finalAckWait)
	case <-s.runCtx.Done():
	}
	return nil
}

// finalAckWait bounds the wait for the broker's acknowledgement of the
// run's final announcement.
const finalAckWait = 30 * time.Second

// EvalStatus is the federated evaluation of one eval round: the
// sample-weighted combination of the sites' reports and each site's.
type EvalStatus struct {
	Round      int                        `json:"round"`
	Federation evaluate.Report            `json:"federation"`
	Sites      map[string]evaluate.Report `json:"sites"`
	// Missing, for the final evaluation, are the sites whose report was
	// awaited and had not come at its deadline: the figures cover Sites.
	Missing []string `json:"missing,omitempty"`
}

// evalFigures combines the stored reports of eval round e (nil: none).
func evalFigures(store *aggstore.AggStore, sc *schema.Schema, e int, lim wire.Limits) (*EvalStatus, error) {
	recs, err := store.Evals(uint64(e))
	if err != nil || len(recs) == 0 {
		return nil, err
	}
	out := &EvalStatus{Round: e, Sites: map[string]evaluate.Report{}}
	var reps []evaluate.Report
	for _, r := range recs {
		m, err := wire.DecodeEvaluation(r.Msg, lim)
		if err != nil {
			return nil, fmt.Errorf("aggregator: stored evaluation (%d, %q): %w", e, r.ClientID, err)
		}
		rep, err := decodeReport(sc, m.Report)
		if err != nil {
			return nil, fmt.Errorf("aggregator: stored evaluation (%d, %q): %w", e, r.ClientID, err)
		}
		out.Sites[r.ClientID] = rep.WithBaseline() // the aggregator's, whatever a site sent
		reps = append(reps, rep)                   // client-id order: a deterministic sum
	}
	if out.Federation, err = evaluate.Combine(reps); err != nil {
		return nil, fmt.Errorf("aggregator: evaluations of round %d: %w", e, err)
	}
	out.Federation = out.Federation.WithBaseline()
	return out, nil
}

// finalizeEval logs eval round e's federated figures, shows them in the
// metrics and status, and writes the latest bundle (once per eval round).
func (s *Server) finalizeEval(e int) {
	if !s.fed.newEval(e) {
		return
	}
	fig, err := evalFigures(s.store, s.fed.fitted().schema, e, s.lim)
	if err != nil {
		s.log.Error("combining the evaluation reports", "round", e, "err", err)
		return
	}
	if fig == nil {
		return
	}
	s.mu.Lock()
	s.fed.setEvalView(fig)
	s.mu.Unlock()
	s.hist.addEval(evalPointOf(fig))
	s.log.Info("evaluation", evalArgs(fig)...)
	x, err := s.globalOf(uint64(e + 1))
	if err != nil {
		s.log.Error("the model of an eval round", "round", e, "err", err)
		return
	}
	priv, err := s.livePrivacy(e)
	if err != nil {
		s.log.Error("the privacy of the latest bundle", "round", e, "err", err)
		return
	}
	raw, err := makeBundle(s.stored, s.fed.fitted(), s.spec, x, fig, priv, e, s.clock.Now(), s.cfg.Version)
	if err != nil {
		s.log.Error("making the latest bundle", "round", e, "err", err)
		return
	}
	p := filepath.Join(filepath.Dir(s.cfg.StatePath), LatestBundle)
	if err := bundle.WriteFileAtomic(p, raw); err != nil {
		s.log.Error("writing the latest bundle", "path", p, "err", err)
		return
	}
	s.log.Debug("latest bundle written", "path", p, "round", e)
}

// lateEval takes in an evaluation report stored after its round's figures
// were logged: a site's report of round r-1 travels apart from its round-r
// update (the ingest workers may store the update first), so with rounds
// drawn back to back round r can close first, and later rounds may follow.
// The round's figures are combined again with it and replace the earlier
// ones in the history; for the latest evaluated round, also in the status,
// the metrics and the latest bundle (finalizeEval again).
func (s *Server) lateEval(e int) {
	if s.fed.fitted() == nil || e < 1 || e > s.fed.evalLogged {
		return
	}
	if ph := s.coord.Phase(); (ph == coordinator.PhaseFinishing || ph == coordinator.PhaseFinished) && e == s.coord.Round() {
		return // the final evaluation is the final bundle's, as the end decided it
	}
	if e == s.fed.evalLogged {
		s.fed.evalLogged = e - 1
		s.finalizeEval(e)
		return
	}
	fig, err := evalFigures(s.store, s.fed.fitted().schema, e, s.lim)
	if err != nil || fig == nil {
		s.log.Error("combining the evaluation reports", "round", e, "err", err)
		return
	}
	s.hist.addEval(evalPointOf(fig))
	s.log.Info("evaluation", evalArgs(fig)...)
}

func evalArgs(fig *EvalStatus) []any {
	f := fig.Federation
	args := []any{"round", fig.Round, "sites", len(fig.Sites), "n", f.N, "loss", f.Loss}
	if f.Confusion != nil {
		args = append(args, "accuracy", f.Accuracy, "balanced_accuracy", f.BalancedAccuracy)
		if b := f.Baseline; b != nil {
			args = append(args, "majority_baseline", b.Accuracy)
		}
		if f.AUC != nil {
			args = append(args, "auc", *f.AUC)
		}
	} else {
		args = append(args, "rmse", f.RMSE)
		if f.R2 != nil {
			args = append(args, "r2", *f.R2)
		}
	}
	// The sites (and the federation) whose model does not beat the
	// baseline on their own rows: an accuracy that is the majority
	// class's share says nothing.
	var below []string
	for _, id := range slices.Sorted(maps.Keys(fig.Sites)) {
		if b := fig.Sites[id].Baseline; b != nil && !b.Beaten {
			below = append(below, id)
		}
	}
	if b := f.Baseline; b != nil && !b.Beaten {
		below = append(below, "federation")
	}
	if len(below) > 0 {
		args = append(args, "not_above_baseline", below)
	}
	return args
}

// makeBundle makes the bundle of eval round e (the model x after e
// aggregations). A run with differential privacy (sc.DP) records its
// guarantee priv and no evaluation: the sites' figures are outside the
// guarantee (docs/privacy.md, "Evaluation under DP").
func makeBundle(sc storedConfig, rec *fitRecord, spec model.Spec, x []float64, fig *EvalStatus, priv *bundle.Privacy, e int, now time.Time, version string) ([]byte, error) {
	m, err := model.New(spec)
	if err != nil {
		return nil, err
	}
	if sc.DP != nil {
		if priv == nil {
			return nil, errNoPrivacy
		}
		fig = nil
	}
	if version == "" {
		version = "dev"
	}
	b := &bundle.Bundle{
		Model: model.Saved{Spec: spec, Layout: m.Layout(), Params: x}, Schema: rec.schema, Transform: rec.tr,
		Provenance: bundle.Provenance{Federation: sc.Federation, RunID: sc.RunID, Round: e, Algorithm: sc.Algorithm,
			Params: rec.Params, EdgeflVersion: version, Time: now.UTC().Format(time.RFC3339),
			StatisticsSites: slices.Clone(rec.Sites)},
		Privacy: priv,
	}
	if fig != nil {
		b.Evaluation = &bundle.Evaluation{Round: e, Federation: fig.Federation, Sites: fig.Sites, Missing: fig.Missing}
	}
	return b.Marshal()
}

// finalPath is where the final bundle goes.
func (s *Server) finalPath() string {
	if s.cfg.FinalModel != "" {
		return s.cfg.FinalModel
	}
	return filepath.Join(filepath.Dir(s.cfg.StatePath), FinalBundle)
}

// finalBundle makes (once; a restart reuses the stored one), stores and
// writes the final bundle.
func (s *Server) finalBundle(rounds int, missing []string) ([]byte, error) {
	s.finalizeEval(rounds)
	raw, err := s.store.FinalBundle()
	if errors.Is(err, storage.ErrNotFound) {
		fig, ferr := evalFigures(s.store, s.fed.fitted().schema, rounds, s.lim)
		if ferr != nil {
			s.log.Error("combining the final evaluation reports; the bundle has none", "err", ferr)
			fig = nil
		}
		if len(missing) > 0 {
			covered := 0
			if fig != nil {
				fig.Missing = slices.Clone(missing)
				covered = len(fig.Sites)
			}
			s.log.Warn("final evaluation at its deadline without these sites' reports: the bundle's figures cover the others (its evaluation's missing names them)",
				"missing", missing, "covered", covered)
		}
		priv, perr := s.livePrivacy(rounds)
		if perr != nil {
			return nil, fmt.Errorf("aggregator: the final bundle's privacy: %w", perr)
		}
		if raw, err = makeBundle(s.stored, s.fed.fitted(), s.spec, s.global, fig, priv, rounds, s.clock.Now(), s.cfg.Version); err != nil {
			return nil, fmt.Errorf("aggregator: the final bundle: %w", err)
		}
		if err := s.store.PutFinalBundle(raw); err != nil {
			s.storageErrors.Add(1)
			return nil, fmt.Errorf("aggregator: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("aggregator: %w", err)
	}
	b, err := bundle.Unmarshal(raw)
	if err != nil {
		return nil, fmt.Errorf("aggregator: the stored final bundle: %w", err)
	}
	p := s.finalPath()
	if err := bundle.WriteFileAtomic(p, raw); err != nil {
		s.log.Error("writing the final model bundle (it is in the state file: broker-agg export)", "path", p, "err", err)
	} else {
		args := []any{"path", p, "round", rounds, "digest", b.Digest, "bytes", len(raw)}
		if b.Evaluation != nil {
			args = append(args, "eval_sites", len(b.Evaluation.Sites), "eval_n", b.Evaluation.Federation.N)
		}
		if p := b.Privacy; p != nil {
			args = append(args, "dp_epsilon", p.Epsilon, "dp_delta", p.Delta, "evaluation", "withheld (differential privacy)")
		}
		s.log.Info("final model bundle written", args...)
	}
	return raw, nil
}

// loadSiteErrors seeds the site errors from the registry, so that a
// restart does not log them again.
func (s *Server) loadSiteErrors() {
	s.siteErrs = map[string][2]string{}
	cs, err := s.store.Clients()
	if err != nil {
		return
	}
	for _, c := range cs {
		if c.ErrorReason != "" || c.ErrorMessage != "" {
			s.siteErrs[c.ID] = [2]string{c.ErrorReason, c.ErrorMessage}
		}
	}
}

// siteError records a site's error from its online status: logged at WARN
// and counted when it changes, at INFO when it clears.
func (s *Server) siteError(id, reason, msg string) {
	if s.siteErrs == nil {
		s.siteErrs = map[string][2]string{}
	}
	old, had := s.siteErrs[id]
	now := [2]string{reason, msg}
	switch {
	case reason == "" && msg == "":
		if had {
			delete(s.siteErrs, id)
			s.log.Info("site error cleared", "client", id, "was", old[0])
		}
	case !had || old != now:
		s.siteErrs[id] = now
		if reason == "" {
			reason = "unspecified"
		}
		s.mu.Lock()
		if s.siteErrCounts == nil {
			s.siteErrCounts = map[[2]string]uint64{}
		}
		s.siteErrCounts[[2]string{id, reason}]++
		s.mu.Unlock()
		s.log.Warn("site error", "client", id, "reason", reason, "message", msg)
	}
}

// publishRunSpec moves the announcement's schema and transform to the
// retained run spec on the run topic (wire.RoundAnnouncement.ByDigest: the
// announcement keeps their digests) and publishes the spec when it is not
// the one this process last published: once per run and fit, and again
// after a restart, rather than with every round (wire RunSpec).
func (s *Server) publishRunSpec(a *wire.RoundAnnouncement) error {
	spec := a.ByDigest()
	if spec == nil {
		return nil
	}
	if len(spec.Transform) > 0 {
		spec.StatisticsSites = s.coord.StatisticsSites()
	}
	b, err := wire.Encode(spec)
	if err != nil {
		return fmt.Errorf("aggregator: encode the run spec: %w", err)
	}
	if !s.fed.specChanged(b) {
		return nil
	}
	s.log.Info("run spec published", "schema", a.SchemaDigest, "transform", a.TransformDigest, "bytes", len(b))
	s.publish(s.topics.Run(), true, b, "run spec")
	return nil
}

package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/dataset"
	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/learn/aggregate"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/learn/serveropt"
	"github.com/edgefl/edgefl/learn/split"
	"github.com/edgefl/edgefl/proto/round"
	"github.com/edgefl/edgefl/proto/secagg"
	"github.com/edgefl/edgefl/proto/uplink"
)

// Results is what a run writes to results.json.
type Results struct {
	Config  Config    `json:"config"`
	Data    DataInfo  `json:"data"`
	Optimum Optimum   `json:"optimum"`
	Runs    []AlgoRun `json:"runs"`
	// Sites are the sites of a --schema run.
	Sites []SiteInfo `json:"sites,omitempty"`
	// Model is the model every run trained (for saving the final weights).
	Model model.Model `json:"-"`
	sites *siteSet
}

// DataInfo describes the federated data set of a run.
type DataInfo struct {
	Name         string `json:"name"`
	Clients      int    `json:"clients"`
	TrainSamples int    `json:"train_samples"`
	TestSamples  int    `json:"test_samples"`
	Features     int    `json:"features"`
	Classes      int    `json:"classes"`
	Params       int    `json:"params"`
	MinClient    int    `json:"min_client_samples"`
	MaxClient    int    `json:"max_client_samples"`
	// SchemaDigest is the federation schema's digest (--schema runs).
	SchemaDigest string `json:"schema_digest,omitempty"`
	// PNI is FedSim's privacy-preserving non-IID index (seeds/002 eq. 15-18):
	// the spread of the clients' RMSE of one shared random model.
	PNI Float `json:"pni"`
}

// Optimum is the centralised optimum of F on the pooled training data.
type Optimum struct {
	TrainLoss    Float `json:"train_loss"`
	TestAccuracy Float `json:"test_accuracy"`
	GradNorm     Float `json:"grad_norm"`
	GradEvals    int   `json:"grad_evals"`
	Seconds      Float `json:"seconds"`
	Converged    bool  `json:"converged"`
	// Eval is the centralised optimum's federated evaluation (--schema
	// runs): the reference the federation's figures compare with.
	Eval *bundle.Evaluation `json:"eval,omitempty"`
}

// AlgoRun is one algorithm's trajectory.
type AlgoRun struct {
	Algo       string `json:"algo"`
	Family     string `json:"family"`
	Aggregator string `json:"aggregator"`
	Local      Local  `json:"local"`
	// ServerOpt is the server optimiser with its parameters (empty: none).
	ServerOpt string  `json:"server_opt,omitempty"`
	Rounds    []Round `json:"rounds"`
	// DP is the privacy the run spent (--dp; nil without).
	DP *DPRun `json:"dp,omitempty"`
	// Final is the last global model (written by --save-models).
	Final []float64 `json:"-"`
}

// Round is one row of the results: the global model after the round.
type Round struct {
	Round        int                `json:"round"`
	TrainLoss    Float              `json:"train_loss"`
	TestAccuracy Float              `json:"test_accuracy"`
	Gap          Float              `json:"gap"`
	DistToOpt    Float              `json:"dist_to_opt"`
	Participants int                `json:"participants"`
	Stragglers   int                `json:"stragglers"`
	GradEvals    int                `json:"grad_evals"`
	Seconds      Float              `json:"seconds"`
	BytesUp      int64              `json:"bytes_up"`
	BytesDown    int64              `json:"bytes_down,omitempty"`
	Metrics      map[string]float64 `json:"metrics,omitempty"`
	// Epsilon is the privacy spent after this round (--dp; 0: no DP).
	Epsilon Float `json:"epsilon,omitempty"`
	// Clip is the round's DP clip norm (--dp; it moves with adaptive
	// clipping).
	Clip Float `json:"clip,omitempty"`
	// EpsilonUnamplified is the largest per-site epsilon without
	// amplification by subsampling after this round (--dp): the unsampled
	// Gaussian over the rounds the site contributed to (docs/privacy.md,
	// "Sampling rate"), what holds against whoever knows the selection.
	EpsilonUnamplified Float `json:"epsilon_unamplified,omitempty"`
	// Eval is the federated evaluation on the sites' held-out rows
	// (--schema runs, evaluated rounds except round 0).
	Eval *bundle.Evaluation `json:"eval,omitempty"`
}

// DPRun is what --dp reports for one algorithm's run: the accountant's
// epsilon at Delta after Rounds rounds of sampling rate SamplingRate and
// noise multiplier Noise, and why it stopped early, if it did.
type DPRun struct {
	Epsilon      Float   `json:"epsilon"`
	Delta        float64 `json:"delta"`
	Noise        float64 `json:"noise_multiplier"`
	Clip         float64 `json:"clip"`
	SamplingRate float64 `json:"sampling_rate"`
	Rounds       int     `json:"rounds"`
	Budget       float64 `json:"epsilon_budget,omitempty"`
	// Stopped is "epsilon_budget" when the run ended before --rounds
	// because the next round would have exceeded the budget.
	Stopped string `json:"stopped,omitempty"`

	// EpsilonUnamplified is the largest per-site epsilon without
	// amplification (Round.EpsilonUnamplified) and MaxSiteRounds the
	// rounds of that site.
	EpsilonUnamplified Float `json:"epsilon_unamplified"`
	MaxSiteRounds      int   `json:"max_site_rounds"`
}

// env is what every algorithm of a run shares.
type env struct {
	cfg       Config
	fed       *dataset.Federated
	spec      model.Spec
	train     model.Data
	test      model.Data
	pooledM   model.Model
	xStar     []float64
	fStar     float64
	nTotal    int
	cands     []aggregate.Candidate
	stragKeep int  // selected clients per round that do full work
	sampled   bool // the selector draws rounds of random size: round(K_t(1-p)) of them do
	sites     *siteSet
	sq        *secagg.Quantizer // --secagg's quantiser (nil: off)
}

// Run executes the simulation. Progress lines go to progress (may be nil).
func Run(ctx context.Context, cfg Config, progress io.Writer) (*Results, error) {
	if progress == nil {
		progress = io.Discard
	}
	if cfg.Select == "" {
		cfg.Select = "uniform"
		if cfg.DP != nil && cfg.SecAgg == nil {
			cfg.Select = aggregate.DPSelector
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Workers <= 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	fed, sites, err := loadFederation(&cfg, progress)
	if err != nil {
		return nil, err
	}
	if len(fed.Clients) < cfg.PerRound {
		return nil, fmt.Errorf("--per-round %d: the data set has only %d clients", cfg.PerRound, len(fed.Clients))
	}
	if err := startDP(&cfg, len(fed.Clients)); err != nil {
		return nil, err
	}
	e := &env{cfg: cfg, fed: fed, sites: sites}
	if e.sq, err = secAggQuantizer(&cfg); err != nil {
		return nil, err
	}
	e.cfg = cfg
	if err := checkContrast(cfg); err != nil {
		return nil, err
	}
	if e.spec, err = modelSpecOf(cfg, fed, sites); err != nil {
		return nil, err
	}
	m, err := model.New(e.spec)
	if err != nil {
		return nil, fmt.Errorf("--model: %w", err)
	}
	e.pooledM = m
	for _, c := range fed.Clients {
		for _, d := range []model.Data{c.Train, c.Test} {
			if err := model.CheckTargets(e.spec, d); err != nil {
				return nil, fmt.Errorf("--dataset %s, client %s: %w", cfg.Dataset, c.ID, err)
			}
		}
	}
	e.train, e.test = fed.Pooled()
	e.nTotal = e.train.N
	if e.nTotal == 0 {
		return nil, fmt.Errorf("--dataset %s: no training samples", cfg.Dataset)
	}
	res := e.newResults(m, progress)

	// The centralised optimum: what every run is measured against.
	x0 := e.initial(m)
	cachePath := ""
	if cfg.OptimumCache != "" {
		extra := ""
		if sites != nil {
			extra = schemaCacheKey(sites.schema, cfg)
		}
		cachePath = optimumCachePath(cfg, e.spec, extra)
	}
	xs, opt, err := centralised(ctx, cfg, m, e.train, e.test, x0, cachePath, progress)
	if err != nil {
		return nil, err
	}
	e.xStar, e.fStar, res.Optimum = xs, float64(opt.TrainLoss), opt
	if sites != nil {
		if res.Optimum.Eval, err = sites.evaluate(e.spec, fed, 0, xs); err != nil {
			return nil, err
		}
		fmt.Fprintf(progress, "centralised optimum, held-out rows:%s\n", evalLine(sites.ids, res.Optimum.Eval))
	}
	if !res.Optimum.Converged {
		fmt.Fprintf(progress, "warning: the optimum did not reach ||grad F|| <= %g within %d gradient evaluations (--optimum-evals): gaps are relative to the best point found\n", cfg.OptimumTol, cfg.OptimumEvals)
	}
	e.stragKeep = int(math.Round(float64(cfg.PerRound) * (1 - cfg.Stragglers)))
	if sel, err := aggregate.NewSelector(cfg.Select); err == nil {
		_, e.sampled = sel.(aggregate.Sampler)
	}

	for _, a := range cfg.Algos {
		run, err := e.runAlgo(ctx, a, x0, progress)
		if err != nil {
			return res, fmt.Errorf("%s: %w", a.Label, err)
		}
		res.Runs = append(res.Runs, *run)
	}
	return res, nil
}

// modelSpecOf is the run's model: the schema's (a --schema run) or the
// flags' over the data's dimensions.
func modelSpecOf(cfg Config, fed *dataset.Federated, sites *siteSet) (model.Spec, error) {
	if sites != nil {
		return sites.modelSpec(cfg)
	}
	spec := model.Spec{Kind: cfg.Model, Inputs: fed.D, Classes: fed.Classes, L2: cfg.L2}
	if cfg.Model == model.KindMLP {
		spec.Hidden, spec.Activation = cfg.Hidden, cfg.Activation
	}
	if cfg.Model == model.KindLinear {
		spec.Classes = 0
	}
	return spec, nil
}

// startDP checks, before any work, that a --dp run can take even one round
// within its budget at the run's sampling rate K/N, and defaults the codec
// to fp32 (the uplink applies the clip, as the daemons send it).
func startDP(cfg *Config, clients int) error {
	if cfg.DP == nil {
		return nil
	}
	if cfg.Codec == "" {
		cfg.Codec = "fp32"
	}
	sel, err := aggregate.NewSelector(cfg.Select)
	if err != nil {
		return fmt.Errorf("--select: %w", err)
	}
	q := cfg.DP.ChargedRate(aggregate.SamplingRate(sel, cfg.PerRound, clients))
	if ok, eps, err := cfg.DP.Within(nil, q); err != nil {
		return fmt.Errorf("--dp: %w", err)
	} else if !ok {
		return fmt.Errorf("--dp-epsilon %g: even one round (q = %g, z = %g) spends epsilon %.4g", cfg.DP.Budget, q, cfg.DP.Noise, eps)
	}
	return nil
}

// newResults starts the run's results with what the data is (sizes, the
// PNI), prints it, and lists the selection's candidates.
func (e *env) newResults(m model.Model, progress io.Writer) *Results {
	fed, sites := e.fed, e.sites
	res := &Results{Config: e.cfg, Model: m, sites: sites, Data: DataInfo{
		Name: fed.Name, Clients: len(fed.Clients), TrainSamples: e.train.N, TestSamples: e.test.N,
		Features: fed.D, Classes: fed.Classes, Params: m.NumParams(), MinClient: math.MaxInt,
	}}
	if sites != nil {
		res.Sites, res.Data.SchemaDigest = sites.info, sites.schema.Digest()
	}
	for _, c := range fed.Clients {
		res.Data.MinClient = min(res.Data.MinClient, c.Train.N)
		res.Data.MaxClient = max(res.Data.MaxClient, c.Train.N)
		e.cands = append(e.cands, aggregate.Candidate{ID: c.ID, Samples: c.Train.N, Loss: math.NaN()})
	}
	res.Data.PNI = Float(e.pni())
	fmt.Fprintf(progress, "data %s: PNI %.4g\n", fed.Name, float64(res.Data.PNI))
	fmt.Fprintf(progress, "data %s: %d clients, %d train / %d test samples (per client %d..%d), %d features, %d classes, %d params\n",
		fed.Name, len(fed.Clients), e.train.N, e.test.N, res.Data.MinClient, res.Data.MaxClient, fed.D, fed.Classes, m.NumParams())
	return res
}

// centralised is the centralised optimum of m on the pooled training data
// from x0 (L-BFGS to cfg.OptimumTol within cfg.OptimumEvals gradient
// evaluations; read from, or else written to, cachePath when it is given).
func centralised(ctx context.Context, cfg Config, m model.Model, train, test model.Data, x0 []float64, cachePath string, progress io.Writer) ([]float64, Optimum, error) {
	t0 := time.Now()
	var xs []float64
	var rep proxsolver.Report
	var err error
	if cachePath != "" {
		xs, _ = readOptimum(cachePath, m.NumParams())
	}
	if xs == nil {
		xs, rep, err = proxsolver.Minimize(ctx, m, train, x0, cfg.OptimumTol, cfg.OptimumEvals)
		if err != nil && !errors.Is(err, proxsolver.ErrNotConverged) {
			return nil, Optimum{}, fmt.Errorf("centralised optimum: %w", err)
		}
		if cachePath != "" {
			if werr := writeOptimum(cachePath, xs); werr != nil {
				fmt.Fprintf(progress, "warning: optimum cache: %v\n", werr)
			}
		}
	}
	fStar := m.LossGrad(xs, train, nil)
	gn := gradNorm(m, xs, train)
	opt := Optimum{TrainLoss: Float(fStar), TestAccuracy: Float(m.Score(xs, test)), GradNorm: Float(gn),
		GradEvals: rep.GradEvals, Seconds: Float(time.Since(t0).Seconds()), Converged: gn <= cfg.OptimumTol}
	fmt.Fprintf(progress, "centralised optimum: F* = %.12g, ||grad F|| = %.2e (%d gradient evaluations, %.1fs), test accuracy %.4f\n",
		fStar, gn, rep.GradEvals, float64(opt.Seconds), float64(opt.TestAccuracy))
	return xs, opt, nil
}

// loadFederation builds the run's federated data: --dataset partitioned
// by --partition, or with --schema the sites' CSVs through the daemons'
// pipeline (buildSites, which may set cfg's site defaults).
func loadFederation(cfg *Config, progress io.Writer) (*dataset.Federated, *siteSet, error) {
	if cfg.Schema != "" {
		return buildSites(cfg, progress)
	}
	src, err := dataset.ParseSource(cfg.Dataset)
	if err != nil {
		return nil, nil, fmt.Errorf("--dataset: %w", err)
	}
	part, err := dataset.ParsePartition(cfg.Partition)
	if err != nil {
		return nil, nil, fmt.Errorf("--partition: %w", err)
	}
	fed, err := dataset.Build(src, part, dataset.BuildOptions{
		Clients: cfg.Clients, TestFraction: cfg.TestFrac, Seed: cfg.Seed,
		Standardize: cfg.Standardize, SyntheticDevices: cfg.Clients,
	})
	return fed, nil, err
}

func gradNorm(m model.Model, w []float64, d model.Data) float64 {
	g := make([]float64, len(w))
	m.LossGrad(w, d, g)
	return norm(g)
}

func norm(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x * x
	}
	return math.Sqrt(s)
}

func dist(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += (a[i] - b[i]) * (a[i] - b[i])
	}
	return math.Sqrt(s)
}

// job is one selected client's local work in a round.
type job struct {
	client    int
	epochs    int // 0: no epoch budget (exact FedSplit)
	straggler bool
}

type outcome struct {
	params []float64       // w_k, or FedSplit's new z_j (the client's exact state)
	frame  *uplink.Frame   // the encoded uplink update (nil without a codec)
	input  []uint32        // --secagg: the quantised update, the secure sum's input
	sumPen *uplink.Pending // --secagg, sum mode: what the input adds to the client's record
	rep    proxsolver.Report
	err    error
	// SCAFFOLD (scaffold.go): the encoded control delta (with a codec)
	// or the exact one, and the client's new c_i.
	ctrlPayload   []byte
	ctrlDelta, ci []float64
	// local is the contrastive objectives' new local model (the solve's
	// w before any tampering), the client's next previous model.
	local []float64
}

// algoState is the server's side of one algorithm's run across rounds:
// the global model, the clients' z (FedSplit), the uplink state, the
// worker pool and the codecs.
type algoState struct {
	a     Algo
	split bool
	agg   aggregate.Aggregator // FedAvg/FedProx family
	// opt is the server optimiser (FedAvg/FedProx family), ost its state.
	opt     serveropt.Params
	ost     serveropt.State
	screen  float64 // FedSplit's step bound factor (split.BoundedStep)
	sel     aggregate.Selector
	x       []float64
	z       map[int][]float64 // FedSplit: every known client's latest z
	local   map[int][]float64 // moon, fedsiam-da: each client's last local model
	cands   []aggregate.Candidate
	workers []*worker
	// serverCodec decodes the uplink, downCodec encodes the broadcast
	// model (nil: none).
	serverCodec, downCodec *quant.Codec
	// Uplink state (package uplink): each client's error-feedback residual
	// (FedAvg/FedProx family) and, for FedSplit, the server's decoded copy of
	// each z_j (the client keeps its exact z; what it has not yet got across
	// is the difference, sent in later rounds). One value serves as both
	// sides' record of the copy: uplink computes them alike.
	residual map[int][]float64
	zServer  map[int]*uplink.Copy
	// The FedSplit server step's state (split.BoundedStep), as the
	// aggregator keeps it: each client's standing, the reference step,
	// and the round's updates (decoded delta, against x or the copy).
	bstate map[int]split.SiteState
	bref   float64
	bwatch split.Watch
	bround map[int]splitUpdate
	// Central DP (cfg.DP): the accountant, the noise key and the sampling
	// rate of every round; the selection key (the daemon's is secret, this
	// one derived from --dp-noise-seed), the candidates' order by id (the
	// coordinator draws from its pool sorted by id), the round's fixed
	// denominator, and each client's count of rounds contributed to with
	// the accountant of the most charged one (q = 1).
	acc       *dp.Accountant
	key       [32]byte
	q         float64
	selKey    *[32]byte
	byID      []int
	m         int
	siteRnds  map[string]int
	unsampled *dp.Accountant
	// FedSplit under DP runs in sum mode, as the daemons do (package
	// uplink, sum.go): the server's S and m, each client's record c_j, and
	// the round's contributions with what each will add to its record.
	sum    *uplink.SumState
	rec    map[int]*uplink.Record
	sumCs  []uplink.SumContribution
	sumPen map[int]uplink.Pending
	// initial is x_0 under central DP's fixed roster (every client counted
	// from round 1 with the record x_0, as the aggregator counts every
	// site registered when round 1 is drawn): a client's first update is a
	// delta against it, and its z_j starts there.
	initial []float64
	// clip is the round's clip norm (cfg.DP.Clip, or adaptive clipping's
	// estimate), bits the round's clip bits (true: not clipped).
	clip float64
	bits []bool
	// scaffold is SCAFFOLD's control variates (nil: another family).
	scaffold *scaffoldState
}

// newAlgoState sets up algorithm a's run from the global model x0.
func (e *env) newAlgoState(a Algo, x0 []float64) (*algoState, error) {
	cfg := e.cfg
	s := &algoState{a: a, split: a.Family == FedSplit || a.Family == FedProxSplit,
		x: append([]float64(nil), x0...), z: make(map[int][]float64),
		cands:    append([]aggregate.Candidate(nil), e.cands...),
		residual: make(map[int][]float64), zServer: make(map[int]*uplink.Copy), bstate: make(map[int]split.SiteState)}
	var err error
	s.opt = cfg.serverOptOf(a)
	if !s.split {
		if s.agg, err = aggregate.NewAggregator(a.Agg, cfg.Seed); err != nil {
			return nil, fmt.Errorf("aggregator: %w", err)
		}
	} else if s.screen, err = split.ParseServerStep(a.Agg); err != nil {
		return nil, err
	}
	if s.sel, err = aggregate.NewSelector(cfg.Select); err != nil {
		return nil, fmt.Errorf("--select: %w", err)
	}
	am, err := e.algoModel(a, s)
	if err != nil {
		return nil, err
	}
	s.workers = make([]*worker, cfg.Workers)
	for i := range s.workers {
		s.workers[i] = &worker{m: am.Clone()}
		if cfg.Codec != "" {
			if s.workers[i].codec, err = quant.Parse(cfg.Codec); err != nil {
				return nil, fmt.Errorf("--codec: %w", err)
			}
			if d, n := s.workers[i].codec.MinDim(), am.NumParams(); d > n {
				return nil, fmt.Errorf("--codec %s covers %d parameters, the model has %d", cfg.Codec, d, n)
			}
		}
	}
	if cfg.Codec != "" {
		s.serverCodec, _ = quant.Parse(cfg.Codec)
	}
	if cfg.Downlink != "" {
		if s.downCodec, err = quant.Parse(cfg.Downlink); err != nil {
			return nil, fmt.Errorf("--downlink: %w", err)
		}
		// Round 1's model is broadcast through the downlink codec too, as
		// the aggregator's first checkpoint holds it (a random MLP
		// initialisation is not a float32 grid point; zeros are).
		if s.x, err = downlinked(s.downCodec, s.x); err != nil {
			return nil, fmt.Errorf("--downlink: %w", err)
		}
	}
	if cfg.DP != nil {
		seed := cfg.DPNoiseSeed
		if seed == 0 {
			seed = cfg.Seed
		}
		n := len(e.fed.Clients)
		s.acc, s.key, s.q = dp.NewAccountant(nil), dp.TestKey(seed), cfg.DP.ChargedRate(aggregate.SamplingRate(s.sel, cfg.PerRound, n))
		k := dp.TestSelectionKey(seed)
		s.selKey, s.m = &k, aggregate.DPDenominator(s.sel, cfg.PerRound, n)
		s.byID = make([]int, n)
		for i := range s.byID {
			s.byID[i] = i
		}
		slices.SortStableFunc(s.byID, func(a, b int) int { return strings.Compare(e.fed.Clients[a].ID, e.fed.Clients[b].ID) })
		s.siteRnds, s.unsampled = map[string]int{}, dp.NewAccountant(nil)
		if s.split && cfg.SecAgg == nil {
			ids := make([]string, n)
			for i, c := range e.fed.Clients {
				ids[i] = c.ID
			}
			s.sum, s.rec = &uplink.SumState{Fixed: true}, map[int]*uplink.Record{}
			if err := s.sum.StartRoster(ids, s.x); err != nil {
				return nil, err
			}
			s.initial = slices.Clone(s.x)
			for c := range n {
				s.z[c] = s.initial // replaced, never written through
			}
		}
		s.clip = cfg.DP.Clip
	}
	if a.Family == Scaffold {
		s.scaffold = newScaffoldState(len(x0))
	}
	if s.split && cfg.SecAgg != nil && s.sum == nil {
		// Sum mode under secure aggregation (docs/privacy.md).
		s.sum, s.rec = &uplink.SumState{}, map[int]*uplink.Record{}
	}
	return s, nil
}

func (e *env) runAlgo(ctx context.Context, a Algo, x0 []float64, progress io.Writer) (*AlgoRun, error) {
	cfg := e.cfg
	s, err := e.newAlgoState(a, x0)
	if err != nil {
		return nil, err
	}
	run := &AlgoRun{Algo: a.Label, Family: a.Family, Aggregator: a.Agg, Local: a.solved()}
	if s.opt.On() {
		run.ServerOpt = s.opt.String()
	}
	if d := cfg.DP; d != nil {
		run.DP = &DPRun{Delta: d.Delta, Noise: d.Noise, Clip: d.Clip, SamplingRate: s.q, Budget: d.Budget}
	}
	run.Rounds = append(run.Rounds, e.evaluate(0, e.classifier(s.x)))
	for t := 1; t <= cfg.Rounds; t++ {
		if err := ctx.Err(); err != nil {
			return run, err
		}
		if cfg.DP != nil {
			ok, eps, err := cfg.DP.Within(s.acc, s.q)
			if err != nil {
				return run, err
			}
			if !ok {
				run.DP.Stopped = "epsilon_budget"
				fmt.Fprintf(progress, "%-16s stopped before round %d: it would spend epsilon %.4g > --dp-epsilon %g\n", a.Label, t, eps, cfg.DP.Budget)
				break
			}
		}
		row, evaluated, err := e.round(ctx, s, t)
		if err != nil {
			return run, err
		}
		run.Rounds = append(run.Rounds, row)
		epsText := ""
		if run.DP != nil {
			run.DP.Epsilon, run.DP.Rounds = row.Epsilon, t
			run.DP.EpsilonUnamplified, run.DP.MaxSiteRounds = row.EpsilonUnamplified, int(s.unsampled.Rounds)
			epsText = fmt.Sprintf("  epsilon %.4g (per site, unamplified %.4g)", float64(row.Epsilon), float64(row.EpsilonUnamplified))
		}
		fmt.Fprintf(progress, "%-16s round %4d/%d  loss %.6f  gap %.3e  acc %.4f  clients %d (stragglers %d)  %.2fs%s\n",
			a.Label, t, cfg.Rounds, float64(row.TrainLoss), float64(row.Gap), float64(row.TestAccuracy), row.Participants, row.Stragglers, row.Seconds, epsText)
		if row.Eval != nil {
			fmt.Fprintf(progress, "%-16s round %4d/%d  held-out:%s\n", a.Label, t, cfg.Rounds, evalLine(e.sites.ids, row.Eval))
		}
		if evaluated && (math.IsNaN(float64(row.TrainLoss)) || math.IsInf(float64(row.TrainLoss), 0)) {
			return run, fmt.Errorf("round %d: training diverged (loss %v); lower --lr or --step", t, row.TrainLoss)
		}
	}
	run.Final = s.x
	return run, nil
}

// round runs round t: selection, the clients' work on the worker pool
// (with fault injection and the client side of the uplink), the server's
// side of the uplink, the server step, the downlink and the evaluation. It
// reports whether the round was evaluated.
func (e *env) round(ctx context.Context, s *algoState, t int) (Round, bool, error) {
	cfg := e.cfg
	start := time.Now()
	jobs := e.assignWork(t, s.selectClients(cfg, t), s.a)
	row := Round{Round: t}
	outs := e.solveAll(ctx, s, jobs, t)
	ups, cs, frames, err := e.receiveAll(s, t, jobs, outs, &row)
	if err != nil {
		return row, false, err
	}
	switch {
	case e.sq != nil:
		err = e.secAggStep(s, t, jobs, outs, &row)
	case s.acc != nil:
		err = s.privateStep(e.cfg.DP, t, s.m, cs, &row)
	default:
		err = s.serverStep(t, len(e.fed.Clients), ups, &row)
	}
	if err != nil {
		return row, false, err
	}
	if err := s.downlink(cfg.Seed, t, &row); err != nil {
		return row, false, err
	}
	if cfg.trace != nil {
		cfg.trace(s.a.Label, t, frames, s.x)
	}
	evaluated := cfg.EvalEvery <= 1 || t%cfg.EvalEvery == 0 || t == cfg.Rounds
	row.TrainLoss, row.TestAccuracy, row.Gap, row.DistToOpt = Float(math.NaN()), Float(math.NaN()), Float(math.NaN()), Float(math.NaN())
	if evaluated {
		ev := e.evaluate(t, e.classifier(s.x))
		row.TrainLoss, row.TestAccuracy, row.Gap, row.DistToOpt = ev.TrainLoss, ev.TestAccuracy, ev.Gap, ev.DistToOpt
		if e.sites != nil {
			if row.Eval, err = e.sites.evaluate(e.spec, e.fed, t, e.classifier(s.x)); err != nil {
				return row, false, fmt.Errorf("round %d: evaluation: %w", t, err)
			}
		}
	}
	row.Seconds = Float(time.Since(start).Seconds())
	return row, evaluated, nil
}

// selectClients draws round t's clients; faulty clients take part in every
// round (the robustness setting).
func (s *algoState) selectClients(cfg Config, t int) []int {
	if s.byID != nil {
		// Under DP, as the coordinator draws: candidates by id, from the
		// selection key's stream.
		cands := make([]aggregate.Candidate, len(s.byID))
		for i, c := range s.byID {
			cands[i] = s.cands[c]
		}
		var picked []int
		for _, i := range s.sel.Select(t, cands, cfg.PerRound, streams.Selection(cfg.Seed, s.selKey, t, 0)) {
			picked = append(picked, s.byID[i])
		}
		return picked
	}
	picked := s.sel.Select(t, s.cands, cfg.PerRound, streams.Of(cfg.Seed, streams.Select, t, 0))
	for c := 0; c < cfg.Faulty; c++ {
		if !slices.Contains(picked, c) {
			picked = append(picked, c)
		}
	}
	return picked
}

// receiveAll is the server's side of round t's uplink: it counts the
// round's participants, stragglers, work and bytes in row, decodes each
// frame against the server's base, and updates the uplink state (residuals
// and copies are per client and each client runs at most once per round,
// so they are updated here, outside the workers). It returns the FedAvg
// family's updates and, for cfg.trace, the frames.
func (e *env) receiveAll(s *algoState, t int, jobs []job, outs []outcome, row *Round) ([]aggregate.Update, []uplink.Contribution, map[string]*uplink.Frame, error) {
	var ups []aggregate.Update
	var cs []uplink.Contribution        // under DP: the decoded deltas
	var frames map[string]*uplink.Frame // for cfg.trace
	if e.cfg.trace != nil {
		frames = map[string]*uplink.Frame{}
	}
	s.sumCs, s.sumPen, s.bits = nil, map[int]uplink.Pending{}, nil
	s.bround = map[int]splitUpdate{}
	if s.scaffold != nil {
		s.scaffold.reset()
	}
	for i, j := range jobs {
		if j.straggler {
			row.Stragglers++
		}
		if outs[i].params == nil {
			continue
		}
		id := e.fed.Clients[j.client].ID
		if outs[i].err != nil {
			return nil, nil, nil, fmt.Errorf("round %d, client %s: %w", t, id, outs[i].err)
		}
		row.Participants++
		row.GradEvals += outs[i].rep.GradEvals
		s.cands[j.client].Loss = outs[i].rep.AnchorLoss
		received := outs[i].params
		if f := outs[i].frame; f != nil {
			if frames != nil {
				frames[id] = f
			}
			row.BytesUp += int64(len(f.Payload))
			s.bits = append(s.bits, !f.Clipped.Clipped)
			if s.sum != nil {
				// Sum mode: the server keeps the decoded delta for the
				// round's sum; the client what it will add to its record.
				d, err := s.serverCodec.Decode(f.Payload, nil)
				if err != nil || len(d) != len(s.x) {
					return nil, nil, nil, fmt.Errorf("round %d, client %s: decode (%d values): %w", t, id, len(d), err)
				}
				s.sumCs = append(s.sumCs, uplink.SumContribution{Client: id, Join: uplink.IsJoin(f.Header), Delta: d})
				s.sumPen[j.client] = *f.Sum
				s.z[j.client] = outs[i].params
				continue
			}
			var d []float64
			var err error
			if d, received, err = receive(s.serverCodec, f, s.x, s.zServer[j.client]); err != nil {
				return nil, nil, nil, fmt.Errorf("round %d, client %s: %w", t, id, err)
			}
			if s.split {
				s.bround[j.client] = splitUpdate{delta: d, reset: uplink.BaseOf(f.Header) != uplink.BaseCopy}
			}
			if s.acc != nil {
				cs = append(cs, uplink.Contribution{Client: id, Delta: d})
			}
			s.residual[j.client] = f.Residual
		} else {
			row.BytesUp += int64(8 * len(outs[i].params)) // exact float64 vectors
			if s.split {
				// Exact vectors: the same protocol without a codec, the
				// delta against the server's copy (x before any).
				base, reset := s.x, true
				if cp := s.zServer[j.client]; cp != nil {
					base, reset = cp.Z, false
				}
				scale := 1.0
				if sc, ok := e.cfg.faultyScale(j.client, t); ok && s.sum == nil {
					scale = sc
				}
				d := make([]float64, len(base))
				received = make([]float64, len(base))
				for k := range d {
					d[k] = (outs[i].params[k] - base[k]) * scale
					received[k] = base[k] + d[k]
				}
				s.bround[j.client] = splitUpdate{delta: d, reset: reset}
			}
		}
		if s.a.Contrast != "" {
			s.local[j.client] = outs[i].local // as the site commits it with its update
		}
		if s.split {
			s.z[j.client] = outs[i].params
			s.zServer[j.client] = &uplink.Copy{Round: uint64(t), Z: received}
			continue
		}
		if s.scaffold != nil {
			if err := s.scaffold.receive(s.serverCodec, id, j.client, outs[i]); err != nil {
				return nil, nil, nil, fmt.Errorf("round %d, client %s: %w", t, id, err)
			}
		}
		ups = append(ups, aggregate.Update{Client: id, Params: received,
			Samples: e.fed.Clients[j.client].Train.N, AnchorGrad: outs[i].rep.AnchorGrad, Loss: outs[i].rep.AnchorLoss})
	}
	return ups, cs, frames, nil
}

// privateStep is the central-DP server step of round t (uplink.NoisyMean
// over the m invited clients' re-clipped deltas, noise from the round's
// stream), then the accountant's charge for the round.
func (s *algoState) privateStep(c *dp.Config, t, m int, cs []uplink.Contribution, row *Round) error {
	var next []float64
	var err error
	row.Clip = Float(s.clip)
	if s.sum != nil {
		next, err = s.sumStep(c, t, row)
	} else {
		next, err = uplink.NoisyMean(s.x, cs, uplink.Private{Clip: s.clip, Noise: c.UpdateNoise(), Denominator: m}, dp.NoiseRand(s.key, uint64(t)))
		if err == nil {
			// The optimiser steps on the noisy mean, as the aggregator.
			err = s.optStep(t, next)
		}
	}
	if err != nil {
		return fmt.Errorf("round %d: %w", t, err)
	}
	s.x = next
	if a := c.Adaptive; a != nil {
		// Adaptive clipping, as the aggregator (uplink.NextClip over the
		// round's bits and its m invited clients).
		if s.clip, err = uplink.NextClip(*a, s.clip, s.bits, m, dp.BitNoiseRand(s.key, uint64(t))); err != nil {
			return fmt.Errorf("round %d: %w", t, err)
		}
	}
	ids := make([]string, 0, len(cs)+len(s.sumCs))
	for _, ct := range cs {
		ids = append(ids, ct.Client)
	}
	for _, ct := range s.sumCs { // sum mode
		ids = append(ids, ct.Client)
	}
	return s.account(c, t, ids, row)
}

// account charges round t to the accountant (at the run's sampling rate)
// and counts it for each contributing site (ids), as the coordinator does:
// the amplified epsilon and the largest per-site unamplified one in row.
func (s *algoState) account(c *dp.Config, t int, ids []string, row *Round) error {
	if err := s.acc.Step(s.q, c.Noise); err != nil {
		return fmt.Errorf("round %d: %w", t, err)
	}
	eps, _ := s.acc.Epsilon(c.Delta)
	row.Epsilon = Float(eps)
	most := 0
	for _, id := range ids {
		s.siteRnds[id]++
		most = max(most, s.siteRnds[id])
	}
	for int(s.unsampled.Rounds) < most {
		if err := s.unsampled.Step(1, c.Noise); err != nil {
			return fmt.Errorf("round %d: %w", t, err)
		}
	}
	if s.unsampled.Rounds > 0 {
		eps, _ = s.unsampled.Epsilon(c.Delta)
		row.EpsilonUnamplified = Float(eps)
	}
	return nil
}

// sumStep is sum mode's server step of round t, as the aggregator's
// (uplink.SumState.CloseCentral over the round's contributions), then each
// contributing client's record advanced as its receipt advances it at a
// site (uplink.Advance): every update of a simulated round is stored.
func (s *algoState) sumStep(c *dp.Config, t int, row *Round) ([]float64, error) {
	next, err := s.sum.CloseCentral(uint64(t), s.x, s.sumCs, uplink.Private{Clip: s.clip, Noise: c.UpdateNoise()}, dp.NoiseRand(s.key, uint64(t)))
	if err != nil {
		return nil, err
	}
	for client, p := range s.sumPen {
		if s.rec[client], err = uplink.Advance(s.rec[client], uint64(t), p); err != nil {
			return nil, err
		}
	}
	row.Metrics = map[string]float64{"split_counted": float64(s.sum.M), "split_joined": float64(len(uplink.JoinersOf(s.sumCs)))}
	return next, nil
}

// serverStep computes the next global model: FedSplit's robust step over
// the server's copies of every known z_j (in client order, of the n
// clients: a deterministic sum), or the aggregator over the round's
// updates; without either the model stays.
func (s *algoState) serverStep(t, n int, ups []aggregate.Update, row *Round) error {
	next := make([]float64, len(s.x))
	switch {
	case s.split:
		if len(s.z) == 0 {
			return nil
		}
		var in []split.SiteInput
		var ids []int
		for c := range n {
			if v, ok := s.zServer[c]; ok {
				u := s.bround[c]
				in = append(in, split.SiteInput{Z: v.Z, Delta: u.delta, Reset: u.reset, State: s.bstate[c]})
				ids = append(ids, c)
			}
		}
		rep, kept, err := round.SplitStep(next, s.x, in, s.screen, s.bref, s.bwatch)
		if kept {
			row.Metrics = map[string]float64{"non_finite": 1} // the model is kept, as the aggregator keeps it
			return nil
		}
		if err != nil {
			return err
		}
		s.bref, s.bwatch = rep.Ref, rep.Watch
		clipped, aside := 0, 0
		for k, r := range rep.Sites {
			s.bstate[ids[k]] = r.State
			if r.Clipped {
				clipped++
			}
			if r.State.Aside {
				aside++
			}
		}
		if clipped+aside > 0 {
			row.Metrics = map[string]float64{"excluded": float64(aside), "clipped": float64(clipped)}
		}
		s.x = next
	case len(ups) > 0:
		rep, err := s.agg.Aggregate(s.x, ups, next)
		if err != nil {
			return fmt.Errorf("round %d: %w", t, err)
		}
		if err := s.optStep(t, next); err != nil {
			return err
		}
		if s.scaffold != nil {
			if err := s.scaffold.step(n, s.downCodec); err != nil {
				return fmt.Errorf("round %d: %w", t, err)
			}
		}
		row.Metrics = rep.Metrics
		s.x = next
	}
	return nil
}

// downlink applies the downlink codec to the global model: the aggregator
// applies the model it broadcasts, so that the clients' FedSplit
// reflections use the same x as the server.
func (s *algoState) downlink(seed uint64, t int, row *Round) error {
	if s.downCodec == nil {
		return nil
	}
	frame, err := s.downCodec.Encode(nil, s.x, nil, streams.Of(seed, streams.Codec, t, -1))
	if err != nil {
		return fmt.Errorf("round %d downlink: %w", t, err)
	}
	if s.x, err = s.downCodec.Decode(frame, nil); err != nil {
		return fmt.Errorf("round %d downlink: %w", t, err)
	}
	row.BytesDown = int64(len(frame))
	return nil
}

// assignWork gives each picked client its epoch budget. As in the FedProx
// reference, round(K(1-p)) of the K selected clients do the full E epochs and
// the others get a uniformly random number of epochs in [1, E). The draw
// depends only on the seed, the round and the picked clients, so algorithms
// with the same selection see the same stragglers.
func (e *env) assignWork(t int, picked []int, a Algo) []job {
	rng := streams.Of(e.cfg.Seed, streams.Straggle, t, 0)
	order := rng.Perm(len(picked))
	keep := min(e.stragKeep, len(picked))
	if e.sampled {
		keep = int(math.Round(float64(len(picked)) * (1 - e.cfg.Stragglers)))
	}
	jobs := make([]job, len(picked))
	for rank, i := range order {
		j := job{client: picked[i], epochs: a.Local.MaxEpochs}
		if rank >= keep {
			j.straggler = true
			if a.Local.MaxEpochs > 1 {
				j.epochs = 1 + rng.IntN(a.Local.MaxEpochs-1)
			}
		}
		jobs[i] = j
	}
	if a.Family == FedSplit { // the exact reference: no work budget
		for i := range jobs {
			jobs[i].epochs, jobs[i].straggler = 0, false
		}
	}
	return jobs
}

func (e *env) work(ctx context.Context, m model.Model, a Algo, j job, x, zj []float64, t int, shift []float64) outcome {
	if a.Contrast != "" {
		return e.contrastWork(ctx, m, a, j, x, zj, t)
	}
	c := e.fed.Clients[j.client]
	rng := streams.Of(e.cfg.Seed, streams.Solve, t, j.client)
	if e.cfg.siteSeed != nil {
		rng = streams.Site(*e.cfg.siteSeed+uint64(j.client), c.ID, uint64(t), streams.SiteSolve)
	}
	p := a.solved()
	budget := proxsolver.Budget{MaxEpochs: j.epochs}
	if a.Family == FedSplit { // the exact reference: no work budget
		budget.MaxGradEvals = 100000
	}
	pop := round.Population{Clients: uint64(len(e.fed.Clients)), TotalSamples: uint64(max(e.nTotal, 0))}
	if e.cfg.DP != nil {
		// Under DP the announcement leaves the total sample count out (one
		// patient's row changes it), and a FedSplit site's step is then s
		// (docs/privacy.md, "As built (FedSplit)"): the agent's rule.
		pop = round.Population{}
	}
	w, err := round.Prepare(a.Family, p, pop, round.Params{}, c.Train.N)
	if err != nil {
		return outcome{err: err}
	}
	if a.Family == Scaffold {
		w.Solver.Mu, w.Solver.Shift = 0, shift // as the site's scaffoldPrepare
	}
	if zj == nil {
		zj = x // z_j starts at the first global model the client sees
	}
	// The site's work as a site does it (package round); a diverged solve
	// sends the received model or z_j unchanged, as a site does.
	res, err := w.Solve(ctx, m, c.Train, x, zj, budget, rng, false)
	return outcome{params: res.Vec, rep: res.Report, err: err}
}

func (e *env) evaluate(t int, x []float64) Round {
	loss := e.pooledM.LossGrad(x, e.train, nil)
	r := Round{Round: t, TrainLoss: Float(loss), TestAccuracy: Float(math.NaN()), Gap: Float(loss - e.fStar), DistToOpt: Float(dist(x, e.xStar))}
	if e.test.N > 0 {
		r.TestAccuracy = Float(e.pooledM.Score(x, e.test))
	}
	return r
}

type worker struct {
	m     model.Model
	codec *quant.Codec
}

// solveAll runs the round's jobs on the worker pool: each selected client's
// local work (e.work), a faulty client's scaling, and the client side of the
// uplink (uplink.Encode against the client's residual or copy). FedAvg's
// stragglers are dropped before they run. Workers only read the uplink
// state; runAlgo updates it from the outcomes.
func (e *env) solveAll(ctx context.Context, s *algoState, jobs []job, t int) []outcome {
	a := s.a
	outs := make([]outcome, len(jobs))
	var wg sync.WaitGroup
	next := make(chan int)
	for _, wk := range s.workers {
		wg.Add(1)
		go func(wk *worker) {
			defer wg.Done()
			for i := range next {
				outs[i] = e.solveJob(ctx, s, wk, jobs[i], t)
			}
		}(wk)
	}
	for i, j := range jobs {
		if a.Family == FedAvg && j.straggler {
			continue // FedAvg drops stragglers
		}
		next <- i
	}
	close(next)
	wg.Wait()
	return outs
}

// solveJob is one selected client's round in solveAll: its local work
// (e.work), a faulty client's scaling, SCAFFOLD's control delta and the
// client side of the uplink (uplink.Encode against its residual or copy).
func (e *env) solveJob(ctx context.Context, s *algoState, wk *worker, j job, t int) outcome {
	cfg := e.cfg
	a, x, z, zServer, residual, initial := s.a, s.x, s.z, s.zServer, s.residual, s.initial
	isSplit := a.Family == FedSplit || a.Family == FedProxSplit
	c := j.client
	var shift []float64
	if s.scaffold != nil {
		shift = s.scaffold.shift(c)
	}
	prev := z[c]
	if a.Contrast != "" {
		prev = s.local[c] // read only: receiveAll replaces it
	}
	o := e.work(ctx, wk.m, a, j, x, prev, t, shift)
	y := o.params
	if s.scaffold != nil && cfg.Faulty > 0 {
		y = slices.Clone(o.params) // delta c from the honest solve, as the agent's (its poison hook changes only delta y)
	}
	var tamper func([]float64)
	if sc, ok := cfg.faultyScale(c, t); ok && o.params != nil {
		if isSplit && s.sum == nil && e.sq == nil {
			// A faulty FedSplit site scales the delta it
			// sends, against the server's copy of its z, as
			// the attacking agent does: its own z stays as
			// computed (receiveAll without a codec).
			tamper = scaleBy(sc)
		} else {
			// A faulty site sends its delta scaled: w = x + scale (w - x).
			for k, v := range o.params {
				o.params[k] = x[k] + sc*(v-x[k])
			}
		}
	}
	if e.sq != nil && o.err == nil && o.params != nil {
		o.input, o.sumPen, o.err = e.secAggInput(s, j.client, t, o.params, x)
	} else if wk.codec != nil && o.err == nil && o.params != nil {
		var f uplink.Frame
		rng := streams.Of(cfg.Seed, streams.Codec, t, c)
		if cfg.siteSeed != nil {
			rng = streams.Site(*cfg.siteSeed+uint64(c), e.fed.Clients[c].ID, uint64(t), streams.SiteCodec)
		}
		if s.sum != nil {
			f, o.err = uplink.EncodeSum(wk.codec, uplink.SumUpdate{Round: uint64(t), Z: o.params, Global: x, Initial: initial, Record: s.rec[c], Clip: s.clip}, rng)
		} else {
			u := uplink.Update{Split: isSplit, Round: uint64(t), Sent: o.params, Global: x, Residual: residual[c], Copy: zServer[c], Tamper: tamper}
			if cfg.DP != nil {
				u.Clip = s.clip
			}
			f, o.err = uplink.Encode(wk.codec, u, rng)
			if o.err != nil && tamper != nil {
				// A poisoned delta the codec cannot carry
				// (beyond float32): the attacking agent's
				// round fails and it sends nothing, keeping
				// its z.
				o.params, o.err = nil, nil
			}
			if s.scaffold != nil && o.err == nil && o.params != nil {
				o.ctrlPayload, _, o.ci, o.err = s.scaffold.clientControl(wk.codec, c, x, y, o.rep, a.Local.LR, rng)
			}
		}
		o.frame = &f
	} else if s.scaffold != nil && o.err == nil && o.params != nil {
		_, o.ctrlDelta, o.ci, o.err = s.scaffold.clientControl(nil, c, x, y, o.rep, a.Local.LR, nil)
	}
	return o
}

// receive is the aggregator's side of a client's frame: decoded by the
// server's codec and applied to its base (uplink.Receive), as the
// aggregator does.
func receive(c *quant.Codec, f *uplink.Frame, x []float64, held *uplink.Copy) (d, v []float64, err error) {
	if d, err = c.Decode(f.Payload, nil); err != nil {
		return nil, nil, err
	}
	if len(d) != len(x) {
		return nil, nil, fmt.Errorf("decoded %d values, want %d", len(d), len(x))
	}
	v, err = uplink.Receive(f.Header, d, x, held)
	return d, v, err
}

// pni computes the privacy-preserving non-IID index: the server draws one
// random model, every client reports only the RMSE of that model's
// predictions of its own training labels, and the index is the mean over
// clients of the L2 distance between its RMSE and the others'.
func (e *env) pni() float64 {
	m := e.pooledM.Clone()
	w := make([]float64, m.NumParams())
	rng := streams.Of(e.cfg.Seed, streams.Init, 1, 0)
	scale := 1 / math.Sqrt(float64(max(e.fed.D, 1)))
	for i := range w {
		w[i] = rng.NormFloat64() * scale
	}
	var rmse []float64
	for _, c := range e.fed.Clients {
		if c.Train.N == 0 {
			continue
		}
		pred := make([]float64, c.Train.N)
		m.Predict(w, c.Train, pred)
		r, err := aggregate.RMSE(pred, c.Train.Y)
		if err != nil {
			return math.NaN()
		}
		rmse = append(rmse, r)
	}
	v, err := aggregate.PNI(rmse)
	if err != nil {
		return math.NaN()
	}
	return v
}

// splitUpdate is a FedSplit client's update of a round as the server
// decoded it: the delta, and whether it is against x (reset) or the
// server's copy of its z.
type splitUpdate struct {
	delta []float64
	reset bool
}

// scaleBy returns the poisoning hook of a faulty site: its delta times s.
func scaleBy(s float64) func([]float64) {
	return func(d []float64) {
		for i := range d {
			d[i] *= s
		}
	}
}

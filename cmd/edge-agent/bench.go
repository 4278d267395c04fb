package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"

	"github.com/edgefl/edgefl/internal/cli"
	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/proto/round"
)

// benchConfig is what `edge-agent bench` measures.
type benchConfig struct {
	Samples, Features, Classes int
	Model                      string // model.KindLogReg or model.KindMLP
	Hidden                     int    // MLP hidden units
	L2                         float64
	// Train are the solve's training parameters (solver, epochs, batch,
	// lr, mu; gamma 0: the whole budget is spent), as a round's.
	Train    round.Params
	Deadline time.Duration // the round deadline the budget must fit
	Margin   float64       // fraction of the deadline kept free
	Seed     uint64
	JSON     bool
	// Config is the site's configuration file (--config): its data and
	// model replace the synthetic problem (site, set by parseBenchFlags);
	// SchemaFile the federation's schema for data read by one.
	Config, SchemaFile string
	site               *siteBench
}

func defaultBenchConfig() benchConfig {
	return benchConfig{
		Samples: 2000, Features: 784, Classes: 10, Model: model.KindLogReg, Hidden: 64, L2: 1e-4,
		Train:    round.Bench.Params,
		Deadline: 60 * time.Second, Margin: 0.5, Seed: 1,
	}
}

// marginNote says what the margin is for; it is printed with the budget.
const marginNote = "the margin covers receiving the model, encoding, persisting and publishing\n" +
	"the update, other load on the gateway, and thermal throttling in long solves\n" +
	"(this benchmark runs for seconds, a round for minutes)"

// benchResult is the report, printed as text or JSON.
type benchResult struct {
	Version    string `json:"version"`
	GOOS       string `json:"goos"`
	GOARCH     string `json:"goarch"`
	NumCPU     int    `json:"num_cpu"`
	GOMAXPROCS int    `json:"gomaxprocs"`

	Model           model.Spec `json:"model"`
	Params          int        `json:"params"`
	Samples         int        `json:"samples"`
	Seed            uint64     `json:"seed"`
	Solver          string     `json:"solver"`
	Epochs          int        `json:"epochs"` // asked for
	Batch           int        `json:"batch,omitempty"`
	LR              float64    `json:"lr,omitempty"`
	Mu              float64    `json:"mu"`
	GenerateSeconds float64    `json:"generate_seconds"` // synthetic data; with --config, reading the site's
	// Data and ShapeFrom say what was benchmarked: the site's data (read
	// locally, never sent) and where the model's shape comes from (empty:
	// the synthetic problem of the flags).
	Data      string `json:"data,omitempty"`
	ShapeFrom string `json:"shape_from,omitempty"`

	SolveSeconds float64 `json:"solve_seconds"`
	// SolveCPUSeconds is the process's CPU time (user and system, all
	// threads) during the solve, 0 where it is not measured: on a shared
	// machine it says what the solve cost when SolveSeconds also counts
	// waiting for a core.
	SolveCPUSeconds  float64 `json:"solve_cpu_seconds,omitempty"`
	EpochsDone       float64 `json:"epochs_done"` // training passes (Report.Epochs)
	GradEvals        int     `json:"grad_evals"`
	SampleGrads      int64   `json:"sample_grads"` // per-sample gradients, anchor and final measurement included
	Stop             string  `json:"stop"`
	AnchorLoss       float64 `json:"anchor_loss"`
	Loss             float64 `json:"loss"`
	Gamma            float64 `json:"gamma"`
	TrainAccuracy    float64 `json:"train_accuracy"`
	FullPassSeconds  float64 `json:"full_pass_seconds"`  // one full-batch loss and gradient, timed before the solve
	SecondsPerEpoch  float64 `json:"seconds_per_epoch"`  // one training epoch (see secondsPerEpoch)
	SamplesPerSecond float64 `json:"samples_per_second"` // training throughput: samples / seconds_per_epoch

	PeakRSSBytes  uint64 `json:"peak_rss_bytes"`
	PeakRSSSource string `json:"peak_rss_source"`

	DeadlineSeconds float64 `json:"deadline_seconds"`
	Margin          float64 `json:"margin"`          // fraction of the deadline kept free
	OverheadEpochs  int     `json:"overhead_epochs"` // full passes a solve makes besides training
	// FitEpochs is how many epochs per round fit deadline·(1-margin);
	// BudgetEpochs the suggestion: FitEpochs capped at MaxSuggested.
	FitEpochs    int `json:"fit_epochs"`
	BudgetEpochs int `json:"budget_epochs"`
	MaxSuggested int `json:"max_suggested"`
}

// runBench benchmarks a local FedProx solve on this device and suggests the
// work budget (epochs per round) that fits a round deadline.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseBenchFlags(args, stderr)
	if err != nil {
		return err
	}
	res, err := bench(ctx, cfg)
	if err != nil {
		return err
	}
	res.Version = version
	if cfg.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return wrapErr("writing the report", err)
		}
		return nil
	}
	return writeBenchText(stdout, res)
}

// benchTrainingFlags are the training flags bench registers.
var benchTrainingFlags = []string{round.FlagSolver, round.FlagEpochs, round.FlagBatch, round.FlagLR, round.FlagMu}

func parseBenchFlags(args []string, stderr io.Writer) (benchConfig, error) {
	cfg := defaultBenchConfig()
	fs := cli.NewFlagSet("bench", stderr, fmt.Sprintf("usage: edge-agent bench [--config FILE [--schema FILE]] [flags]\n\n"+
		round.Bench.Note(benchTrainingFlags...)+"\n"+
		"Times a FedProx local solve on this device and reports samples per second,\n"+
		"seconds per epoch, peak resident memory and the epochs per round that fit\n"+
		"--deadline (at most %d: the local solve stops at its gamma or the round's budget\n"+
		"long before that).\n\n"+
		"With --config (the site's edge-agent.conf) it trains on the site's own data,\n"+
		"read locally and never sent (nothing connects to the broker; no credentials are\n"+
		"read), with the site's model shape: for data read by the federation's schema\n"+
		"(data = csv:PATH) from --schema FILE with a preprocessing fitted on this site's\n"+
		"statistics, or else from the final model bundle of the site's last run\n"+
		"(model_out or the state file); otherwise from the data's features and labels.\n"+
		"The model kind is the aggregator's --model: give the same --model (and --hidden).\n"+
		"Without --config it times a synthetic problem (Gaussian features, labels from a\n"+
		"random linear teacher) of --samples x --features and --classes.\n\nflags:\n", maxSuggestedEpochs))
	fs.StringVar(&cfg.Config, "config", "", "the site's configuration `FILE` (edge-agent run --config): benchmark its data and model instead of a synthetic problem")
	fs.StringVar(&cfg.SchemaFile, "schema", "", "with --config and data read by a schema: the federation's schema `FILE` (as broker-agg run --schema)")
	fs.IntVar(&cfg.Samples, "samples", cfg.Samples, "local training samples (synthetic problem)")
	fs.IntVar(&cfg.Features, "features", cfg.Features, "features per sample (synthetic problem)")
	fs.IntVar(&cfg.Classes, "classes", cfg.Classes, "classes (synthetic problem)")
	fs.StringVar(&cfg.Model, "model", cfg.Model, "model, as the aggregator's --model: logreg | binary-logreg | linear | mlp (with a schema, logreg is the task's linear model)")
	fs.IntVar(&cfg.Hidden, "hidden", cfg.Hidden, "hidden units (mlp)")
	fs.Float64Var(&cfg.L2, "l2", cfg.L2, "L2 regularisation lambda of (lambda/2)||w||^2")
	round.Register(fs, nil, &cfg.Train, round.Bench, map[string]string{round.FlagEpochs: "training epochs to time (passes over the data)"},
		benchTrainingFlags...)
	fs.DurationVar(&cfg.Deadline, "deadline", cfg.Deadline, "round deadline the suggested budget must fit (also stops the benchmark)")
	fs.Float64Var(&cfg.Margin, "margin", cfg.Margin, "fraction of the deadline kept free when sizing the budget, in [0, 1)")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed (data, initial MLP weights, SGD order)")
	fs.BoolVar(&cfg.JSON, "json", false, "print the report as JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, err
		}
		return cfg, cli.ErrUsage
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if cfg.Config == "" {
		if cfg.SchemaFile != "" {
			return cfg, errors.New("--schema needs --config FILE (the site's data)")
		}
		return cfg, cfg.validate()
	}
	var synthetic []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "samples" || f.Name == "features" || f.Name == "classes" {
			synthetic = append(synthetic, "--"+f.Name)
		}
	})
	if len(synthetic) > 0 {
		return cfg, fmt.Errorf("%s: with --config the site's data decides", strings.Join(synthetic, ", "))
	}
	if err := cfg.checkModelKind(); err != nil {
		return cfg, err
	}
	site, err := loadSiteBench(cfg)
	if err != nil {
		return cfg, err
	}
	cfg.site = &site
	cfg.Samples, cfg.Features, cfg.Classes = site.data.N, site.data.D, site.spec.Classes
	return cfg, cfg.validate()
}

func (c benchConfig) checkModelKind() error {
	switch c.Model {
	case model.KindLogReg, model.KindBinaryLogReg, model.KindLinear, model.KindMLP:
		return nil
	}
	return fmt.Errorf("--model %q: want logreg, binary-logreg, linear or mlp", c.Model)
}

func (c benchConfig) validate() error {
	switch {
	case c.Samples < 1:
		return fmt.Errorf("--samples %d: want at least 1", c.Samples)
	case c.Train.MaxEpochs < 1:
		return fmt.Errorf("--epochs %d: want at least 1", c.Train.MaxEpochs)
	case c.Deadline <= 0:
		return fmt.Errorf("--deadline %v: want a positive duration", c.Deadline)
	case !(c.Margin >= 0 && c.Margin < 1):
		return fmt.Errorf("--margin %v: want a fraction in [0, 1)", c.Margin)
	case c.checkModelKind() != nil:
		return c.checkModelKind()
	}
	if err := c.Train.Validate(round.FedProx); err != nil {
		return err
	}
	// The model's and the solver's own checks cover the rest (feature and
	// class counts, hidden units, l2, lr, batch, mu) with their messages.
	if _, err := model.New(c.spec()); err != nil {
		return wrapErr("model", err)
	}
	if err := c.solverConfig().Validate(); err != nil {
		return wrapErr("solver", err)
	}
	// The synthetic data (n·d float64s) must be addressable on 32-bit gateways.
	if n := int64(c.Samples) * int64(c.Features); n > maxBenchValues {
		return fmt.Errorf("--samples %d x --features %d: more than %d feature values (%d MiB)", c.Samples, c.Features, maxBenchValues, maxBenchValues*8>>20)
	}
	return nil
}

// maxBenchValues bounds samples·features: 512 MiB of float64s.
const maxBenchValues = 1 << 26

func (c benchConfig) spec() model.Spec {
	if c.site != nil {
		return c.site.spec
	}
	s := model.Spec{Kind: c.Model, Inputs: c.Features, L2: c.L2}
	if c.Model == model.KindLogReg || c.Model == model.KindMLP {
		s.Classes = c.Classes
	}
	if c.Model == model.KindMLP {
		s.Hidden, s.Activation = c.Hidden, model.ActivationReLU
	}
	return s
}

func (c benchConfig) solverConfig() proxsolver.Config {
	// Gamma 0: no target, the benchmark spends its whole budget.
	t := c.Train
	return proxsolver.Config{Solver: t.Solver, Mu: t.Mu, Gamma: t.Gamma, LR: t.LR, Batch: t.Batch}
}

// overheadEpochs is the number of full passes over the data a solve makes
// besides its training epochs (see the proxsolver package documentation):
// SGD evaluates the full gradient at the anchor and measures the returned
// point; L-BFGS evaluates the anchor and counts every later evaluation as an
// epoch.
func overheadEpochs(solver string) int {
	if solver == proxsolver.LBFGS {
		return 1
	}
	return 2
}

// benchData draws n samples of d standard Gaussian features (what
// standardised data looks like) and labels them with a random linear teacher:
// y = argmax_c x·W[:, c] + b[c] with W, b standard Gaussian.
func benchData(n, d, classes int, seed uint64) model.Data {
	rng := rand.New(rand.NewPCG(seed, 0x62656e6368)) // "bench"
	teacher := make([]float64, d*classes+classes)
	for i := range teacher {
		teacher[i] = rng.NormFloat64()
	}
	w, b := teacher[:d*classes], teacher[d*classes:]
	data := model.Data{N: n, D: d, X: make([]float64, n*d), Y: make([]float64, n)}
	logits := make([]float64, classes)
	for i := range n {
		x := data.X[i*d : (i+1)*d]
		for j := range x {
			x[j] = rng.NormFloat64()
		}
		copy(logits, b)
		for j, xj := range x {
			row := w[j*classes : (j+1)*classes]
			for c := range logits {
				logits[c] += xj * row[c]
			}
		}
		best := 0
		for c := range logits {
			if logits[c] > logits[best] {
				best = c
			}
		}
		data.Y[i] = float64(best)
	}
	return data
}

// bench generates the data and times one local solve with the real clock.
func bench(ctx context.Context, cfg benchConfig) (benchResult, error) {
	if err := cfg.validate(); err != nil {
		return benchResult{}, err
	}
	res := benchResult{
		GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		Model: cfg.spec(), Samples: cfg.Samples, Seed: cfg.Seed, Solver: cfg.Train.Solver, Epochs: cfg.Train.MaxEpochs, Mu: cfg.Train.Mu,
		DeadlineSeconds: cfg.Deadline.Seconds(), Margin: cfg.Margin, OverheadEpochs: overheadEpochs(cfg.Train.Solver),
	}
	if cfg.Train.Solver == proxsolver.SGD {
		res.Batch, res.LR = cfg.Train.Batch, cfg.Train.LR
	}
	clk := clock.Real{}

	t0 := clk.Now()
	var data model.Data
	if cfg.site != nil {
		data = cfg.site.data
		res.Data, res.ShapeFrom = cfg.site.dataDesc, cfg.site.shapeFrom
	} else {
		k := max(cfg.Classes, 2)
		if cfg.Model == model.KindBinaryLogReg {
			k = 2
		}
		data = benchData(cfg.Samples, cfg.Features, k, cfg.Seed)
		if cfg.Model == model.KindLinear {
			for i := range data.Y {
				data.Y[i] -= float64(k-1) / 2 // a real-valued target
			}
		}
	}
	res.GenerateSeconds = clk.Now().Sub(t0).Seconds()
	m, err := model.New(res.Model)
	if err != nil {
		return res, wrapErr("model", err)
	}
	if err := model.CheckTargets(res.Model, data); err != nil {
		return res, wrapErr("synthetic data", err)
	}
	res.Params = m.NumParams()

	rng := rand.New(rand.NewPCG(cfg.Seed, 0x736f6c7665)) // "solve"
	anchor := m.InitParams(rng)

	// Two full passes first: the first warms the caches and page tables, the
	// second times what each of the solve's overhead passes costs.
	grad := make([]float64, len(anchor))
	m.LossGrad(anchor, data, grad)
	t0 = clk.Now()
	m.LossGrad(anchor, data, grad)
	res.FullPassSeconds = clk.Now().Sub(t0).Seconds()

	cpu0, cpuOK := processCPU()
	start := clk.Now()
	budget := proxsolver.Budget{MaxEpochs: cfg.Train.MaxEpochs, Deadline: start.Add(cfg.Deadline), Clock: clk}
	w, rep, err := proxsolver.Solve(ctx, m, data, anchor, nil, cfg.solverConfig(), budget, rng)
	solveTime := clk.Now().Sub(start)
	if cpu1, ok := processCPU(); cpuOK && ok {
		res.SolveCPUSeconds = (cpu1 - cpu0).Seconds()
	}
	if err != nil {
		return res, wrapErr("local solve", err)
	}
	if rep.Stop == proxsolver.StopCanceled {
		return res, fmt.Errorf("local solve: %w", context.Cause(ctx))
	}
	res.SolveSeconds = solveTime.Seconds()
	res.EpochsDone, res.GradEvals, res.SampleGrads, res.Stop = rep.Epochs, rep.GradEvals, rep.SampleGrads, rep.Stop
	res.AnchorLoss, res.Loss, res.Gamma = rep.AnchorLoss, rep.Loss, rep.Gamma
	res.TrainAccuracy = m.Score(w, data)
	res.SecondsPerEpoch = secondsPerEpoch(res.SolveSeconds, res.FullPassSeconds, rep.Epochs, float64(rep.SampleGrads)/float64(cfg.Samples))
	if res.SecondsPerEpoch > 0 {
		res.SamplesPerSecond = float64(cfg.Samples) / res.SecondsPerEpoch
	}
	res.FitEpochs = budgetEpochs(cfg.Deadline, cfg.Margin, res.SecondsPerEpoch, res.FullPassSeconds, res.OverheadEpochs)
	res.MaxSuggested = maxSuggestedEpochs
	res.BudgetEpochs = min(res.FitEpochs, maxSuggestedEpochs)
	res.PeakRSSBytes, res.PeakRSSSource = peakRSS()
	return res, nil
}

// secondsPerEpoch is the time of one training epoch: the solve's time less
// its overhead passes (passes - epochs full passes of fullPass seconds each),
// spread over its epochs. A mini-batch epoch costs more than a full-batch
// pass, so this is steadier than the solve's time over all its passes, which
// it falls back to when the subtraction leaves nothing (timer noise in very
// short runs) or no epoch was trained.
func secondsPerEpoch(solve, fullPass, epochs, passes float64) float64 {
	if epochs > 0 {
		if t := solve - (passes-epochs)*fullPass; t > 0 {
			return t / epochs
		}
	}
	if passes > 0 {
		return solve / passes
	}
	return 0
}

// budgetEpochs returns the training epochs per round whose solve fits in
// deadline·(1-margin) at perEpoch seconds per training epoch plus overhead
// full passes of fullPass seconds each; 0 when not even one epoch fits.
func budgetEpochs(deadline time.Duration, margin, perEpoch, fullPass float64, overhead int) int {
	if perEpoch <= 0 || deadline <= 0 {
		return 0
	}
	e := math.Floor((deadline.Seconds()*(1-margin) - float64(overhead)*fullPass) / perEpoch)
	switch {
	case e < 1 || math.IsNaN(e):
		return 0
	case e > math.MaxInt32:
		return math.MaxInt32
	}
	return int(e)
}

// peakRSS returns the process's peak resident set size: VmHWM from
// /proc/self/status on Linux, else the Go runtime's mapped memory at this
// moment (runtime/metrics), which is a lower bound of the peak.
func peakRSS() (uint64, string) {
	if status, err := os.ReadFile("/proc/self/status"); err == nil {
		if v, ok := parseVmHWM(status); ok {
			return v, "VmHWM"
		}
	}
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() == metrics.KindUint64 {
		return s[0].Value.Uint64(), "runtime/metrics /memory/classes/total:bytes (Go runtime memory now, not a peak)"
	}
	return 0, "unavailable"
}

// parseVmHWM reads the "VmHWM:  1234 kB" line of a /proc/PID/status file.
func parseVmHWM(status []byte) (uint64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, false
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil || kb > math.MaxUint64/1024 {
			return 0, false
		}
		return kb * 1024, true
	}
	return 0, false
}

func writeBenchText(w io.Writer, r benchResult) error {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	const mib = 1 << 20
	p("edge-agent %s bench on %s/%s, %d CPUs (the solve runs on one goroutine)\n", r.Version, r.GOOS, r.GOARCH, r.NumCPU)
	shape := fmt.Sprintf("%d features x %d classes", r.Model.Inputs, r.Model.Classes)
	switch r.Model.Kind {
	case model.KindMLP:
		shape = fmt.Sprintf("%d features x %d hidden (%s) x %d classes", r.Model.Inputs, r.Model.Hidden, r.Model.Activation, r.Model.Classes)
	case model.KindBinaryLogReg, model.KindLinear:
		shape = fmt.Sprintf("%d features", r.Model.Inputs)
	}
	p("model        %s, %s, %d parameters\n", r.Model.Kind, shape, r.Params)
	if r.Data != "" {
		p("             shape from %s\n", r.ShapeFrom)
		p("data         %d samples of this site's data %s, read locally (nothing is sent)\n", r.Samples, r.Data)
	} else {
		p("data         %d synthetic samples (seed %d), generated in %.2f s; --config FILE benchmarks this site's data and model\n", r.Samples, r.Seed, r.GenerateSeconds)
	}
	if r.Solver == proxsolver.SGD {
		p("solver       sgd, %d epochs, batch %d, lr %g, mu %g\n", r.Epochs, r.Batch, r.LR, r.Mu)
	} else {
		p("solver       %s, %d epochs, mu %g\n", r.Solver, r.Epochs, r.Mu)
	}
	p("solve        %.3f s: %.3g training epochs + %d overhead passes, %d per-sample gradients, stopped by %s\n",
		r.SolveSeconds, r.EpochsDone, r.OverheadEpochs, r.SampleGrads, r.Stop)
	if r.SolveCPUSeconds > 0 {
		p("cpu          %.3f s of process CPU time during the solve (all threads)\n", r.SolveCPUSeconds)
	}
	p("loss         %.4f -> %.4f (gamma %.3g), training accuracy %.1f%%\n", r.AnchorLoss, r.Loss, r.Gamma, 100*r.TrainAccuracy)
	p("throughput   %.0f samples/s, %.4f s per epoch (a full-batch pass: %.4f s)\n", r.SamplesPerSecond, r.SecondsPerEpoch, r.FullPassSeconds)
	p("peak memory  %.1f MiB (%s)\n", float64(r.PeakRSSBytes)/mib, r.PeakRSSSource)
	deadline := seconds(r.DeadlineSeconds)
	p("work budget  %d epochs per round fit the %s deadline with a %.0f%% margin:\n", r.FitEpochs, deadline, 100*r.Margin)
	p("             %.1f s of compute, %d full overhead passes included;\n", r.DeadlineSeconds*(1-r.Margin), r.OverheadEpochs)
	p("             %s\n", strings.ReplaceAll(marginNote, "\n", "\n             "))
	if r.FitEpochs > r.BudgetEpochs {
		p("suggested    max_epochs = %d (capped at %d: %d epochs fit, but the local solve stops at the\n", r.BudgetEpochs, r.MaxSuggested, r.FitEpochs)
		p("             round's gamma or budget, the aggregator's --max-epochs, long before; this device\n")
		p("             is not what limits a round's work, and max_epochs = 0 leaves it to the round)\n")
	} else if r.BudgetEpochs > 0 {
		p("suggested    max_epochs = %d in the site's configuration: the device cap on the local epochs of a\n", r.BudgetEpochs)
		p("             round (the round's own budget, the aggregator's --max-epochs, applies when smaller)\n")
	}
	switch {
	case r.Stop == proxsolver.StopDeadline:
		p("warning      the solve hit the %s deadline before %d epochs: this device cannot do that much work in a round\n", deadline, r.Epochs)
	case r.BudgetEpochs == 0:
		p("warning      not even one epoch fits: use fewer samples, a smaller model or a longer deadline\n")
	case r.SolveSeconds < 1:
		p("note         the solve took under a second: raise --epochs for steadier figures\n")
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return wrapErr("writing the report", err)
	}
	return nil
}

// seconds formats a duration in seconds as "60s", or "1.5ms" below a second.
func seconds(s float64) string {
	if s >= 1 {
		return strconv.FormatFloat(s, 'g', -1, 64) + "s"
	}
	return time.Duration(s * float64(time.Second)).String()
}

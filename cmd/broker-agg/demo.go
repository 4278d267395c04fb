package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/edgefl/edgefl/data/dataset"
	"github.com/edgefl/edgefl/internal/cli"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/serveropt"
	"github.com/edgefl/edgefl/node/aggregator"
	"github.com/edgefl/edgefl/proto/round"
	"github.com/edgefl/edgefl/sim/localfed"
)

// demoFlags are `broker-agg demo`'s flags.
type demoFlags struct {
	clients, perRound, rounds  int
	algo, agg, data, partition string
	seed                       uint64
	dir, model                 string
	hidden                     int
	l2                         float64
	params                     round.Params
	codec                      string
	timeout                    time.Duration
	quorum                     float64
	metricsAddr, logLevel      string
	schema, siteColumn         string
	evalEvery                  int
	clientsGiven               bool // --clients was on the command line
	dp                         dpFlags
	secagg                     secAggFlags
	serverOpt                  serverOptFlags
	opt                        serveropt.Params // serverOpt's, checked
}

func demoFlagSet(stderr io.Writer) (*flag.FlagSet, *demoFlags) {
	f := &demoFlags{}
	fs := cli.NewFlagSet("demo", stderr, "usage: broker-agg demo [flags]\n       broker-agg demo --schema FILE --dataset csv:PATH [--site-column NAME --partition natural | --partition iid --clients N ...]\n\n"+demoNote()+"\nEmbedded broker + aggregator + N edge agents in one process over real MQTT\n(loopback TCP, per-site passwords, the federation ACL), each with its own\nstate file. Prints one line per round; Ctrl-C stops it.\n\nWith --schema, the federation of a schema: each site reads its own CSV (its\nrows of --dataset, split as `broker-agg simulate --schema` splits them) by\nthe schema, sends statistics before round 1, evaluates on its held-out rows\nevery --eval-every rounds, and writes the final model bundle to its\nmodel_out. The end prints the bundle's path and the federation's and each\nsite's held-out figures next to the centralised reference.\n\nflags:\n")
	fs.IntVar(&f.clients, "clients", 5, "number of edge agents N (with --schema and --partition natural: one per site of --site-column)")
	fs.IntVar(&f.perRound, "per-round", 0, "clients selected per round K (0: all)")
	fs.IntVar(&f.rounds, "rounds", 20, "rounds")
	round.Register(fs, &f.algo, &f.params, round.Demo, nil, round.FlagAlgorithm)
	fs.StringVar(&f.agg, "aggregator", "", "aggregator SPEC (FedAvg/FedProx families)")
	fs.StringVar(&f.data, "dataset", "synthetic:1,1", "data SPEC, as simulate's --dataset")
	fs.StringVar(&f.partition, "partition", "natural", "partition SPEC: natural | iid | dirichlet:ALPHA | classes:K (with --schema: natural needs --site-column; the others deal the rows to --clients sites, as simulate does)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the data, the partition and the selection")
	fs.StringVar(&f.dir, "dir", "", "keep the state files in `DIR` (default: a temporary directory, removed at exit)")
	fs.StringVar(&f.model, "model", model.KindLogReg, "model: logreg | binary-logreg | linear | mlp")
	fs.IntVar(&f.hidden, "hidden", 64, "hidden units (mlp)")
	fs.Float64Var(&f.l2, "l2", 0.01, "L2 coefficient (makes the pooled objective strongly convex: FedSplit then converges linearly)")
	round.Register(fs, nil, &f.params, round.Demo, map[string]string{
		round.FlagStep: "FedSplit step size s (about 1/sqrt(l2 L); see docs/simulate.md)",
		round.FlagMu:   "FedProx proximal weight; for moon and fedsiam-da the contrastive term's weight",
	}, demoTrainingFlags[1:]...)
	fs.StringVar(&f.codec, "codec", "fp32", "uplink codec spec")
	fs.DurationVar(&f.timeout, "round-timeout", time.Minute, "round deadline")
	fs.Float64Var(&f.quorum, "quorum-fraction", 1, "fraction of the selection a round closes with at its deadline")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "127.0.0.1:0", "serve the aggregator's console (/), /metrics and /status on `ADDR` (port 0: a free one); its URL is printed; '' turns it off")
	fs.StringVar(&f.logLevel, "log-level", "warn", "log level of the daemons (stderr): debug | info | warn | error")
	fs.StringVar(&f.schema, "schema", "", "federation schema `FILE`: --dataset is then csv:PATH, partitioned into sites as simulate --schema does; each site's rows go to a CSV of its own in the demo directory, which its agent reads by the schema (model_out next to it); the run has a statistics phase, federated evaluation and a final bundle, compared at the end with the centralised reference on the same rows and preprocessing")
	fs.StringVar(&f.siteColumn, "site-column", "", "with --schema and --partition natural: the column `NAME` naming each row's site (one agent per site)")
	fs.IntVar(&f.evalEvery, "eval-every", 5, "with --schema: the sites evaluate every E rounds and at the end")
	f.dp.register(fs, true, true)
	f.secagg.register(fs, true)
	f.serverOpt.register(fs)
	return fs, f
}

// demoTrainingFlags are the training flags demo registers.
var demoTrainingFlags = []string{round.FlagAlgorithm, round.FlagSolver, round.FlagMu, round.FlagStep, round.FlagRelax,
	round.FlagGamma, round.FlagLR, round.FlagBatch, round.FlagMaxEpochs, round.FlagTau}

// demoNote is the first line of demo's help and output: the defaults it
// needs that differ from run's (round.Demo), as flags.
func demoNote() string { return round.Demo.Note(demoTrainingFlags...) }

// demoNoteInline is demoNote at the end of the output's first line.
func demoNoteInline() string {
	n := strings.TrimSuffix(demoNote(), ".")
	return strings.ToLower(n[:1]) + n[1:]
}

// runDemo is `broker-agg demo`: the embedded broker, the aggregator and N
// edge agents in one process, over real MQTT (sim/localfed). With
// --schema it is runDemoSchema.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, f := demoFlagSet(stderr)
	var cfgFlag string
	if err := parseFlags(fs, args, &cfgFlag); err != nil {
		return err
	}
	if f.clients < 1 || f.rounds < 1 {
		return errors.New("--clients and --rounds: want >= 1")
	}
	solverGiven := false
	fs.Visit(func(fl *flag.Flag) {
		f.clientsGiven = f.clientsGiven || fl.Name == "clients"
		solverGiven = solverGiven || fl.Name == "solver"
	})
	if f.algo == aggregator.AlgoScaffold && !solverGiven {
		f.params.Solver = "sgd" // SCAFFOLD's control variates count SGD steps
	}
	var err error
	if f.opt, err = f.serverOpt.params(); err != nil {
		return err
	}
	log, err := newLogger(stderr, "text", f.logLevel)
	if err != nil {
		return err
	}
	if f.schema != "" {
		if f.secagg.on {
			return errors.New("--secagg with --schema: the per-site statistics and evaluation reports are not summed securely (docs/privacy.md)")
		}
		return runDemoSchema(ctx, f, log, stdout)
	}
	return runDemoData(ctx, f, log, stdout)
}

// demoData is the federation of a demo without --schema: --clients sites
// of --dataset's partition, and the pooled test data.
type demoData struct {
	fed  *dataset.Federated
	part dataset.Partition
	spec model.Spec
	test model.Data
}

func loadDemoData(f *demoFlags) (*demoData, error) {
	src, err := dataset.ParseSource(f.data)
	if err != nil {
		return nil, fmt.Errorf("--dataset: %w", err)
	}
	part, err := dataset.ParsePartition(f.partition)
	if err != nil {
		return nil, fmt.Errorf("--partition: %w", err)
	}
	fed, err := dataset.Build(src, part, dataset.BuildOptions{Clients: f.clients, Seed: f.seed})
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	if len(fed.Clients) < f.clients {
		return nil, fmt.Errorf("the data has %d clients, fewer than --clients %d", len(fed.Clients), f.clients)
	}
	spec := model.Spec{Kind: f.model, Inputs: fed.D, Classes: fed.Classes, L2: f.l2}
	if f.model == model.KindMLP {
		spec.Hidden, spec.Activation = f.hidden, model.ActivationReLU
	}
	_, test := fed.Pooled()
	if test.N == 0 {
		test, _ = fed.Pooled()
	}
	return &demoData{fed: fed, part: part, spec: spec, test: test}, nil
}

// stateDir is the demo's state directory: --dir, or a temporary one that
// cleanup removes.
func (f *demoFlags) stateDir() (dir string, cleanup func(), err error) {
	return localfed.StateDir(f.dir, "edgefl-demo-")
}

// perRound is the K of a demo of n sites.
func (f *demoFlags) perRoundOf(n int) int {
	if f.perRound <= 0 || f.perRound > n {
		return n
	}
	return f.perRound
}

// serverConfig is the aggregator's configuration of a demo (localfed sets
// its federation, connection and state file).
func (f *demoFlags) serverConfig(k int, spec model.Spec, log *slog.Logger) aggregator.ServerConfig {
	return aggregator.ServerConfig{
		K: k, QuorumFraction: f.quorum, RoundTimeout: f.timeout, Settle: 300 * time.Millisecond, MaxReselections: -1,
		Rounds: f.rounds, Seed: f.seed, Algorithm: f.algo, Aggregator: f.agg, Params: f.params, ServerOpt: f.opt,
		Model: spec, Codec: f.codec, MetricsAddr: f.metricsAddr, Logger: log,
	}
}

// runDemoData runs a demo without --schema: one line per round with the
// test loss and accuracy, and at the end the centralised optimum's.
func runDemoData(ctx context.Context, f *demoFlags, log *slog.Logger, stdout io.Writer) error {
	d, err := loadDemoData(f)
	if err != nil {
		return err
	}
	stateDir, cleanup, err := f.stateDir()
	if err != nil {
		return err
	}
	defer cleanup()
	ids := localfed.SiteIDs(f.clients, 2)
	sites := make([]localfed.Site, len(ids))
	for i, id := range ids {
		data := d.fed.Clients[i].Train
		sites[i] = localfed.Site{ID: id, Data: &data}
	}
	k := f.perRoundOf(f.clients)
	start := time.Now()
	took := ""
	if est, ok := f.estimate(k); ok {
		took = fmt.Sprintf("; about %d s on a 2-core machine", int(est.Round(time.Second)/time.Second))
	}
	fmt.Fprintf(stdout, "demo: %d sites, %d per round, %d rounds of %s on %s (%s partition), model %s with %d parameters; %s%s\n",
		f.clients, k, f.rounds, f.algo, f.data, d.part, f.model, mustParams(d.spec), demoNoteInline(), took)
	sc := f.serverConfig(k, d.spec, log)
	if sc.DP, err = f.dp.config(float64(k)/float64(f.clients), f.rounds, k); err != nil {
		return err
	}
	sc.SecAgg = f.secagg.settings()
	sc.Eval = &d.test
	sc.OnRound = func(rr aggregator.RoundReport) {
		eps := ""
		if sc.DP != nil {
			eps = fmt.Sprintf("  epsilon %.4g (per site, unamplified %.4g)", rr.Epsilon, rr.EpsilonUnamplified)
		}
		fmt.Fprintf(stdout, "%5d  %-9s  %-10d  %-12.6g  %-9s  %s%s\n", rr.Round,
			fmt.Sprintf("%d/%d", len(rr.Contributors), len(rr.Contributors)+len(rr.Stragglers)), len(rr.Stragglers),
			rr.EvalLoss, fmt.Sprintf("%.2f%%", 100*rr.EvalScore), time.Since(start).Round(time.Millisecond), eps)
	}
	lf, err := localfed.Start(ctx, localfed.Config{Dir: stateDir, Sites: sites, Seed: f.seed, Server: sc, Logger: log,
		Serving: func(lf *localfed.Federation) {
			fmt.Fprintf(stdout, "broker %s (per-site passwords, ACL on edgefl/%s/), state in %s\n", lf.Broker.Addr(), demoFederation, stateDir)
			printConsole(lf.Server, stdout)
			fmt.Fprintf(stdout, "%5s  %-9s  %-10s  %-12s  %-9s  %s\n", "round", "clients", "stragglers", "test loss", "accuracy", "elapsed")
		}})
	if err != nil {
		return err
	}
	lf.Wait(ctx)
	if err := lf.Stop(); err != nil {
		return err
	}
	if v, _ := lf.Server.Watch(); v.StopReason == aggregator.StopDPBudget && v.Privacy != nil {
		fmt.Fprintf(stdout, "stopped after %d rounds: the next would spend more than --dp-epsilon %g (spent %.4g)\n",
			v.Privacy.Rounds, v.Privacy.Budget, v.Privacy.Epsilon)
	}
	if x, r := lf.Server.Global(); r > f.rounds {
		if err := printDemoOptimum(ctx, f, d, x, start, stdout); err != nil {
			return err
		}
	}
	if f.dir != "" {
		fmt.Fprintf(stdout, "state kept in %s: broker-agg status --state %s\n", stateDir, lf.StatePath)
	}
	return nil
}

// estimate is how long a demo on synthetic data takes on a 2-core machine,
// k sites a round: about 1 s to start and stop, plus 20 ms per selected
// site and round. Measured with `broker-agg demo` on a 2-core machine at a
// load average of 15 (wall time): 5 sites x 20 rounds (the default)
// 2.4-2.9 s, 5 x 60 5.6 s, 3 x 20 2.4 s, 10 x 20 6.2 s, 20 x 40 21 s. No
// estimate (false) for other data, whose local solves cost more, or with
// secure aggregation's four phases a round.
func (f *demoFlags) estimate(k int) (time.Duration, bool) {
	if !strings.HasPrefix(f.data, "synthetic") || f.secagg.on {
		return 0, false
	}
	return time.Second + time.Duration(k*f.rounds)*20*time.Millisecond, true
}

// demoFederation is the federation name of a demo.
const demoFederation = "demo"

// printDemoOptimum prints the final model's test figures and those of the
// model a central server would fit on all the sites' training data pooled:
// what the federation is measured against.
func printDemoOptimum(ctx context.Context, f *demoFlags, d *demoData, x []float64, start time.Time, stdout io.Writer) error {
	m, _ := model.New(d.spec)
	x = x[:m.NumParams()] // fedsiam-da's prediction head follows the classifier's parameters
	fmt.Fprintf(stdout, "done: %d rounds in %s; final model: test loss %.6g, accuracy %.2f%%%s\n", f.rounds,
		time.Since(start).Round(time.Millisecond), m.LossGrad(x, d.test, nil), 100*m.Score(x, d.test), majorityNote(d.spec, d.test, m.Score(x, d.test)))
	var pooled model.Data
	for _, c := range d.fed.Clients[:f.clients] {
		pooled.X = append(pooled.X, c.Train.X...)
		pooled.Y = append(pooled.Y, c.Train.Y...)
		pooled.N += c.Train.N
	}
	pooled.D = d.fed.D
	xs, rep, err := proxsolver.Minimize(context.WithoutCancel(ctx), m, pooled, nil, 1e-10, 3000)
	note := ""
	if errors.Is(err, proxsolver.ErrNotConverged) {
		note = fmt.Sprintf(" (best point after %d gradient evaluations, ||grad|| %.1e)", rep.GradEvals, rep.GradNorm)
	} else if err != nil {
		return fmt.Errorf("centralised optimum: %w", err)
	}
	fmt.Fprintf(stdout, "centralised optimum on the pooled training data%s: test loss %.6g, accuracy %.2f%%\n",
		note, m.LossGrad(xs, d.test, nil), 100*m.Score(xs, d.test))
	return nil
}

// majorityNote is the majority-class baseline of the test rows next to a
// classifier's accuracy ("" for regression): the accuracy of always
// predicting the most frequent class, which a useful model beats.
func majorityNote(spec model.Spec, test model.Data, acc float64) string {
	if spec.Kind == model.KindLinear || test.N == 0 {
		return ""
	}
	counts := map[float64]int{}
	best := 0
	for _, y := range test.Y {
		counts[y]++
		best = max(best, counts[y])
	}
	base := float64(best) / float64(test.N)
	note := fmt.Sprintf(" (majority-class baseline %.2f%%", 100*base)
	if acc <= base {
		note += ", not beaten"
	}
	return note + ")"
}

func mustParams(s model.Spec) int {
	m, err := model.New(s)
	if err != nil {
		return 0
	}
	return m.NumParams()
}

// printConsole prints the console's URL of a serving aggregator (nothing
// without a metrics address).
func printConsole(srv *aggregator.Server, stdout io.Writer) {
	if isClosed(srv.Ready()) {
		if a := srv.MetricsAddr(); a != "" {
			fmt.Fprintf(stdout, "console: http://%s/\n", a)
		}
	}
}

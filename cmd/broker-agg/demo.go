package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/edgefl/edgefl/agent"
	"github.com/edgefl/edgefl/aggregator"
	"github.com/edgefl/edgefl/broker"
	"github.com/edgefl/edgefl/dataset"
	"github.com/edgefl/edgefl/model"
	"github.com/edgefl/edgefl/proxsolver"
	"github.com/edgefl/edgefl/wire"
)

// runDemo runs the embedded broker, the aggregator and N edge agents in one
// process, over real MQTT: the agents connect to the broker's TCP listener
// on loopback with per-site passwords, exactly as remote sites would; the
// aggregator uses the in-process connection. Every party keeps its own
// bbolt state file.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	clients := fs.Int("clients", 5, "number of edge agents N (with --schema and --partition natural: one per site of --site-column)")
	perRound := fs.Int("per-round", 0, "clients selected per round K (0: all)")
	rounds := fs.Int("rounds", 20, "rounds")
	algo := fs.String("algorithm", aggregator.AlgoFedProxSplit, "fedavg | fedprox | fedsplit | fedproxsplit | an aggregator name")
	aggSpec := fs.String("aggregator", "", "aggregator SPEC (FedAvg/FedProx families)")
	dataSpec := fs.String("dataset", "synthetic:1,1", "data SPEC, as simulate's --dataset")
	partSpec := fs.String("partition", "natural", "partition SPEC: natural | iid | dirichlet:ALPHA | classes:K (with --schema: natural needs --site-column; the others deal the rows to --clients sites, as simulate does)")
	seed := fs.Uint64("seed", 1, "seed of the data, the partition and the selection")
	dir := fs.String("dir", "", "keep the state files in `DIR` (default: a temporary directory, removed at exit)")
	modelKind := fs.String("model", model.KindLogReg, "model: logreg | binary-logreg | linear | mlp")
	hidden := fs.Int("hidden", 64, "hidden units (mlp)")
	l2 := fs.Float64("l2", 0.01, "L2 coefficient (makes the pooled objective strongly convex: FedSplit then converges linearly)")
	solver := fs.String("solver", "lbfgs", "local solver: sgd | lbfgs")
	mu := fs.Float64("mu", 1, "FedProx proximal weight")
	step := fs.Float64("step", 10, "FedSplit step size s (about 1/sqrt(l2 L); see README)")
	relax := fs.Float64("relax", 1, "FedSplit relaxation")
	gamma := fs.Float64("gamma", 1e-6, "target inexactness")
	lr := fs.Float64("lr", 0.01, "SGD learning rate")
	batch := fs.Int("batch", 10, "SGD mini-batch size")
	epochs := fs.Int("max-epochs", 20, "local epochs per round")
	codec := fs.String("codec", "fp32", "uplink codec spec")
	timeout := fs.Duration("round-timeout", time.Minute, "round deadline")
	quorum := fs.Float64("quorum-fraction", 1, "fraction of the selection a round closes with at its deadline")
	metricsAddr := fs.String("metrics-addr", "", "serve the aggregator's console (/), /metrics and /status on `ADDR`, e.g. 127.0.0.1:9464 (default: off); its URL is printed")
	logLevel := fs.String("log-level", "warn", "log level of the daemons (stderr): debug | info | warn | error")
	schemaPath := fs.String("schema", "", "federation schema `FILE`: --dataset is then csv:PATH, partitioned into sites as simulate --schema does; each site's rows go to a CSV of its own in the demo directory, which its agent reads by the schema (model_out next to it); the run has a statistics phase, federated evaluation and a final bundle, compared at the end with the centralised reference on the same rows and preprocessing (issue 11)")
	siteColumn := fs.String("site-column", "", "with --schema and --partition natural: the column `NAME` naming each row's site (one agent per site)")
	evalEvery := fs.Int("eval-every", 5, "with --schema: the sites evaluate every E rounds and at the end")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: broker-agg demo [flags]\n       broker-agg demo --schema FILE --dataset csv:PATH [--site-column NAME --partition natural | --partition iid --clients N ...]\n\nEmbedded broker + aggregator + N edge agents in one process over real MQTT\n(loopback TCP, per-site passwords, the federation ACL), each with its own\nstate file. Prints one line per round; Ctrl-C stops it.\n\nWith --schema, the federation of a schema: each site reads its own CSV (its\nrows of --dataset, split as `broker-agg simulate --schema` splits them) by\nthe schema, sends statistics before round 1, evaluates on its held-out rows\nevery --eval-every rounds, and writes the final model bundle to its\nmodel_out. The end prints the bundle's path and the federation's and each\nsite's held-out figures next to the centralised reference.\n\nflags:")
		fs.PrintDefaults()
	}
	var cfgFlag string
	if err := parseFlags(fs, args, &cfgFlag); err != nil {
		return err
	}
	if *clients < 1 || *rounds < 1 {
		return errors.New("--clients and --rounds: want >= 1")
	}
	k := *perRound
	if k <= 0 || k > *clients {
		k = *clients
	}
	log, err := newLogger(stderr, "text", *logLevel)
	if err != nil {
		return err
	}
	if *schemaPath != "" {
		// With --partition natural the site column decides how many sites
		// there are: --clients then only when given (it must agree).
		given := *clients
		if strings.TrimSpace(*partSpec) == "natural" {
			given = 0
			fs.Visit(func(f *flag.Flag) {
				if f.Name == "clients" {
					given = *clients
				}
			})
		}
		return runDemoSchema(ctx, demoSchemaArgs{schema: *schemaPath, data: *dataSpec, siteColumn: *siteColumn, partition: *partSpec, clients: given,
			perRound: *perRound, rounds: *rounds, algo: *algo, agg: *aggSpec, seed: *seed, dir: *dir, model: *modelKind, hidden: *hidden,
			l2: *l2, params: aggregator.Params{Mu: *mu, Step: *step, Relax: *relax, Solver: *solver, Gamma: *gamma, LR: *lr, Batch: *batch, MaxEpochs: *epochs},
			codec: *codec, timeout: *timeout, quorum: *quorum, metricsAddr: *metricsAddr, evalEvery: *evalEvery}, log, stdout)
	}

	src, err := dataset.ParseSource(*dataSpec)
	if err != nil {
		return fmt.Errorf("--dataset: %w", err)
	}
	part, err := dataset.ParsePartition(*partSpec)
	if err != nil {
		return fmt.Errorf("--partition: %w", err)
	}
	fed, err := dataset.Build(src, part, dataset.BuildOptions{Clients: *clients, Seed: *seed})
	if err != nil {
		return fmt.Errorf("data: %w", err)
	}
	if len(fed.Clients) < *clients {
		return fmt.Errorf("the data has %d clients, fewer than --clients %d", len(fed.Clients), *clients)
	}
	spec := model.Spec{Kind: *modelKind, Inputs: fed.D, Classes: fed.Classes, L2: *l2}
	if *modelKind == model.KindMLP {
		spec.Hidden, spec.Activation = *hidden, model.ActivationReLU
	}
	_, test := fed.Pooled()
	if test.N == 0 {
		test, _ = fed.Pooled()
	}

	stateDir := *dir
	if stateDir == "" {
		if stateDir, err = os.MkdirTemp("", "edgefl-demo-"); err != nil {
			return err
		}
		defer os.RemoveAll(stateDir)
	} else if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return err
	}
	fedName := "demo"
	topics, _ := wire.ForFederation(fedName)
	users := map[string]string{}
	ids := make([]string, *clients)
	for i := range ids {
		ids[i] = fmt.Sprintf("site-%02d", i+1)
		b := make([]byte, 12)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		users[ids[i]] = base64.RawURLEncoding.EncodeToString(b)
	}
	brk, err := broker.Start(broker.Config{Addr: "127.0.0.1:0", Prefix: topics.Prefix(), Users: users,
		Superusers: []string{aggregator.DefaultClientID}, Logger: log})
	if err != nil {
		return err
	}
	defer brk.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	statePath := filepath.Join(stateDir, "aggregator.db")
	start := time.Now()
	fmt.Fprintf(stdout, "demo: %d sites, %d per round, %d rounds of %s on %s (%s partition), model %s with %d parameters\n",
		*clients, k, *rounds, *algo, *dataSpec, part, *modelKind, mustParams(spec))
	fmt.Fprintf(stdout, "broker %s (per-site passwords, ACL on edgefl/%s/), state in %s\n", brk.Addr(), fedName, stateDir)
	srv, err := aggregator.NewServer(aggregator.ServerConfig{
		Federation: fedName, Dial: brk.Dial,
		K: k, QuorumFraction: *quorum, RoundTimeout: *timeout, Settle: 300 * time.Millisecond, MaxReselections: -1,
		Rounds: *rounds, Seed: *seed, Algorithm: *algo, Aggregator: *aggSpec,
		Params: aggregator.Params{Mu: *mu, Step: *step, Relax: *relax, Solver: *solver, Gamma: *gamma, LR: *lr,
			Batch: *batch, MaxEpochs: *epochs},
		Model: spec, Codec: *codec, StatePath: statePath, MetricsAddr: *metricsAddr, Eval: &test, Logger: log,
		OnRound: func(rr aggregator.RoundReport) {
			fmt.Fprintf(stdout, "%5d  %-9s  %-10d  %-12.6g  %-9s  %s\n", rr.Round,
				fmt.Sprintf("%d/%d", len(rr.Contributors), len(rr.Contributors)+len(rr.Stragglers)), len(rr.Stragglers),
				rr.EvalLoss, fmt.Sprintf("%.2f%%", 100*rr.EvalScore), time.Since(start).Round(time.Millisecond))
		},
	})
	if err != nil {
		return err
	}
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Run(ctx) }()
	printConsole(ctx, srv, srvDone, stdout)
	fmt.Fprintf(stdout, "%5s  %-9s  %-10s  %-12s  %-9s  %s\n", "round", "clients", "stragglers", "test loss", "accuracy", "elapsed")

	agentCtx, stopAgents := context.WithCancel(ctx)
	defer stopAgents()
	agentsDone := make(chan error, *clients)
	for i, id := range ids {
		cfg := agentDefaultConfig()
		cfg.SiteID, cfg.Federation, cfg.Brokers = id, fedName, []string{brk.URL()}
		cfg.Username, cfg.Password = id, users[id]
		cfg.StateFile = filepath.Join(stateDir, id+".db")
		cfg.Seed = *seed + uint64(i)
		cfg.ReconnectMin = 200 * time.Millisecond
		data := fed.Clients[i].Train
		a, err := newAgent(cfg, &data, log)
		if err != nil {
			cancel()
			<-srvDone
			return fmt.Errorf("agent %s: %w", id, err)
		}
		go func() { agentsDone <- a.Run(agentCtx) }()
	}

	var runErr error
	select {
	case <-srv.Finished():
	case runErr = <-srvDone:
		srvDone <- runErr
	case <-ctx.Done():
	}
	if err := stopDemo(stopAgents, agentsDone, len(ids), cancel, srvDone, runErr); err != nil {
		return err
	}
	x, r := srv.Global()
	if r > *rounds {
		m, _ := model.New(spec)
		fmt.Fprintf(stdout, "done: %d rounds in %s; final model: test loss %.6g, accuracy %.2f%%\n", *rounds,
			time.Since(start).Round(time.Millisecond), m.LossGrad(x, test, nil), 100*m.Score(x, test))
		// What the federation is measured against: the model a central
		// server would fit on all the sites' training data pooled.
		var pooled model.Data
		for _, c := range fed.Clients[:*clients] {
			pooled.X = append(pooled.X, c.Train.X...)
			pooled.Y = append(pooled.Y, c.Train.Y...)
			pooled.N += c.Train.N
		}
		pooled.D = fed.D
		xs, rep, err := proxsolver.Minimize(context.WithoutCancel(ctx), m, pooled, nil, 1e-10, 3000)
		note := ""
		if errors.Is(err, proxsolver.ErrNotConverged) {
			note = fmt.Sprintf(" (best point after %d gradient evaluations, ||grad|| %.1e)", rep.GradEvals, rep.GradNorm)
		} else if err != nil {
			return fmt.Errorf("centralised optimum: %w", err)
		}
		fmt.Fprintf(stdout, "centralised optimum on the pooled training data%s: test loss %.6g, accuracy %.2f%%\n",
			note, m.LossGrad(xs, test, nil), 100*m.Score(xs, test))
	}
	if *dir != "" {
		fmt.Fprintf(stdout, "state kept in %s: broker-agg status --state %s\n", stateDir, statePath)
	}
	return nil
}

func agentDefaultConfig() agent.Config { return agent.DefaultConfig() }

func newAgent(cfg agent.Config, data *model.Data, log *slog.Logger) (*agent.Agent, error) {
	return agent.New(cfg, agent.Deps{Data: data, Logger: log})
}

func mustParams(s model.Spec) int {
	m, err := model.New(s)
	if err != nil {
		return 0
	}
	return m.NumParams()
}

// printConsole waits until srv is serving and prints its console's URL
// (nothing without a metrics address).
func printConsole(ctx context.Context, srv *aggregator.Server, srvDone chan error, stdout io.Writer) {
	select {
	case <-srv.Ready():
		if a := srv.MetricsAddr(); a != "" {
			fmt.Fprintf(stdout, "console: http://%s/\n", a)
		}
	case err := <-srvDone:
		srvDone <- err
	case <-ctx.Done():
	}
}

// stopDemo ends a demo's federation: the n agents first (stopAgents, then
// their Run results on agentsDone), then the aggregator (cancel, then its
// result on srvDone). It returns runErr, or else the first error any of
// them returned.
func stopDemo(stopAgents func(), agentsDone <-chan error, n int, cancel func(), srvDone <-chan error, runErr error) error {
	stopAgents()
	for range n {
		if err := <-agentsDone; err != nil && runErr == nil {
			runErr = err
		}
	}
	cancel()
	if err := <-srvDone; err != nil && runErr == nil {
		runErr = err
	}
	return runErr
}

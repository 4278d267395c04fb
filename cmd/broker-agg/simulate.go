package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/internal/cli"
	"github.com/edgefl/edgefl/learn/aggregate"
	"github.com/edgefl/edgefl/proto/round"
	"github.com/edgefl/edgefl/sim"
)

// simulateFlags are simulate's flags that are not sim.Config's.
type simulateFlags struct {
	bundleOut, aggs, algos, out string
	dp                          dpFlags
	secagg                      secAggFlags
	serverOpt                   serverOptFlags
}

func simulateFlagSet(stderr io.Writer) (*flag.FlagSet, *sim.Config, *simulateFlags) {
	cfg := sim.DefaultConfig()
	o := &simulateFlags{}
	bundleOut, aggs, algos, out := &o.bundleOut, &o.aggs, &o.algos, &o.out
	fs := cli.NewFlagSet("simulate", stderr, `usage: broker-agg simulate [--dataset SPEC] [--partition SPEC] [--clients N] [--per-round K]
                           [--algo LIST] [--rounds R] [--seed S] [--out DIR] [flags]

`+simulateNote()+`
Runs many virtual clients in one process, without MQTT, over the same code as
the daemons: every algorithm of --algo sees the same data, partition,
selection sequence, stragglers and SGD order. The run first computes the
centralised optimum of the pooled data, so every round reports the gap to it.
Writes DIR/results.json, results.csv and results.png, a progress line per
round to stderr and a summary table to stdout; broker-agg report tabulates
results.json files. With --schema, --dataset csv:PATH goes through the
daemons' pipeline (statistics, the federation's preprocessing, federated
evaluation).

flags:
`)
	fs.StringVar(&cfg.Dataset, "dataset", cfg.Dataset, "data `SPEC`: synthetic:ALPHA,BETA | synthetic-iid | idx:DIR | csv:PATH:label=COLUMN | leaf:PATH; with --schema: csv:PATH")
	fs.StringVar(&cfg.Partition, "partition", cfg.Partition, "partition `SPEC`: natural (synthetic devices, LEAF users, or with --schema the sites of --site-column) | iid | dirichlet:ALPHA | classes:K")
	fs.StringVar(&cfg.Schema, "schema", "", "federation schema `FILE` (JSON, as broker-agg run --schema): --dataset csv:PATH is read by header name through it and goes through the daemons' pipeline: per-site statistics of the training rows, the federation's preprocessing (the schema's standardize), training, and every --eval-every rounds and at the end a federated evaluation on each site's held-out rows (the schema's holdout share), written to results.json")
	fs.StringVar(&cfg.SiteColumn, "site-column", "", "with --schema and --partition natural: the CSV column `NAME` naming each row's site (one client per site; --clients defaults to the site count, --per-round to every site)")
	fs.StringVar(&cfg.EvalDataset, "eval-dataset", "", "with --schema and --site-column: csv:`PATH` of held-out rows with the same columns, each naming its site in the site column; every row of --dataset then trains (the schema's holdout does not apply) and each site evaluates on its rows of PATH, as an edge agent with eval_data does (a fixed per-site train/test split, e.g. a published benchmark's)")
	fs.StringVar(bundleOut, "bundle-out", "", "with --schema: write the final model bundle (model, schema, preprocessing, final evaluation, provenance) to `FILE`; with several algorithms FILE gets -LABEL before its extension")
	fs.IntVar(&cfg.Clients, "clients", cfg.Clients, "number of clients N")
	fs.IntVar(&cfg.PerRound, "per-round", cfg.PerRound, "clients selected per round K")
	fs.StringVar(aggs, "agg", "", "comma-separated `LIST` of aggregator SPECs to compare, each fed by FedProx local training (the same as naming them in --algo; without --algo, only these run)")
	fs.StringVar(algos, "algo", "fedavg,fedprox,fedsplit,fedproxsplit", "comma-separated `LIST` of NAME[:key=value...]: fedavg, fedprox, fedsplit, fedproxsplit, scaffold (SCAFFOLD's control variates: local SGD shifted by c - c_i, the mean as the server step, scaffold:server-opt=sgd:server-lr=ETA for a global rate eta_g; sgd only, not with --dp or --secagg), moon (MOON's contrastive local loss, fedavg's mean), fedsiam-da (FedSiam-DA: contrastive local loss and dual aggregation; fedsiam alone is the dual aggregation), or an aggregator ("+strings.Join(aggregate.Names(), ", ")+"); keys: solver, mu (moon, fedsiam-da: the contrastive weight), gamma, epochs, batch, lr, step, relax, label, tau (moon); moon and fedsiam-da need --model mlp; fedavg also cap=M (no site's sample count above M x the other sites' median, as the daemon: 3 by default, 0 off); the FedAvg/FedProx families also server-opt=KIND with server-lr, server-beta1, server-beta2, server-tau (this algorithm's --server-opt, e.g. fedavg:server-opt=adam:label=fedadam)")
	fs.IntVar(&cfg.Rounds, "rounds", cfg.Rounds, "communication rounds R")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed (data, partition, selection, stragglers, SGD order)")
	fs.StringVar(out, "out", "results", "output `DIR` for results.json, results.csv, results.png")
	fs.StringVar(&cfg.Model, "model", cfg.Model, "model: logreg | binary-logreg | linear | mlp; with --schema, logreg is the task's linear model (binary: binary-logreg, multiclass: logreg, regression: linear) and mlp a classifier")
	fs.IntVar(&cfg.Hidden, "hidden", cfg.Hidden, "hidden units (mlp)")
	fs.StringVar(&cfg.Activation, "activation", cfg.Activation, "hidden activation (mlp): relu | tanh")
	fs.Float64Var(&cfg.L2, "l2", cfg.L2, "L2 regularisation lambda of (lambda/2)||w||^2")
	fs.StringVar(&cfg.Standardize, "standardize", cfg.Standardize, "feature standardisation: none | client | global (default: client for csv/leaf, none otherwise); with --schema: federation | client, overriding the schema's standardize")
	fs.Float64Var(&cfg.TestFrac, "test-fraction", cfg.TestFrac, "fraction of each client's samples held out for testing (not with --schema: its holdout share applies)")
	fs.StringVar(&cfg.Select, "select", cfg.Select, "client selection: uniform | samples | loss | window | poisson[:q=Q] (each client independently with probability Q, default --per-round / --clients); default uniform, poisson with --dp (the only one under --dp central)")
	fs.Float64Var(&cfg.Stragglers, "stragglers", cfg.Stragglers, "straggler rate p: round(K(1-p)) selected clients do E epochs, the rest a random number in [1, E)")
	round.Register(fs, nil, &cfg.Local, round.Simulate, map[string]string{
		round.FlagGamma: "target inexactness gamma in [0, 1]: the local solve stops once ||grad h|| <= gamma ||grad f(anchor)|| (0: no target, the whole budget); fedsplit, the exact reference, solves its prox to " +
			strconv.FormatFloat(round.SimulateSplitGamma, 'g', -1, 64) + " unless --gamma (or its gamma=) is given",
		round.FlagEpochs: "local work budget E in passes over the local data (at least 1; fedsplit has no budget)",
		round.FlagMu:     "FedProx proximal weight mu; for moon and fedsiam-da the contrastive term's weight",
	}, simulateTrainingFlags...)
	fs.StringVar(&cfg.Codec, "codec", "", "uplink codec `SPEC` (fp32, fp16, q8, q4, qsgd:16, topk:0.01+qsgd:16, dct:28x28x10+topk:0.16+q4+ac, ...); empty = exact float64 vectors")
	fs.StringVar(&cfg.Downlink, "downlink", "", "global-model codec `SPEC` (fp32 or fp16); the aggregator applies the model it broadcasts")
	fs.Float64Var(&cfg.OptimumTol, "optimum-tol", cfg.OptimumTol, "gradient-norm tolerance of the centralised optimum")
	fs.IntVar(&cfg.EvalEvery, "eval-every", 1, "evaluate the global model every `N` rounds and at the last (evaluation on large data dominates short local work)")
	fs.IntVar(&cfg.Faulty, "faulty", 0, "number of faulty clients (the first ones): they take part in every round and send their delta scaled by --faulty-scale (FedSplit: the delta against the server's copy of their z, as a poisoning site does; their own z stays as computed)")
	fs.Float64Var(&cfg.FaultyScale, "faulty-scale", 1000, "scale of a faulty client's delta w - x")
	fs.IntVar(&cfg.FaultyEvery, "faulty-every", 0, "a faulty client scales its delta only in the rounds t with t mod N = 1 and is honest in the others (2: every odd round, an alternating attacker); 0: every round")
	fs.IntVar(&cfg.OptimumEvals, "optimum-evals", cfg.OptimumEvals, "gradient evaluations allowed for the centralised optimum (an unregularised problem may need many; the run reports the norm reached)")
	fs.StringVar(&cfg.OptimumCache, "optimum-cache", "", "`DIR` to keep centralised optima in, so runs on the same data and model skip recomputing it")
	fs.BoolVar(&cfg.SaveModels, "save-models", false, "also write DIR/<algo>-model.json with each final model")
	o.dp.register(fs, true, false)
	fs.Uint64Var(&cfg.DPNoiseSeed, "dp-noise-seed", 0, "with --dp: the seed of the noise key (dp.TestKey: reproducible and public, for simulation only; 0: --seed)")
	o.secagg.register(fs, false)
	o.serverOpt.register(fs)
	fs.IntVar(&cfg.Workers, "workers", 0, "clients solved in parallel (default: GOMAXPROCS); results do not depend on it")
	return fs, &cfg, o
}

// simulateTrainingFlags are the training flags simulate registers.
var simulateTrainingFlags = []string{round.FlagSolver, round.FlagMu, round.FlagGamma, round.FlagEpochs, round.FlagBatch, round.FlagLR, round.FlagStep, round.FlagRelax}

// simulateNote is the first line of simulate's help: its defaults that
// differ from run's (round.Simulate).
func simulateNote() string {
	return strings.TrimSuffix(round.Simulate.Note(simulateTrainingFlags...), ".") +
		"; fedsplit's --gamma " + strconv.FormatFloat(round.SimulateSplitGamma, 'g', -1, 64) + " (its exact prox)."
}

// runSimulate is `broker-agg simulate`: the algorithms of --algo over one
// federation, in one process (package sim), written to --out.
func runSimulate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, cfg, o := simulateFlagSet(stderr)
	var noConfig string
	if err := parseFlags(fs, args, &noConfig); err != nil {
		return err
	}
	if err := o.apply(fs, cfg); err != nil {
		return err
	}
	res, err := sim.Run(ctx, *cfg, stderr)
	if err != nil {
		return err
	}
	return o.write(res, cfg.SaveModels, stdout, stderr)
}

// apply checks the flags that depend on --schema and sets cfg's
// algorithms from --algo and --agg.
func (o *simulateFlags) apply(fs *flag.FlagSet, cfg *sim.Config) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if cfg.Schema == "" {
		for _, name := range []string{"site-column", "eval-dataset", "bundle-out"} {
			if set[name] {
				return fmt.Errorf("--%s needs --schema FILE", name)
			}
		}
	} else {
		if set["test-fraction"] {
			return fmt.Errorf("--test-fraction does not apply with --schema: the schema's holdout share is each site's held-out rows")
		}
		if cfg.SiteColumn != "" {
			// One client per site, every site each round, unless told.
			if !set["clients"] {
				cfg.Clients = 0
			}
			if !set["per-round"] {
				cfg.PerRound = 0
			}
		}
	}
	list := o.algos
	if o.aggs != "" {
		algoSet := false
		fs.Visit(func(f *flag.Flag) { algoSet = algoSet || f.Name == "algo" })
		if algoSet {
			list += "," + o.aggs
		} else {
			list = o.aggs
		}
	}
	var err error
	if cfg.ServerOpt, err = o.serverOpt.params(); err != nil {
		return err
	}
	splitGamma := cfg.SplitGamma
	if set["gamma"] {
		splitGamma = 0 // --gamma given: fedsplit's too
	}
	if cfg.Algos, err = sim.ParseAlgos(list, cfg.Local, splitGamma, func(n string) bool { return slices.Contains(aggregate.Names(), n) }); err != nil {
		return err
	}
	q := 0.0
	switch {
	case cfg.Clients > 0:
		spec := cfg.Select
		if spec == "" {
			spec = aggregate.DPSelector // what --dp defaults to; q is only used under --dp
			if o.secagg.on {
				spec = "uniform" // --secagg's only selector
			}
		}
		sel, err := aggregate.NewSelector(spec)
		if err != nil {
			return fmt.Errorf("--select: %w", err)
		}
		q = aggregate.SamplingRate(sel, cfg.PerRound, cfg.Clients)
	case cfg.Schema != "" && cfg.PerRound == 0:
		q = 1 // every site of the CSV, every round
	}
	if cfg.DP, err = o.dp.config(q, cfg.Rounds, cfg.PerRound); err != nil {
		return err
	}
	if o.secagg.on {
		cfg.SecAgg = &sim.SecAgg{Clip: o.secagg.clip, ScaleBits: o.secagg.scaleBits, Threshold: o.secagg.threshold}
	}
	return nil
}

// write writes the results, the bundles of --bundle-out, the models of
// --save-models and the summary table.
func (o *simulateFlags) write(res *sim.Results, saveModels bool, stdout, stderr io.Writer) error {
	if err := res.WriteDir(o.out); err != nil {
		return err
	}
	if o.bundleOut != "" {
		now := time.Now()
		for _, r := range res.Runs {
			b, err := res.Bundle(r, version, now)
			if err != nil {
				return err
			}
			path := sim.BundlePath(o.bundleOut, r.Algo, len(res.Runs))
			if err := bundle.Write(path, b); err != nil {
				return fmt.Errorf("--bundle-out: %w", err)
			}
			fmt.Fprintf(stderr, "bundle %s: %s, round %d, digest %.16s\n", r.Algo, path, b.Provenance.Round, b.Digest)
		}
	}
	if saveModels {
		for _, r := range res.Runs {
			if err := sim.SaveModel(o.out, r.Algo, res.Model, r.Final); err != nil {
				return err
			}
		}
	}
	return sim.Summary(stdout, res, filepath.Join(o.out, "results.json"))
}

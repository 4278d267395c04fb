package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/edgefl/edgefl/aggregator"
	"github.com/edgefl/edgefl/broker"
	"github.com/edgefl/edgefl/bundle"
	"github.com/edgefl/edgefl/model"
	"github.com/edgefl/edgefl/schema"
	"github.com/edgefl/edgefl/wire"
)

type demoSchemaArgs struct {
	schema, data, siteColumn     string
	clients, perRound, rounds    int
	algo, agg, dir, model, codec string
	seed                         uint64
	hidden                       int
	l2, quorum                   float64
	params                       aggregator.Params
	timeout                      time.Duration
	metricsAddr                  string
	evalEvery                    int
}

// runDemoSchema is `broker-agg demo --schema`: the federation of issue 11
// in one process. The CSV is split into one CSV per site (by --site-column,
// or dealt to --clients sites), which each agent reads by the schema: the
// statistics phase, rounds with federated evaluation, the final bundle
// written by the aggregator and every site.
func runDemoSchema(ctx context.Context, a demoSchemaArgs, log *slog.Logger, stdout io.Writer) error {
	sc, err := schema.Load(a.schema)
	if err != nil {
		return fmt.Errorf("--schema: %w", err)
	}
	path, label, err := bundle.ParseDataArg(a.data)
	if err != nil || label != "" {
		return fmt.Errorf("--dataset %q: with --schema, want csv:PATH (the schema names the label column)", a.data)
	}
	stateDir := a.dir
	if stateDir == "" {
		if stateDir, err = os.MkdirTemp("", "edgefl-demo-"); err != nil {
			return err
		}
		defer os.RemoveAll(stateDir)
	} else if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return err
	}
	ids, files, err := splitSites(path, a.siteColumn, a.clients, a.seed, stateDir)
	if err != nil {
		return err
	}
	k := a.perRound
	if k <= 0 || k > len(ids) {
		k = len(ids)
	}
	fedName := "demo"
	topics, _ := wire.ForFederation(fedName)
	users := map[string]string{}
	for _, id := range ids {
		b := make([]byte, 12)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		users[id] = base64.RawURLEncoding.EncodeToString(b)
	}
	brk, err := broker.Start(broker.Config{Addr: "127.0.0.1:0", Prefix: topics.Prefix(), Users: users,
		Superusers: []string{aggregator.DefaultClientID}, Logger: log})
	if err != nil {
		return err
	}
	defer brk.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	spec := model.Spec{Kind: a.model, L2: a.l2}
	if a.model == model.KindMLP {
		spec.Hidden, spec.Activation = a.hidden, model.ActivationReLU
	}
	start := time.Now()
	fmt.Fprintf(stdout, "demo: %d sites (%s), %d per round, %d rounds of %s, schema %s (%s, %d features)\n",
		len(ids), siteSource(a.siteColumn), k, a.rounds, a.algo, a.schema, sc.Task, len(sc.Features))
	fmt.Fprintf(stdout, "broker %s (per-site passwords, ACL on edgefl/%s/), state and site CSVs in %s\n", brk.Addr(), fedName, stateDir)
	fmt.Fprintf(stdout, "%5s  %-9s  %-10s  %-22s  %s\n", "round", "clients", "stragglers", "federated evaluation", "elapsed")
	var srv *aggregator.Server
	srv, err = aggregator.NewServer(aggregator.ServerConfig{
		Federation: fedName, Dial: brk.Dial,
		K: k, QuorumFraction: a.quorum, RoundTimeout: a.timeout, Settle: 300 * time.Millisecond, MaxReselections: -1,
		Rounds: a.rounds, Seed: a.seed, Algorithm: a.algo, Aggregator: a.agg, Params: a.params,
		Model: spec, Schema: sc, EvalEvery: a.evalEvery, Codec: a.codec, StatePath: filepath.Join(stateDir, "aggregator.db"),
		MetricsAddr: a.metricsAddr, Logger: log, Version: version,
		OnRound: func(rr aggregator.RoundReport) {
			ev := "-"
			if v, _ := srv.Watch(); v.Evaluation != nil {
				ev = fmt.Sprintf("r%d loss %.4g acc %.2f%%", v.Evaluation.Round, v.Evaluation.Federation.Loss, 100*v.Evaluation.Federation.Accuracy)
			}
			fmt.Fprintf(stdout, "%5d  %-9s  %-10d  %-22s  %s\n", rr.Round,
				fmt.Sprintf("%d/%d", len(rr.Contributors), len(rr.Contributors)+len(rr.Stragglers)), len(rr.Stragglers),
				ev, time.Since(start).Round(time.Millisecond))
		},
	})
	if err != nil {
		return err
	}
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Run(ctx) }()
	agentCtx, stopAgents := context.WithCancel(ctx)
	defer stopAgents()
	agentsDone := make(chan error, len(ids))
	for i, id := range ids {
		cfg := agentDefaultConfig()
		cfg.SiteID, cfg.Federation, cfg.Brokers = id, fedName, []string{brk.URL()}
		cfg.Username, cfg.Password = id, users[id]
		// A directory per site: its state file, and its copy of the final
		// bundle next to it (the agent's default model_out).
		if err := os.MkdirAll(filepath.Join(stateDir, id), 0o755); err != nil {
			cancel()
			<-srvDone
			return err
		}
		cfg.StateFile = filepath.Join(stateDir, id, "edge-agent.db")
		cfg.Seed = a.seed + uint64(i)
		cfg.ReconnectMin = 200 * time.Millisecond
		cfg.Data = "csv:" + files[i]
		ag, err := newAgent(cfg, nil, log)
		if err != nil {
			cancel()
			<-srvDone
			return fmt.Errorf("agent %s: %w", id, err)
		}
		go func() { agentsDone <- ag.Run(agentCtx) }()
	}
	var runErr error
	finished := false
	select {
	case <-srv.Finished():
		finished = true
	case runErr = <-srvDone:
		srvDone <- runErr
	case <-ctx.Done():
	}
	if finished {
		// Every site stores the final bundle of the end announcement and
		// writes it next to its state file: give them a moment.
		waitSiteBundles(ctx, stateDir, ids, 15*time.Second, stdout)
	}
	stopAgents()
	for range ids {
		if err := <-agentsDone; err != nil && runErr == nil {
			runErr = err
		}
	}
	cancel()
	if err := <-srvDone; err != nil && runErr == nil {
		runErr = err
	}
	if runErr != nil {
		return runErr
	}
	final := filepath.Join(stateDir, aggregator.FinalBundle)
	b, err := bundle.Read(final)
	if err != nil {
		return fmt.Errorf("the final bundle: %w", err)
	}
	fmt.Fprintf(stdout, "done in %s: final bundle of round %d", time.Since(start).Round(time.Millisecond), b.Provenance.Round)
	if e := b.Evaluation; e != nil {
		fmt.Fprintf(stdout, ", federated evaluation on %d held-out rows: loss %.4g", e.Federation.N, e.Federation.Loss)
		if e.Federation.Confusion != nil {
			fmt.Fprintf(stdout, ", accuracy %.2f%%", 100*e.Federation.Accuracy)
		}
		if e.Federation.AUC != nil {
			fmt.Fprintf(stdout, ", AUC %.4f", *e.Federation.AUC)
		}
		for _, id := range slices.Sorted(func(yield func(string) bool) {
			for id := range e.Sites {
				if !yield(id) {
					return
				}
			}
		}) {
			r := e.Sites[id]
			fmt.Fprintf(stdout, "\n  %s: n %d, loss %.4g", id, r.N, r.Loss)
			if r.Confusion != nil {
				fmt.Fprintf(stdout, ", accuracy %.2f%%", 100*r.Accuracy)
			}
		}
	}
	fmt.Fprintln(stdout)
	if a.dir != "" {
		fmt.Fprintf(stdout, "state kept in %s: broker-agg status --state %s; edge-agent evaluate --model %s --data csv:PATH\n",
			stateDir, filepath.Join(stateDir, "aggregator.db"), final)
	}
	return nil
}

func siteSource(col string) string {
	if col == "" {
		return "rows dealt at random"
	}
	return "by column " + col
}

// splitSites writes one CSV per site into dir: the rows of each value of
// siteColumn (sites named site-01.. in the values' sorted order), or the
// rows dealt at random (seeded) to n sites. It returns the site ids and
// their files.
func splitSites(path, siteColumn string, n int, seed uint64, dir string) (ids, files []string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("--dataset: %w", err)
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.FieldsPerRecord = -1
	header, err := r.Read()
	if err != nil {
		return nil, nil, fmt.Errorf("--dataset %s: header: %w", path, err)
	}
	col := -1
	if siteColumn != "" {
		if col = slices.Index(header, siteColumn); col < 0 {
			return nil, nil, fmt.Errorf("--site-column %q: %s has no such column", siteColumn, path)
		}
	}
	groups := map[string][][]string{}
	rng := mrand.New(mrand.NewPCG(seed, 0x73697465))
	for line := 2; ; line++ {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("--dataset %s: %w", path, err)
		}
		key := ""
		if col >= 0 {
			if col >= len(rec) {
				return nil, nil, fmt.Errorf("--dataset %s: line %d has no %q cell", path, line, siteColumn)
			}
			key = rec[col]
		} else {
			key = fmt.Sprintf("%06d", rng.IntN(max(n, 1)))
		}
		groups[key] = append(groups[key], rec)
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range groups {
			if !yield(k) {
				return
			}
		}
	})
	if len(keys) == 0 {
		return nil, nil, fmt.Errorf("--dataset %s: no rows", path)
	}
	for i, k := range keys {
		id := fmt.Sprintf("site-%02d", i+1)
		p := filepath.Join(dir, id+".csv")
		out, err := os.Create(p)
		if err != nil {
			return nil, nil, err
		}
		w := csv.NewWriter(out)
		_ = w.Write(header)
		_ = w.WriteAll(groups[k]) // flushes
		if err := errors.Join(w.Error(), out.Close()); err != nil {
			return nil, nil, fmt.Errorf("writing %s: %w", p, err)
		}
		ids, files = append(ids, id), append(files, p)
	}
	return ids, files, nil
}

// waitSiteBundles waits until every site wrote its copy of the final
// bundle, or the time is up (then it says which did not).
func waitSiteBundles(ctx context.Context, dir string, ids []string, limit time.Duration, stdout io.Writer) {
	deadline := time.Now().Add(limit)
	for {
		var missing []string
		for _, id := range ids {
			if _, err := os.Stat(filepath.Join(dir, id, aggregator.FinalBundle)); err != nil {
				missing = append(missing, id)
			}
		}
		if len(missing) == 0 {
			fmt.Fprintf(stdout, "every site wrote the final bundle (%s/SITE/%s)\n", dir, aggregator.FinalBundle)
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			fmt.Fprintf(stdout, "no final bundle written yet at: %v\n", missing)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

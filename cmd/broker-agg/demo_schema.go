package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/edgefl/edgefl/aggregator"
	"github.com/edgefl/edgefl/broker"
	"github.com/edgefl/edgefl/bundle"
	"github.com/edgefl/edgefl/evaluate"
	"github.com/edgefl/edgefl/model"
	"github.com/edgefl/edgefl/schema"
	"github.com/edgefl/edgefl/sim"
	"github.com/edgefl/edgefl/wire"
)

type demoSchemaArgs struct {
	schema, data, siteColumn, partition string
	// clients is --clients (with --partition natural only when given, else 0).
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
// in one process. The CSV is partitioned into sites exactly as `broker-agg
// simulate --schema` partitions it (by --site-column with --partition
// natural, or iid, dirichlet:ALPHA, classes:K over --clients sites); each
// site's rows are written as its own CSV, which its agent reads by the
// schema: the statistics phase, rounds with federated evaluation, the
// final bundle written by the aggregator and every site's model_out. At
// the end the federation's held-out figures are printed next to the
// centralised reference simulate computes on the same rows and
// preprocessing.
func runDemoSchema(ctx context.Context, a demoSchemaArgs, log *slog.Logger, stdout io.Writer) error {
	sc, err := schema.Load(a.schema)
	if err != nil {
		return fmt.Errorf("--schema: %w", err)
	}
	path, label, err := bundle.ParseDataArg(a.data)
	if err != nil || label != "" {
		return fmt.Errorf("--dataset %q: with --schema, want csv:PATH (the schema names the label column)", a.data)
	}
	// The sites and the reference, as simulate builds them.
	cfg := sim.DefaultConfig()
	cfg.Dataset, cfg.Schema, cfg.SiteColumn, cfg.Partition = "csv:"+path, a.schema, a.siteColumn, a.partition
	cfg.Clients, cfg.PerRound, cfg.Seed = a.clients, 0, a.seed
	cfg.Model, cfg.Hidden, cfg.Activation, cfg.L2 = a.model, a.hidden, model.ActivationReLU, a.l2
	fed, err := sim.BuildSchemaFederation(ctx, cfg, io.Discard)
	if err != nil {
		return err
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
	ids := demoSiteIDs(fed.Sites)
	files, err := writeSiteCSVs(path, fed.Rows, ids, stateDir)
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
	fmt.Fprintf(stdout, "demo: %d sites (%s), %d per round, %d rounds of %s, schema %s (%s, %d features), model %s with %d parameters\n",
		len(ids), siteSource(a.siteColumn, a.partition), k, a.rounds, a.algo, a.schema, sc.Task, len(sc.Features), fed.Spec.Kind, mustParams(fed.Spec))
	for i, s := range fed.Sites {
		fmt.Fprintf(stdout, "  %s: %d training rows, %d held out (%s)\n", ids[i], s.TrainRows, s.HoldoutRows, files[i])
	}
	fmt.Fprintf(stdout, "broker %s (per-site passwords, ACL on edgefl/%s/), state and site CSVs in %s\n", brk.Addr(), fedName, stateDir)
	var srv *aggregator.Server
	printed := -1
	srv, err = aggregator.NewServer(aggregator.ServerConfig{
		Federation: fedName, Dial: brk.Dial,
		K: k, QuorumFraction: a.quorum, RoundTimeout: a.timeout, Settle: 300 * time.Millisecond, MaxReselections: -1,
		Rounds: a.rounds, Seed: a.seed, Algorithm: a.algo, Aggregator: a.agg, Params: a.params,
		Model: spec, Schema: sc, EvalEvery: a.evalEvery, Codec: a.codec, StatePath: filepath.Join(stateDir, "aggregator.db"),
		MetricsAddr: a.metricsAddr, Logger: log, Version: version,
		OnRound: func(rr aggregator.RoundReport) {
			// An evaluation is shown once, when every site's report is in.
			ev := ""
			if v, _ := srv.Watch(); v.Evaluation != nil && v.Evaluation.Round != printed && len(v.Evaluation.Sites) == len(ids) {
				printed = v.Evaluation.Round
				ev = fmt.Sprintf("of round %d: %s", v.Evaluation.Round, figures(v.Evaluation.Federation))
			}
			fmt.Fprintf(stdout, "%5d  %-9s  %-10d  %-8s  %s\n", rr.Round,
				fmt.Sprintf("%d/%d", len(rr.Contributors), len(rr.Contributors)+len(rr.Stragglers)), len(rr.Stragglers),
				time.Since(start).Round(time.Millisecond), ev)
		},
	})
	if err != nil {
		return err
	}
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Run(ctx) }()
	printConsole(ctx, srv, srvDone, stdout)
	fmt.Fprintf(stdout, "%5s  %-9s  %-10s  %-8s  %s\n", "round", "clients", "stragglers", "elapsed", "federated evaluation (held-out rows)")
	agentCtx, stopAgents := context.WithCancel(ctx)
	defer stopAgents()
	agentsDone := make(chan error, len(ids))
	outs := make([]string, len(ids))
	for i, id := range ids {
		cfg := agentDefaultConfig()
		cfg.SiteID, cfg.Federation, cfg.Brokers = id, fedName, []string{brk.URL()}
		cfg.Username, cfg.Password = id, users[id]
		cfg.StateFile = filepath.Join(stateDir, id+".db")
		cfg.Seed = a.seed + uint64(i)
		cfg.ReconnectMin = 200 * time.Millisecond
		cfg.Data = "csv:" + files[i]
		outs[i] = filepath.Join(stateDir, id+".bundle.json")
		cfg.ModelOut = outs[i]
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
	final := filepath.Join(stateDir, aggregator.FinalBundle)
	if finished {
		// Every site stores the final bundle of the end announcement and
		// writes it to its model_out: give them a moment.
		waitSiteBundles(ctx, final, ids, outs, 15*time.Second, stdout)
	}
	if err := stopDemo(stopAgents, agentsDone, len(ids), cancel, srvDone, runErr); err != nil {
		return err
	}
	if !finished {
		fmt.Fprintf(stdout, "stopped before the run ended (%s)\n", time.Since(start).Round(time.Millisecond))
		return nil
	}
	b, err := bundle.Read(final)
	if err != nil {
		return fmt.Errorf("the final bundle: %w", err)
	}
	where := final
	if a.dir == "" {
		where += " (removed at exit; keep it with --dir)"
	}
	fmt.Fprintf(stdout, "done in %s: final bundle %s, round %d, digest %.16s\n", time.Since(start).Round(time.Millisecond), where, b.Provenance.Round, b.Digest)
	ref := fed.Reference.Eval
	if e := b.Evaluation; e != nil && ref != nil {
		fmt.Fprintf(stdout, "%-24s  %-42s  %s\n", "held-out rows", fmt.Sprintf("edgefl, the final model (round %d)", e.Round), "centralised reference (pooled training rows, same preprocessing)")
		fmt.Fprintf(stdout, "  %-22s  %-42s  %s\n", fmt.Sprintf("federation (n %d)", e.Federation.N), figures(e.Federation), figures(ref.Federation))
		for i, s := range fed.Sites {
			r, ok := e.Sites[ids[i]]
			got := "no report"
			if ok {
				got = figures(r)
			}
			fmt.Fprintf(stdout, "  %-22s  %-42s  %s\n", fmt.Sprintf("%s (n %d)", ids[i], r.N), got, figures(ref.Sites[s.ID]))
		}
		if !fed.Reference.Converged {
			fmt.Fprintf(stdout, "(the reference stopped at ||grad F|| = %.2g, not at the optimum)\n", float64(fed.Reference.GradNorm))
		}
	}
	if a.dir != "" {
		fmt.Fprintf(stdout, "state kept in %s: broker-agg status --state %s; edge-agent evaluate --model %s --data csv:PATH\n",
			stateDir, filepath.Join(stateDir, "aggregator.db"), final)
	}
	return nil
}

// figures is one evaluation report on a line: loss with accuracy and AUC
// (classification) or RMSE and R^2 (regression).
func figures(r evaluate.Report) string {
	if r.Confusion == nil && r.N > 0 {
		s := fmt.Sprintf("loss %.4f  rmse %.4g", r.Loss, r.RMSE)
		if r.R2 != nil {
			s += fmt.Sprintf("  r2 %.4f", *r.R2)
		}
		return s
	}
	s := fmt.Sprintf("loss %.4f  accuracy %.2f%%", r.Loss, 100*r.Accuracy)
	if r.AUC != nil {
		s += fmt.Sprintf("  AUC %.4f", *r.AUC)
	}
	return s
}

func siteSource(col, partition string) string {
	if col != "" {
		return "by column " + col
	}
	return partition + " partition"
}

// demoSiteIDs are the sites' client ids: simulate's site ids (the site
// column's values, or client0..) when every one is a valid client id other
// than the aggregator's, else site-01...
func demoSiteIDs(sites []sim.SiteInfo) []string {
	ids := make([]string, len(sites))
	own := true
	for i, s := range sites {
		ids[i] = s.ID
		if wire.ValidID(s.ID) != nil || s.ID == aggregator.DefaultClientID {
			own = false
		}
	}
	if !own {
		for i := range ids {
			ids[i] = fmt.Sprintf("site-%02d", i+1)
		}
	}
	return ids
}

// writeSiteCSVs writes site k's rows (data rows of the CSV at path,
// 0-based) to dir/<ids[k]>.csv under the source's header, in the given
// order, and returns the files.
func writeSiteCSVs(path string, rows [][]int, ids []string, dir string) ([]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--dataset: %w", err)
	}
	r := csv.NewReader(bytes.NewReader(raw))
	r.FieldsPerRecord = -1
	recs, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("--dataset %s: %w", path, err)
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("--dataset %s: no header", path)
	}
	files := make([]string, len(rows))
	for k, rs := range rows {
		files[k] = filepath.Join(dir, ids[k]+".csv")
		var b bytes.Buffer
		w := csv.NewWriter(&b)
		_ = w.Write(recs[0])
		for _, i := range rs {
			if i < 0 || i+1 >= len(recs) {
				return nil, fmt.Errorf("--dataset %s: no data row %d", path, i)
			}
			_ = w.Write(recs[i+1])
		}
		w.Flush()
		if err := errors.Join(w.Error(), os.WriteFile(files[k], b.Bytes(), 0o600)); err != nil {
			return nil, fmt.Errorf("writing %s: %w", files[k], err)
		}
	}
	return files, nil
}

// waitSiteBundles waits until every site's model_out holds the final
// bundle, byte for byte the aggregator's, or the time is up (then it says
// which sites did not write it or wrote another).
func waitSiteBundles(ctx context.Context, final string, ids, outs []string, limit time.Duration, stdout io.Writer) {
	deadline := time.Now().Add(limit)
	for {
		want, err := os.ReadFile(final)
		var missing []string
		for i, p := range outs {
			got, gerr := os.ReadFile(p)
			if err != nil || gerr != nil || !bytes.Equal(got, want) {
				missing = append(missing, ids[i])
			}
		}
		if len(missing) == 0 {
			fmt.Fprintf(stdout, "every site's model_out (%s) is the aggregator's final bundle, byte for byte\n",
				filepath.Join(filepath.Dir(final), "SITE.bundle.json"))
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			fmt.Fprintf(stdout, "the final bundle is not (yet) at these sites' model_out: %v\n", missing)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

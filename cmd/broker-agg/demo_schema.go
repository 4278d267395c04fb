package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/learn/evaluate"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/node/aggregator"
	"github.com/edgefl/edgefl/proto/wire"
	"github.com/edgefl/edgefl/sim"
	"github.com/edgefl/edgefl/sim/localfed"
)

// runDemoSchema is `broker-agg demo --schema`: the federation of a schema run
// in one process. The CSV is partitioned into sites exactly as `broker-agg
// simulate --schema` partitions it (by --site-column with --partition
// natural, or iid, dirichlet:ALPHA, classes:K over --clients sites); each
// site's rows are written as its own CSV, which its agent reads by the
// schema: the statistics phase, rounds with federated evaluation, the
// final bundle written by the aggregator and every site's model_out. At
// the end the federation's held-out figures are printed next to the
// centralised reference simulate computes on the same rows and
// preprocessing.
func runDemoSchema(ctx context.Context, f *demoFlags, log *slog.Logger, stdout io.Writer) error {
	sc, err := schema.Load(f.schema)
	if err != nil {
		return fmt.Errorf("--schema: %w", err)
	}
	if f.dp.mode != "off" && !sc.Declared() {
		return fmt.Errorf("--dp with --schema %s: the schema must declare its preprocessing, or the statistics phase is outside the guarantee (hint: deploy/schema-dp.example.json)", f.schema)
	}
	path, label, err := bundle.ParseDataArg(f.data)
	if err != nil || label != "" {
		return fmt.Errorf("--dataset %q: with --schema, want csv:PATH (the schema names the label column)", f.data)
	}
	fed, err := sim.BuildSchemaFederation(ctx, f.simConfig(path), io.Discard)
	if err != nil {
		return err
	}
	stateDir, cleanup, err := f.stateDir()
	if err != nil {
		return err
	}
	defer cleanup()
	ids := demoSiteIDs(fed.Sites)
	files, err := writeSiteCSVs(path, fed.Rows, ids, stateDir)
	if err != nil {
		return err
	}
	sites := make([]localfed.Site, len(ids))
	for i, id := range ids {
		sites[i] = localfed.Site{ID: id, Source: "csv:" + files[i], ModelOut: filepath.Join(stateDir, id+".bundle.json")}
	}
	k := f.perRoundOf(len(ids))
	start := time.Now()
	fmt.Fprintf(stdout, "demo: %d sites (%s), %d per round, %d rounds of %s, schema %s (%s, %d features), model %s with %d parameters; %s\n",
		len(ids), siteSource(f.siteColumn, f.partition), k, f.rounds, f.algo, f.schema, sc.Task, len(sc.Features), fed.Spec.Kind, mustParams(fed.Spec), demoNoteInline())
	for i, s := range fed.Sites {
		fmt.Fprintf(stdout, "  %s: %d training rows, %d held out (%s)\n", ids[i], s.TrainRows, s.HoldoutRows, files[i])
	}
	spec := model.Spec{Kind: f.model, L2: f.l2}
	if f.model == model.KindMLP {
		spec.Hidden, spec.Activation = f.hidden, model.ActivationReLU
	}
	cfg := f.serverConfig(k, spec, log)
	cfg.Schema, cfg.EvalEvery, cfg.Version = sc, f.evalEvery, version
	if cfg.DP, err = f.dp.config(float64(k)/float64(len(ids)), f.rounds, k); err != nil {
		return err
	}
	var srv *aggregator.Server // set before the agents start, so before any round
	printed := map[int]bool{}  // the eval rounds shown
	cfg.OnRound = func(rr aggregator.RoundReport) {
		// An evaluation is shown once, when every site's report is in.
		ev := ""
		if v, _ := srv.Watch(); v.Evaluation != nil && !printed[v.Evaluation.Round] && len(v.Evaluation.Sites) == len(ids) {
			printed[v.Evaluation.Round] = true
			ev = fmt.Sprintf("of round %d: %s", v.Evaluation.Round, figures(v.Evaluation.Federation))
		}
		if cfg.DP != nil {
			ev = fmt.Sprintf("epsilon %.4g  %s", rr.Epsilon, ev)
		}
		fmt.Fprintf(stdout, "%5d  %-9s  %-10d  %-8s  %s\n", rr.Round,
			fmt.Sprintf("%d/%d", len(rr.Contributors), len(rr.Contributors)+len(rr.Stragglers)), len(rr.Stragglers),
			time.Since(start).Round(time.Millisecond), ev)
	}
	lf, err := localfed.Start(ctx, localfed.Config{Dir: stateDir, Sites: sites, Seed: f.seed, Server: cfg, Logger: log,
		Serving: func(lf *localfed.Federation) {
			srv = lf.Server
			fmt.Fprintf(stdout, "broker %s (per-site passwords, ACL on edgefl/%s/), state and site CSVs in %s\n", lf.Broker.Addr(), demoFederation, stateDir)
			printConsole(lf.Server, stdout)
			fmt.Fprintf(stdout, "%5s  %-9s  %-10s  %-8s  %s\n", "round", "clients", "stragglers", "elapsed", "federated evaluation (held-out rows)")
		}})
	if err != nil {
		return err
	}
	finished := lf.Wait(ctx)
	final := filepath.Join(stateDir, aggregator.FinalBundle)
	if finished {
		// Every site stores the final bundle of the end announcement and
		// writes it to its model_out: give them a moment.
		outs := make([]string, len(sites))
		for i, s := range sites {
			outs[i] = s.ModelOut
		}
		waitSiteBundles(ctx, final, ids, outs, 15*time.Second, stdout)
	}
	view, _ := lf.Server.Watch()
	printLateEvaluations(lf.Server, view.Evaluation, printed, len(ids), stdout)
	if err := lf.Stop(); err != nil {
		return err
	}
	if !finished {
		fmt.Fprintf(stdout, "stopped before the run ended (%s)\n", time.Since(start).Round(time.Millisecond))
		return nil
	}
	return printDemoSchemaEnd(f, fed, ids, stateDir, final, view.Evaluation, start, stdout)
}

// simConfig is the simulator's configuration that splits the CSV at path
// into the demo's sites and computes the centralised reference.
func (f *demoFlags) simConfig(path string) sim.Config {
	cfg := sim.DefaultConfig()
	cfg.Dataset, cfg.Schema, cfg.SiteColumn, cfg.Partition = "csv:"+path, f.schema, f.siteColumn, f.partition
	// With --partition natural the site column decides how many sites
	// there are: --clients then only when given (it must agree).
	cfg.Clients, cfg.PerRound, cfg.Seed = f.clients, 0, f.seed
	if strings.TrimSpace(f.partition) == "natural" && !f.clientsGiven {
		cfg.Clients = 0
	}
	cfg.Model, cfg.Hidden, cfg.Activation, cfg.L2 = f.model, f.hidden, model.ActivationReLU, f.l2
	return cfg
}

// printDemoSchemaEnd prints the final bundle and the federation's and each
// site's held-out figures next to the centralised reference's.
//
// Under --dp the bundle carries no evaluation: the figures printed are
// then the aggregator's own (operator) view of the final evaluation, which
// the demo, holding every site's data, may show (docs/privacy.md,
// "Evaluation under DP").
func printDemoSchemaEnd(f *demoFlags, fed *sim.SchemaFederation, ids []string, stateDir, final string, operator *aggregator.EvalStatus,
	start time.Time, stdout io.Writer) error {
	b, err := bundle.Read(final)
	if err != nil {
		return fmt.Errorf("the final bundle: %w", err)
	}
	where := final
	if f.dir == "" {
		where += " (removed at exit; keep it with --dir)"
	}
	fmt.Fprintf(stdout, "done in %s: final bundle %s, round %d, digest %.16s\n", time.Since(start).Round(time.Millisecond), where, b.Provenance.Round, b.Digest)
	ref := fed.Reference.Eval
	e := b.Evaluation
	if p := b.Privacy; p != nil {
		fmt.Fprintf(stdout, "privacy: %s\n", p)
		if operator != nil {
			e = &bundle.Evaluation{Round: operator.Round, Federation: operator.Federation, Sites: operator.Sites}
			fmt.Fprintln(stdout, "the bundle carries no evaluation (outside the guarantee); the aggregator's operator view of it:")
		}
	}
	if e != nil && ref != nil {
		fmt.Fprintf(stdout, "%-24s  %-72s  %s\n", "held-out rows", fmt.Sprintf("edgefl, the final model (round %d)", e.Round), "centralised reference (pooled training rows, same preprocessing)")
		fmt.Fprintf(stdout, "  %-22s  %-72s  %s\n", fmt.Sprintf("federation (n %d)", e.Federation.N), figures(e.Federation), figures(ref.Federation))
		for i, s := range fed.Sites {
			r, ok := e.Sites[ids[i]]
			got := "no report"
			if ok {
				got = figures(r)
			}
			fmt.Fprintf(stdout, "  %-22s  %-72s  %s\n", fmt.Sprintf("%s (n %d)", ids[i], r.N), got, figures(ref.Sites[s.ID]))
		}
		if !fed.Reference.Converged {
			fmt.Fprintf(stdout, "(the reference stopped at ||grad F|| = %.2g, not at the optimum)\n", float64(fed.Reference.GradNorm))
		}
	}
	if f.dir != "" {
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
			if *r.R2 <= 0 {
				s += " (not above the mean)"
			}
		}
		return s
	}
	s := fmt.Sprintf("loss %.4f  accuracy %.2f%%  balanced %.2f%%", r.Loss, 100*r.Accuracy, 100*r.BalancedAccuracy)
	if b := r.WithBaseline().Baseline; b != nil {
		s += fmt.Sprintf("  baseline %.2f%%", 100*b.Accuracy)
		if !b.Beaten {
			s += " (not above)"
		}
	}
	if r.AUC != nil {
		s += fmt.Sprintf("  AUC %.4f", *r.AUC)
	}
	return s
}

// printLateEvaluations prints the evaluations completed after the row of
// the round that would have shown them: a site's evaluation report and its
// update travel separately (the ingest workers may store the update
// first), so with rounds drawn back to back a row can be printed before
// its evaluation is complete. The history has them: the aggregator
// completes a round's evaluation there with a report that comes late.
func printLateEvaluations(srv *aggregator.Server, last *aggregator.EvalStatus, printed map[int]bool, sites int, stdout io.Writer) {
	st, err := srv.LiveStatus(-1, -1)
	if err != nil || st.Live == nil {
		return
	}
	for _, e := range st.Live.Evaluations {
		if !printed[e.Round] && len(e.Sites) == sites && (last == nil || e.Round < last.Round) {
			fmt.Fprintf(stdout, "%5s  %-9s  %-10s  %-8s  of round %d: %s\n", "", "", "", "", e.Round, evalFigures(e.Federation))
		}
	}
}

// evalFigures is figures for an evaluation of the history, which keeps
// the headline figures only (no AUC).
func evalFigures(f aggregator.EvalFigures) string {
	switch {
	case f.BalancedAccuracy != nil && f.Score != nil:
		return fmt.Sprintf("loss %.4f  accuracy %.2f%%  balanced %.2f%%", f.Loss, 100**f.Score, 100**f.BalancedAccuracy)
	case f.Score != nil:
		return fmt.Sprintf("loss %.4f  rmse %.4g  r2 %.4f", f.Loss, math.Sqrt(f.Loss), *f.Score)
	}
	return fmt.Sprintf("loss %.4f", f.Loss)
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

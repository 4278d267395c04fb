package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/dataset"
	"github.com/edgefl/edgefl/data/prep"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/learn/evaluate"
	"github.com/edgefl/edgefl/learn/model"
)

// SiteInfo describes one site of a --schema run.
type SiteInfo struct {
	ID          string  `json:"id"`
	TrainRows   int     `json:"train_rows"`
	HoldoutRows int     `json:"holdout_rows"`
	ClassCounts []int64 `json:"class_counts,omitempty"` // training rows per class
	// StatsBytes is the size of the site's statistics as JSON (what it
	// sends before round 1, before the envelope).
	StatsBytes int `json:"stats_bytes"`
}

// siteSet is a --schema run's federation: the daemons' pipeline, computed
// in one process (sitedata per site -> Statistics -> prep.Combine ->
// sitedata.Fit -> sitedata.Data).
type siteSet struct {
	schema    *schema.Schema
	transform *prep.Transform // the federation's (what the aggregator announces)
	sites     []*sitedata.Site
	ids       []string
	info      []SiteInfo
	rows      [][]int // each site's data rows of the CSV (0-based), in file order
	// evalRows are each site's rows of the --eval-dataset CSV, nil
	// without it.
	evalRows [][]int
	eval     *schema.Table
}

// modelSpec is the model every party of the federation trains
// (sitedata.ModelSpec of the schema, the transform and the model flags).
func (set *siteSet) modelSpec(cfg Config) (model.Spec, error) {
	hidden, act := 0, ""
	if cfg.Model == model.KindMLP {
		hidden, act = cfg.Hidden, cfg.Activation
	}
	spec, err := sitedata.ModelSpec(set.schema, set.transform, cfg.Model, hidden, act, cfg.L2)
	if err != nil {
		return model.Spec{}, fmt.Errorf("--model: %w", err)
	}
	return spec, nil
}

// schemaSource is the CSV path of --dataset csv:PATH with --schema (a
// :label=COLUMN suffix must name the schema's label column).
func schemaSource(spec string, s *schema.Schema) (string, error) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(spec), "csv:")
	if !ok || rest == "" {
		return "", fmt.Errorf("--dataset %q: with --schema expected csv:PATH (the schema names the columns and the label)", spec)
	}
	if i := strings.LastIndex(rest, ":label="); i >= 0 {
		if l := rest[i+len(":label="):]; l != s.Label.Column {
			return "", fmt.Errorf("--dataset %q: label=%s, but the schema's label column is %q (with --schema, give csv:PATH)", spec, l, s.Label.Column)
		}
		rest = rest[:i]
	}
	return rest, nil
}

// schemaStandardize applies --standardize to the schema: "" keeps the
// schema's; federation (or global) and client override it.
func schemaStandardize(s *schema.Schema, mode string) error {
	switch mode {
	case "":
	case schema.StandardizeFederation, dataset.StandardizeGlobal:
		s.Standardize = schema.StandardizeFederation
	case schema.StandardizeClient:
		s.Standardize = schema.StandardizeClient
	default:
		return fmt.Errorf("--standardize %q: with --schema expected federation (pooled statistics, the default) or client", mode)
	}
	return s.Validate()
}

// buildSites reads the CSV by the schema, partitions its rows into sites
// and runs the statistics phase and the transform, as the daemons do.
func buildSites(cfg *Config, progress io.Writer) (*dataset.Federated, *siteSet, error) {
	src, err := readSchemaData(cfg, progress)
	if err != nil {
		return nil, nil, err
	}
	ids, groups, err := src.group(cfg)
	if err != nil {
		return nil, nil, err
	}
	set := &siteSet{schema: src.schema, ids: ids, rows: groups}
	if src.evalTab != nil {
		if set.evalRows, err = src.evalGroups(ids); err != nil {
			return nil, nil, err
		}
		set.eval = src.evalTab
	}
	if err := set.fit(src, progress); err != nil {
		return nil, nil, err
	}
	fed, err := set.federated(src)
	if err != nil {
		return nil, nil, err
	}
	if cfg.Clients == 0 {
		cfg.Clients = len(fed.Clients)
	}
	if cfg.PerRound == 0 {
		cfg.PerRound = len(fed.Clients)
	}
	return fed, set, nil
}

// schemaData is the CSV of a --schema run, read by the schema.
type schemaData struct {
	schema  *schema.Schema
	path    string
	part    dataset.Partition
	tab     *schema.Table
	rowSite []string // each row's site (--site-column), else nil
	// The --eval-dataset CSV, its path and each of its rows' site (nil
	// without it).
	evalPath    string
	evalTab     *schema.Table
	evalRowSite []string
}

// readSchemaData checks the flags of a --schema run and reads its CSV.
func readSchemaData(cfg *Config, progress io.Writer) (*schemaData, error) {
	s, err := schema.Load(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("--schema: %w", err)
	}
	if err := schemaStandardize(s, cfg.Standardize); err != nil {
		return nil, err
	}
	if cfg.DP != nil && !s.Declared() {
		return nil, fmt.Errorf("--dp with --schema %s: the schema must declare its preprocessing, or the statistics phase is outside the guarantee (hint: deploy/schema-dp.example.json)", cfg.Schema)
	}
	path, err := schemaSource(cfg.Dataset, s)
	if err != nil {
		return nil, err
	}
	part, err := dataset.ParsePartition(cfg.Partition)
	if err != nil {
		return nil, fmt.Errorf("--partition: %w", err)
	}
	if part.Kind == dataset.PartNatural && cfg.SiteColumn == "" {
		return nil, fmt.Errorf("--partition natural with --schema needs --site-column NAME (the column naming each row's site); or use iid, dirichlet:ALPHA or classes:K")
	}
	if part.Kind != dataset.PartNatural && cfg.SiteColumn != "" {
		return nil, fmt.Errorf("--site-column %s: only --partition natural partitions by a site column (got --partition %s)", cfg.SiteColumn, cfg.Partition)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--dataset: %w", err)
	}
	defer f.Close()
	d := &schemaData{schema: s, path: path, part: part}
	if cfg.SiteColumn != "" {
		d.tab, d.rowSite, err = s.ReadSitesCSV(f, path, cfg.SiteColumn)
	} else {
		d.tab, err = s.ReadCSV(f, path)
	}
	if err != nil {
		return nil, err // a *schema.CSVError: one line naming file, line, column
	}
	if d.tab.Rows == 0 {
		return nil, fmt.Errorf("%s: no data rows", path)
	}
	if len(d.tab.Extra) > 0 {
		fmt.Fprintf(progress, "data %s: columns not in the schema, ignored: %s\n", path, strings.Join(d.tab.Extra, ", "))
	}
	if cfg.EvalDataset != "" {
		if err := d.readEval(cfg); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// readEval reads the --eval-dataset CSV: held-out rows, each naming its
// site in the same --site-column.
func (d *schemaData) readEval(cfg *Config) error {
	if cfg.SiteColumn == "" {
		return fmt.Errorf("--eval-dataset needs --site-column (with --partition natural): each held-out row names its site")
	}
	path, err := schemaSource(cfg.EvalDataset, d.schema)
	if err != nil {
		return fmt.Errorf("--eval-dataset: %w", err)
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--eval-dataset: %w", err)
	}
	defer f.Close()
	d.evalPath = path
	d.evalTab, d.evalRowSite, err = d.schema.ReadSitesCSV(f, path, cfg.SiteColumn)
	return err // a *schema.CSVError: one line naming file, line, column
}

// evalGroups are each site's rows of the --eval-dataset CSV, in the
// order of ids; a held-out row of a site with no training rows is an
// error (it would be evaluated by nobody).
func (d *schemaData) evalGroups(ids []string) ([][]int, error) {
	pos := make(map[string]int, len(ids))
	for k, id := range ids {
		pos[id] = k
	}
	groups := make([][]int, len(ids))
	for i, id := range d.evalRowSite {
		k, ok := pos[id]
		if !ok {
			return nil, fmt.Errorf("--eval-dataset %s: row %d names site %q, which has no rows in %s", d.evalPath, i+2, id, d.path)
		}
		groups[k] = append(groups[k], i)
	}
	return groups, nil
}

// newSite is site k's data as its agent reads it: its rows of the CSV,
// split by the schema's holdout, or with --eval-dataset every row a
// training row (its held-out rows are set.evalRows[k]).
func (set *siteSet) newSite(d *schemaData, k int) *sitedata.Site {
	file := fmt.Sprintf("%s (%s)", d.path, set.ids[k])
	if d.part.Kind == dataset.PartNatural {
		file = fmt.Sprintf("%s (site %s)", d.path, set.ids[k])
	}
	site := sitedata.FromTable(set.schema, d.tab.Subset(set.rows[k]), file)
	if set.eval != nil {
		site.TrainOnEvery()
	}
	return site
}

// holdoutRows is the number of site k's held-out rows.
func (set *siteSet) holdoutRows(k int) int {
	if set.eval != nil {
		return len(set.evalRows[k])
	}
	return len(set.sites[k].Holdout)
}

// group splits the rows into sites: by the site column (natural, sites in
// the aggregator's fixed order, by id), or by the partition over
// cfg.Clients sites client0...
func (d *schemaData) group(cfg *Config) (ids []string, groups [][]int, err error) {
	if d.part.Kind == dataset.PartNatural {
		bySite := map[string][]int{}
		for i, id := range d.rowSite {
			bySite[id] = append(bySite[id], i)
		}
		for id := range bySite {
			ids = append(ids, id)
		}
		sort.Strings(ids) // the aggregator's fixed order: by site id
		for _, id := range ids {
			groups = append(groups, bySite[id])
		}
		if cfg.Clients != 0 && cfg.Clients != len(ids) {
			return nil, nil, fmt.Errorf("--clients %d: column %q of %s names %d sites (one client per site; omit --clients)", cfg.Clients, cfg.SiteColumn, d.path, len(ids))
		}
		return ids, groups, nil
	}
	if cfg.Clients < 1 {
		return nil, nil, fmt.Errorf("--clients: want at least 1 with --partition %s, got %d", cfg.Partition, cfg.Clients)
	}
	if groups, err = partitionRows(d.tab, d.schema.NumClasses(), d.part, cfg.Clients, cfg.Seed); err != nil {
		return nil, nil, err
	}
	w := len(strconv.Itoa(max(len(groups)-1, 0)))
	for i := range groups {
		ids = append(ids, fmt.Sprintf("client%0*d", w, i))
	}
	return ids, groups, nil
}

// fit computes each site's statistics of its training rows, as the sites
// send them, and fits the federation's preprocessing on them pooled; with
// a schema that declares its preprocessing no statistics are computed (no
// site sends any) and the transform is prep.Declared, as the aggregator
// announces it.
func (set *siteSet) fit(d *schemaData, progress io.Writer) error {
	if set.schema.Declared() {
		return set.declared(d, progress)
	}
	var stats []*prep.Stats
	for k := range set.rows {
		site := set.newSite(d, k)
		st, err := site.Statistics()
		if err != nil {
			return err
		}
		if site.Table.SingleClass() {
			fmt.Fprintf(progress, "site %s: every row is of one class (allowed; it trains and reports)\n", set.ids[k])
		}
		set.sites = append(set.sites, site)
		stats = append(stats, st)
		raw, err := json.Marshal(st)
		if err != nil {
			return err
		}
		set.info = append(set.info, SiteInfo{ID: set.ids[k], TrainRows: len(site.Train), HoldoutRows: set.holdoutRows(k), ClassCounts: st.ClassCounts, StatsBytes: len(raw)})
	}
	// The aggregator's statistics review, as it logs it (its findings
	// never stop a simulation).
	review, err := prep.ReviewStats(set.schema, set.ids, stats)
	if err != nil {
		return err
	}
	for _, f := range review.Lines() {
		fmt.Fprintf(progress, "statistics review: %s\n", f)
	}
	pooled, err := prep.Combine(set.schema, stats)
	if err != nil {
		return err
	}
	set.transform, err = sitedata.Fit(set.schema, pooled)
	return err
}

// statisticsSites are the sites whose statistics made the preprocessing:
// every site, sorted (none when the schema declares it), as a bundle's
// provenance names them.
func (set *siteSet) statisticsSites() []string {
	if set.schema.Declared() {
		return nil
	}
	return slices.Sorted(slices.Values(set.ids))
}

// declared is fit for a schema that declares its preprocessing.
func (set *siteSet) declared(d *schemaData, progress io.Writer) error {
	for k := range set.rows {
		site := set.newSite(d, k)
		if err := site.EnoughRows(); err != nil {
			return err // as the site refuses to train
		}
		if site.Table.SingleClass() {
			fmt.Fprintf(progress, "site %s: every row is of one class (allowed; it trains and reports)\n", set.ids[k])
		}
		var counts []int64
		if k := set.schema.NumClasses(); k > 0 {
			counts = make([]int64, k)
			for _, i := range site.Train {
				counts[int(site.Table.Labels[i])]++
			}
		}
		set.sites = append(set.sites, site)
		set.info = append(set.info, SiteInfo{ID: set.ids[k], TrainRows: len(site.Train), HoldoutRows: set.holdoutRows(k), ClassCounts: counts})
	}
	var err error
	set.transform, err = prep.Declared(set.schema)
	return err
}

// federated is the sites' data after the federation's preprocessing.
func (set *siteSet) federated(d *schemaData) (*dataset.Federated, error) {
	s := set.schema
	fed := &dataset.Federated{
		Name: fmt.Sprintf("%s (schema %.12s, %s, standardize %s)", d.path, s.Digest(), d.part, s.Standardize),
		D:    set.transform.Outputs, Classes: s.NumClasses(), Standardized: s.Standardize,
	}
	for k, site := range set.sites {
		train, hold, err := site.Data(set.transform)
		if err != nil {
			return nil, err
		}
		if set.eval != nil {
			if hold, err = site.EvalData(set.transform, set.eval.Subset(set.evalRows[k])); err != nil {
				return nil, err
			}
		}
		fed.Clients = append(fed.Clients, dataset.Client{ID: set.ids[k], Train: train, Test: hold})
	}
	for _, c := range set.transform.Columns {
		if c.Type == schema.Numeric {
			fed.FeatureNames = append(fed.FeatureNames, c.Name)
			continue
		}
		for _, l := range c.Levels {
			fed.FeatureNames = append(fed.FeatureNames, c.Name+"="+l)
		}
	}
	return fed, nil
}

// SchemaFederation is a --schema federation as simulate builds it, for
// running the same federation with the daemons (broker-agg demo --schema):
// its sites, each site's rows of the CSV, the model and the centralised
// reference.
type SchemaFederation struct {
	// Sites are the sites in the aggregator's order (by id).
	Sites []SiteInfo
	// Rows[k] are site k's data rows of the CSV (0-based, the header not
	// counted), in file order: a CSV of these rows under the same header,
	// read by the schema, is exactly the site's data here (its training and
	// held-out rows included, which follow the row order).
	Rows [][]int
	// Spec is the model every party trains.
	Spec model.Spec
	// Reference is the centralised optimum on the pooled training rows of
	// every site with the federation's preprocessing (what Run measures the
	// algorithms against), its Eval the figures on each site's held-out
	// rows and their combination.
	Reference Optimum
}

// BuildSchemaFederation reads cfg.Dataset by cfg.Schema, partitions it into
// sites (cfg.Partition, cfg.SiteColumn, cfg.Clients, cfg.Seed), runs the
// statistics phase and the transform, and computes the centralised
// reference, all as Run does. cfg's model (Model, Hidden, Activation, L2)
// and optimum settings (OptimumTol, OptimumEvals, OptimumCache) apply; its
// algorithms and rounds do not.
func BuildSchemaFederation(ctx context.Context, cfg Config, progress io.Writer) (*SchemaFederation, error) {
	if progress == nil {
		progress = io.Discard
	}
	if cfg.Schema == "" {
		return nil, fmt.Errorf("sim: BuildSchemaFederation needs a schema")
	}
	if !(cfg.OptimumTol > 0) || cfg.OptimumEvals < 1 {
		return nil, fmt.Errorf("sim: optimum tolerance %v and evaluations %d: want > 0 and >= 1", cfg.OptimumTol, cfg.OptimumEvals)
	}
	fed, set, err := buildSites(&cfg, progress)
	if err != nil {
		return nil, err
	}
	spec, err := set.modelSpec(cfg)
	if err != nil {
		return nil, err
	}
	m, err := model.New(spec)
	if err != nil {
		return nil, fmt.Errorf("--model: %w", err)
	}
	train, test := fed.Pooled()
	if train.N == 0 {
		return nil, fmt.Errorf("--dataset %s: no training rows", cfg.Dataset)
	}
	cachePath := ""
	if cfg.OptimumCache != "" {
		cachePath = optimumCachePath(cfg, spec, schemaCacheKey(set.schema, cfg))
	}
	xs, opt, err := centralised(ctx, cfg, m, train, test, m.InitParams(streams.Of(cfg.Seed, streams.Init, 0, 0)), cachePath, progress)
	if err != nil {
		return nil, err
	}
	if opt.Eval, err = set.evaluate(spec, fed, 0, xs); err != nil {
		return nil, err
	}
	return &SchemaFederation{Sites: set.info, Rows: set.rows, Spec: spec, Reference: opt}, nil
}

// partitionRows splits the table's rows over clients with the partitioners
// of the csv:PATH:label=COL path (the rows' indices stand in for their
// features, so the groups are the same); each group lists its rows in file
// order, as a site's own CSV would.
func partitionRows(t *schema.Table, classes int, part dataset.Partition, clients int, seed uint64) ([][]int, error) {
	idx := make([]float64, t.Rows)
	for i := range idx {
		idx[i] = float64(i)
	}
	ds := &dataset.Dataset{Name: "rows", Data: model.Data{N: t.Rows, D: 1, X: idx, Y: slices.Clone(t.Labels)}, Classes: classes}
	opt := dataset.PartitionOptions{Seed: seed}
	var f *dataset.Federated
	var err error
	switch part.Kind {
	case dataset.PartIID:
		f, err = dataset.PartitionIID(ds, clients, opt)
	case dataset.PartDirichlet:
		f, err = dataset.PartitionDirichlet(ds, clients, part.Alpha, opt)
	case dataset.PartClasses:
		f, err = dataset.PartitionClasses(ds, clients, part.K, opt)
	default:
		return nil, fmt.Errorf("--partition %s: not a partition of rows", part)
	}
	if err != nil {
		return nil, fmt.Errorf("--partition: %w", err)
	}
	groups := make([][]int, len(f.Clients))
	for k, c := range f.Clients {
		for _, d := range []model.Data{c.Train, c.Test} {
			for _, v := range d.X {
				groups[k] = append(groups[k], int(v))
			}
		}
		sort.Ints(groups[k])
	}
	return groups, nil
}

// evaluate is the federated evaluation of x: each site's report on its
// held-out rows (sitedata.Evaluate) and their evaluate.Combine.
func (set *siteSet) evaluate(spec model.Spec, fed *dataset.Federated, round int, x []float64) (*bundle.Evaluation, error) {
	ev := &bundle.Evaluation{Round: round, Sites: map[string]evaluate.Report{}}
	reports := make([]evaluate.Report, 0, len(fed.Clients))
	for _, c := range fed.Clients {
		r, err := sitedata.Evaluate(spec, x, c.Test)
		if err != nil {
			return nil, fmt.Errorf("site %s: %w", c.ID, err)
		}
		ev.Sites[c.ID] = r.WithBaseline() // as the aggregator shows them
		reports = append(reports, r)
	}
	var err error
	if ev.Federation, err = evaluate.Combine(reports); err != nil {
		return nil, err
	}
	ev.Federation = ev.Federation.WithBaseline()
	return ev, nil
}

// evalLine is a one-line summary of an evaluation for the progress log.
func evalLine(ids []string, ev *bundle.Evaluation) string {
	var b strings.Builder
	one := func(name string, r evaluate.Report) {
		fmt.Fprintf(&b, "  %s n %d loss %.4f", name, r.N, r.Loss)
		if r.Confusion != nil {
			fmt.Fprintf(&b, " acc %.4f", r.Accuracy)
			if r.AUC != nil {
				fmt.Fprintf(&b, " auc %.4f", *r.AUC)
			}
		} else {
			fmt.Fprintf(&b, " rmse %.4g", r.RMSE)
			if r.R2 != nil {
				fmt.Fprintf(&b, " r2 %.4f", *r.R2)
			}
		}
	}
	one("federation", ev.Federation)
	for _, id := range ids {
		b.WriteString(" |")
		one(id, ev.Sites[id])
	}
	return b.String()
}

// Bundle is the model bundle of one run's final model: the model, the
// schema, the federation's transform, the final federated evaluation and
// the provenance (algorithm and its parameters). Only for --schema runs.
func (r *Results) Bundle(run AlgoRun, version string, now time.Time) (*bundle.Bundle, error) {
	if r.sites == nil {
		return nil, fmt.Errorf("--bundle-out needs --schema (a bundle carries the schema and the fitted preprocessing)")
	}
	if run.Final == nil {
		return nil, fmt.Errorf("%s: no final model", run.Algo)
	}
	var ev *bundle.Evaluation
	for _, row := range run.Rounds {
		if row.Eval != nil {
			ev = row.Eval
		}
	}
	var priv *bundle.Privacy
	if d := run.DP; d != nil {
		// As the aggregator's bundle: the guarantee after the run's
		// rounds, and no evaluation (docs/privacy.md, "Evaluation under DP").
		var rates []dp.Rate
		if d.Rounds > 0 {
			rates = []dp.Rate{{Q: d.SamplingRate, Noise: d.Noise, Rounds: uint64(d.Rounds)}}
		}
		var err error
		c := dp.Config{Clip: d.Clip, Noise: d.Noise, Delta: d.Delta, Budget: d.Budget}
		if r.Config.DP != nil {
			c.EarlyClose = r.Config.DP.EarlyClose // charged at q = 1, and the bundle says why
		}
		if priv, err = bundle.NewPrivacy(c, rates, d.Rounds); err != nil {
			return nil, err
		}
		ev = nil
	}
	cfg := r.Config
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	params := map[string]string{
		"model": r.Model.Spec().Kind, "l2": f(cfg.L2), "rounds": strconv.Itoa(cfg.Rounds),
		"clients": strconv.Itoa(cfg.Clients), "per_round": strconv.Itoa(cfg.PerRound), "select": cfg.Select,
		"partition": cfg.Partition, "seed": strconv.FormatUint(cfg.Seed, 10), "aggregator": run.Aggregator,
		"solver": run.Local.Solver, "epochs": strconv.Itoa(run.Local.MaxEpochs), "gamma": f(run.Local.Gamma),
		"standardize": r.sites.schema.Standardize,
	}
	switch run.Family {
	case FedSplit, FedProxSplit:
		params["step"], params["relax"] = f(run.Local.Step), f(run.Local.Relax)
	}
	if run.Family != FedAvg {
		params["mu"] = f(run.Local.Mu)
	}
	if run.ServerOpt != "" {
		params["server_opt"] = run.ServerOpt // as the aggregator's bundles
	}
	if run.Local.Solver == "sgd" {
		params["lr"], params["batch"] = f(run.Local.LR), strconv.Itoa(run.Local.Batch)
	}
	if s := r.Model.Spec(); s.Kind == model.KindMLP {
		params["hidden"], params["activation"] = strconv.Itoa(s.Hidden), s.Activation
	}
	round := 0
	if n := len(run.Rounds); n > 0 {
		round = run.Rounds[n-1].Round
	}
	return &bundle.Bundle{
		Model:      model.Saved{Spec: r.Model.Spec(), Layout: r.Model.Layout(), Params: run.Final},
		Schema:     r.sites.schema,
		Transform:  r.sites.transform,
		Evaluation: ev,
		Provenance: bundle.Provenance{
			Federation: "simulate", RunID: fmt.Sprintf("simulate-%s-seed%d", run.Algo, cfg.Seed), Round: round,
			Algorithm: run.Family, Params: params, EdgeflVersion: version, Time: now.UTC().Format(time.RFC3339),
			StatisticsSites: r.sites.statisticsSites(),
		},
		Privacy: priv,
	}, nil
}

// BundlePath is where --bundle-out FILE puts run label's bundle: FILE
// itself when the run has one algorithm, else FILE with "-LABEL" before
// its extension.
func BundlePath(file, label string, runs int) string {
	if runs <= 1 {
		return file
	}
	dir, base := "", file
	if i := strings.LastIndexByte(file, '/'); i >= 0 {
		dir, base = file[:i+1], file[i+1:]
	}
	name, ext, _ := strings.Cut(base, ".")
	if ext != "" {
		ext = "." + ext
	}
	return dir + name + "-" + safeName(label) + ext
}

// schemaCacheKey is what a --schema run's centralised optimum depends on
// besides optimumCachePath's fields: the schema, the site column and the
// held-out file (which decides the training rows).
func schemaCacheKey(s *schema.Schema, cfg Config) string {
	k := s.Digest() + "," + cfg.SiteColumn
	if cfg.EvalDataset != "" {
		k += ",eval=" + cfg.EvalDataset
	}
	return k
}

package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/dataset"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/internal/cli"
	"github.com/edgefl/edgefl/internal/ratelimit"
	"github.com/edgefl/edgefl/learn/aggregate"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/node/aggregator"
	"github.com/edgefl/edgefl/node/broker"
	"github.com/edgefl/edgefl/proto/pki"
	"github.com/edgefl/edgefl/proto/round"
	"github.com/edgefl/edgefl/proto/wire"
)

// DefaultMetricsAddr is where `run` serves /metrics and /status, and where
// `status` looks for a running daemon.
const DefaultMetricsAddr = "127.0.0.1:9464"

// passwordEnv holds the aggregator's password for an external broker when
// --password-file is not given.
const passwordEnv = "EDGEFL_MQTT_PASSWORD"

type serveFlags struct {
	config string

	federation, listen, brokerURL, clientID  string
	tlsCA, tlsClientCA, tlsCert, tlsKey      string
	tlsServerName                            string
	sessionExpiry, instanceTakeover          time.Duration
	brokerPasswd, username, passwordFile     string
	allowAnonymous                           bool
	maxPacket                                int
	rateMsgs, rateBytes                      float64
	rateBurst, siteQueue                     int
	k                                        int
	quorum                                   float64
	roundTimeout, extension, settle          time.Duration
	maxReselections, rounds                  int
	seed                                     uint64
	algo, agg, sel, codec, downlink          string
	params                                   round.Params
	anchorSketch                             int
	modelKind, activation                    string
	inputs, classes, hidden                  int
	l2                                       float64
	init                                     string
	initSeed                                 uint64
	state, metricsAddr, evalData, finalModel string
	logFormat, logLevel                      string
	exitWhenFinished                         bool
	rollback                                 string
	sites                                    string
	schema                                   string
	statsSites, evalEvery, stopPatience      int
	statsReview                              bool
	stopTol, stopDelta                       float64
	console                                  consoleFlags
	dp                                       dpFlags
	secagg                                   secAggFlags
	serverOpt                                serverOptFlags
}

// serveAliases are alternative flag names (short or as simulate spells
// them) -> the canonical name.
var serveAliases = map[string]string{
	"k": "per-round", "quorum": "quorum-fraction", "algo": "algorithm", "select": "selector",
	"epochs": "max-epochs", "inputs": "features", "state": "state-file", "metrics": "metrics-addr",
}

func canonical(name string) string {
	if c, ok := serveAliases[name]; ok {
		return c
	}
	return name
}

func serveFlagSet(stderr io.Writer) (*flag.FlagSet, *serveFlags) {
	f := &serveFlags{}
	fs := cli.NewFlagSet("run", stderr, `usage: broker-agg run [flags]

Runs the aggregator daemon. By default it embeds an MQTT broker on --listen,
authenticating sites by --password-file and/or mutual TLS (--tls-cert,
--tls-key, --tls-client-ca) and enforcing the federation ACL; --broker URL
uses an external broker instead (Mosquitto, EMQX; see deploy/mosquitto/).
State lives in --state-file and survives kill -9: a restart resumes the open
round. SIGINT/SIGTERM stop it cleanly. A restart must keep the run's
--federation, --algorithm, --aggregator, model, --codec, --downlink, --mu
(FedProx family) and --step and --relax (FedSplit family): other values are
refused with the difference spelled out (start a new run with another
--state-file); the local work settings (--solver, --gamma, --lr, --batch,
--max-epochs, --max-seconds) may change and apply from the next
announcement.

A --config file holds one "key = value" per line ('#' comments), keys named
as the flags below (underscores may replace hyphens); flags given on the
command line override it.

Environment: EDGEFL_HEAP_PROFILE=FILE keeps a heap profile taken near the
run's peak memory in FILE (docs/operations.md).

flags:
`)
	fs.StringVar(&f.config, "config", "", "configuration `FILE` of key = value lines, keys named as these flags (flags override the file)")

	f.registerConnection(fs)
	f.registerRounds(fs)
	f.registerFederation(fs)
	f.registerDaemon(fs)
	for alias, name := range serveAliases {
		fs.Var(fs.Lookup(name).Value, alias, "same as --"+name)
	}
	return fs, f
}

// registerConnection registers the flags of the broker, embedded or
// external, and of the connection to it.
func (f *serveFlags) registerConnection(fs *flag.FlagSet) {
	fs.StringVar(&f.federation, "federation", "default", "federation `NAME`; topics live under edgefl/NAME/")
	fs.StringVar(&f.listen, "listen", "", "embedded broker listen `ADDR` (default :8883 with --tls-cert, else 127.0.0.1:1883)")
	fs.StringVar(&f.brokerURL, "broker", "", "external broker `URL` (tcp://, ssl://, ws://, wss://) instead of the embedded one")
	fs.StringVar(&f.clientID, "client-id", aggregator.DefaultClientID, "the aggregator's MQTT client id and identity (a superuser of the ACL)")
	fs.StringVar(&f.tlsClientCA, "tls-client-ca", "", "embedded broker: CA `FILE`; client certificates signed by it are required (mutual TLS, CN = site id)")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "external broker: CA `FILE` that signed the broker's certificate (default: the system roots)")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "certificate `FILE`: the embedded broker's server certificate, or the aggregator's client certificate for an external broker")
	fs.StringVar(&f.tlsKey, "tls-key", "", "private key `FILE` of --tls-cert")
	fs.StringVar(&f.tlsServerName, "tls-server-name", "", "external broker: the `NAME` its certificate must carry (default: the URL's host)")
	fs.StringVar(&f.brokerPasswd, "password-file", "", "embedded broker: the sites' password `FILE`, Mosquitto format (see `broker-agg pki passwd`)")
	fs.BoolVar(&f.allowAnonymous, "allow-anonymous", false, "embedded broker: let clients in without credentials (development only; the ACL still applies)")
	fs.IntVar(&f.maxPacket, "max-message-bytes", broker.DefaultMaxPacketSize, "largest message in `BYTES`: the embedded broker's packet cap and the aggregator's inbound limit")
	fs.Float64Var(&f.rateMsgs, "rate-messages", aggregator.DefaultRateMessages, "per-site inbound rate limit in messages per second; over it (and --rate-burst) messages are dropped and counted (copies of a message the site got through recently first: a tenth of the burst is kept for new messages), by the embedded broker before it routes them (edgefl_broker_rate_limited_total) and by the aggregator before it decodes them (edgefl_aggregator_rate_limited_total)")
	fs.IntVar(&f.rateBurst, "rate-burst", aggregator.DefaultRateBurst, "messages a site may send at once before --rate-messages applies")
	fs.Float64Var(&f.rateBytes, "rate-bytes", aggregator.DefaultRateBytes, "per-site inbound rate limit in bytes per second (one message of --max-message-bytes always fits)")
	fs.DurationVar(&f.sessionExpiry, "session-expiry", broker.DefaultSessionExpiry, "embedded broker: how long a disconnected site's session and queued messages are kept")
	fs.IntVar(&f.siteQueue, "site-queue", broker.DefaultSiteQueue, "embedded broker: the QoS 1 messages (announcements, receipts) held for one site while it is offline or has not acknowledged them; past it the oldest are forgotten (the latest announcement is retained, and a missed receipt comes again when the site re-sends its update)")
	fs.DurationVar(&f.instanceTakeover, "instance-takeover", aggregator.DefaultInstanceTakeover, "a site id is served for one installation (instance id) at a time; once two installations with one id were seen alive (a cloned gateway), the first keeps the site and the other is set aside until the first stopped cleanly or has been offline this long")
	fs.StringVar(&f.sites, "sites", "", "the federation's roster: the site ids expected, comma-separated; status, the console and /metrics show each one (never connected, or the embedded broker's latest refusal of it, with its reason and time), and the embedded broker refuses any other identity (default: the --password-file's users and the certificates under the --tls-client-ca's clients/ folder, shown but not enforced)")
	fs.StringVar(&f.username, "username", "", "external broker: the aggregator's username")
	fs.StringVar(&f.passwordFile, "broker-password-file", "", "external broker: `FILE` holding the aggregator's password (default: $"+passwordEnv+")")
}

// registerRounds registers the flags of the rounds and of the algorithm.
func (f *serveFlags) registerRounds(fs *flag.FlagSet) {
	fs.IntVar(&f.k, "per-round", 10, "clients selected per round")
	fs.Float64Var(&f.quorum, "quorum-fraction", 0.7, "fraction of the selected clients a round needs to close at its deadline, in (0, 1]")
	fs.DurationVar(&f.roundTimeout, "round-timeout", 10*time.Minute, "time from an announcement to its deadline")
	fs.DurationVar(&f.extension, "extension", 0, "length of the one extension below quorum (default --round-timeout)")
	fs.DurationVar(&f.settle, "settle", 5*time.Second, "how long a draw waits for expected sites that are not online: after start or a restart (after start, only until every roster site is online), and for a site that dropped since the previous draw (a round whose sites are all online is drawn at once)")
	fs.IntVar(&f.maxReselections, "max-reselections", 3, "re-selections of a round below quorum before it stalls (negative: unlimited)")
	fs.IntVar(&f.rounds, "rounds", 0, "rounds to run (0: forever)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the selection and of randomised aggregators")

	round.Register(fs, &f.algo, &f.params, round.Run, map[string]string{
		round.FlagAlgorithm: "fedavg | fedprox | fedsplit | fedproxsplit | scaffold (control variates: local SGD shifted by c - c_i, the mean as the server step, --server-opt sgd --server-lr ETA for a global rate eta_g; sgd only, not with --dp, --secagg or a robust --aggregator) | moon (MOON's contrastive local loss, fedavg's mean; --model mlp) | fedsiam-da (FedSiam-DA: its contrastive local loss and dual aggregation; --model mlp) | an aggregator (" + strings.Join(aggregate.Names(), ", ") + "), trained like fedprox (fedsiam alone: the dual aggregation only)",
	}, round.FlagAlgorithm)
	fs.StringVar(&f.agg, "aggregator", "", "how updates are combined: an update aggregator `SPEC` for the FedAvg/FedProx families (e.g. normbound:mult=3:inner=median; fedavg counts no site's reported sample count above 3 x the median of the other sites' counts by default, fedavg:cap=M sets M, fedavg:cap=0 turns the cap off); fedsplit-robust[:mult=M] (default) or fedsplit-mean for the FedSplit family (default: per --algorithm)")
	fs.StringVar(&f.sel, "selector", "", "client selection: uniform | samples | loss[:power=P][:explore=E] | window | poisson[:q=Q] (each online site independently with probability Q, default --per-round / online sites; --dp only); default uniform, poisson with --dp (the only one under --dp central)")
	round.Register(fs, nil, &f.params, round.Run, map[string]string{
		round.FlagMu: "FedProx proximal weight (0 for fedavg); for moon and fedsiam-da the contrastive term's weight (no proximal term)",
	}, round.FlagSolver, round.FlagMu, round.FlagStep, round.FlagRelax,
		round.FlagGamma, round.FlagLR, round.FlagBatch, round.FlagMaxEpochs, round.FlagMaxSeconds, round.FlagTau)
	fs.IntVar(&f.anchorSketch, "anchor-sketch", -1, "ask clients for the gradient at the anchor: -1 no, 0 the full gradient, N a random-projection sketch of length N (fedsim-cluster)")
	fs.StringVar(&f.codec, "codec", "fp32", "uplink codec `SPEC` clients must use for their deltas (fp32, fp16, q8, q4, qsgd:16, topk:0.05+q8, dct:28x28x10+topk:0.16+q4+ac, ...; see quant's package doc)")
	fs.StringVar(&f.downlink, "downlink", "fp32", "codec of the global model in the round announcement: fp32 | fp16")
	f.dp.register(fs, false, true)
	f.secagg.register(fs, true)
	f.serverOpt.register(fs)
}

// registerFederation registers the flags of the schema, the stopping rules
// and the model.
func (f *serveFlags) registerFederation(fs *flag.FlagSet) {
	fs.StringVar(&f.schema, "schema", "", "federation schema `FILE` (JSON; see deploy/schema.example.json): sites read their CSV by column name, a statistics phase before round 1 fits the federation's preprocessing (none when the schema declares it, as --dp requires: deploy/schema-dp.example.json), the model's inputs and classes follow from it, sites evaluate on held-out rows, model bundles are written")
	fs.IntVar(&f.statsSites, "stats-sites", 0, "with --schema: the statistics phase closes once this many sites sent theirs, or at --round-timeout with a quorum (0: --per-round)")
	fs.BoolVar(&f.statsReview, "stats-review", false, "with --schema: stop before round 1 when the statistics review finds values that differ between sites (a level seen at one site only, per-site ranges that disagree; every finding is logged at WARN and shown in status and the console either way), so the schema can be fixed first; restart without it to go on")
	fs.IntVar(&f.evalEvery, "eval-every", 10, "with --schema: sites evaluate the global model every `E` rounds (0: only at the end); each evaluation writes latest.bundle.json next to the state file")
	fs.IntVar(&f.stopPatience, "stop-patience", 0, "with --schema: end the run early after `P` evaluations in a row without the federated loss improving on its best by more than --stop-tol (0: off; refused with --dp: the sites' losses are outside the guarantee)")
	fs.Float64Var(&f.stopTol, "stop-tol", 0, "improvement of the federated evaluation loss that resets --stop-patience")
	fs.Float64Var(&f.stopDelta, "stop-delta", 0, "end the run early when an aggregation changes the global model by less than this, relatively: ||x_new - x_old|| / ||x_old|| (meant for the FedSplit family; 0: off)")

	fs.StringVar(&f.modelKind, "model", model.KindLogReg, "model: logreg | binary-logreg | linear | mlp (with --schema: logreg is the task's linear model, mlp a classifier)")
	fs.IntVar(&f.inputs, "features", 0, "model inputs; default from --eval-data (with --schema: from the fitted preprocessing, not set)")
	fs.IntVar(&f.classes, "classes", 0, "model classes (logreg, mlp); default from --eval-data (with --schema: from the schema, not set)")
	fs.IntVar(&f.hidden, "hidden", 64, "hidden units (mlp)")
	fs.StringVar(&f.activation, "activation", model.ActivationReLU, "hidden activation (mlp): relu | tanh")
	fs.Float64Var(&f.l2, "l2", 0, "L2 coefficient lambda")
	fs.StringVar(&f.init, "init", aggregator.InitZeros, "initial model: zeros | model (the model's own initialisation, seeded by --init-seed)")
	fs.Uint64Var(&f.initSeed, "init-seed", 1, "seed of --init model")
}

// registerDaemon registers the flags of the state, the console, the
// evaluation data, the end of the run and the logs.
func (f *serveFlags) registerDaemon(fs *flag.FlagSet) {
	fs.StringVar(&f.state, "state-file", "broker-agg.db", "state `FILE` (bbolt): round log, accepted updates, checkpoints; resumed on restart")
	fs.StringVar(&f.metricsAddr, "metrics-addr", DefaultMetricsAddr, "serve the console (/), /metrics (Prometheus), /status (JSON), /bundle and /healthz on `ADDR` (loopback by default; \"\": off)")
	f.console.register(fs)
	fs.StringVar(&f.evalData, "eval-data", "", "evaluation data `SPEC` (as simulate's --dataset: synthetic:A,B | synthetic-iid | idx:DIR | csv:PATH:label=COL | leaf:PATH; with --schema csv:PATH, read by the schema and the federation's preprocessing): report loss and accuracy per round")
	fs.StringVar(&f.finalModel, "final-model", "", "where the final model goes when the run ends: with --schema the final model bundle (default: final.bundle.json next to the state file), without it the last global model's weights (model.Save; default: none)")
	fs.BoolVar(&f.exitWhenFinished, "exit-when-finished", false, "exit once --rounds are done (default: keep serving receipts and metrics)")
	fs.StringVar(&f.rollback, "rollback", "", "before starting, roll the --state-file back to round `N` (or last-good: the newest intact round), keeping a copy of the file; command line only, never in a --config file")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format: text | json")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug | info | warn | error")
}

// loadEval builds the evaluation set from a dataset spec: every sample of
// the source, train and test pooled.
func loadEval(spec string, seed uint64) (*model.Data, int, error) {
	src, err := dataset.ParseSource(spec)
	if err != nil {
		return nil, 0, fmt.Errorf("--eval-data: %w", err)
	}
	part, opt := dataset.Partition{Kind: dataset.PartNatural}, dataset.BuildOptions{Seed: seed}
	if src.Kind == dataset.SourceCSV || src.Kind == dataset.SourceIDX {
		part, opt.Clients = dataset.Partition{Kind: dataset.PartIID}, 1
	}
	fed, err := dataset.Build(src, part, opt)
	if err != nil {
		return nil, 0, fmt.Errorf("--eval-data: %w", err)
	}
	train, test := fed.Pooled()
	d := model.Data{N: train.N + test.N, D: fed.D, X: append(train.X, test.X...), Y: append(train.Y, test.Y...)}
	return &d, fed.Classes, nil
}

// serverConfig turns the flags into an aggregator configuration (without
// the broker connection).
func (f *serveFlags) serverConfig(log *slog.Logger) (aggregator.ServerConfig, error) {
	if f.rateMsgs < 0 || f.rateBurst < 0 || f.rateBytes < 0 {
		return aggregator.ServerConfig{}, errors.New("--rate-messages, --rate-burst and --rate-bytes must be >= 0 (0: the default)")
	}
	cfg, err := f.modelServerConfig(log)
	if err != nil {
		return cfg, err
	}
	if cfg.DP, err = f.dp.config(0, f.rounds, f.k); err != nil {
		return cfg, err
	}
	cfg.SecAgg = f.secagg.settings()
	if cfg.ServerOpt, err = f.serverOpt.params(); err != nil {
		return cfg, err
	}
	return cfg, f.console.apply(&cfg)
}

func (f *serveFlags) modelServerConfig(log *slog.Logger) (aggregator.ServerConfig, error) {
	if f.schema != "" {
		return f.fedServerConfig(log)
	}
	if f.stopPatience > 0 {
		return aggregator.ServerConfig{}, errors.New("--stop-patience: the patience rule watches the federated evaluation, which needs --schema")
	}
	spec := model.Spec{Kind: f.modelKind, Inputs: f.inputs, Classes: f.classes, L2: f.l2}
	if f.modelKind == model.KindMLP {
		spec.Hidden, spec.Activation = f.hidden, f.activation
	}
	var eval *model.Data
	if f.evalData != "" {
		d, classes, err := loadEval(f.evalData, f.seed)
		if err != nil {
			return aggregator.ServerConfig{}, err
		}
		eval = d
		if spec.Inputs == 0 {
			spec.Inputs = d.D
		}
		if spec.Classes == 0 && (spec.Kind == model.KindLogReg || spec.Kind == model.KindMLP) {
			spec.Classes = classes
		}
		log.Info("evaluation data loaded", "spec", f.evalData, "samples", d.N, "features", d.D, "classes", classes)
	}
	if spec.Inputs <= 0 {
		return aggregator.ServerConfig{}, errors.New("--inputs: the model needs its input count (or give --eval-data)")
	}
	if (spec.Kind == model.KindLogReg || spec.Kind == model.KindMLP) && spec.Classes < 2 {
		return aggregator.ServerConfig{}, errors.New("--classes: the model needs at least 2 classes (or give --eval-data)")
	}
	sketch := f.anchorSketchSpec()
	if f.maxPacket <= 0 {
		return aggregator.ServerConfig{}, errors.New("--max-message-bytes: want > 0")
	}
	return f.baseConfig(spec, sketch, eval, log), nil
}

// anchorSketch is the --anchor-sketch request.
func (f *serveFlags) anchorSketchSpec() *wire.SketchSpec {
	switch {
	case f.anchorSketch == 0:
		return &wire.SketchSpec{Seed: f.seed}
	case f.anchorSketch > 0:
		return &wire.SketchSpec{Dimension: uint32(min(int64(f.anchorSketch), math.MaxUint32)), Seed: f.seed}
	}
	return nil
}

// fedServerConfig is serverConfig with --schema.
func (f *serveFlags) fedServerConfig(log *slog.Logger) (aggregator.ServerConfig, error) {
	sc, err := schema.Load(f.schema)
	if err != nil {
		return aggregator.ServerConfig{}, fmt.Errorf("--schema: %w", err)
	}
	if f.inputs != 0 || f.classes != 0 {
		return aggregator.ServerConfig{}, errors.New("--features and --classes: with --schema the schema and the fitted preprocessing decide them")
	}
	if f.statsSites < 0 || f.evalEvery < 0 || f.stopPatience < 0 {
		return aggregator.ServerConfig{}, errors.New("--stats-sites, --eval-every and --stop-patience: want >= 0")
	}
	if f.maxPacket <= 0 {
		return aggregator.ServerConfig{}, errors.New("--max-message-bytes: want > 0")
	}
	spec := model.Spec{Kind: f.modelKind, L2: f.l2}
	if f.modelKind == model.KindMLP {
		spec.Hidden, spec.Activation = f.hidden, f.activation
	}
	cfg := f.baseConfig(spec, f.anchorSketchSpec(), nil, log)
	cfg.SchemaConfig = aggregator.SchemaConfig{Schema: sc, StatsSites: f.statsSites, EvalEvery: f.evalEvery, StatsReview: f.statsReview}
	if f.evalData != "" {
		spec := f.evalData
		if !strings.HasPrefix(spec, "csv:") {
			spec = "csv:" + spec
		}
		path, label, err := bundle.ParseDataArg(spec)
		if err != nil {
			return aggregator.ServerConfig{}, fmt.Errorf("--eval-data: with --schema, expected csv:PATH: %w", err)
		}
		if label != "" {
			return aggregator.ServerConfig{}, fmt.Errorf("--eval-data %q: with --schema the schema names the label column (%s)", f.evalData, sc.Label.Column)
		}
		tab, err := sc.ReadCSVFile(path)
		if err != nil {
			return aggregator.ServerConfig{}, fmt.Errorf("--eval-data: %w", err)
		}
		cfg.EvalTable = tab
		log.Info("evaluation data loaded (the federation's preprocessing applies once fitted)", "path", path, "rows", tab.Rows)
	}
	log.Info("federation schema loaded", "schema", f.schema, "digest", sc.Digest(), "task", sc.Task, "features", len(sc.Features))
	return cfg, nil
}

// baseConfig is the configuration every run shares.
func (f *serveFlags) baseConfig(spec model.Spec, sketch *wire.SketchSpec, eval *model.Data, log *slog.Logger) aggregator.ServerConfig {
	return aggregator.ServerConfig{
		Federation: f.federation, ClientID: f.clientID,
		K: f.k, QuorumFraction: f.quorum, RoundTimeout: f.roundTimeout, Extension: f.extension, Settle: f.settle,
		MaxReselections: f.maxReselections, Rounds: f.rounds, Seed: f.seed,
		Algorithm: f.algo, Aggregator: f.agg, Selector: f.sel, AnchorSketch: sketch,
		Params: f.params,
		Model:  spec, Init: f.init, InitSeed: f.initSeed, Codec: f.codec, Downlink: f.downlink,
		StatePath: f.state, MetricsAddr: f.metricsAddr, Eval: eval, FinalModel: f.finalModel,
		MaxMessageBytes: f.maxPacket, Logger: log,
		RateMessages: f.rateMsgs, RateBurst: f.rateBurst, RateBytes: f.rateBytes, InstanceTakeover: f.instanceTakeover,
		StopPatience: f.stopPatience, StopTol: f.stopTol, StopDelta: f.stopDelta, Version: version,
	}
}

// runServe runs the aggregator daemon (`broker-agg run`).
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, f := serveFlagSet(stderr)
	if err := parseFlags(fs, args, &f.config); err != nil {
		return err
	}
	log, err := newLogger(stderr, f.logFormat, f.logLevel)
	if err != nil {
		return err
	}
	cfg, err := f.serverConfig(log)
	if err != nil {
		return err
	}
	startHeapProfile(ctx, log)
	// Everything checkable without side effects, before --rollback, the
	// broker or the state file is touched (the broker URL is set below).
	vc := cfg
	vc.BrokerURL = cmp.Or(f.brokerURL, "tcp://in-process")
	if err := vc.Validate(); err != nil {
		return err
	}
	if f.rollback != "" && cfg.DP != nil {
		return errors.New("--rollback with --dp: the rounds after the rollback point were published and charged; they would be published again under the same noise key")
	}
	if f.rollback != "" {
		if err := rollbackState(cfg.StatePath, f.rollback, log); err != nil {
			return err
		}
	}
	topics, err := wire.ForFederation(f.federation)
	if err != nil {
		return fmt.Errorf("--federation: %w", err)
	}
	if (f.tlsCert == "") != (f.tlsKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}

	if cfg.Roster, err = f.roster(); err != nil {
		return err
	}
	if len(cfg.Roster) > 0 {
		log.Info("roster", "sites", cfg.Roster, "enforced_by_the_embedded_broker", f.sites != "" && f.brokerURL == "")
	}
	if f.brokerURL == "" {
		return serveEmbedded(ctx, f, cfg, topics, log, stdout)
	}
	if err := f.externalBroker(&cfg); err != nil {
		return err
	}
	fresh := !exists(cfg.StatePath)
	srv, err := aggregator.NewServer(cfg)
	if err != nil {
		return err
	}
	return discardFresh(fresh, cfg.StatePath, srv, serve(ctx, srv, f.exitWhenFinished, stdout))
}

// externalBroker sets cfg's connection to the external --broker.
func (f *serveFlags) externalBroker(cfg *aggregator.ServerConfig) error {
	if f.brokerPasswd != "" || f.allowAnonymous || f.listen != "" || f.tlsClientCA != "" {
		return errors.New("--listen, --password-file, --tls-client-ca and --allow-anonymous configure the embedded broker; they do not apply with --broker")
	}
	cfg.BrokerURL = f.brokerURL
	if f.tlsCA != "" || f.tlsCert != "" || isTLSURL(f.brokerURL) {
		tc, err := pki.ClientTLSConfig(f.tlsCA, f.tlsCert, f.tlsKey)
		if err != nil {
			return err
		}
		tc.ServerName = f.tlsServerName
		cfg.TLS = tc
	}
	cfg.Username = f.username
	switch {
	case f.passwordFile != "":
		b, err := os.ReadFile(f.passwordFile)
		if err != nil {
			return fmt.Errorf("--password-file: %w", err)
		}
		cfg.Password = strings.TrimRight(strings.SplitN(string(b), "\n", 2)[0], "\r")
	default:
		cfg.Password = os.Getenv(passwordEnv)
	}
	if cfg.Password != "" && cfg.Username == "" {
		cfg.Username = f.clientID
	}
	return nil
}

// embeddedBroker is the embedded broker's configuration.
func (f *serveFlags) embeddedBroker(topics wire.Topics, log *slog.Logger) (broker.Config, error) {
	if f.username != "" || f.passwordFile != "" || f.tlsCA != "" || f.tlsServerName != "" {
		return broker.Config{}, errors.New("--username, --broker-password-file, --tls-ca and --tls-server-name are for an external --broker (hint: the embedded broker's client CA is --tls-client-ca)")
	}
	listen := f.listen
	if listen == "" {
		listen = "127.0.0.1:1883"
		if f.tlsCert != "" {
			listen = ":8883"
		}
	}
	var sites []string
	if f.sites != "" { // an explicit roster is enforced; a derived one only shown
		var err error
		if sites, err = parseSites(f.sites); err != nil {
			return broker.Config{}, err
		}
	}
	bc := broker.Config{Addr: listen, Prefix: topics.Prefix(), Superusers: []string{f.clientID}, Sites: sites,
		PasswordFile: f.brokerPasswd, AllowAnonymous: f.allowAnonymous, MaxPacketSize: uint32(min(int64(f.maxPacket), math.MaxUint32)),
		SessionExpiry: f.sessionExpiry, SiteQueue: f.siteQueue, Logger: log,
		// The aggregator's limits, enforced by the broker before routing
		// (node/broker/ratelimit.go): a flood never queues inside broker-agg.
		RateLimit: ratelimit.Limits{Messages: f.rateMsgs, Burst: f.rateBurst, Bytes: f.rateBytes}}
	if f.tlsCert != "" {
		tc, err := pki.ServerTLSConfig(f.tlsCert, f.tlsKey, f.tlsClientCA)
		if err != nil {
			return bc, err
		}
		bc.TLS = tc
	} else if f.tlsClientCA != "" {
		return bc, errors.New("--tls-client-ca needs --tls-cert and --tls-key (the embedded broker's certificate)")
	}
	// The password file and the ways to authenticate, before the state
	// file is written.
	if err := broker.Check(bc); err != nil {
		return bc, brokerFlagError(err, f.brokerPasswd)
	}
	return bc, nil
}

// serveEmbedded runs the daemon with its embedded broker.
func serveEmbedded(ctx context.Context, f *serveFlags, cfg aggregator.ServerConfig, topics wire.Topics, log *slog.Logger, stdout io.Writer) error {
	bc, err := f.embeddedBroker(topics, log)
	if err != nil {
		return err
	}
	// Open the state file before listening: a second daemon on the
	// same file fails without touching the port.
	var brk *broker.Broker
	cfg.Dial = func() (net.Conn, error) { return brk.Dial() }
	cfg.BrokerRateLimited = func() map[string]uint64 {
		if brk == nil { // before the broker starts
			return nil
		}
		return brk.RateLimited()
	}
	cfg.BrokerDropped = func() map[string]uint64 {
		if brk == nil {
			return nil
		}
		return brk.Dropped()
	}
	cfg.BrokerRefusals = func() []aggregator.SiteRefusal {
		if brk == nil {
			return nil
		}
		var out []aggregator.SiteRefusal
		for _, r := range brk.Refusals() {
			out = append(out, aggregator.SiteRefusal{ID: r.ID, Reason: r.Reason, At: r.At, Count: r.Count})
		}
		return out
	}
	cfg.BrokerURL = "tcp://in-process"
	fresh := !exists(cfg.StatePath)
	srv, err := aggregator.NewServer(cfg)
	if err != nil {
		return err
	}
	if brk, err = broker.Start(bc); err != nil {
		srv.Close()
		return discardFresh(fresh, cfg.StatePath, srv, err)
	}
	defer brk.Close()
	err = serve(ctx, srv, f.exitWhenFinished, stdout)
	if f.exitWhenFinished && isClosed(srv.Finished()) {
		// The sites connected now get the end of the run (the final
		// bundle) before the broker, and its retained copy, go away.
		dctx, cancel := context.WithTimeout(ctx, drainWait)
		if waiting := brk.Drain(dctx); len(waiting) > 0 {
			log.Warn("exiting although these clients have not acknowledged the end of the run: they may lack the final bundle", "clients", waiting, "waited", drainWait)
		}
		cancel()
	}
	return discardFresh(fresh, cfg.StatePath, srv, err)
}

// parseSites parses --sites: comma-separated site ids.
func parseSites(list string) ([]string, error) {
	var out []string
	for _, id := range strings.Split(list, ",") {
		id = strings.TrimSpace(id)
		if id == "" {
			continue
		}
		if err := wire.ValidID(id); err != nil {
			return nil, fmt.Errorf("--sites: %w", err)
		}
		out = append(out, id)
	}
	if len(out) == 0 {
		return nil, errors.New("--sites: no site id")
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// roster is the federation's expected sites: --sites, else the users of
// the embedded broker's --password-file and the client certificates
// `broker-agg pki` wrote next to --tls-client-ca (its clients/ folder),
// without the aggregator's own id.
func (f *serveFlags) roster() ([]string, error) {
	if f.sites != "" {
		return parseSites(f.sites)
	}
	var ids []string
	if f.brokerPasswd != "" && f.brokerURL == "" {
		users, err := broker.ReadPasswordFile(f.brokerPasswd)
		if err != nil {
			return nil, fmt.Errorf("--password-file: %w", err)
		}
		for u := range users {
			ids = append(ids, u)
		}
	}
	if f.tlsClientCA != "" && f.brokerURL == "" {
		certs, _ := filepath.Glob(filepath.Join(filepath.Dir(f.tlsClientCA), pki.ClientsDir, "*.crt"))
		for _, c := range certs {
			ids = append(ids, strings.TrimSuffix(filepath.Base(c), ".crt"))
		}
	}
	out := ids[:0]
	for _, id := range ids {
		if id != f.clientID && wire.ValidID(id) == nil {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// brokerFlagError names the flag behind an embedded broker's configuration
// error.
func brokerFlagError(err error, passwordFile string) error {
	if passwordFile != "" && strings.Contains(err.Error(), passwordFile) {
		return fmt.Errorf("--password-file: %w", err)
	}
	if strings.Contains(err.Error(), "no way to authenticate") {
		return fmt.Errorf("%w (--password-file, --tls-cert with --tls-key and --tls-client-ca, or --allow-anonymous)", err)
	}
	return err
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// discardFresh removes the state file a start created when the start
// failed before the daemon served a round (a busy port, a broker that
// refused the connection): the file holds nothing but the configuration
// that failed, and a corrected command must not be refused as another
// run's. err is the start's error; nil leaves everything as it is.
func discardFresh(fresh bool, path string, srv *aggregator.Server, err error) error {
	if err == nil || !fresh {
		return err
	}
	select {
	case <-srv.Ready():
		return err // it ran: the file is the run's
	default:
	}
	srv.Close() // released by Run already; a no-op then
	if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		return fmt.Errorf("%w (and removing the state file it created: %v)", err, rerr)
	}
	return err
}

func isTLSURL(u string) bool {
	for _, p := range []string{"ssl://", "tls://", "mqtts://", "tcps://", "wss://"} {
		if strings.HasPrefix(u, p) {
			return true
		}
	}
	return false
}

// drainWait bounds how long exit_when_finished waits, with the embedded
// broker, for the connected sites to acknowledge the end of the run.
const drainWait = 30 * time.Second

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func serve(ctx context.Context, srv *aggregator.Server, exitWhenFinished bool, stdout io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if exitWhenFinished {
		go func() {
			select {
			case <-srv.Finished():
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	return srv.Run(ctx)
}

// rollbackState carries out --rollback before the daemon opens the file.
func rollbackState(path, to string, log *slog.Logger) error {
	var n uint64
	if to != "last-good" {
		v, err := strconv.ParseUint(to, 10, 64)
		if err != nil || v == 0 {
			return fmt.Errorf("--rollback %q: want a round number >= 1 or last-good", to)
		}
		n = v
	}
	res, runID, err := aggregator.Rollback(path, n, time.Now())
	if err != nil {
		return fmt.Errorf("--rollback: %w", err)
	}
	log.Warn("state file rolled back: the federation resumes from this round as a new run", "state", path, "round", res.Round,
		"rounds_removed", res.Rounds, "z_removed", len(res.ZsRemoved), "copy", res.Backup, "run_id", runID)
	return nil
}

package main

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgefl/edgefl/agent"
	"github.com/edgefl/edgefl/aggregate"
	"github.com/edgefl/edgefl/aggregator"
	"github.com/edgefl/edgefl/broker"
	"github.com/edgefl/edgefl/bundle"
	"github.com/edgefl/edgefl/dataset"
	"github.com/edgefl/edgefl/evaluate"
	"github.com/edgefl/edgefl/model"
	"github.com/edgefl/edgefl/pki"
	"github.com/edgefl/edgefl/proxsolver"
	"github.com/edgefl/edgefl/schema"
	"github.com/edgefl/edgefl/storage"
	"github.com/edgefl/edgefl/wire"
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
	rateBurst                                int
	k                                        int
	quorum                                   float64
	roundTimeout, extension, settle          time.Duration
	maxReselections, rounds                  int
	seed                                     uint64
	algo, agg, sel, solver, codec, downlink  string
	mu, step, relax, gamma, lr, maxSeconds   float64
	batch, epochs                            int
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
	schema                                   string
	statsSites, evalEvery, stopPatience      int
	stopTol, stopDelta                       float64
	console                                  consoleFlags
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
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.config, "config", "", "configuration `FILE` of key = value lines, keys named as these flags (flags override the file)")

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
	fs.Float64Var(&f.rateMsgs, "rate-messages", aggregator.DefaultRateMessages, "per-site inbound rate limit in messages per second; over it (and --rate-burst) messages are dropped and counted")
	fs.IntVar(&f.rateBurst, "rate-burst", aggregator.DefaultRateBurst, "messages a site may send at once before --rate-messages applies")
	fs.Float64Var(&f.rateBytes, "rate-bytes", aggregator.DefaultRateBytes, "per-site inbound rate limit in bytes per second (one message of --max-message-bytes always fits)")
	fs.DurationVar(&f.sessionExpiry, "session-expiry", broker.DefaultSessionExpiry, "embedded broker: how long a disconnected site's session and queued messages are kept")
	fs.DurationVar(&f.instanceTakeover, "instance-takeover", aggregator.DefaultInstanceTakeover, "a site id is served for one installation (instance id) at a time; once two installations with one id were seen alive (a cloned gateway), the first keeps the site and the other is set aside until the first stopped cleanly or has been offline this long")
	fs.StringVar(&f.username, "username", "", "external broker: the aggregator's username")
	fs.StringVar(&f.passwordFile, "broker-password-file", "", "external broker: `FILE` holding the aggregator's password (default: $"+passwordEnv+")")

	fs.IntVar(&f.k, "per-round", 10, "clients selected per round")
	fs.Float64Var(&f.quorum, "quorum-fraction", 0.7, "fraction of the selected clients a round needs to close at its deadline, in (0, 1]")
	fs.DurationVar(&f.roundTimeout, "round-timeout", 10*time.Minute, "time from an announcement to its deadline")
	fs.DurationVar(&f.extension, "extension", 0, "length of the one extension below quorum (default --round-timeout)")
	fs.DurationVar(&f.settle, "settle", 5*time.Second, "wait for clients to come online before each draw")
	fs.IntVar(&f.maxReselections, "max-reselections", 3, "re-selections of a round below quorum before it stalls (negative: unlimited)")
	fs.IntVar(&f.rounds, "rounds", 0, "rounds to run (0: forever)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the selection and of randomised aggregators")

	fs.StringVar(&f.algo, "algorithm", aggregator.AlgoFedProx, "fedavg | fedprox | fedsplit | fedproxsplit | an aggregator ("+strings.Join(aggregate.Names(), ", ")+"), trained like fedprox")
	fs.StringVar(&f.agg, "aggregator", "", "how updates are combined: an update aggregator `SPEC` for the FedAvg/FedProx families (e.g. normbound:mult=3:inner=median); fedsplit-robust[:mult=M] (default) or fedsplit-mean for the FedSplit family (default: per --algorithm)")
	fs.StringVar(&f.sel, "selector", "uniform", "client selection: uniform | samples | loss[:power=P][:explore=E] | window")
	fs.StringVar(&f.solver, "solver", "sgd", "local solver: sgd | lbfgs")
	fs.Float64Var(&f.mu, "mu", 0.01, "FedProx proximal weight (0 for fedavg)")
	fs.Float64Var(&f.step, "step", 1, "FedSplit step size s")
	fs.Float64Var(&f.relax, "relax", 1, "FedSplit relaxation: 1 Peaceman-Rachford, 0.5 Douglas-Rachford")
	fs.Float64Var(&f.gamma, "gamma", 0.001, "target inexactness of the local solve, in (0, 1]")
	fs.Float64Var(&f.lr, "lr", 0.01, "SGD learning rate")
	fs.IntVar(&f.batch, "batch", 10, "SGD mini-batch size (0: full batch)")
	fs.IntVar(&f.epochs, "max-epochs", 20, "work budget: local epochs (0: no limit)")
	fs.Float64Var(&f.maxSeconds, "max-seconds", 0, "work budget: local seconds (0: no limit; the round deadline always applies)")
	fs.IntVar(&f.anchorSketch, "anchor-sketch", -1, "ask clients for the gradient at the anchor: -1 no, 0 the full gradient, N a random-projection sketch of length N (fedsim-cluster)")
	fs.StringVar(&f.codec, "codec", "fp32", "uplink codec `SPEC` clients must use for their deltas (fp32, fp16, q8, q4, qsgd:16, topk:0.05+q8, dct:28x28x10+topk:0.16+q4+ac, ...; see quant's package doc)")
	fs.StringVar(&f.downlink, "downlink", "fp32", "codec of the global model in the round announcement: fp32 | fp16")

	fs.StringVar(&f.schema, "schema", "", "federation schema `FILE` (JSON; see deploy/schema.example.json): sites read their CSV by column name, a statistics phase before round 1 fits the federation's preprocessing, the model's inputs and classes follow from it, sites evaluate on held-out rows, model bundles are written")
	fs.IntVar(&f.statsSites, "stats-sites", 0, "with --schema: the statistics phase closes once this many sites sent theirs, or at --round-timeout with a quorum (0: --per-round)")
	fs.IntVar(&f.evalEvery, "eval-every", 10, "with --schema: sites evaluate the global model every `E` rounds (0: only at the end); each evaluation writes latest.bundle.json next to the state file")
	fs.IntVar(&f.stopPatience, "stop-patience", 0, "with --schema: end the run early after `P` evaluations in a row without the federated loss improving on its best by more than --stop-tol (0: off)")
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

	fs.StringVar(&f.state, "state-file", "broker-agg.db", "state `FILE` (bbolt): round log, accepted updates, checkpoints; resumed on restart")
	fs.StringVar(&f.metricsAddr, "metrics-addr", DefaultMetricsAddr, "serve the console (/), /metrics (Prometheus), /status (JSON), /bundle and /healthz on `ADDR` (loopback by default; \"\": off)")
	f.console.register(fs)
	fs.StringVar(&f.evalData, "eval-data", "", "evaluation data `SPEC` (as simulate's --dataset: synthetic:A,B | synthetic-iid | idx:DIR | csv:PATH:label=COL | leaf:PATH; with --schema csv:PATH, read by the schema and the federation's preprocessing): report loss and accuracy per round")
	fs.StringVar(&f.finalModel, "final-model", "", "where the final model goes when the run ends: with --schema the final model bundle (default: final.bundle.json next to the state file), without it the last global model's weights (model.Save; default: none)")
	fs.BoolVar(&f.exitWhenFinished, "exit-when-finished", false, "exit once --rounds are done (default: keep serving receipts and metrics)")
	fs.StringVar(&f.rollback, "rollback", "", "before starting, roll the --state-file back to round `N` (or last-good: the newest intact round), keeping a copy of the file; command line only, never in a --config file")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format: text | json")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug | info | warn | error")
	for alias, name := range serveAliases {
		fs.Var(fs.Lookup(name).Value, alias, "same as --"+name)
	}
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: broker-agg run [flags]

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

flags:
`)
		fs.PrintDefaults()
	}
	return fs, f
}

// parseFlags parses args and then the --config file for the flags not set
// on the command line.
func parseFlags(fs *flag.FlagSet, args []string, configFlag *string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *configFlag == "" {
		return nil
	}
	return applyConfigFile(fs, *configFlag)
}

func applyConfigFile(fs *flag.FlagSet, path string) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[canonical(f.Name)] = true })
	fh, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	defer fh.Close()
	seen := map[string]int{}
	sc := bufio.NewScanner(io.LimitReader(fh, 1<<20))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, val, ok := strings.Cut(line, "=")
		if !ok {
			return fmt.Errorf("%s:%d: want key = value", path, n)
		}
		name := canonical(strings.ReplaceAll(strings.TrimSpace(key), "_", "-"))
		val = strings.TrimSpace(val)
		f := fs.Lookup(name)
		switch {
		case f == nil || name == "config" || name == "rollback":
			return fmt.Errorf("%s:%d: unknown key %q", path, n, strings.TrimSpace(key))
		case seen[name] > 0:
			return fmt.Errorf("%s:%d: %s repeats line %d", path, n, name, seen[name])
		}
		seen[name] = n
		if set[name] {
			continue // the command line wins
		}
		if err := fs.Set(name, val); err != nil {
			return fmt.Errorf("%s:%d: %s: %w", path, n, name, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	return nil
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	o := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
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
	cfg, err := f.modelServerConfig(log)
	if err != nil {
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
	cfg.Schema, cfg.StatsSites, cfg.EvalEvery = sc, f.statsSites, f.evalEvery
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
		Params: aggregator.Params{Mu: f.mu, Step: f.step, Relax: f.relax, Solver: f.solver, Gamma: f.gamma, LR: f.lr,
			Batch: f.batch, MaxEpochs: f.epochs, MaxSeconds: f.maxSeconds},
		Model: spec, Init: f.init, InitSeed: f.initSeed, Codec: f.codec, Downlink: f.downlink,
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
	// Everything checkable without side effects, before --rollback, the
	// broker or the state file is touched (the broker URL is set below).
	vc := cfg
	vc.BrokerURL = cmp.Or(f.brokerURL, "tcp://in-process")
	if err := vc.Validate(); err != nil {
		return err
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

	var brk *broker.Broker
	if f.brokerURL != "" {
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
	} else {
		if f.username != "" || f.passwordFile != "" || f.tlsCA != "" || f.tlsServerName != "" {
			return errors.New("--username, --broker-password-file, --tls-ca and --tls-server-name configure the connection to an external --broker (the embedded broker's client CA is --tls-client-ca)")
		}
		listen := f.listen
		if listen == "" {
			listen = "127.0.0.1:1883"
			if f.tlsCert != "" {
				listen = ":8883"
			}
		}
		bc := broker.Config{Addr: listen, Prefix: topics.Prefix(), Superusers: []string{f.clientID},
			PasswordFile: f.brokerPasswd, AllowAnonymous: f.allowAnonymous, MaxPacketSize: uint32(min(int64(f.maxPacket), math.MaxUint32)),
			SessionExpiry: f.sessionExpiry, Logger: log}
		if f.tlsCert != "" {
			tc, err := pki.ServerTLSConfig(f.tlsCert, f.tlsKey, f.tlsClientCA)
			if err != nil {
				return err
			}
			bc.TLS = tc
		} else if f.tlsClientCA != "" {
			return errors.New("--tls-client-ca needs --tls-cert and --tls-key (the embedded broker's certificate)")
		}
		// The password file and the ways to authenticate, before the state
		// file is written.
		if err := broker.Check(bc); err != nil {
			return brokerFlagError(err, f.brokerPasswd)
		}
		// Open the state file before listening: a second daemon on the
		// same file fails without touching the port.
		cfg.Dial = func() (net.Conn, error) { return brk.Dial() }
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
	fresh := !exists(cfg.StatePath)
	srv, err := aggregator.NewServer(cfg)
	if err != nil {
		return err
	}
	return discardFresh(fresh, cfg.StatePath, srv, serve(ctx, srv, f.exitWhenFinished, stdout))
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

// runStatus prints the federation's current round and clients: from the
// state file when no daemon holds it, else from the running daemon's
// /status endpoint (bbolt lets one process at a time open the file).
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	state := fs.String("state", "broker-agg.db", "the daemon's state `FILE`")
	addr := fs.String("addr", "", "ask the running daemon at `ADDR` (its --metrics address) instead of reading the file (default: read the file; if the daemon holds it, ask "+DefaultMetricsAddr+")")
	asJSON := fs.Bool("json", false, "print JSON (from a running daemon: the console's data, /status)")
	var dc daemonClient
	dc.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: broker-agg status [--state FILE | --addr HOST:PORT|https://HOST:PORT] [--json]\n\nPrints the current round and each client's last-seen and participation; from a\nrunning daemon (--addr) also the run's configuration, recent rounds and each\nsite's figures: the data behind its console.\n\nflags:")
		fs.PrintDefaults()
	}
	var cfgFlag string
	if err := parseFlags(fs, args, &cfgFlag); err != nil {
		return err
	}
	var st aggregator.Status
	var err error
	if *addr != "" {
		st, err = fetchStatus(ctx, &dc, *addr)
	} else {
		st, err = readStatusFile(*state)
		if errors.Is(err, storage.ErrLocked) {
			var herr error
			if st, herr = fetchStatus(ctx, &dc, DefaultMetricsAddr); herr != nil {
				return fmt.Errorf("%s is held by a running daemon and its status endpoint did not answer (%v): pass its --metrics address as --addr", *state, herr)
			}
			err = nil
		}
	}
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	return printStatus(stdout, st, time.Now())
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

func readStatusFile(path string) (aggregator.Status, error) {
	if _, err := os.Stat(path); err != nil {
		return aggregator.Status{}, fmt.Errorf("--state: %w", err)
	}
	s, err := storage.OpenAgg(path, storage.Options{LockTimeout: 500 * time.Millisecond})
	if err != nil {
		return aggregator.Status{}, err
	}
	defer s.Close()
	return aggregator.ReadStatus(s)
}

// fetchStatus reads a running daemon's /status: the console's data.
func fetchStatus(ctx context.Context, dc *daemonClient, addr string) (aggregator.Status, error) {
	var st aggregator.Status
	resp, err := dc.get(ctx, addr, "/status?compact=1", 10*time.Second)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return st, fmt.Errorf("%s/status: %s: %s", addr, resp.Status, strings.TrimSpace(string(b)))
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&st); err != nil {
		return st, fmt.Errorf("%s/status: %w", addr, err)
	}
	return st, nil
}

func printStatus(w io.Writer, st aggregator.Status, now time.Time) error {
	if st.Live != nil {
		now = st.Live.Now // the daemon's clock
	}
	fmt.Fprintf(w, "federation %s (%s)  round %d", orDash(st.Federation), orDash(st.Algorithm), st.Round)
	if l := st.Live; l != nil && l.Rounds > 0 {
		fmt.Fprintf(w, " of %d", l.Rounds)
	}
	fmt.Fprintf(w, "  phase %s", st.Phase)
	if st.RoundOpenedAt != nil && st.Phase != aggregator.PhaseFinished {
		fmt.Fprintf(w, " for %s", now.Sub(*st.RoundOpenedAt).Round(time.Second))
	}
	if st.Deadline != nil {
		fmt.Fprintf(w, "  deadline %s (%s)", st.Deadline.UTC().Format(time.RFC3339), rel(*st.Deadline, now))
	}
	if st.RunID != "" {
		fmt.Fprintf(w, "\nrun %s  codec %s, downlink %s", st.RunID, orDash(st.Codec), orDash(st.Downlink))
		if st.Aggregator != "" {
			fmt.Fprintf(w, "  aggregator %s", st.Aggregator)
		}
	}
	if l := st.Live; l != nil {
		fmt.Fprintf(w, "  quorum %d of %d", l.Quorum, l.PerRound)
	}
	fmt.Fprintf(w, "\nselected %d: %s\nreceived %d: %s\n", len(st.Selected), orDash(strings.Join(st.Selected, " ")),
		len(st.Received), orDash(strings.Join(st.Received, " ")))
	c := st.Counters
	fmt.Fprintf(w, "rounds closed %d  accepted %d (late %d, partial %d)  stragglers %d  extensions %d  reselections %d\n\n",
		c.RoundsClosed, c.Accepted, c.AcceptedLate, c.PartialUpdates, c.Stragglers, c.Extensions, c.Reselections)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CLIENT\tONLINE\tLAST SEEN\tSAMPLES\tUPDATES\tLAST ROUND\tTHIS ROUND")
	for _, ci := range st.Clients {
		seen := "-"
		if ci.LastSeen != nil {
			seen = ci.LastSeen.UTC().Format("2006-01-02 15:04:05") + " (" + rel(*ci.LastSeen, now) + ")"
		}
		this := "-"
		switch {
		case ci.Reported:
			this = "reported"
		case ci.Selected:
			this = "waiting"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\n", ci.ID, yesNo(ci.Online), seen, ci.Samples, ci.Participation, ci.LastRound, this)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	printDuplicates(w, st.DuplicateInstances)
	if err := printLive(w, st); err != nil {
		return err
	}
	return printFedStatus(w, st)
}

// printLive prints what only a running daemon knows: each site's straggled
// and partial rounds, its last work report and rejections, and the last
// rounds of the history.
func printLive(w io.Writer, st aggregator.Status) error {
	l := st.Live
	if l == nil {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "\nsites over the last %d rounds:\n", len(l.History))
	fmt.Fprintln(tw, "CLIENT\tSTRAGGLED\tPARTIAL\tLAST GAMMA\tEPOCHS\tREJECTED")
	for _, ci := range st.Clients {
		gamma, epochs := "-", "-"
		if lw := ci.LastWork; lw != nil {
			gamma, epochs = fmt.Sprintf("%.3g", lw.Gamma), strconv.FormatUint(lw.Epochs, 10)
		}
		var rej []string
		for _, r := range slices.Sorted(maps.Keys(ci.Rejections)) {
			rej = append(rej, fmt.Sprintf("%s %d", r, ci.Rejections[r]))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", ci.ID, ci.Straggled, ci.Partial, gamma, epochs, orDash(strings.Join(rej, ", ")))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	h := l.History
	if len(h) == 0 {
		return nil
	}
	if len(h) > 5 {
		h = h[len(h)-5:]
	}
	fmt.Fprintln(w, "\nrecent rounds:")
	fmt.Fprintln(tw, "ROUND\tPARTICIPANTS\tSTRAGGLERS\tPARTIAL\tBYTES UP\tBYTES DOWN\t||x'-x||")
	opt := func(p *uint64) string {
		if p == nil {
			return "-"
		}
		return strconv.FormatUint(*p, 10)
	}
	for _, r := range h {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\n", r.Round, r.Participants, orDash(strings.Join(r.Stragglers, " ")),
			orDash(strings.Join(r.Partial, " ")), opt(r.BytesUp), opt(r.BytesDown), optG(r.DeltaNorm))
	}
	return tw.Flush()
}

// printFedStatus prints a run's schema, statistics, evaluation, site errors
// and final bundle (nothing for a run without a schema and site errors).
func printFedStatus(w io.Writer, st aggregator.Status) error {
	var errs []string
	for _, ci := range st.Clients {
		if ci.Error != nil {
			errs = append(errs, fmt.Sprintf("  %s: %s: %s", ci.ID, ci.Error.Reason, ci.Error.Message))
		}
	}
	if len(errs) > 0 {
		fmt.Fprintf(w, "\nsite errors:\n%s\n", strings.Join(errs, "\n"))
	}
	if st.Schema == "" {
		return nil
	}
	fmt.Fprintf(w, "\nschema %.16s  statistics from %d sites: %s\n", st.Schema, len(st.StatisticsSites), orDash(strings.Join(st.StatisticsSites, " ")))
	if m := st.Model; m != nil {
		fmt.Fprintf(w, "model %s, %d inputs after the federation's preprocessing", m.Kind, m.Inputs)
		if m.Classes > 0 {
			fmt.Fprintf(w, ", %d classes", m.Classes)
		}
		fmt.Fprintln(w)
	}
	if ev := st.Evaluation; ev != nil {
		fmt.Fprintf(w, "evaluation of round %d (the model after %d aggregations) on the sites' held-out rows:\n", ev.Round, ev.Round)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		cls := ev.Federation.Confusion != nil
		if cls {
			fmt.Fprintln(tw, "SITE\tN\tLOSS\tACCURACY\tBALANCED\tAUC")
		} else {
			fmt.Fprintln(tw, "SITE\tN\tLOSS\tRMSE\tR2")
		}
		row := func(name string, r evaluate.Report) {
			if cls {
				fmt.Fprintf(tw, "%s\t%d\t%.4g\t%.4f\t%.4f\t%s\n", name, r.N, r.Loss, r.Accuracy, r.BalancedAccuracy, optF(r.AUC))
			} else {
				fmt.Fprintf(tw, "%s\t%d\t%.4g\t%.4g\t%s\n", name, r.N, r.Loss, r.RMSE, optF(r.R2))
			}
		}
		for _, id := range slices.Sorted(maps.Keys(ev.Sites)) {
			row(id, ev.Sites[id])
		}
		row("federation", ev.Federation)
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if st.StopReason != "" {
		fmt.Fprintf(w, "run ended: %s\n", st.StopReason)
	}
	if b := st.FinalBundle; b != nil {
		fmt.Fprintf(w, "final bundle: round %d, %d bytes, digest %.16s (broker-agg export --state FILE --out FILE)\n", b.Round, b.Bytes, b.Digest)
	}
	return nil
}

// printDuplicates lists the sites a second installation uses.
func printDuplicates(w io.Writer, ds []aggregator.DuplicateInstance) {
	if len(ds) == 0 {
		return
	}
	fmt.Fprintf(w, "\nsecond installations with one site id (set aside; a cloned gateway? give each its own site_id):\n")
	for _, d := range ds {
		var others []string
		for _, o := range d.Others {
			others = append(others, fmt.Sprintf("%s (last seen %s)", o.ID, o.LastSeen.UTC().Format(time.RFC3339)))
		}
		fmt.Fprintf(w, "  %s: held by instance %s; set aside: %s, %d messages\n", d.Site, d.Instance, strings.Join(others, ", "), d.SetAside)
	}
}

func optF(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.4f", *v)
}

func rel(t, now time.Time) string {
	d := now.Sub(t).Round(time.Second)
	if d < 0 {
		return "in " + (-d).String()
	}
	return d.String() + " ago"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// runPKI makes a site PKI (`broker-agg pki`), or with `pki passwd` adds a
// site to a password file.
func runPKI(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "passwd" {
		return runPasswd(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("pki", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "pki", "output `DIR`")
	hosts := fs.String("hosts", "localhost,127.0.0.1,::1", "comma-separated host names and IP addresses of the broker (server certificate)")
	clients := fs.String("clients", "", "comma-separated site ids to issue client certificates for (CN = id)")
	aggID := fs.String("aggregator-id", aggregator.DefaultClientID, "the aggregator's id, also issued a client certificate (for an external broker with mutual TLS; \"\": none)")
	caName := fs.String("ca-name", "edgefl site CA", "the CA's common name")
	days := fs.Int("days", int(pki.DefaultLeafValidity/(24*time.Hour)), "validity of the server and client certificates in days")
	force := fs.Bool("force", false, "re-issue existing server and client certificates (never the CA)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: broker-agg pki [flags]
       broker-agg pki passwd --file FILE --user ID [--password-stdin]

Makes (or extends) a site PKI for mutual TLS with ECDSA P-256 keys:
  DIR/ca.crt, ca.key              the CA (made once, reused; keep ca.key offline)
  DIR/server.crt, server.key      the broker's certificate for --hosts
  DIR/clients/ID.crt, ID.key      one per site (CN = site id) and the aggregator
Keys are written with mode 0600. Run the embedded broker with
  broker-agg run --tls-cert DIR/server.crt --tls-key DIR/server.key --tls-client-ca DIR/ca.crt
and give each site its ca.crt, ID.crt and ID.key.

flags:
`)
		fs.PrintDefaults()
	}
	var cfgFlag string
	if err := parseFlags(fs, args, &cfgFlag); err != nil {
		return err
	}
	ids := splitList(*clients)
	if *aggID != "" {
		ids = append(ids, *aggID)
	}
	if *days <= 0 {
		return errors.New("--days: want > 0")
	}
	written, err := pki.MakeSite(pki.SiteOptions{Dir: *dir, CAName: *caName, Hosts: splitList(*hosts), Clients: ids,
		Validity: time.Duration(*days) * 24 * time.Hour, Force: *force})
	for _, p := range written {
		fmt.Fprintln(stdout, "wrote", p)
	}
	if err != nil {
		return err
	}
	if len(written) == 0 {
		fmt.Fprintln(stdout, "nothing to do: every certificate exists (use --force to re-issue)")
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return slices.Compact(out)
}

// runPasswd adds or replaces a site in a Mosquitto-format password file.
func runPasswd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("pki passwd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("file", "", "password `FILE` (created with mode 0600)")
	user := fs.String("user", "", "site `ID` (username = MQTT client id = topic id)")
	fromStdin := fs.Bool("password-stdin", false, "read the password from the first line of standard input (default: generate one and print it)")
	iters := fs.Int("iterations", broker.DefaultIterations, "PBKDF2-SHA512 iterations")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: broker-agg pki passwd --file FILE --user ID [--password-stdin]

Adds a site to a Mosquitto-format password file for the embedded broker's
--password-file (or Mosquitto's), or replaces its password. Without
--password-stdin a random password is generated and printed once: give it to
the site (its password_file).

flags:
`)
		fs.PrintDefaults()
	}
	var cfgFlag string
	if err := parseFlags(fs, args, &cfgFlag); err != nil {
		return err
	}
	if *file == "" || *user == "" {
		return errors.New("--file and --user are required")
	}
	if err := wire.ValidID(*user); err != nil {
		return fmt.Errorf("--user: %w", err)
	}
	var pw string
	if *fromStdin {
		line, err := bufio.NewReader(io.LimitReader(os.Stdin, 4096)).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("reading the password: %w", err)
		}
		pw = strings.TrimRight(line, "\r\n")
		if pw == "" {
			return errors.New("empty password on standard input")
		}
	} else {
		b := make([]byte, 18)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		pw = base64.RawURLEncoding.EncodeToString(b)
	}
	if err := broker.SetPassword(*file, *user, pw, *iters); err != nil {
		return err
	}
	if !*fromStdin {
		fmt.Fprintf(stdout, "%s\n", pw)
		fmt.Fprintf(stderr, "password of %s set in %s (printed above once; give it to the site)\n", *user, filepath.Clean(*file))
	}
	return nil
}

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

func optG(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.4g", *v)
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

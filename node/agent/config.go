package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/edgefl/edgefl/data/dataset"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/proto/round"
	"github.com/edgefl/edgefl/proto/wire"
)

// ErrConfig is wrapped by every error about the agent's configuration.
var ErrConfig = errors.New("agent: bad configuration")

// Defaults of the optional settings.
const (
	DefaultKeepAlive        = 30 * time.Second
	DefaultConnectTimeout   = 10 * time.Second
	DefaultReconnectMin     = 2 * time.Second
	DefaultReconnectMax     = 60 * time.Second
	DefaultPublishTimeout   = 30 * time.Second
	DefaultDeadlineMargin   = time.Second
	DefaultFallbackSeconds  = 300.0
	DefaultSGDLearningRate  = 0.01
	DefaultDataSeed         = 1
	DefaultMaxMessageBytes  = 32 << 20
	DefaultShutdownTimeout  = 2 * time.Second
	defaultQuiesceMillis    = 250
	defaultLogLevel         = "info"
	defaultDataClientUnused = -1
	// DefaultModelOutName is the final bundle's file name in the state
	// file's directory when ModelOut is not set.
	DefaultModelOutName = "final.bundle.json"
)

// Config is everything an edge agent is told. The zero value is not valid:
// start from DefaultConfig.
type Config struct {
	// SiteID is this site's client id: the MQTT client id, the id in every
	// message and topic, and the identity recorded in the state file.
	// 1 to 64 characters from [A-Za-z0-9._-].
	SiteID string
	// Federation names the federation; topics live under
	// "edgefl/<federation>/".
	Federation string
	// Brokers are the broker URLs, tried in order: tcp://host:1883,
	// ssl://host:8883 (also tls://, mqtts://), ws://, wss://.
	Brokers []string
	// TLS: CAFile verifies the broker (empty = the system roots), CertFile
	// and KeyFile are this site's client certificate for mutual TLS (both or
	// neither), ServerName overrides the name checked in the broker's
	// certificate. Any of them requires a TLS broker URL.
	CAFile, CertFile, KeyFile, ServerName string
	// Username and Password authenticate to the broker (optional).
	Username, Password string

	// Data is the local data source, a dataset source spec:
	//   csv:PATH | csv:PATH:label=COLUMN[:regression] | idx:DIR | leaf:PATH |
	//   synthetic:ALPHA,BETA | synthetic-iid
	// A federation with a schema (announced by the aggregator) reads a csv
	// source by the schema: by header name, the label column the schema's
	// (label= is then ignored). csv:PATH without label= serves only such
	// federations. Without a schema the source is loaded at start as
	// configured (ignored when Deps.Data is given).
	Data string
	// EvalData is an optional separate CSV of held-out rows (read by the
	// federation's schema), csv:PATH as Data or a bare PATH: then every
	// row of Data is a training row. Without it the schema's hold-out rule
	// splits Data. Unused without a schema.
	EvalData string
	// ModelOut is where the final model bundle of a finished run is
	// written (atomically); "" = final.bundle.json next to StateFile.
	ModelOut string
	// DataClient picks one client of the federation the source is
	// partitioned into (0-based), for demos where several agents share one
	// data set; -1 means the whole source is this site's data (the normal
	// case for csv, idx and leaf; synthetic sources need a client).
	DataClient int
	// DataPartition (natural, iid, dirichlet:ALPHA, classes:K),
	// DataClients (the number of clients of the partition; for synthetic the
	// number of devices), DataSeed and DataMaxSamples (synthetic: cap on a
	// device's samples, 0 = none) describe that federation; every site of a
	// demo must use the same values. Used only when DataClient >= 0.
	DataPartition  string
	DataClients    int
	DataSeed       uint64
	DataMaxSamples int
	// Standardize is none or client (this site's own feature statistics);
	// "" picks client for csv and leaf, none for idx and synthetic.
	Standardize string

	// StateFile is the bbolt file holding the identity, FedSplit z, the last
	// global model and the outbox.
	StateFile string
	// FreshState lets Run create a missing state file although traces show
	// this site ran before (CheckStateFile): a deliberate start over with
	// a new identity. Not a key of the configuration file: edge-agent
	// run's --fresh-state (and --reset-state) set it.
	FreshState bool

	// Local is the device's work budget and solver overrides.
	Local Local

	// Seed seeds the local solver's and the uplink codec's randomness
	// (mixed with the round number).
	Seed uint64

	// MaxMessageBytes bounds every inbound message (keep it at or below the
	// broker's packet size cap).
	MaxMessageBytes int

	// Connection timing (zero = the default): the MQTT keepalive, the
	// timeout of one connection attempt, the retry interval of the first
	// connection (also the first delay of an unreceipted update's re-send,
	// and of an INTERNAL receipt's), the longest reconnect backoff (also the
	// longest re-send backoff), and how long a publish may wait.
	KeepAlive, ConnectTimeout, ReconnectMin, ReconnectMax, PublishTimeout time.Duration

	// LogLevel is debug, info, warn or error.
	LogLevel string

	// SoftwareVersion is reported in the status message.
	SoftwareVersion string
}

// Local is the device's side of the local solve: its own work budget,
// combined with the round's (the smaller limit wins), and overrides of the
// solver parameters the round announces.
type Local struct {
	// MaxEpochs caps the passes over the local data per round (0 = no
	// device cap).
	MaxEpochs int
	// MaxSeconds caps the wall-clock time of a local solve (0 = no device
	// cap).
	MaxSeconds float64
	// Solver forces "sgd" or "lbfgs" whatever the round says ("" = as
	// announced). It is also the only capability the status then reports.
	Solver string
	// LR and Batch override the announced SGD learning rate and mini-batch
	// size (0 = as announced).
	LR    float64
	Batch int
	// DeadlineMargin is how long before the round's deadline the solve
	// stops, leaving time for the final measurement, the commit and the
	// publish (0 = DefaultDeadlineMargin; negative = none).
	DeadlineMargin time.Duration
	// FallbackSeconds bounds a solve that neither the device, the round nor
	// a deadline limits (0 = DefaultFallbackSeconds), so that a round
	// without a budget cannot run forever.
	FallbackSeconds float64
}

// DefaultConfig returns a Config with every optional setting at its default.
func DefaultConfig() Config {
	return Config{
		DataClient:      defaultDataClientUnused,
		DataPartition:   dataset.PartNatural,
		DataSeed:        DefaultDataSeed,
		Seed:            1,
		MaxMessageBytes: DefaultMaxMessageBytes,
		LogLevel:        defaultLogLevel,
		SoftwareVersion: "dev",
	}
}

// withDefaults fills the zero durations and limits.
func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.KeepAlive, DefaultKeepAlive)
	def(&c.ConnectTimeout, DefaultConnectTimeout)
	def(&c.ReconnectMin, DefaultReconnectMin)
	def(&c.ReconnectMax, DefaultReconnectMax)
	def(&c.PublishTimeout, DefaultPublishTimeout)
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.LogLevel == "" {
		c.LogLevel = defaultLogLevel
	}
	if c.ModelOut == "" && c.StateFile != "" {
		c.ModelOut = filepath.Join(filepath.Dir(c.StateFile), DefaultModelOutName)
	}
	c.Local = c.Local.withDefaults()
	return c
}

func (l Local) withDefaults() Local {
	if l.DeadlineMargin == 0 {
		l.DeadlineMargin = DefaultDeadlineMargin
	}
	if l.DeadlineMargin < 0 {
		l.DeadlineMargin = 0
	}
	if l.FallbackSeconds == 0 {
		l.FallbackSeconds = DefaultFallbackSeconds
	}
	return l
}

func configErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
}

// Validate reports the first setting that is missing or out of range. The
// data source is checked when it is loaded (New), the TLS files when they
// are read.
func (c Config) Validate() error {
	if err := wire.ValidID(c.SiteID); err != nil {
		return configErr("site id: %v", err)
	}
	if err := wire.ValidID(c.Federation); err != nil {
		return configErr("federation: %v", err)
	}
	if err := c.validateBrokers(); err != nil {
		return err
	}
	if c.StateFile == "" {
		return configErr("no state file")
	}
	if err := c.validateData(); err != nil {
		return err
	}
	if err := c.validateSession(); err != nil {
		return err
	}
	if _, err := ParseLevel(c.LogLevel); err != nil {
		return err
	}
	return c.Local.Validate()
}

// validateBrokers checks the broker URLs against the TLS and login
// settings.
func (c Config) validateBrokers() error {
	if len(c.Brokers) == 0 {
		return configErr("no broker URL")
	}
	tlsWanted := c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" || c.ServerName != ""
	for _, b := range c.Brokers {
		u, err := url.Parse(b)
		if err != nil {
			return configErr("broker %q: %v", b, err)
		}
		if u.Host == "" {
			return configErr("broker %q: no host (expected e.g. tcp://host:1883 or ssl://host:8883)", b)
		}
		switch strings.ToLower(u.Scheme) {
		case "tcp", "mqtt":
			if tlsWanted {
				return configErr("broker %q is not a TLS URL but TLS files are set (use ssl://, tls://, mqtts:// or wss://)", b)
			}
		case "ws":
			if tlsWanted {
				return configErr("broker %q is not a TLS URL but TLS files are set (use wss://)", b)
			}
		case "ssl", "tls", "mqtts", "tcps", "wss":
		default:
			return configErr("broker %q: scheme %q, expected tcp, ssl, tls, mqtts, ws or wss", b, u.Scheme)
		}
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return configErr("tls cert and key go together (both or neither)")
	}
	if c.Password != "" && c.Username == "" {
		return configErr("a password without a username")
	}
	return nil
}

// validateData checks the data source's settings and the output paths.
func (c Config) validateData() error {
	if c.EvalData != "" {
		if _, ok := csvPath(c.Data); !ok || c.DataClient >= 0 {
			return configErr("eval_data %s: held-out rows of a csv source read by the federation's schema; data %q is not csv:PATH", c.EvalData, c.Data)
		}
		if evalDataPath(c.EvalData) == "" {
			return configErr("eval_data %s: want csv:PATH or PATH (the federation's schema reads it: no label= or :regression)", c.EvalData)
		}
	}
	if c.ModelOut != "" && filepath.Clean(c.ModelOut) == filepath.Clean(c.StateFile) {
		return configErr("model_out %s is the state file", c.ModelOut)
	}
	if c.DataClient < -1 {
		return configErr("data client %d: expected >= 0, or -1 for the whole source", c.DataClient)
	}
	if c.DataClients < 0 || c.DataMaxSamples < 0 {
		return configErr("data clients %d, data max samples %d: expected >= 0", c.DataClients, c.DataMaxSamples)
	}
	switch c.Standardize {
	case "", dataset.StandardizeNone, dataset.StandardizeClient:
	case dataset.StandardizeGlobal:
		if c.DataClient < 0 {
			return configErr("standardize global needs every site's data; a site standardizes with its own statistics (client) or not at all (none)")
		}
	default:
		return configErr("standardize %q: expected none or client", c.Standardize)
	}
	return nil
}

// validateSession checks the MQTT session's limits and durations.
func (c Config) validateSession() error {
	if c.MaxMessageBytes < 0 {
		return configErr("max message bytes %d < 0", c.MaxMessageBytes)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"keepalive", c.KeepAlive}, {"connect timeout", c.ConnectTimeout}, {"reconnect min", c.ReconnectMin}, {"reconnect max", c.ReconnectMax}, {"publish timeout", c.PublishTimeout}} {
		if d.v < 0 {
			return configErr("%s %v < 0", d.name, d.v)
		}
	}
	return nil
}

// Validate reports a device budget or override out of range: the device's
// caps and overrides are training parameters, checked as the round's are
// (round.Params.Validate).
func (l Local) Validate() error {
	p := round.Params{Solver: l.Solver, LR: l.LR, Batch: l.Batch, MaxEpochs: l.MaxEpochs, MaxSeconds: l.MaxSeconds}
	if err := p.Validate(""); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if f := l.FallbackSeconds; math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return configErr("fallback seconds %v: expected a finite number >= 0", f)
	}
	return nil
}

// ParseLevel reads a log level: debug, info, warn or error.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	switch strings.ToLower(s) {
	case "", "info":
		l = slog.LevelInfo
	case "debug":
		l = slog.LevelDebug
	case "warn", "warning":
		l = slog.LevelWarn
	case "error":
		l = slog.LevelError
	default:
		return l, configErr("log level %q: expected debug, info, warn or error", s)
	}
	return l, nil
}

// capabilities are the solver names this agent runs.
func (l Local) capabilities() []string {
	if l.Solver != "" {
		return []string{l.Solver}
	}
	return []string{proxsolver.LBFGS, proxsolver.SGD}
}

// csvPath is the file of a csv source (csv:PATH[:label=COLUMN][:regression]),
// which a federation schema reads by header name.
func csvPath(data string) (string, bool) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(data), "csv:")
	if !ok {
		return "", false
	}
	rest = strings.TrimSuffix(rest, ":regression")
	if i := strings.LastIndex(rest, ":label="); i >= 0 {
		rest = rest[:i]
	}
	return rest, rest != ""
}

// evalDataPath is the file of an eval_data setting: csv:PATH (as data is
// written) or a bare PATH; "" for a csv: setting with options, which the
// schema's reading does not take.
func evalDataPath(e string) string {
	e = strings.TrimSpace(e)
	rest, ok := strings.CutPrefix(e, "csv:")
	if !ok {
		return e
	}
	if p, _ := csvPath(e); p != rest {
		return ""
	}
	return rest
}

// schemaOnly reports a csv source without label=: it can only be read by a
// federation schema, so nothing is loaded at start.
func schemaOnly(c Config) bool {
	_, ok := csvPath(c.Data)
	return ok && c.DataClient < 0 && !strings.Contains(c.Data, ":label=")
}

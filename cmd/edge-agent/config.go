package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/edgefl/edgefl/internal/cli"
	"github.com/edgefl/edgefl/node/agent"
)

// The configuration file is plain text, one setting per line:
//
//	# a comment
//	key = value
//
// Keys are the option names below (a '-' in a key reads as '_'); values run
// to the end of the line, surrounding spaces removed. An unknown key, a
// repeated key (except broker) or a bad value is an error naming the file
// and line. Every option can also be given as a flag, --key-with-hyphens
// VALUE, which overrides the file. deploy/edge-agent.example.conf documents
// every option. internal/cli parses the file (the parser broker-agg's
// --config files share); this file names the options and words the errors.

// option is one setting of the file and the command line.
type option struct {
	key  string // file form, underscores
	help string
	val  optVal
	// def is the default shown in --help when the setting's zero value
	// stands for one the agent fills in (keepalive 0 = 30s); otherwise
	// the default configuration's value is shown, when it is not zero.
	def   string
	multi bool // may repeat (values accumulate)
}

// optVal reads (set) and shows (get) one setting; typ names its values in
// --help.
type optVal struct {
	typ string
	set func(c *runConfig, v string) error
	get func(c *runConfig) string
}

func (o option) set(c *runConfig, v string) error { return o.val.set(c, v) }

func flagName(key string) string { return strings.ReplaceAll(key, "_", "-") }

// The value constructors below are not inlined: inlined into options,
// each call site got its own copy of the set and get closures (9 kB of
// edge-agent's arm64 text); called, they share one pair per constructor.
//
//go:noinline
func str(dst func(c *runConfig) *string) optVal {
	return typedStr("string", dst)
}

//go:noinline
func typedStr(typ string, dst func(c *runConfig) *string) optVal {
	return optVal{typ: typ, set: func(c *runConfig, v string) error { *dst(c) = v; return nil },
		get: func(c *runConfig) string { return *dst(c) }}
}

//go:noinline
func integer(dst func(c *runConfig) *int, lo int) optVal {
	return optVal{typ: "int", set: func(c *runConfig, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < lo {
			return fmt.Errorf("%q: expected an integer >= %d", v, lo)
		}
		*dst(c) = n
		return nil
	}, get: func(c *runConfig) string { return strconv.Itoa(*dst(c)) }}
}

//go:noinline
func unsigned(dst func(c *runConfig) *uint64) optVal {
	return optVal{typ: "uint", set: func(c *runConfig, v string) error {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return fmt.Errorf("%q: expected an integer >= 0", v)
		}
		*dst(c) = n
		return nil
	}, get: func(c *runConfig) string { return strconv.FormatUint(*dst(c), 10) }}
}

//go:noinline
func number(dst func(c *runConfig) *float64) optVal {
	return optVal{typ: "float", set: func(c *runConfig, v string) error {
		x, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(x) || math.IsInf(x, 0) || x < 0 {
			return fmt.Errorf("%q: expected a finite number >= 0", v)
		}
		*dst(c) = x
		return nil
	}, get: func(c *runConfig) string { return strconv.FormatFloat(*dst(c), 'g', -1, 64) }}
}

// duration reads a Go duration ("30s", "2m") or a number of seconds.
//
//go:noinline
func duration(dst func(c *runConfig) *time.Duration) optVal {
	return optVal{typ: "duration", set: func(c *runConfig, v string) error {
		d, err := parseDuration(v)
		if err != nil {
			return err
		}
		*dst(c) = d
		return nil
	}, get: func(c *runConfig) string { return dst(c).String() }}
}

func parseDuration(v string) (time.Duration, error) {
	if x, err := strconv.ParseFloat(v, 64); err == nil {
		if math.IsNaN(x) || x < 0 || x > float64(math.MaxInt64/int64(time.Second)) {
			return 0, fmt.Errorf("%q: expected a duration >= 0", v)
		}
		return time.Duration(x * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q: expected a duration >= 0 such as 30s or 2m, or a number of seconds", v)
	}
	return d, nil
}

// options lists every setting. Keep deploy/edge-agent.example.conf in step
// (TestExampleConfigDocumentsEveryOption).
func options() []option {
	return []option{
		{key: "site_id", help: "this site's client id (MQTT client id, topics, state file identity)", val: str(func(c *runConfig) *string { return &c.SiteID })},
		{key: "federation", help: "federation name; topics live under edgefl/<federation>/", val: str(func(c *runConfig) *string { return &c.Federation })},
		{key: "broker", help: "broker URL, tcp://host:1883 or ssl://host:8883 (repeat, or comma-separate, for fail-over)", multi: true, val: optVal{typ: "URL", set: func(c *runConfig, v string) error {
			for _, b := range strings.Split(v, ",") {
				if b = strings.TrimSpace(b); b != "" {
					c.Brokers = append(c.Brokers, b)
				}
			}
			return nil
		}, get: func(c *runConfig) string { return strings.Join(c.Brokers, ",") }}},
		{key: "tls_ca", help: "PEM file of the CA that signed the broker's certificate (default: system roots)", val: typedStr("FILE", func(c *runConfig) *string { return &c.CAFile })},
		{key: "tls_cert", help: "PEM client certificate of this site (mutual TLS); with tls_ca, also signs this site's secure-aggregation keys and views, and every other site's are checked against tls_ca (docs/privacy.md)", val: typedStr("FILE", func(c *runConfig) *string { return &c.CertFile })},
		{key: "tls_key", help: "PEM private key of the client certificate", val: typedStr("FILE", func(c *runConfig) *string { return &c.KeyFile })},
		{key: "tls_server_name", help: "name to verify in the broker's certificate (default: the URL's host)", val: str(func(c *runConfig) *string { return &c.ServerName })},
		{key: "username", help: "MQTT username", val: str(func(c *runConfig) *string { return &c.Username })},
		{key: "password", help: "MQTT password (prefer password_file: a flag shows in ps)", val: str(func(c *runConfig) *string { return &c.Password })},
		{key: "password_file", help: "file holding the MQTT password (trailing newline removed)", val: typedStr("FILE", func(c *runConfig) *string { return &c.PasswordFile })},
		{key: "data", help: "local data: csv:PATH (read by the federation's schema) | csv:PATH:label=COLUMN[:regression] | idx:DIR | leaf:PATH | synthetic:ALPHA,BETA | synthetic-iid", val: str(func(c *runConfig) *string { return &c.Data })},
		{key: "eval_data", help: "optional CSV of held-out rows, csv:PATH as data (a bare PATH too), read by the federation's schema (then every row of data trains; default: the schema's holdout share of data)", val: str(func(c *runConfig) *string { return &c.EvalData })},
		{key: "model_out", help: "where the final model bundle is written when the federation finishes (default: final.bundle.json next to the state file)", val: str(func(c *runConfig) *string { return &c.ModelOut })},
		{key: "data_client", help: "-1: the whole source is this site's data; K >= 0: client K of the partitioned source (demos)", val: integer(func(c *runConfig) *int { return &c.DataClient }, -1)},
		{key: "data_partition", help: "with data_client: natural | iid | dirichlet:ALPHA | classes:K", val: str(func(c *runConfig) *string { return &c.DataPartition })},
		{key: "data_clients", help: "with data_client: number of clients of the partition (synthetic: devices)", val: integer(func(c *runConfig) *int { return &c.DataClients }, 0)},
		{key: "data_seed", help: "with data_client: seed of the generator and the partition (same at every site)", val: unsigned(func(c *runConfig) *uint64 { return &c.DataSeed })},
		{key: "data_max_samples", help: "with data_client: cap on a synthetic device's samples (0 = none)", val: integer(func(c *runConfig) *int { return &c.DataMaxSamples }, 0)},
		{key: "standardize", help: "none | client (this site's own feature statistics); empty: client for csv and leaf, none otherwise", val: str(func(c *runConfig) *string { return &c.Standardize })},
		{key: "state_file", help: "bbolt state file (identity, FedSplit z, global model, outbox)", val: typedStr("FILE", func(c *runConfig) *string { return &c.StateFile })},
		{key: "max_epochs", help: "device cap on local epochs per round (0 = only the round's budget)", val: integer(func(c *runConfig) *int { return &c.Local.MaxEpochs }, 0)},
		{key: "max_seconds", help: "device cap on seconds of local solve per round (0 = only the round's budget)", val: number(func(c *runConfig) *float64 { return &c.Local.MaxSeconds })},
		{key: "solver", help: "force the local solver, sgd or lbfgs (empty = as the round says)", val: str(func(c *runConfig) *string { return &c.Local.Solver })},
		{key: "lr", help: "override the SGD learning rate (0 = as the round says)", val: number(func(c *runConfig) *float64 { return &c.Local.LR })},
		{key: "batch", help: "override the SGD mini-batch size (0 = as the round says)", val: integer(func(c *runConfig) *int { return &c.Local.Batch }, 0)},
		{key: "deadline_margin", help: "stop the solve this long before the round's deadline (negative: no margin)", def: agent.DefaultDeadlineMargin.String(), val: optVal{typ: "duration", set: func(c *runConfig, v string) error {
			neg := strings.HasPrefix(v, "-")
			d, err := parseDuration(strings.TrimPrefix(v, "-"))
			if err != nil {
				return err
			}
			if neg {
				d = -max(d, 1)
			}
			c.Local.DeadlineMargin = d
			return nil
		}, get: func(c *runConfig) string { return c.Local.DeadlineMargin.String() }}},
		{key: "fallback_seconds", help: "seconds a solve may take when nothing else limits it", def: strconv.FormatFloat(agent.DefaultFallbackSeconds, 'g', -1, 64), val: number(func(c *runConfig) *float64 { return &c.Local.FallbackSeconds })},
		{key: "seed", help: "seed of the local solver's and the codec's randomness", val: unsigned(func(c *runConfig) *uint64 { return &c.Seed })},
		{key: "max_message_bytes", help: "largest inbound message accepted, in bytes", val: integer(func(c *runConfig) *int { return &c.MaxMessageBytes }, 1)},
		{key: "keepalive", help: "MQTT keepalive", def: agent.DefaultKeepAlive.String(), val: duration(func(c *runConfig) *time.Duration { return &c.KeepAlive })},
		{key: "connect_timeout", help: "timeout of one connection attempt", def: agent.DefaultConnectTimeout.String(), val: duration(func(c *runConfig) *time.Duration { return &c.ConnectTimeout })},
		{key: "reconnect_min", help: "first retry interval when the broker is unreachable at start; also the first re-send delay of an update without a receipt (doubling up to reconnect_max)", def: agent.DefaultReconnectMin.String(), val: duration(func(c *runConfig) *time.Duration { return &c.ReconnectMin })},
		{key: "reconnect_max", help: "longest reconnect backoff, and longest re-send backoff of an update without a receipt", def: agent.DefaultReconnectMax.String(), val: duration(func(c *runConfig) *time.Duration { return &c.ReconnectMax })},
		{key: "publish_timeout", help: "how long a publish may wait for the broker", def: agent.DefaultPublishTimeout.String(), val: duration(func(c *runConfig) *time.Duration { return &c.PublishTimeout })},
		{key: "log_level", help: "debug | info | warn | error", val: str(func(c *runConfig) *string { return &c.LogLevel })},
		{key: "log_format", help: "text | json (stderr)", val: optVal{typ: "string", set: func(c *runConfig, v string) error {
			if v != "text" && v != "json" {
				return fmt.Errorf("%q: expected text or json", v)
			}
			c.LogFormat = v
			return nil
		}, get: func(c *runConfig) string { return c.LogFormat }}},
	}
}

// runConfig is the agent's configuration plus the settings of the command
// itself.
type runConfig struct {
	agent.Config
	LogFormat    string // text or json
	PasswordFile string // read into Config.Password by loadConfig
}

func lookup(key string) (option, bool) {
	key = strings.ReplaceAll(strings.TrimSpace(key), "-", "_")
	for _, o := range options() {
		if o.key == key {
			return o, true
		}
	}
	return option{}, false
}

// setting is one key = value from the file or the command line (where:
// FILE:LINE or --flag).
type setting = cli.Setting

// syntax is the edge-agent's configuration file syntax: the keys of
// options (a '-' reads as '_'), broker the only one that may repeat.
var syntax = cli.Syntax{
	Key: func(k string) (string, bool) {
		o, ok := lookup(k)
		return o.key, ok
	},
	Multi: func(key string) bool { o, _ := lookup(key); return o.multi },
	NoEquals: func(where, line string) error {
		return fmt.Errorf("%s: expected key = value, got %q", where, line)
	},
	Unknown: func(where, key string) error { return fmt.Errorf("%s: unknown option %q", where, key) },
	Repeated: func(where, key string, first setting) error {
		return fmt.Errorf("%s: %s is already set at %s", where, key, first.Where)
	},
	MaxLine: 1 << 20,
}

// readConfig parses the key = value text of name.
func readConfig(r io.Reader, name string) ([]setting, error) {
	var out []setting
	syn := syntax
	syn.ReadFailed = func(err error) error { return fmt.Errorf("%s: %w", name, err) }
	err := cli.ReadConfig(r, name, syn, func(s setting) error { out = append(out, s); return nil })
	if err != nil {
		return nil, err
	}
	return out, nil
}

// buildConfig applies the file's settings, then the flags' (a flag
// replaces the file's value, for broker the whole list).
func buildConfig(file, flags []setting, version string) (runConfig, error) {
	cfg := runConfig{Config: agent.DefaultConfig(), LogFormat: "text"}
	cfg.SoftwareVersion = version
	// password and password_file are one setting: a flag for either
	// replaces both lines of the file.
	group := func(key string) string { return strings.TrimSuffix(key, "_file") }
	fromFlag := map[string]bool{}
	for _, s := range flags {
		fromFlag[group(s.Key)] = true
	}
	apply := func(s setting) error {
		o, _ := lookup(s.Key)
		if err := o.set(&cfg, s.Value); err != nil {
			return fmt.Errorf("%s: %s: %w", s.Where, o.key, err)
		}
		return nil
	}
	for _, s := range file {
		if fromFlag[group(s.Key)] {
			continue
		}
		if err := apply(s); err != nil {
			return cfg, err
		}
	}
	for _, s := range flags {
		if err := apply(s); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// addOptionFlags registers every option as --key-with-hyphens and returns
// where the values given are collected, in command-line order.
func addOptionFlags(fs *flag.FlagSet) *[]setting {
	var got []setting
	opts := options()
	sort.Slice(opts, func(i, j int) bool { return opts[i].key < opts[j].key })
	for _, o := range opts {
		name := flagName(o.key)
		fs.Func(name, o.help, func(v string) error {
			got = append(got, setting{Key: o.key, Value: strings.TrimSpace(v), Where: "--" + name})
			return nil
		})
	}
	return &got
}

// printOptionFlags writes every option as a flag, as flag.PrintDefaults
// would with its type and default (fs.Func flags would show "value").
func printOptionFlags(w io.Writer) {
	opts := options()
	sort.Slice(opts, func(i, j int) bool { return opts[i].key < opts[j].key })
	def := runConfig{Config: agent.DefaultConfig(), LogFormat: "text"}
	for _, o := range opts {
		d := o.def
		if d == "" {
			d = o.val.get(&def)
			if d == "0" || d == "0s" {
				d = ""
			}
		}
		fmt.Fprintf(w, "  -%s %s\n    \t%s", flagName(o.key), o.val.typ, o.help)
		if d != "" {
			if o.val.typ == "string" {
				d = strconv.Quote(d)
			}
			fmt.Fprintf(w, " (default %s)", d)
		}
		fmt.Fprintln(w)
	}
}

// loadConfig reads the file (if any) and applies the flags.
func loadConfig(path string, flags []setting, version string) (runConfig, error) {
	var file []setting
	if path != "" {
		f, err := os.Open(path)
		if err != nil {
			return runConfig{}, err
		}
		defer f.Close()
		if file, err = readConfig(f, path); err != nil {
			return runConfig{}, err
		}
	}
	cfg, err := buildConfig(file, flags, version)
	if err != nil {
		return cfg, err
	}
	if cfg.PasswordFile != "" {
		if cfg.Password != "" {
			return cfg, fmt.Errorf("password and password_file are both set")
		}
		b, err := os.ReadFile(cfg.PasswordFile)
		if err != nil {
			return cfg, wrapErr("password_file", err)
		}
		cfg.Password = strings.TrimRight(string(b), "\r\n")
	}
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

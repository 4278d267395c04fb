package agent

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/data/dataset"
)

func validConfig() Config {
	c := DefaultConfig()
	c.SiteID, c.Federation, c.Brokers, c.StateFile = "s1", "fed", []string{"tcp://localhost:1883"}, "state.db"
	return c
}

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		mod  func(c *Config)
		want string // "" = valid
	}{
		{"valid", func(*Config) {}, ""},
		{"tls with client cert", func(c *Config) {
			c.Brokers, c.CAFile, c.CertFile, c.KeyFile = []string{"ssl://h:8883", "mqtts://h2:8883"}, "ca", "c", "k"
		}, ""},
		{"wss", func(c *Config) { c.Brokers, c.CAFile = []string{"wss://h/mqtt"}, "ca" }, ""},
		{"no site", func(c *Config) { c.SiteID = "" }, "site id"},
		{"site with a slash", func(c *Config) { c.SiteID = "a/b" }, "site id"},
		{"site with a wildcard", func(c *Config) { c.SiteID = "a+" }, "site id"},
		{"long site", func(c *Config) { c.SiteID = strings.Repeat("x", 65) }, "site id"},
		{"no federation", func(c *Config) { c.Federation = "" }, "federation"},
		{"no broker", func(c *Config) { c.Brokers = nil }, "no broker"},
		{"broker without host", func(c *Config) { c.Brokers = []string{"tcp://"} }, "no host"},
		{"broker scheme", func(c *Config) { c.Brokers = []string{"http://h:80"} }, "scheme"},
		{"broker garbage", func(c *Config) { c.Brokers = []string{"::"} }, "broker"},
		{"tls on tcp", func(c *Config) { c.CAFile = "ca" }, "not a TLS URL"},
		{"tls on ws", func(c *Config) { c.Brokers, c.ServerName = []string{"ws://h"}, "n" }, "not a TLS URL"},
		{"cert without key", func(c *Config) { c.Brokers, c.CertFile = []string{"ssl://h:1"}, "c" }, "both or neither"},
		{"password without user", func(c *Config) { c.Password = "p" }, "without a username"},
		{"no state file", func(c *Config) { c.StateFile = "" }, "state file"},
		{"data client below -1", func(c *Config) { c.DataClient = -2 }, "data client"},
		{"negative clients", func(c *Config) { c.DataClients = -1 }, "data clients"},
		{"global standardization of a whole source", func(c *Config) { c.Standardize = "global" }, "standardize global"},
		{"standardize typo", func(c *Config) { c.Standardize = "zscore" }, "standardize"},
		{"negative keepalive", func(c *Config) { c.KeepAlive = -time.Second }, "keepalive"},
		{"log level", func(c *Config) { c.LogLevel = "verbose" }, "log level"},
		{"negative epochs", func(c *Config) { c.Local.MaxEpochs = -1 }, "max-epochs"},
		{"NaN seconds", func(c *Config) { c.Local.MaxSeconds = math.NaN() }, "max-seconds"},
		{"Inf lr", func(c *Config) { c.Local.LR = math.Inf(1) }, "lr"},
		{"negative batch", func(c *Config) { c.Local.Batch = -1 }, "batch"},
		{"unknown solver", func(c *Config) { c.Local.Solver = "adam" }, "solver"},
		{"schema csv with eval data", func(c *Config) {
			c.Data, c.EvalData, c.ModelOut = "csv:/srv/site.csv", "/srv/heldout.csv", "/srv/model.json"
		}, ""},
		{"eval data of a labelled csv", func(c *Config) { c.Data, c.EvalData = "csv:/srv/site.csv:label=dx", "/srv/heldout.csv" }, ""},
		{"eval data as csv:PATH", func(c *Config) { c.Data, c.EvalData = "csv:/srv/site.csv", "csv:/srv/heldout.csv" }, ""},
		{"eval data with a label", func(c *Config) { c.Data, c.EvalData = "csv:/srv/site.csv", "csv:/srv/heldout.csv:label=dx" }, "eval_data"},
		{"eval data without a csv source", func(c *Config) { c.Data, c.EvalData = "idx:/srv/mnist", "/srv/heldout.csv" }, "eval_data"},
		{"eval data of a demo partition", func(c *Config) { c.Data, c.DataClient, c.EvalData = "csv:/srv/a.csv:label=y", 1, "/srv/heldout.csv" }, "eval_data"},
		{"model out is the state file", func(c *Config) { c.ModelOut = "./state.db" }, "model_out"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := validConfig()
			c.mod(&cfg)
			err := cfg.Validate()
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want ErrConfig mentioning %q", err, c.want)
			}
		})
	}
}

func TestLoadData(t *testing.T) {
	dir := t.TempDir()
	csv := filepath.Join(dir, "site.csv")
	if err := os.WriteFile(csv, []byte("age,bp,dx\n50,120,0\n61,140,1\n45,118,2\n70,150,1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Run("csv, whole file, standardized", func(t *testing.T) {
		c := validConfig()
		c.Data = "csv:" + csv + ":label=dx"
		d, err := LoadData(c)
		if err != nil {
			t.Fatal(err)
		}
		if d.N != 4 || d.D != 2 || d.Y[2] != 2 {
			t.Fatalf("data %+v", d)
		}
		var mean float64
		for i := range d.N {
			mean += d.X[i*2] / 4
		}
		if math.Abs(mean) > 1e-12 {
			t.Fatalf("feature mean %v after client standardization", mean)
		}
	})
	t.Run("csv, not standardized", func(t *testing.T) {
		c := validConfig()
		c.Data, c.Standardize = "csv:"+csv+":label=dx", dataset.StandardizeNone
		d, err := LoadData(c)
		if err != nil || d.X[0] != 50 {
			t.Fatalf("%v %v", d.X, err)
		}
	})
	t.Run("synthetic device", func(t *testing.T) {
		c := validConfig()
		c.Data, c.DataClient, c.DataClients, c.DataMaxSamples = "synthetic:1,1", 3, 5, 80
		d, err := LoadData(c)
		if err != nil {
			t.Fatal(err)
		}
		// The same as the simulator's client 3 training split.
		f, err := dataset.Build(dataset.Source{Kind: dataset.SourceSynthetic, Alpha: 1, Beta: 1}, dataset.Partition{Kind: dataset.PartNatural},
			dataset.BuildOptions{Clients: 5, Seed: DefaultDataSeed, SyntheticMaxSamples: 80})
		if err != nil {
			t.Fatal(err)
		}
		want := f.Clients[3].Train
		if d.N != want.N || d.D != dataset.DefaultSyntheticDim || d.X[0] != want.X[0] {
			t.Fatalf("got %d samples, want %d", d.N, want.N)
		}
	})
	bad := []struct {
		name string
		mod  func(c *Config)
		want string
	}{
		{"no data", func(c *Config) {}, "no data source"},
		{"bad spec", func(c *Config) { c.Data = "parquet:x" }, "source"},
		{"missing file", func(c *Config) { c.Data = "csv:" + filepath.Join(dir, "none.csv") + ":label=dx" }, "none.csv"},
		{"missing label", func(c *Config) { c.Data = "csv:" + csv + ":label=outcome" }, "outcome"},
		{"synthetic without a client", func(c *Config) { c.Data = "synthetic:1,1" }, "data_client"},
		{"client beyond the federation", func(c *Config) { c.Data, c.DataClient, c.DataClients = "synthetic:1,1", 5, 5 }, "has 5 clients"},
		{"bad partition", func(c *Config) { c.Data, c.DataClient, c.DataPartition = "synthetic:1,1", 0, "zipf" }, "partition"},
		{"missing idx dir", func(c *Config) { c.Data = "idx:" + filepath.Join(dir, "mnist") }, "mnist"},
	}
	for _, b := range bad {
		t.Run(b.name, func(t *testing.T) {
			c := validConfig()
			b.mod(&c)
			if _, err := LoadData(c); err == nil || !strings.Contains(err.Error(), b.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, b.want)
			}
		})
	}
}

func TestNewRefusesUnusableData(t *testing.T) {
	c := validConfig() // no Data spec either
	c.StateFile = filepath.Join(t.TempDir(), "edge.db")
	// New loads nothing: Run loads Config.Data before it opens the state
	// file, and refuses to start without it.
	a, err := New(c, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Run(context.Background()); err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "no data source") {
		t.Fatalf("Run without data: %v", err)
	}
	if _, err := os.Stat(c.StateFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Run without data made the state file: %v", err)
	}
	nan := testData(1, 10)
	nan.X[3] = math.NaN()
	if _, err := New(c, Deps{Data: &nan}); err == nil || !errors.Is(err, ErrConfig) {
		t.Fatalf("NaN data: %v", err)
	}
	empty := testData(1, 10)
	empty.N, empty.X, empty.Y = 0, nil, nil
	if _, err := New(c, Deps{Data: &empty}); err == nil {
		t.Fatal("empty data accepted")
	}
	good := testData(1, 10)
	if _, err := New(c, Deps{Data: &good}); err != nil {
		t.Fatal(err)
	}
}

func TestConfigModelOutDefault(t *testing.T) {
	for _, tt := range []struct{ state, out, want string }{
		{"/var/lib/edgefl/edge-agent.db", "", "/var/lib/edgefl/final.bundle.json"},
		{"edge.db", "", "final.bundle.json"},
		{"/var/lib/edgefl/edge-agent.db", "/srv/model.json", "/srv/model.json"},
	} {
		c := validConfig()
		c.StateFile, c.ModelOut = tt.state, tt.out
		if got := c.withDefaults().ModelOut; got != tt.want {
			t.Errorf("state %q, model_out %q: %q, want %q", tt.state, tt.out, got, tt.want)
		}
	}
}

func TestCSVPath(t *testing.T) {
	for _, tt := range []struct {
		data, path     string
		ok, schemaOnly bool
	}{
		{"csv:/srv/a.csv", "/srv/a.csv", true, true},
		{"csv:/srv/a.csv:label=dx", "/srv/a.csv", true, false},
		{"csv:/srv/a.csv:label=y:regression", "/srv/a.csv", true, false},
		{"csv:C:/data/a.csv", "C:/data/a.csv", true, true},
		{"csv:", "", false, false},
		{"idx:/srv/mnist", "", false, false},
		{"synthetic:1,1", "", false, false},
	} {
		path, ok := csvPath(tt.data)
		c := validConfig()
		c.Data = tt.data
		if path != tt.path || ok != tt.ok || schemaOnly(c) != tt.schemaOnly {
			t.Errorf("%q: csvPath = %q, %v; schemaOnly %v; want %q, %v, %v", tt.data, path, ok, schemaOnly(c), tt.path, tt.ok, tt.schemaOnly)
		}
	}
}

// A csv source without label= loads nothing at start (the federation's
// schema reads it when announced); New succeeds and reports 0 samples.
func TestNewSchemaOnlyData(t *testing.T) {
	c := validConfig()
	c.Data = "csv:" + filepath.Join(t.TempDir(), "not-read-yet.csv")
	a, err := New(c, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if a.Data().N != 0 || a.cfg.ModelOut != "final.bundle.json" {
		t.Fatalf("data %d samples, model_out %q", a.Data().N, a.cfg.ModelOut)
	}
}

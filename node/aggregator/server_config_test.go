package aggregator

import (
	"errors"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/testkit"
)

// ServerConfig.Validate refuses every configuration NewServer refuses
// before it opens anything, with an error naming the setting, and has no
// side effect: no state file appears, from Validate or from NewServer.
func TestValidate(t *testing.T) {
	valid := func(dir string) ServerConfig {
		return ServerConfig{
			Federation: testFed, BrokerURL: "tcp://127.0.0.1:1", K: 3, QuorumFraction: 1, RoundTimeout: time.Minute,
			Seed: 7, Algorithm: AlgoFedAvg, Model: testModel, StatePath: filepath.Join(dir, "state.db"),
			Logger: testkit.Logger(t), Params: Params{Solver: "sgd", LR: 0.1, MaxEpochs: 1, Gamma: 0.5},
		}
	}
	for _, tc := range []struct {
		name string
		mod  func(*ServerConfig)
		want string // "" : valid
	}{
		{"valid", func(*ServerConfig) {}, ""},
		{"in-process broker", func(c *ServerConfig) { c.BrokerURL, c.Dial = "", nopDial }, ""},
		{"federation", func(c *ServerConfig) { c.Federation = "a/b" }, "federation"},
		{"client id", func(c *ServerConfig) { c.ClientID = "a b" }, "client id"},
		{"no broker", func(c *ServerConfig) { c.BrokerURL = "" }, "no broker URL"},
		{"no state file", func(c *ServerConfig) { c.StatePath = "" }, "no state file"},
		{"K", func(c *ServerConfig) { c.K = 0 }, "K = 0"},
		{"quorum", func(c *ServerConfig) { c.QuorumFraction = 1.5 }, "quorum fraction"},
		{"algorithm", func(c *ServerConfig) { c.Algorithm = "sgd" }, "algorithm"},
		{"FedSplit step with FedProx", func(c *ServerConfig) { c.Algorithm, c.Aggregator = AlgoFedProx, "fedsplit" }, "FedSplit server step"},
		{"FedSplit without a step size", func(c *ServerConfig) { c.Algorithm = AlgoFedSplit }, "step size"},
		{"negative lr", func(c *ServerConfig) { c.Params.LR = -1 }, "--lr -1"},
		{"NaN mu", func(c *ServerConfig) { c.Algorithm, c.Params.Mu = AlgoFedProx, math.NaN() }, "--mu NaN"},
		{"negative epochs", func(c *ServerConfig) { c.Params.MaxEpochs = -1 }, "--max-epochs"},
		{"selector", func(c *ServerConfig) { c.Selector = "nope" }, "selector"},
		{"init", func(c *ServerConfig) { c.Init = "ones" }, "init"},
		{"codec", func(c *ServerConfig) { c.Codec = "nope" }, "codec"},
		{"downlink", func(c *ServerConfig) { c.Downlink = "q8" }, "downlink codec"},
		{"model", func(c *ServerConfig) { c.Model = model.Spec{Kind: "tree"} }, "model"},
		{"evaluation data", func(c *ServerConfig) {
			c.Eval = &model.Data{N: 1, D: testModel.Inputs + 1, X: make([]float64, testModel.Inputs+1), Y: []float64{0}}
		}, "evaluation data"},
		{"coordinator policy", func(c *ServerConfig) { c.Extension = -time.Second }, "Extension"},
		{"scaffold", func(c *ServerConfig) { c.Algorithm = AlgoScaffold }, ""},
		{"scaffold with a robust aggregator", func(c *ServerConfig) { c.Algorithm, c.Aggregator = AlgoScaffold, "median" }, "robust aggregators do not compose"},
		{"scaffold with lbfgs", func(c *ServerConfig) { c.Algorithm, c.Params.Solver = AlgoScaffold, "lbfgs" }, "scaffold needs the sgd solver"},
		{"scaffold with DP", func(c *ServerConfig) {
			c.Algorithm, c.DP = AlgoScaffold, &dp.Config{Clip: 1, Noise: 1, Delta: 1e-5}
		}, "scaffold does not compose with DP"},
		{"scaffold with secure aggregation", func(c *ServerConfig) {
			c.Algorithm, c.SecAgg = AlgoScaffold, &SecAggConfig{Clip: 1, Threshold: 2}
		}, "scaffold does not compose with secure aggregation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := valid(dir)
			tc.mod(&cfg)
			err := cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, coordinator.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want ErrConfig naming %q", err, tc.want)
			}
			if _, nerr := NewServer(cfg); nerr == nil || nerr.Error() != err.Error() {
				t.Fatalf("NewServer: %v, Validate: %v", nerr, err)
			}
			if ents, _ := os.ReadDir(dir); len(ents) > 0 {
				t.Fatalf("a refused configuration left %d files in the state directory", len(ents))
			}
		})
	}
}

func nopDial() (net.Conn, error) { return nil, errors.New("no broker") }

// Each component's configuration checks its own settings (Validate), and
// ServerConfig.Validate, which composes them, refuses with the component's
// error.
func TestComponentValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cmp  interface{ Validate() error }
		want string // "" : valid
	}{
		{"secagg", &SecAggConfig{Clip: 1}, ""},
		{"secagg clip", &SecAggConfig{}, "clip 0"},
		{"secagg clip too large", &SecAggConfig{Clip: 2e6}, "at most 1e6"},
		{"secagg timeout", &SecAggConfig{Clip: 1, Timeout: -time.Second}, "phase timeout"},
		{"privacy off", PrivacyConfig{}, ""},
		{"privacy", PrivacyConfig{DP: &dp.Config{Clip: 1, Noise: 1, Delta: 1e-5}}, ""},
		{"privacy clip", PrivacyConfig{DP: &dp.Config{Noise: 1, Delta: 1e-5}}, "clip norm"},
		{"schema off", SchemaConfig{}, ""},
		{"schema", SchemaConfig{Schema: &schema.Schema{}}, "schema: no task"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cmp.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, coordinator.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want ErrConfig naming %q", err, tc.want)
			}
			cfg := ServerConfig{Federation: testFed, BrokerURL: "tcp://127.0.0.1:1", K: 3, Algorithm: AlgoFedAvg, Model: testModel,
				StatePath: filepath.Join(t.TempDir(), "state.db"), Params: Params{Solver: "sgd", LR: 0.1, MaxEpochs: 1, Gamma: 0.5}}
			switch c := tc.cmp.(type) {
			case *SecAggConfig:
				cfg.SecAgg = c
			case PrivacyConfig:
				cfg.PrivacyConfig = c
			case SchemaConfig:
				cfg.SchemaConfig = c
			}
			if serr := cfg.Validate(); serr == nil || serr.Error() != err.Error() {
				t.Fatalf("ServerConfig.Validate: %v, the component's: %v", serr, err)
			}
		})
	}
}

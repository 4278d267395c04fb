package aggregator

import (
	"encoding/json"
	"errors"
	"github.com/edgefl/edgefl/node/aggstore"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/learn/serveropt"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/storage"
)

// A run resumes only with its own algorithm parameters: another --mu
// (FedProx family), --step or --relax (FedSplit family), --codec,
// --downlink, --algorithm or --aggregator is refused with every difference
// spelled out and the way out, and nothing is written; the local work
// settings may change. A log written before the parameters were kept
// resumes unchecked.
func TestResumeRefusesOtherParams(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		name  string
		base  func(*ServerConfig)
		other func(*ServerConfig)
		want  []string // in the error; nil: resumes
	}{
		{"fedsplit step", func(c *ServerConfig) { c.Algorithm, c.Params.Step = AlgoFedSplit, 1 },
			func(c *ServerConfig) { c.Params.Step = 10 }, []string{"--step 10 differs from the run's 1"}},
		{"fedsplit relax and codec", func(c *ServerConfig) { c.Algorithm, c.Params.Step = AlgoFedProxSplit, 1 },
			func(c *ServerConfig) { c.Params.Relax, c.Codec = 0.5, "q8" },
			[]string{"--relax 0.5 differs from the run's 0", "--codec q8 differs from the run's fp32"}},
		{"fedprox mu", func(c *ServerConfig) { c.Algorithm, c.Params.Mu = AlgoFedProx, 0.01 },
			func(c *ServerConfig) { c.Params.Mu = 1 }, []string{"--mu 1 differs from the run's 0.01"}},
		{"downlink", func(c *ServerConfig) {}, func(c *ServerConfig) { c.Downlink = "fp16" },
			[]string{"--downlink fp16 differs from the run's fp32"}},
		{"aggregator", func(c *ServerConfig) { c.Algorithm = AlgoFedProx },
			func(c *ServerConfig) { c.Aggregator = "median" }, []string{"--aggregator median differs from the run's mean"}},
		{"fedprox step is not its parameter", func(c *ServerConfig) { c.Algorithm = AlgoFedProx },
			func(c *ServerConfig) { c.Params.Step = 10 }, nil},
		// The stored moments assume one optimiser: another, or one added
		// to a run without, is refused.
		{"server optimiser", func(c *ServerConfig) { c.ServerOpt = serveropt.Defaults(serveropt.Adam) },
			func(c *ServerConfig) { c.ServerOpt = serveropt.Defaults(serveropt.Yogi) },
			[]string{"--server-opt yogi:lr=0.01:beta1=0.9:beta2=0.99:tau=0.001 differs from the run's adam:lr=0.01:beta1=0.9:beta2=0.99:tau=0.001"}},
		{"server optimiser added", func(c *ServerConfig) {},
			func(c *ServerConfig) { c.ServerOpt = serveropt.Params{Kind: serveropt.AvgM, Beta1: 0.5} },
			[]string{"--server-opt avgm:lr=1:beta1=0.5 differs from the run's none"}},
		{"fedavg mu is always 0", func(c *ServerConfig) {}, func(c *ServerConfig) { c.Params.Mu = 5 }, nil},
		{"local work settings", func(c *ServerConfig) { c.Algorithm, c.Params.Step = AlgoFedSplit, 1 },
			func(c *ServerConfig) {
				c.Params.MaxEpochs, c.Params.LR, c.Params.Gamma, c.Params.Solver = 7, 0.5, 0.1, "lbfgs"
			}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := f.config()
			cfg.StatePath = t.TempDir() + "/state.db"
			tc.base(&cfg)
			s, err := NewServer(cfg)
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
			before := roundOneConfig(t, cfg.StatePath)
			c := cfg
			tc.other(&c)
			s, err = NewServer(c)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				s.Close()
				return
			}
			if err == nil {
				s.Close()
				t.Fatal("resumed with other parameters")
			}
			if !errors.Is(err, coordinator.ErrConfig) {
				t.Errorf("not ErrConfig: %v", err)
			}
			for _, w := range append(tc.want, cfg.StatePath, "use the run's values, or start a new run with another --state-file") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if after := roundOneConfig(t, cfg.StatePath); after != before {
				t.Errorf("the refusal changed round 1's configuration:\n%s\n%s", before, after)
			}
			// The run's own values resume.
			if s, err = NewServer(cfg); err != nil {
				t.Fatalf("the run's own values: %v", err)
			}
			s.Close()
		})
	}

	// A log whose round 1 has no parameters (written before they were
	// kept) resumes whatever they are.
	cfg := f.config()
	cfg.StatePath = t.TempDir() + "/state.db"
	cfg.Algorithm, cfg.Params.Step = AlgoFedSplit, 1
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	st, err := aggstore.OpenAgg(cfg.StatePath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r1, err := st.Round(1)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(r1.Config, &m); err != nil || m["params"] == nil {
		t.Fatalf("round 1's configuration %s: %v", r1.Config, err)
	}
	st.Close()
	// Round 1's configuration as such a version wrote it.
	if _, err := aggstore.Rollback(cfg.StatePath, 1, start0, func(b []byte) ([]byte, error) {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, err
		}
		delete(m, "params")
		return json.Marshal(m)
	}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(roundOneConfig(t, cfg.StatePath), "params") {
		t.Fatal("params still in round 1's configuration")
	}
	c := cfg
	c.Params.Step = 3
	if s, err = NewServer(c); err != nil {
		t.Fatalf("a log without parameters: %v", err)
	}
	s.Close()
}

func roundOneConfig(t *testing.T, path string) string {
	t.Helper()
	st, err := aggstore.OpenAgg(path, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r1, err := st.Round(1)
	if err != nil {
		t.Fatal(err)
	}
	return string(r1.Config)
}

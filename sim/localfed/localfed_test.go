package localfed

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/node/aggregator"
)

func TestSiteIDs(t *testing.T) {
	tests := []struct {
		n, digits int
		want      []string
	}{
		{3, 0, []string{"site-1", "site-2", "site-3"}},
		{2, 2, []string{"site-01", "site-02"}},
		{1, 3, []string{"site-001"}},
		{0, 2, []string{}},
	}
	for _, tt := range tests {
		if got := SiteIDs(tt.n, tt.digits); !slices.Equal(got, tt.want) {
			t.Errorf("SiteIDs(%d, %d) = %v, want %v", tt.n, tt.digits, got, tt.want)
		}
	}
}

func TestPasswordsDiffer(t *testing.T) {
	pw, err := Passwords([]string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pw) != 2 || pw["a"] == "" || pw["a"] == pw["b"] {
		t.Fatalf("passwords %v", pw)
	}
}

func TestStateDir(t *testing.T) {
	tmp, cleanup, err := StateDir("", "localfed-test-")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); err != nil {
		t.Fatal(err)
	}
	cleanup()
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("the temporary directory %s is still there (%v)", tmp, err)
	}
	kept := filepath.Join(t.TempDir(), "a", "b")
	dir, cleanup, err := StateDir(kept, "unused-")
	if err != nil || dir != kept {
		t.Fatalf("StateDir(%s) = %s, %v", kept, dir, err)
	}
	cleanup()
	if _, err := os.Stat(kept); err != nil {
		t.Errorf("a given directory was removed: %v", err)
	}
}

// TestFederationRuns: three agents and the aggregator over the embedded
// broker finish a two-round run; every party keeps its state file in the
// directory, and Stop returns no error.
func TestFederationRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a federation over MQTT")
	}
	fed, sites, _, _ := syntheticSites(t, 3, 1)
	ids := SiteIDs(3, 0)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	served := false
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	lf, err := Start(ctx, Config{Dir: dir, Sites: sites, Seed: 1, Logger: log,
		Serving: func(lf *Federation) { served = lf.Server != nil },
		Server: aggregator.ServerConfig{K: 3, QuorumFraction: 1, RoundTimeout: time.Minute, Settle: 50 * time.Millisecond,
			MaxReselections: -1, Rounds: 2, Seed: 1, Algorithm: aggregator.AlgoFedProx,
			Params: aggregator.Params{Mu: 1, Solver: "lbfgs", Gamma: 1e-3, MaxEpochs: 2},
			Model:  model.Spec{Kind: model.KindLogReg, Inputs: fed.D, Classes: fed.Classes, L2: 0.01}}})
	if err != nil {
		t.Fatal(err)
	}
	finished := lf.Wait(ctx)
	if err := lf.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if !finished || !served {
		t.Fatalf("finished %v, Serving called %v", finished, served)
	}
	if _, r := lf.Server.Global(); r != 3 {
		t.Errorf("the global model is round %d's, want 3 (after 2 rounds)", r)
	}
	for _, f := range append([]string{"aggregator"}, ids...) {
		if _, err := os.Stat(filepath.Join(dir, f+".db")); err != nil {
			t.Errorf("state file: %v", err)
		}
	}
}

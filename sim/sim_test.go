package sim

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/learn/aggregate"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/proto/uplink"
)

func smallConfig(t *testing.T, algos string) Config {
	t.Helper()
	c := DefaultConfig()
	c.Dataset, c.Partition = "synthetic:0.5,0.5", "natural"
	c.Clients, c.PerRound, c.Rounds = 6, 6, 60
	c.L2 = 0.05
	c.Local.MaxEpochs, c.Local.Gamma = 5, 1e-8
	return withAlgos(t, c, algos)
}

// withAlgos finishes a test configuration: the step size and workers the
// tests share, and the algorithms parsed from algos.
func withAlgos(t *testing.T, c Config, algos string) Config {
	t.Helper()
	c.Local.Step = 5
	c.Workers = 2
	var err error
	c.Algos, err = ParseAlgos(algos, c.Local, 0, func(n string) bool { return slices.Contains(aggregate.Names(), n) })
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// FedSplit with an exact prox converges to the centralised optimum; FedAvg
// with several local epochs stops at a biased point.
func TestFedSplitReachesOptimumFedAvgDoesNot(t *testing.T) {
	cfg := smallConfig(t, "fedavg,fedsplit")
	res, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Optimum.Converged || res.Optimum.GradNorm > 1e-10 {
		t.Fatalf("optimum not converged: ||grad|| = %v", res.Optimum.GradNorm)
	}
	last := func(r AlgoRun) Round { return r.Rounds[len(r.Rounds)-1] }
	avg, split := last(res.Runs[0]), last(res.Runs[1])
	rel := float64(split.Gap) / float64(res.Optimum.TrainLoss)
	if !(rel < 1e-8) {
		t.Errorf("fedsplit relative gap after %d rounds = %.3e, want < 1e-8", cfg.Rounds, rel)
	}
	if !(float64(avg.Gap)/float64(res.Optimum.TrainLoss) > 1e-4) {
		t.Errorf("fedavg relative gap = %.3e: expected a plateau well above FedSplit's", float64(avg.Gap)/float64(res.Optimum.TrainLoss))
	}
	if len(res.Runs[0].Rounds) != cfg.Rounds+1 || res.Runs[0].Rounds[0].Round != 0 {
		t.Errorf("rows: got %d starting at %d, want round 0..%d", len(res.Runs[0].Rounds), res.Runs[0].Rounds[0].Round, cfg.Rounds)
	}
}

// The run is a function of the seed alone: worker count and repetition do
// not change a bit of the trajectory.
func TestDeterministic(t *testing.T) {
	cfg := smallConfig(t, "fedprox,fedproxsplit")
	cfg.Rounds, cfg.PerRound, cfg.Stragglers = 5, 3, 0.5
	a, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Workers = 1
	b, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.Runs {
		for r := range a.Runs[i].Rounds {
			x, y := a.Runs[i].Rounds[r], b.Runs[i].Rounds[r]
			if x.TrainLoss != y.TrainLoss || x.GradEvals != y.GradEvals || x.Stragglers != y.Stragglers {
				t.Fatalf("%s round %d differs: %+v vs %+v", a.Runs[i].Algo, r, x, y)
			}
		}
	}
	cfg.Seed = 2
	c, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Runs[0].Rounds[5].TrainLoss == a.Runs[0].Rounds[5].TrainLoss {
		t.Error("another seed gave the same trajectory")
	}
}

// Stragglers: round(K(1-p)) clients do the full work; FedAvg drops the
// others, FedProx keeps their partial work.
func TestStragglers(t *testing.T) {
	cfg := smallConfig(t, "fedavg,fedprox")
	cfg.Rounds, cfg.PerRound, cfg.Stragglers = 3, 5, 0.4
	res, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range res.Runs[0].Rounds[1:] {
		if row.Stragglers != 2 || row.Participants != 3 {
			t.Errorf("fedavg round %d: %d participants, %d stragglers; want 3 and 2", row.Round, row.Participants, row.Stragglers)
		}
	}
	for _, row := range res.Runs[1].Rounds[1:] {
		if row.Stragglers != 2 || row.Participants != 5 {
			t.Errorf("fedprox round %d: %d participants, %d stragglers; want 5 and 2", row.Round, row.Participants, row.Stragglers)
		}
	}
}

func TestWriteDir(t *testing.T) {
	cfg := smallConfig(t, "fedavg,fedsplit")
	cfg.Rounds = 3
	cfg.SaveModels = true
	res, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := res.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Config  map[string]any `json:"config"`
		Optimum struct {
			TrainLoss    float64 `json:"train_loss"`
			TestAccuracy float64 `json:"test_accuracy"`
		} `json:"optimum"`
		Runs []struct {
			Algo   string           `json:"algo"`
			Rounds []map[string]any `json:"rounds"`
		} `json:"runs"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Optimum.TrainLoss <= 0 || len(back.Runs) != 2 || len(back.Runs[1].Rounds) != 4 {
		t.Fatalf("results.json: %+v", back)
	}
	for _, k := range []string{"round", "train_loss", "test_accuracy", "gap", "dist_to_opt", "participants", "stragglers", "grad_evals", "seconds", "bytes_up"} {
		if _, ok := back.Runs[0].Rounds[1][k]; !ok {
			t.Errorf("results.json round row lacks %q", k)
		}
	}
	f, err := os.Open(filepath.Join(dir, "results.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1+2*4 || rows[0][0] != "algo" {
		t.Errorf("results.csv: %d rows, header %v", len(rows), rows[0])
	}
	png, err := os.ReadFile(filepath.Join(dir, "results.png"))
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Errorf("results.png missing or not a PNG: %v", err)
	}
	for _, r := range res.Runs {
		if err := SaveModel(dir, r.Algo, res.Model, r.Final); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "fedsplit-model.json")); err != nil {
		t.Error(err)
	}
}

func TestFloatJSON(t *testing.T) {
	b, _ := json.Marshal(struct{ A, B Float }{Float(math.NaN()), 1.5})
	if string(b) != `{"A":null,"B":1.5}` {
		t.Errorf("got %s", b)
	}
}

// With a lossy codec and error feedback, FedSplit's server copy of each z_j
// tracks the client's exact z: the copies differ by what is still in flight,
// and the run still converges near the optimum.
func TestCodecFedSplitCopiesAgree(t *testing.T) {
	cfg := smallConfig(t, "fedsplit,fedprox")
	cfg.Rounds, cfg.Codec = 60, "topk:0.25+q8"
	res, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw := int64(4 * res.Data.Params * cfg.PerRound)
	for _, run := range res.Runs {
		for _, row := range run.Rounds[1:] {
			if row.BytesUp <= 0 || row.BytesUp*3 > raw {
				t.Fatalf("%s round %d: %d bytes up, raw float32 would be %d: want > 3x smaller", run.Algo, row.Round, row.BytesUp, raw)
			}
		}
	}
	split := res.Runs[0].Rounds[cfg.Rounds]
	if rel := float64(split.Gap) / float64(res.Optimum.TrainLoss); !(rel < 1e-3) {
		t.Errorf("fedsplit with topk:0.25+q8: relative gap %.3e after %d rounds, want < 1e-3", rel, cfg.Rounds)
	}
}

func TestEncodeReceiveAccounting(t *testing.T) {
	// Sum of what the server received plus the final residual equals the
	// sum of the true deltas (error feedback loses nothing).
	c, err := quant.Parse("topk:0.1+q8")
	if err != nil {
		t.Fatal(err)
	}
	const d = 50
	x := make([]float64, d)
	var res []float64
	sumTrue, sumGot := make([]float64, d), make([]float64, d)
	for r := 1; r <= 30; r++ {
		w := make([]float64, d)
		for i := range w {
			w[i] = math.Sin(float64(r*i)) * float64(i%7)
			sumTrue[i] += w[i]
		}
		f, err := uplink.Encode(c, uplink.Update{Round: uint64(r), Sent: w, Global: x, Residual: res}, streams.Of(7, streams.Codec, r, 0))
		if err != nil {
			t.Fatal(err)
		}
		_, got, err := receive(c, &f, x, nil)
		if err != nil {
			t.Fatal(err)
		}
		res = f.Residual
		for i := range got {
			sumGot[i] += got[i]
		}
	}
	for i := range sumTrue {
		if diff := sumTrue[i] - sumGot[i] - res[i]; math.Abs(diff) > 1e-9 {
			t.Fatalf("coordinate %d: true %v, received %v, residual %v", i, sumTrue[i], sumGot[i], res[i])
		}
	}
}

func TestOptimumCache(t *testing.T) {
	cfg := smallConfig(t, "fedavg")
	cfg.Rounds = 1
	cfg.OptimumCache = t.TempDir()
	a, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.Optimum.GradEvals != 0 || a.Optimum.GradEvals == 0 {
		t.Errorf("second run recomputed the optimum: %d then %d gradient evaluations", a.Optimum.GradEvals, b.Optimum.GradEvals)
	}
	if a.Optimum.TrainLoss != b.Optimum.TrainLoss || a.Runs[0].Rounds[1].Gap != b.Runs[0].Rounds[1].Gap {
		t.Error("cached optimum differs from the computed one")
	}
	cfg.L2 = 0.1 // another objective: another cache entry
	c, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Optimum.GradEvals == 0 {
		t.Error("a different objective reused the cached optimum")
	}
}

// A faulty client scaling its delta by 1000 every round wrecks FedAvg; the
// coordinate-wise median shrugs it off.
func TestFaultyClient(t *testing.T) {
	cfg := smallConfig(t, "fedprox:label=mean,median")
	cfg.Rounds, cfg.PerRound, cfg.Faulty, cfg.FaultyScale = 10, 5, 1, 1000
	res, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	mean, med := res.Runs[0].Rounds[cfg.Rounds], res.Runs[1].Rounds[cfg.Rounds]
	if !(float64(med.Gap) < 0.1*float64(mean.Gap)) {
		t.Errorf("with a faulty client: median gap %.3e, mean gap %.3e; want the median far better", float64(med.Gap), float64(mean.Gap))
	}
	for _, row := range res.Runs[1].Rounds[1:] {
		if row.Participants != 6 && row.Participants != 5 {
			t.Errorf("round %d: %d participants, want the faulty client added to K = 5 unless picked", row.Round, row.Participants)
		}
	}
}

// PNI grows with heterogeneity: identical-distribution clients score lower
// than the FedProx generator's synthetic(1,1) devices.
func TestPNIOrdersHeterogeneity(t *testing.T) {
	pni := func(ds string) float64 {
		cfg := smallConfig(t, "fedavg")
		cfg.Dataset, cfg.Rounds, cfg.Clients, cfg.PerRound = ds, 1, 20, 5
		res, err := Run(context.Background(), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		return float64(res.Data.PNI)
	}
	iid, het := pni("synthetic-iid"), pni("synthetic:1,1")
	if !(iid >= 0 && het > iid) {
		t.Errorf("PNI synthetic-iid %.4g, synthetic(1,1) %.4g: want the heterogeneous one larger", iid, het)
	}
}

// A run whose optimum search stopped early can have no positive gap: the
// plot falls back to a linear axis instead of failing.
func TestPlotWithoutPositiveGap(t *testing.T) {
	cfg := smallConfig(t, "fedavg")
	cfg.Rounds, cfg.OptimumEvals = 2, 1
	res, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.WriteDir(t.TempDir()); err != nil {
		t.Fatal(err)
	}
}

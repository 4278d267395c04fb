package sim

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/edgefl/edgefl/data/dataset"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/split"
	"github.com/edgefl/edgefl/proto/uplink"
)

// fashionMNISTDir is where Debian's dataset-fashion-mnist package installs
// the data (dataset's TestFashionMNIST reads it too).
const fashionMNISTDir = "/usr/share/datasets/fashion-mnist"

// shirtsCSV writes n training images of Fashion-MNIST's two hardest
// classes to tell apart (0, T-shirt/top, label 0; 6, shirt, label 1),
// pooled 2x2 to 196 pixels, as a CSV with a label column. It fails (does
// not skip) when the data are missing.
func shirtsCSV(t *testing.T, n int) string {
	t.Helper()
	ds, err := dataset.LoadIDX(fashionMNISTDir)
	if err != nil {
		t.Fatalf("%v (install Debian's dataset-fashion-mnist package)", err)
	}
	path := filepath.Join(t.TempDir(), "shirts.csv")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for p := range 196 {
		fmt.Fprintf(w, "p%d,", p)
	}
	fmt.Fprintln(w, "label")
	d := ds.Data
	rows := 0
	for i := 0; i < 60000 && rows < n; i++ {
		y := d.Y[i]
		if y != 0 && y != 6 {
			continue
		}
		img := d.X[i*d.D : (i+1)*d.D]
		for r := 0; r < 28; r += 2 {
			for c := 0; c < 28; c += 2 {
				v := (img[r*28+c] + img[r*28+c+1] + img[(r+1)*28+c] + img[(r+1)*28+c+1]) / 4
				fmt.Fprintf(w, "%.4g,", v)
			}
		}
		fmt.Fprintln(w, map[bool]int{false: 0, true: 1}[y == 6])
		rows++
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSumModeConvergesLikeFedSplit: FedSplit in sum mode (--dp; the
// aggregator keeps only S and m, docs/privacy.md "FedSplit") with noise
// too small to matter and a clip that never bites is FedSplit: on real
// data (Fashion-MNIST shirts against T-shirts, 6 sites of equal size) it reaches
// the same optimum as plain FedSplit, with every site every round (the same
// iterates within the fp32 uplink's precision) and with half of them on
// average (as fast, over its own Poisson draws from the selection key).
func TestSumModeConvergesLikeFedSplit(t *testing.T) {
	if testing.Short() {
		t.Skip("runs FedSplit to convergence four times")
	}
	data := shirtsCSV(t, 600)
	for _, perRound := range []int{6, 3} {
		t.Run(fmt.Sprintf("K=%d", perRound), func(t *testing.T) {
			run := func(private *dp.Config) AlgoRun {
				cfg := DefaultConfig()
				// Sites of equal size: under --dp the announcement leaves
				// the total sample count out and every site's step is s,
				// so sum mode solves the sites' unweighted mean, which is
				// plain FedSplit's sample-weighted problem only when the
				// sizes are equal (docs/privacy.md, "As built (FedSplit)").
				cfg.Dataset, cfg.Partition, cfg.Clients, cfg.PerRound = "csv:"+data+":label=label", "iid", 6, perRound
				cfg.Standardize, cfg.L2, cfg.Rounds, cfg.Seed, cfg.Codec = "global", 0.1, 60, 2, "fp32"
				cfg.Workers, cfg.EvalEvery, cfg.OptimumTol = 2, 20, 1e-9
				// K sites a round without DP; under --dp, poisson at
				// q = K/6 (uniform is refused there), every site every
				// round at K = 6.
				cfg.Select = "uniform"
				if private != nil {
					cfg.Select = "poisson"
				}
				local := Local{Solver: proxsolver.LBFGS, Gamma: 1e-9, Step: 0.5, Relax: 1, MaxEpochs: 1, Batch: 10, LR: 0.01}
				cfg.Algos = []Algo{{Label: "fedsplit", Family: FedSplit, Agg: split.StepMean, Local: local}}
				cfg.DP = private
				res, err := Run(context.Background(), cfg, nil)
				if err != nil {
					t.Fatal(err)
				}
				return res.Runs[0]
			}
			plain := run(nil)
			sum := run(&dp.Config{Clip: 1e6, Noise: 1e-15, Delta: 1e-5})
			if sum.Rounds[1].Metrics["split_counted"] == 0 {
				t.Fatal("the DP run did not run in sum mode")
			}
			last := func(r AlgoRun) Round { return r.Rounds[len(r.Rounds)-1] }
			p, s, s0 := last(plain), last(sum), sum.Rounds[0]
			var diff float64
			for i := range plain.Final {
				diff = max(diff, math.Abs(plain.Final[i]-sum.Final[i]))
			}
			t.Logf("after %d rounds: plain FedSplit ||x - x*|| = %.3g (gap %.3g), sum mode %.3g (gap %.3g; %.3g at the start); the models differ by %.3g",
				p.Round, float64(p.DistToOpt), float64(p.Gap), float64(s.DistToOpt), float64(s.Gap), float64(s0.Gap), diff)
			if !(float64(s.Gap) < 1e-4*float64(s0.Gap)) {
				t.Fatalf("sum mode did not converge: gap %v (%v at the start)", s.Gap, s0.Gap)
			}
			if perRound < 6 {
				// Under --dp the draw is keyed by the selection key, not
				// the seed, so the two runs see other rounds: both must
				// reach the optimum to the same precision, not the same
				// iterate.
				if !(float64(s.Gap) < 10*float64(p.Gap)) {
					t.Fatalf("sum mode (gap %v) converges slower than plain FedSplit (gap %v) over other draws of %d sites", s.Gap, p.Gap, perRound)
				}
				return
			}
			// The same optimum: the two runs are far closer to each other
			// than to it after as many rounds.
			if math.Abs(float64(s.Gap-p.Gap)) > 1e-2*float64(p.Gap) || diff > 1e-2*float64(p.DistToOpt) {
				t.Fatalf("sum mode (gap %v) is not plain FedSplit (gap %v): the models differ by %v", s.Gap, p.Gap, diff)
			}
		})
	}
}

// fashionCSV writes the first n training images of Fashion-MNIST (784
// pixels, 10 classes: a logistic model of d = 7850 parameters) as a CSV
// with a label column. It fails (does not skip) when the data are missing.
func fashionCSV(t *testing.T, n int) string {
	t.Helper()
	ds, err := dataset.LoadIDX(fashionMNISTDir)
	if err != nil {
		t.Fatalf("%v (install Debian's dataset-fashion-mnist package)", err)
	}
	path := filepath.Join(t.TempDir(), "fashion.csv")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for p := range 784 {
		fmt.Fprintf(w, "p%d,", p)
	}
	fmt.Fprintln(w, "label")
	d := ds.Data
	for i := range n {
		for _, v := range d.X[i*d.D : (i+1)*d.D] {
			fmt.Fprintf(w, "%.4g,", v)
		}
		fmt.Fprintln(w, d.Y[i])
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSumModeHidesSelection: an observer who sees only the published
// global models and the public parameters (z, C, d) cannot tell from them
// when a site was first drawn. Its best reading of FedSplit's sum mode is
// the divisor of x = S/m off the noise scale: ||x_t - x_{t-1}|| is about
// z C sqrt(d) / m, so round(z C sqrt(d) / ||x_t - x_{t-1}||) is m. When m
// counted the sites drawn so far, that estimate followed the first-time
// draws round by round (and an empty first draw published x_0 unchanged,
// without noise). Under the fixed roster it is the roster's size in every
// round, the first included, whatever was drawn: N = 20 sites, Poisson at
// q = 0.1, d = 7850, as in the review that found the leak.
func TestSumModeHidesSelection(t *testing.T) {
	const n, rounds = 20, 30
	cfg := DefaultConfig()
	cfg.Dataset, cfg.Partition, cfg.Clients, cfg.PerRound, cfg.Rounds = "csv:"+fashionCSV(t, 1000)+":label=label", "iid", n, 2, rounds
	cfg.Seed, cfg.Codec, cfg.Workers, cfg.EvalEvery, cfg.OptimumEvals = 4, "fp32", 2, rounds, 20
	cfg.Select = "poisson"
	local := Local{Solver: proxsolver.LBFGS, Gamma: 1e-3, Step: 0.5, Relax: 1, MaxEpochs: 1, Batch: 10, LR: 0.01}
	cfg.Algos = []Algo{{Label: "fedproxsplit", Family: FedProxSplit, Agg: split.StepMean, Local: local}}
	cfg.DP = &dp.Config{Clip: 0.5, Noise: 1, Delta: 1e-5}
	xs := map[int][]float64{}
	cfg.trace = func(_ string, round int, _ map[string]*uplink.Frame, x []float64) { xs[round] = slices.Clone(x) }
	res, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := len(xs[1])
	prev := make([]float64, d) // x_0: the logistic model starts at zeros
	scale := cfg.DP.Noise * cfg.DP.Clip * math.Sqrt(float64(d))
	first, total := 0, 0
	var ests, firsts []int
	for r := 1; r <= rounds; r++ {
		var step float64
		for i, v := range xs[r] {
			step += (v - prev[i]) * (v - prev[i])
		}
		prev = xs[r]
		est := math.Inf(1)
		if step > 0 {
			est = math.Round(scale / math.Sqrt(step))
		}
		row := res.Runs[0].Rounds[r]
		first = int(row.Metrics["split_joined"])
		total += first
		ests, firsts = append(ests, int(min(est, 1e6))), append(firsts, total)
		if math.Abs(est-n) > 1 {
			t.Errorf("round %d: the observer reads m = %v off the published models (sites drawn so far: %d), want the roster's %d", r, est, total, n)
		}
	}
	t.Logf("observer's m per round: %v", ests)
	t.Logf("sites drawn so far:     %v", firsts)
	if firsts[0] >= n/2 || total < n/2 {
		t.Fatalf("sites drawn so far %v: the test needs most of them drawn for the first time after round 1", firsts)
	}
}

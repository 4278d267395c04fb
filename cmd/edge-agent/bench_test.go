package main

import (
	"bytes"
	"encoding/json"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// runCmd runs edge-agent with args and returns its exit code and output.
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(t.Context(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestBenchJSON(t *testing.T) {
	small := []string{"bench", "--json", "--samples", "200", "--features", "20", "--classes", "4", "--epochs", "3"}
	tests := []struct {
		name        string
		extra       []string
		params      int
		sampleGrads int64 // 3 epochs of 200 plus the overhead passes
		overhead    int
	}{
		{"logreg sgd", nil, 20*4 + 4, 5 * 200, 2},
		{"logreg lbfgs", []string{"--solver", "lbfgs"}, 20*4 + 4, 4 * 200, 1},
		{"mlp sgd", []string{"--model", "mlp", "--hidden", "8"}, 20*8 + 8 + 8*4 + 4, 5 * 200, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCmd(t, append(small, tt.extra...)...)
			if code != 0 {
				t.Fatalf("exit %d, stderr:\n%s", code, stderr)
			}
			var r benchResult
			if err := json.Unmarshal([]byte(stdout), &r); err != nil {
				t.Fatalf("output is not JSON: %v\n%s", err, stdout)
			}
			checkBenchResult(t, r, runtime.GOOS, runtime.GOARCH)
			if r.Samples != 200 || r.Model.Inputs != 20 || r.Model.Classes != 4 || r.Epochs != 3 {
				t.Errorf("report echoes samples %d, features %d, classes %d, epochs %d; want 200, 20, 4, 3", r.Samples, r.Model.Inputs, r.Model.Classes, r.Epochs)
			}
			if r.Params != tt.params || r.SampleGrads != tt.sampleGrads || r.OverheadEpochs != tt.overhead {
				t.Errorf("params %d, sample grads %d, overhead %d; want %d, %d, %d", r.Params, r.SampleGrads, r.OverheadEpochs, tt.params, tt.sampleGrads, tt.overhead)
			}
			if r.EpochsDone != 3 || r.Stop != "epochs" {
				t.Errorf("epochs done %v, stop %q; want 3, epochs", r.EpochsDone, r.Stop)
			}
			if runtime.GOOS == "linux" && r.PeakRSSSource != "VmHWM" {
				t.Errorf("peak RSS source %q on linux, want VmHWM", r.PeakRSSSource)
			}
			if runtime.GOOS == "linux" && !(r.SolveCPUSeconds > 0 && r.SolveCPUSeconds < 60) {
				t.Errorf("solve CPU time %v s on linux, want a positive figure", r.SolveCPUSeconds)
			}
		})
	}
}

// checkBenchResult checks what any successful small benchmark must report;
// the cross-architecture tests use it too.
func checkBenchResult(t *testing.T, r benchResult, goos, goarch string) {
	t.Helper()
	if r.GOOS != goos || r.GOARCH != goarch {
		t.Errorf("ran on %s/%s, want %s/%s", r.GOOS, r.GOARCH, goos, goarch)
	}
	if !(r.Loss < r.AnchorLoss) || math.IsNaN(r.Loss) {
		t.Errorf("loss %v at the end, %v at the anchor: the solve did not descend", r.Loss, r.AnchorLoss)
	}
	if !(r.SolveSeconds > 0 && r.SecondsPerEpoch > 0 && r.SamplesPerSecond > 0 && r.FullPassSeconds > 0) {
		t.Errorf("solve %v s, %v s per epoch, %v samples/s, full pass %v s: want all positive",
			r.SolveSeconds, r.SecondsPerEpoch, r.SamplesPerSecond, r.FullPassSeconds)
	}
	if got := float64(r.Samples) / r.SecondsPerEpoch; math.Abs(got-r.SamplesPerSecond) > 1e-6*got {
		t.Errorf("samples/s %v, but samples / seconds per epoch = %v", r.SamplesPerSecond, got)
	}
	// A few hundred samples of 20 features: a Go binary, emulated or not,
	// peaks well under 256 MiB.
	if r.PeakRSSBytes < 1<<20 || r.PeakRSSBytes > 256<<20 {
		t.Errorf("peak RSS %d bytes (%s): want between 1 MiB and 256 MiB", r.PeakRSSBytes, r.PeakRSSSource)
	}
	if r.BudgetEpochs < 1 || r.Margin != 0.5 || r.DeadlineSeconds != 60 {
		t.Errorf("budget %d epochs for a %v s deadline and margin %v: want at least 1 epoch, 60 s, 0.5", r.BudgetEpochs, r.DeadlineSeconds, r.Margin)
	}
	if r.TrainAccuracy < 0 || r.TrainAccuracy > 1 {
		t.Errorf("training accuracy %v outside [0, 1]", r.TrainAccuracy)
	}
}

func TestBenchText(t *testing.T) {
	code, stdout, stderr := runCmd(t, "bench", "--samples", "100", "--features", "10", "--epochs", "2", "--deadline", "30s", "--margin", "0.25")
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	for _, want := range []string{
		"model        logreg, 10 features x 10 classes, 110 parameters",
		"solver       sgd, 2 epochs, batch 10, lr 0.01, mu 1",
		"samples/s", "s per epoch", "peak memory", "VmHWM",
		"fit the 30s deadline with a 25% margin", "22.5 s of compute",
	} {
		if runtime.GOOS != "linux" && want == "VmHWM" {
			continue
		}
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
}

// A deadline that has passed before the first step stops the solve; the
// report says so and suggests no budget.
func TestBenchDeadline(t *testing.T) {
	code, stdout, stderr := runCmd(t, "bench", "--samples", "100", "--features", "10", "--deadline", "1ns")
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	for _, want := range []string{"stopped by deadline", "0 epochs per round", "warning      the solve hit the 1ns deadline"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
}

func TestBenchFlagErrors(t *testing.T) {
	tests := []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"-h"}, 0, "usage: edge-agent bench"},
		{[]string{"--nope"}, 2, "flag provided but not defined"},
		{[]string{"extra"}, 1, `unexpected argument "extra"`},
		{[]string{"--model", "cnn"}, 1, `--model "cnn": want logreg, binary-logreg, linear or mlp`},
		{[]string{"--solver", "adam"}, 1, `--solver "adam": want sgd or lbfgs`},
		{[]string{"--samples", "0"}, 1, "--samples 0"},
		{[]string{"--epochs", "0"}, 1, "--epochs 0"},
		{[]string{"--deadline", "0s"}, 1, "--deadline 0s"},
		{[]string{"--margin", "1"}, 1, "--margin 1"},
		{[]string{"--margin", "NaN"}, 1, "--margin NaN"},
		{[]string{"--features", "0"}, 1, "model: "},
		{[]string{"--classes", "1"}, 1, "model: "},
		{[]string{"--model", "mlp", "--hidden", "0"}, 1, "model: "},
		{[]string{"--lr", "-1"}, 1, "--lr -1"},
		{[]string{"--batch", "0"}, 1, "solver: "},
		{[]string{"--mu", "-1"}, 1, "--mu -1"},
		{[]string{"--samples", "100000", "--features", "100000"}, 1, "more than 67108864 feature values"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, stdout, stderr := runCmd(t, append([]string{"bench"}, tt.args...)...)
			if code != tt.code || !strings.Contains(stderr, tt.stderr) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, stderr, tt.code, tt.stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
		})
	}
}

func TestBudgetEpochs(t *testing.T) {
	tests := []struct {
		name               string
		deadline           time.Duration
		margin             float64
		perEpoch, fullPass float64
		overhead           int
		want               int
	}{
		{"half of 60 s at 1 s per epoch, 2 passes of 0.5 s", time.Minute, 0.5, 1, 0.5, 2, 29},
		{"no margin", time.Minute, 0, 1, 0.5, 2, 59},
		{"rounds down", 10 * time.Second, 0, 3, 0, 1, 3},
		{"exactly one epoch", 3 * time.Second, 0, 1, 1, 2, 1},
		{"overhead alone overruns", 2 * time.Second, 0, 1, 1, 2, 0},
		{"epoch longer than the deadline", time.Second, 0.5, 1, 0.1, 1, 0},
		{"no measurement", time.Minute, 0.5, 0, 0, 2, 0},
		{"no deadline", 0, 0.5, 1, 1, 2, 0},
		{"absurdly fast", time.Hour, 0, 1e-12, 0, 2, math.MaxInt32},
	}
	for _, tt := range tests {
		if got := budgetEpochs(tt.deadline, tt.margin, tt.perEpoch, tt.fullPass, tt.overhead); got != tt.want {
			t.Errorf("%s: budgetEpochs(%v, %v, %v, %v, %d) = %d, want %d", tt.name, tt.deadline, tt.margin, tt.perEpoch, tt.fullPass, tt.overhead, got, tt.want)
		}
	}
}

func TestSecondsPerEpoch(t *testing.T) {
	tests := []struct {
		name                            string
		solve, fullPass, epochs, passes float64
		want                            float64
	}{
		{"overhead subtracted", 7, 0.5, 5, 7, 1.2},
		{"lbfgs: one overhead pass", 4.5, 0.5, 8, 9, 0.5},
		{"noise leaves nothing: all passes", 1, 1, 1, 3, 1.0 / 3},
		{"no epoch trained", 2, 1, 0, 2, 1},
		{"nothing at all", 0, 0, 0, 0, 0},
	}
	for _, tt := range tests {
		if got := secondsPerEpoch(tt.solve, tt.fullPass, tt.epochs, tt.passes); math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("%s: secondsPerEpoch(%v, %v, %v, %v) = %v, want %v", tt.name, tt.solve, tt.fullPass, tt.epochs, tt.passes, got, tt.want)
		}
	}
}

func TestParseVmHWM(t *testing.T) {
	tests := []struct {
		name   string
		status string
		want   uint64
		ok     bool
	}{
		{"linux", "Name:\tedge-agent\nVmPeak:\t  800000 kB\nVmHWM:\t   16284 kB\nVmRSS:\t   16000 kB\n", 16284 << 10, true},
		{"first line", "VmHWM: 1 kB", 1024, true},
		{"missing", "Name:\tedge-agent\nVmRSS:\t 1 kB\n", 0, false},
		{"no unit", "VmHWM:\t12\n", 0, false},
		{"other unit", "VmHWM:\t12 MB\n", 0, false},
		{"not a number", "VmHWM:\tx kB\n", 0, false},
		{"overflow", "VmHWM:\t18446744073709551615 kB\n", 0, false},
		{"empty", "", 0, false},
	}
	for _, tt := range tests {
		got, ok := parseVmHWM([]byte(tt.status))
		if got != tt.want || ok != tt.ok {
			t.Errorf("%s: parseVmHWM = %d, %v; want %d, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

func TestBenchData(t *testing.T) {
	const n, d, classes = 2000, 30, 10
	a, b := benchData(n, d, classes, 7), benchData(n, d, classes, 7)
	if !slices.Equal(a.X, b.X) || !slices.Equal(a.Y, b.Y) {
		t.Fatal("the same seed gave different data")
	}
	if c := benchData(n, d, classes, 8); slices.Equal(a.X, c.X) {
		t.Fatal("seeds 7 and 8 gave the same features")
	}
	if err := a.Validate(); err != nil || a.N != n || a.D != d {
		t.Fatalf("data %d×%d: %v; want %d×%d and valid", a.N, a.D, err, n, d)
	}
	count := make([]int, classes)
	var sum, sumSq float64
	for i, y := range a.Y {
		if y != math.Trunc(y) || y < 0 || y >= classes {
			t.Fatalf("label %d = %v, not a class in [0, %d)", i, y, classes)
		}
		count[int(y)]++
	}
	for _, x := range a.X {
		sum += x
		sumSq += x * x
	}
	// Every class appears (a random teacher may favour some) and the
	// features are standard Gaussian.
	for c, k := range count {
		if k == 0 {
			t.Errorf("class %d never appears: %v", c, count)
		}
	}
	m, v := sum/float64(len(a.X)), sumSq/float64(len(a.X))
	if math.Abs(m) > 0.02 || math.Abs(v-1) > 0.03 {
		t.Errorf("features have mean %v and second moment %v, want about 0 and 1", m, v)
	}
}

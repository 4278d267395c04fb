package dataset

import (
	"errors"
	"math"
	"slices"
	"testing"
)

func TestSyntheticShape(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  SyntheticConfig
	}{
		{"synthetic(1,1)", SyntheticConfig{Alpha: 1, Beta: 1, Seed: 1}},
		{"synthetic(0,0)", SyntheticConfig{Seed: 2}},
		{"synthetic-iid", SyntheticConfig{IID: true, Seed: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Synthetic(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if f.Name != tc.name || f.D != 60 || f.Classes != 10 || len(f.Clients) != 30 {
				t.Fatalf("got %s D=%d classes=%d clients=%d, want %s 60 10 30", f.Name, f.D, f.Classes, len(f.Clients), tc.name)
			}
			for k, c := range f.Clients {
				n := c.Train.N + c.Test.N
				if n < 50 {
					t.Errorf("device %d has %d samples, want >= 50", k, n)
				}
				if want := n - int(0.9*float64(n)); c.Test.N != want {
					t.Errorf("device %d: %d test samples of %d, want %d (the reference's int(0.9 n) train)", k, c.Test.N, n, want)
				}
				if want := "f_0000" + string(rune('0'+k%10)); k < 10 && c.ID != want {
					t.Errorf("device %d ID %q, want %q", k, c.ID, want)
				}
			}
			checkSplits(t, f, 0.1)
		})
	}
}

func TestSyntheticLabelsAndFeatures(t *testing.T) {
	cfg, err := SyntheticConfig{Alpha: 0.5, Beta: 0.5, Devices: 40, MaxSamples: 400, Seed: 7}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	devs, err := generateSynthetic(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// x - v_k, scaled by Sigma^-1/2, must be standard normal.
	var sum, sumSq, count float64
	logits := make([]float64, cfg.Classes)
	for k, d := range devs {
		if d.Data.N < 50 || d.Data.N > 400 {
			t.Errorf("device %d: %d samples, want 50..400", k, d.Data.N)
		}
		for i := range d.Data.N {
			x := d.Data.Row(i)
			for j, v := range x {
				z := (v - d.V[j]) / math.Pow(float64(j+1), -0.6)
				sum += z
				sumSq += z * z
				count++
			}
			copy(logits, d.B)
			for j, xj := range x {
				for c := range logits {
					logits[c] += xj * d.W[j*cfg.Classes+c]
				}
			}
			if y := d.Data.Y[i]; y != float64(argmax(logits)) || y < 0 || y >= 10 {
				t.Fatalf("device %d sample %d: label %v, argmax(xW+b) = %d", k, i, y, argmax(logits))
			}
		}
	}
	mean, variance := sum/count, sumSq/count-(sum/count)*(sum/count)
	if math.Abs(mean) > 0.02 || math.Abs(variance-1) > 0.03 {
		t.Errorf("standardised features: mean %.4f variance %.4f over %.0f values, want 0 and 1", mean, variance, count)
	}
}

// stdOfMeans returns the standard deviation across devices of the mean of
// each device's vector.
func stdOfMeans(vs [][]float64) float64 {
	var s, s2 float64
	for _, v := range vs {
		m := 0.0
		for _, x := range v {
			m += x
		}
		m /= float64(len(v))
		s += m
		s2 += m * m
	}
	n := float64(len(vs))
	return math.Sqrt(s2/n - (s/n)*(s/n))
}

func TestSyntheticHeterogeneity(t *testing.T) {
	// alpha is the spread of u_k (the mean of W_k), beta that of B_k (the
	// mean of v_k): the spread across devices of mean(W_k) is about
	// sqrt(alpha^2 + 1/600), of mean(v_k) about sqrt(beta^2 + 1/60).
	for _, tc := range []struct {
		alpha, beta    float64
		wantW, wantV   float64
		iid, sharedWBV bool
	}{
		{alpha: 0, beta: 0, wantW: math.Sqrt(1.0 / 600), wantV: math.Sqrt(1.0 / 60)},
		{alpha: 1, beta: 0, wantW: 1, wantV: math.Sqrt(1.0 / 60)},
		{alpha: 0, beta: 2, wantW: math.Sqrt(1.0 / 600), wantV: 2},
		{iid: true, wantW: 0, wantV: 0},
	} {
		cfg, err := SyntheticConfig{Alpha: tc.alpha, Beta: tc.beta, IID: tc.iid, Devices: 200, MaxSamples: 50, Seed: 11}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		devs, err := generateSynthetic(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var ws, vs [][]float64
		for _, d := range devs {
			ws, vs = append(ws, d.W), append(vs, d.V)
		}
		gotW, gotV := stdOfMeans(ws), stdOfMeans(vs)
		if math.Abs(gotW-tc.wantW) > 0.2*tc.wantW+1e-12 || math.Abs(gotV-tc.wantV) > 0.2*tc.wantV+1e-12 {
			t.Errorf("alpha %v beta %v iid %v: spread of mean(W_k) %.4f (want %.4f), of mean(v_k) %.4f (want %.4f)", tc.alpha, tc.beta, tc.iid, gotW, tc.wantW, gotV, tc.wantV)
		}
		if tc.iid {
			for k, d := range devs {
				if !slices.Equal(d.W, devs[0].W) || !slices.Equal(d.B, devs[0].B) || slices.ContainsFunc(d.V, func(v float64) bool { return v != 0 }) {
					t.Fatalf("synthetic-iid device %d does not share W, b or has v != 0", k)
				}
			}
		} else if slices.Equal(devs[0].W, devs[1].W) {
			t.Errorf("alpha %v beta %v: devices share W", tc.alpha, tc.beta)
		}
	}
}

func TestSyntheticSizes(t *testing.T) {
	// n = int(lognormal(4, 2)) + 50: median e^4 + 50 = 104.6, and
	// P(n >= 1000) = P(z >= (ln 950 - 4)/2) = 7.6 %.
	cfg, err := SyntheticConfig{Devices: 4000, Dim: 1, Classes: 2, MaxSamples: 1000, Seed: 5}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	devs, err := generateSynthetic(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sizes := make([]int, len(devs))
	capped := 0
	for k, d := range devs {
		sizes[k] = d.Data.N
		if d.Data.N < 50 || d.Data.N > 1000 {
			t.Fatalf("device %d: %d samples, want 50..1000", k, d.Data.N)
		}
		if d.Data.N == 1000 {
			capped++
		}
	}
	slices.Sort(sizes)
	median := sizes[len(sizes)/2]
	if median < 95 || median > 115 {
		t.Errorf("median device size %d, want about 105", median)
	}
	if p := float64(capped) / float64(len(devs)); p < 0.06 || p > 0.095 {
		t.Errorf("%.3f of the devices reach the 1000 cap, want about 0.076", p)
	}
}

func TestSyntheticDeterminism(t *testing.T) {
	for _, cfg := range []SyntheticConfig{{Alpha: 1, Beta: 1}, {IID: true}} {
		cfg.Devices = 10
		cfg.Seed = 42
		a, errA := Synthetic(cfg)
		b, errB := Synthetic(cfg)
		cfg.Seed = 43
		c, errC := Synthetic(cfg)
		if err := errors.Join(errA, errB, errC); err != nil {
			t.Fatal(err)
		}
		if fingerprint(a) != fingerprint(b) {
			t.Errorf("%s: same seed, different data", a.Name)
		}
		if fingerprint(a) == fingerprint(c) {
			t.Errorf("%s: seeds 42 and 43 give the same data", a.Name)
		}
		pool, err := SyntheticPool(SyntheticConfig{Alpha: cfg.Alpha, Beta: cfg.Beta, IID: cfg.IID, Devices: 10, Seed: 43})
		if err != nil {
			t.Fatal(err)
		}
		train, test := c.Pooled()
		if pool.Data.N != train.N+test.N || pool.Data.D != 60 || pool.Classes != 10 {
			t.Errorf("%s: pool of %d×%d, federation has %d+%d samples", c.Name, pool.Data.N, pool.Data.D, train.N, test.N)
		}
	}
}

func TestSyntheticErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  SyntheticConfig
	}{
		{"negative alpha", SyntheticConfig{Alpha: -1}},
		{"NaN beta", SyntheticConfig{Beta: math.NaN()}},
		{"infinite alpha", SyntheticConfig{Alpha: math.Inf(1)}},
		{"iid with alpha", SyntheticConfig{IID: true, Alpha: 1}},
		{"negative devices", SyntheticConfig{Devices: -3}},
		{"one class", SyntheticConfig{Classes: 1}},
		{"negative dim", SyntheticConfig{Dim: -1}},
		{"negative cap", SyntheticConfig{MaxSamples: -1}},
		{"test fraction 1", SyntheticConfig{TestFraction: 1}},
		{"too large", SyntheticConfig{Devices: 2, Dim: 1 << 27}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Synthetic(tc.cfg)
			if err == nil {
				t.Fatalf("got %d clients, want an error", len(f.Clients))
			}
			checkOneLine(t, err)
			t.Log(err)
		})
	}
}

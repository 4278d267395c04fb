package dataset

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

// balanced labels i mod c.
func modLabels(c int) func(int) int { return func(i int) int { return i % c } }

func TestPartitionIID(t *testing.T) {
	for _, tc := range []struct{ n, clients int }{{1000, 7}, {10, 10}, {31, 3}, {5, 1}} {
		ds := indexed(tc.n, 3, 4, modLabels(4))
		f, err := PartitionIID(ds, tc.clients, PartitionOptions{Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(f.Clients) != tc.clients || f.D != 3 || f.Classes != 4 || f.Dropped != 0 {
			t.Fatalf("%d clients D=%d classes=%d dropped %d", len(f.Clients), f.D, f.Classes, f.Dropped)
		}
		checkUsedOnce(t, f, tc.n)
		checkSplits(t, f, 0.1)
		lo, hi := math.MaxInt, 0
		for _, c := range f.Clients {
			lo, hi = min(lo, c.Train.N+c.Test.N), max(hi, c.Train.N+c.Test.N)
		}
		if hi-lo > 1 {
			t.Errorf("n=%d over %d clients: sizes %d..%d, want near-equal", tc.n, tc.clients, lo, hi)
		}
	}
}

// dominantShare is the mean over clients of the share of a client's most
// frequent label.
func dominantShare(f *Federated) float64 {
	total := 0.0
	for _, c := range f.Clients {
		counts := map[float64]int{}
		n := 0
		for _, y := range append(slices.Clone(c.Train.Y), c.Test.Y...) {
			counts[y]++
			n++
		}
		top := 0
		for _, k := range counts {
			top = max(top, k)
		}
		total += float64(top) / float64(n)
	}
	return total / float64(len(f.Clients))
}

func TestPartitionDirichlet(t *testing.T) {
	ds := indexed(5000, 2, 10, modLabels(10))
	skewed, err := PartitionDirichlet(ds, 10, 0.05, PartitionOptions{Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	flat, err := PartitionDirichlet(ds, 10, 100, PartitionOptions{Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []*Federated{skewed, flat} {
		checkUsedOnce(t, f, 5000)
		checkSplits(t, f, 0.1)
		for _, c := range f.Clients {
			if n := c.Train.N + c.Test.N; n < DefaultMinSamples {
				t.Errorf("%s: client %s has %d samples, want >= %d", f.Name, c.ID, n, DefaultMinSamples)
			}
		}
	}
	if s := dominantShare(skewed); s < 0.6 {
		t.Errorf("alpha 0.05: mean dominant-label share %.2f, want label skew (> 0.6)", s)
	}
	if s := dominantShare(flat); s > 0.2 {
		t.Errorf("alpha 100: mean dominant-label share %.2f, want near 0.1", s)
	}
	// The client sizes of a skewed draw differ a lot.
	lo, hi := math.MaxInt, 0
	for _, c := range skewed.Clients {
		lo, hi = min(lo, c.Train.N+c.Test.N), max(hi, c.Train.N+c.Test.N)
	}
	if hi < 2*lo {
		t.Errorf("alpha 0.05: client sizes %d..%d, want spread", lo, hi)
	}
	if skewed.Name != "indexed, dirichlet:0.05" {
		t.Errorf("name %q", skewed.Name)
	}
}

func TestPartitionClasses(t *testing.T) {
	// 10 balanced classes of 300 samples; PerClass 5.
	ds := indexed(3000, 2, 10, modLabels(10))
	for _, tc := range []struct {
		clients, k, dropped int
	}{
		{100, 2, 0},
		{20, 1, 0},
		{10, 10, 0},
		{4, 2, 1500}, // clients hold classes 0..4: classes 5..9 are left out
	} {
		f, err := PartitionClasses(ds, tc.clients, tc.k, PartitionOptions{Seed: 5})
		if err != nil {
			t.Fatal(err)
		}
		if f.Dropped != tc.dropped {
			t.Errorf("%d clients, k=%d: dropped %d, want %d", tc.clients, tc.k, f.Dropped, tc.dropped)
		}
		got := sampleIndices(f)
		if len(got) != 3000-tc.dropped || len(got) != len(slices.Compact(slices.Sorted(slices.Values(got)))) {
			t.Errorf("%d clients, k=%d: %d samples used (distinct %d), want %d each once", tc.clients, tc.k, len(got), len(slices.Compact(slices.Sorted(slices.Values(got)))), 3000-tc.dropped)
		}
		checkSplits(t, f, 0.1)
		sizes := make([]int, len(f.Clients))
		for u, c := range f.Clients {
			var want []int
			for j := range tc.k {
				want = append(want, (u+j)%10)
			}
			slices.Sort(want)
			got := classesOf(c)
			if len(got) > tc.k || slices.ContainsFunc(got, func(y int) bool { return !slices.Contains(want, y) }) {
				t.Errorf("%d clients, k=%d: client %d has classes %v, want a subset of %v", tc.clients, tc.k, u, got, want)
			}
			sizes[u] = c.Train.N + c.Test.N
			if sizes[u] < DefaultPerClass*tc.k {
				t.Errorf("client %d: %d samples, want at least %d per class", u, sizes[u], DefaultPerClass)
			}
		}
		if tc.clients >= 20 && slices.Max(sizes) < 5*slices.Min(sizes) {
			t.Errorf("%d clients, k=%d: sizes %d..%d, want lognormal spread", tc.clients, tc.k, slices.Min(sizes), slices.Max(sizes))
		}
	}
}

func TestLargestRemainder(t *testing.T) {
	for _, tc := range []struct {
		w     []float64
		total int
		want  []int
	}{
		{[]float64{1, 1, 1}, 10, []int{4, 3, 3}},
		{[]float64{0.5, 0.25, 0.25}, 7, []int{3, 2, 2}}, // 3.5, 1.75, 1.75
		{[]float64{1e-300, 1}, 5, []int{0, 5}},
		{[]float64{3}, 0, []int{0}},
	} {
		sum := 0.0
		for _, x := range tc.w {
			sum += x
		}
		if got := largestRemainder(tc.w, sum, tc.total); !slices.Equal(got, tc.want) {
			t.Errorf("largestRemainder(%v, %d) = %v, want %v", tc.w, tc.total, got, tc.want)
		}
	}
}

func TestDirichletDraw(t *testing.T) {
	rng := newRand(1, 1)
	buf := make([]float64, 5)
	for _, alpha := range []float64{1e-300, 0.001, 0.5, 1, 50, 1e300} {
		// The mean of each component is 1/5 whatever alpha.
		var mean [5]float64
		const draws = 4000
		for range draws {
			p := dirichlet(rng, alpha, buf)
			s := 0.0
			for i, v := range p {
				if !(v >= 0 && v <= 1) {
					t.Fatalf("alpha %v: component %v", alpha, v)
				}
				s += v
				mean[i] += v / draws
			}
			if math.Abs(s-1) > 1e-9 {
				t.Fatalf("alpha %v: sum %v", alpha, s)
			}
		}
		for i, m := range mean {
			if math.Abs(m-0.2) > 0.04 {
				t.Errorf("alpha %v: mean of component %d is %.3f, want 0.2", alpha, i, m)
			}
		}
	}
}

func TestPartitionDeterminism(t *testing.T) {
	ds := indexed(600, 2, 6, modLabels(6))
	parts := map[string]func(seed uint64) (*Federated, error){
		"iid": func(s uint64) (*Federated, error) { return PartitionIID(ds, 5, PartitionOptions{Seed: s}) },
		"dirichlet": func(s uint64) (*Federated, error) {
			return PartitionDirichlet(ds, 5, 0.3, PartitionOptions{Seed: s})
		},
		"classes": func(s uint64) (*Federated, error) { return PartitionClasses(ds, 12, 2, PartitionOptions{Seed: s}) },
	}
	for name, p := range parts {
		a, errA := p(8)
		b, errB := p(8)
		c, errC := p(9)
		if err := errors.Join(errA, errB, errC); err != nil {
			t.Fatal(err)
		}
		if fingerprint(a) != fingerprint(b) {
			t.Errorf("%s: same seed, different partitions", name)
		}
		if fingerprint(a) == fingerprint(c) {
			t.Errorf("%s: seeds 8 and 9 give the same partition", name)
		}
	}
}

func TestPartitionErrors(t *testing.T) {
	ds := indexed(20, 2, 10, modLabels(10))
	reg := indexed(20, 2, 0, func(int) int { return 0 })
	reg.Data.Y[3] = 2.5
	for _, tc := range []struct {
		name string
		run  func() (*Federated, error)
		want string
	}{
		{"iid more clients than samples", func() (*Federated, error) { return PartitionIID(ds, 21, PartitionOptions{}) }, "21 clients but data set indexed has only 20 samples"},
		{"iid zero clients", func() (*Federated, error) { return PartitionIID(ds, 0, PartitionOptions{}) }, "0 clients"},
		{"iid bad test fraction", func() (*Federated, error) { return PartitionIID(ds, 2, PartitionOptions{TestFraction: 1.5}) }, "test fraction 1.5"},
		{"iid nil", func() (*Federated, error) { return PartitionIID(nil, 2, PartitionOptions{}) }, "no data set"},
		{"dirichlet alpha 0", func() (*Federated, error) { return PartitionDirichlet(ds, 2, 0, PartitionOptions{}) }, "alpha must be a finite number > 0"},
		{"dirichlet alpha NaN", func() (*Federated, error) { return PartitionDirichlet(ds, 2, math.NaN(), PartitionOptions{}) }, "alpha must be"},
		{"dirichlet regression", func() (*Federated, error) { return PartitionDirichlet(reg, 2, 1, PartitionOptions{}) }, "regression target"},
		{"dirichlet impossible minimum", func() (*Federated, error) {
			return PartitionDirichlet(ds, 10, 0.001, PartitionOptions{MinSamples: 2})
		}, "after 1000 draws some client still had fewer than 2 samples"},
		{"dirichlet minimum too large", func() (*Federated, error) {
			return PartitionDirichlet(ds, 5, 1, PartitionOptions{MinSamples: 5})
		}, "minimum 5 samples per client × 5 clients"},
		{"classes k > classes", func() (*Federated, error) { return PartitionClasses(ds, 2, 11, PartitionOptions{}) }, "k must be in 1..10"},
		{"classes k = 0", func() (*Federated, error) { return PartitionClasses(ds, 2, 0, PartitionOptions{}) }, "k must be in 1..10"},
		{"classes regression", func() (*Federated, error) { return PartitionClasses(reg, 2, 1, PartitionOptions{}) }, "regression target"},
		{"classes empty client", func() (*Federated, error) {
			// Class 0 has one sample for its two holders, clients 0 and 10.
			rare := indexed(20, 2, 10, func(i int) int { return min(i, 1+i%9) })
			return PartitionClasses(rare, 20, 1, PartitionOptions{})
		}, "0 gets no samples: its classes [0]"},
		{"bad labels", func() (*Federated, error) {
			bad := indexed(20, 2, 3, modLabels(4))
			return PartitionIID(bad, 2, PartitionOptions{})
		}, "sample 3 has label 3, expected an integer in 0..2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := tc.run()
			if err == nil {
				t.Fatalf("got %d clients, want an error containing %q", len(f.Clients), tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
			checkOneLine(t, err)
		})
	}
}

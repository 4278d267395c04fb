package aggregate

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
)

func newCluster(t testing.TB, k int, seed uint64) *FedSimCluster {
	t.Helper()
	c := DefaultClusterConfig()
	c.K = k
	f, err := NewFedSimCluster(c, newRand(seed))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestClusterK1IsFedAvg: n_clusters = 1 is FedAvg bit for bit (seeds/002
// sec. 3.2.2), whatever the gradients and sample counts.
func TestClusterK1IsFedAvg(t *testing.T) {
	for _, m := range []int{1, 2, 7, 40} {
		for _, zero := range []bool{false, true} {
			rng := newRand(uint64(m))
			g := randVec(rng, 31, 0.1, 1)
			ups := randUpdates(rng, g, m, 1, 5)
			if zero {
				for k := range ups {
					ups[k].Samples = 0
				}
			}
			want, wr := aggregate(t, FedAvg{}, g, ups)
			got, gr := aggregate(t, newCluster(t, 1, 1), g, ups)
			if !slices.Equal(want, got) || !slices.Equal(wr.Weights, gr.Weights) {
				t.Fatalf("m = %d, zero samples %v: k = 1 differs from FedAvg by %g", m, zero, maxRelDiff(want, got))
			}
		}
	}
}

// groups returns m updates in three groups whose anchor gradients are far
// apart (plus small noise), with the group of each.
func groups(seed uint64, m, gl int) ([]float64, []Update, []int) {
	rng := newRand(seed)
	g := randVec(rng, 17, 0, 1)
	ups := randUpdates(rng, g, m, 1, gl)
	centres := [][]float64{randVec(rng, gl, 0, 10), randVec(rng, gl, 0, 10), randVec(rng, gl, 0, 10)}
	grp := make([]int, m)
	for k := range ups {
		grp[k] = rng.IntN(3)
		if k < 3 {
			grp[k] = k // every group non-empty
		}
		for i := range ups[k].AnchorGrad {
			ups[k].AnchorGrad[i] = centres[grp[k]][i] + 0.05*rng.NormFloat64()
		}
	}
	return g, ups, grp
}

// expected is eq. 13-14 computed directly from a known partition.
func expected(g []float64, ups []Update, grp []int) []float64 {
	var ids []int
	for _, c := range grp {
		if !slices.Contains(ids, c) {
			ids = append(ids, c)
		}
	}
	out := make([]float64, len(g))
	for _, c := range ids {
		var n float64
		for k, u := range ups {
			if grp[k] == c {
				n += float64(u.Samples)
			}
		}
		for k, u := range ups {
			if grp[k] == c {
				for i, v := range u.Params {
					out[i] += float64(u.Samples) / n * v / float64(len(ids))
				}
			}
		}
	}
	return out
}

// samePartition reports whether two labelings group the items identically.
func samePartition(a, b []int) bool {
	ab, ba := map[int]int{}, map[int]int{}
	for i := range a {
		if x, ok := ab[a[i]]; ok && x != b[i] {
			return false
		}
		if x, ok := ba[b[i]]; ok && x != a[i] {
			return false
		}
		ab[a[i]], ba[b[i]] = b[i], a[i]
	}
	return true
}

// TestClusterFindsGroups: well-separated gradient groups are recovered, on
// full gradients (Gram-side PCA when m <= L, covariance side when m > L) and
// on sketches, and the model is eq. 13-14 over the true groups.
func TestClusterFindsGroups(t *testing.T) {
	cases := []struct {
		name   string
		m, gl  int
		sketch int
	}{
		{"m <= L (Gram PCA)", 12, 200, 0},
		{"m > L (covariance PCA)", 30, 8, 0},
		{"sketched to 32", 20, 2000, 32},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 5; seed++ {
				g, ups, grp := groups(seed, c.m, c.gl)
				if c.sketch > 0 {
					for k := range ups {
						ups[k].AnchorGrad = Sketch(ups[k].AnchorGrad, c.sketch, 99)
					}
				}
				out, rep := aggregate(t, newCluster(t, 3, seed), g, ups)
				if !samePartition(rep.Clusters, grp) {
					t.Fatalf("seed %d: clusters %v, groups %v", seed, rep.Clusters, grp)
				}
				if e := maxRelDiff(out, expected(g, ups, grp)); e > 1e-14 {
					t.Fatalf("seed %d: model differs from eq. 13-14 by %g", seed, e)
				}
				if rep.Metrics["clusters"] != 3 || rep.Metrics["explained_variance"] < 0.95 || rep.Metrics["pca_components"] < 1 {
					t.Fatalf("seed %d: metrics %v", seed, rep.Metrics)
				}
			}
		})
	}
}

// TestClusterDegenerate: more clusters than clients or than distinct
// gradients, identical gradients, determinism from the seed.
func TestClusterDegenerate(t *testing.T) {
	rng := newRand(21)
	g := randVec(rng, 9, 0, 1)
	ups := randUpdates(rng, g, 6, 1, 4)

	// k >= m with distinct gradients: one client per cluster = the mean.
	out, rep := aggregate(t, newCluster(t, 10, 1), g, ups)
	want, _ := aggregate(t, Mean{}, g, ups)
	if e := maxRelDiff(out, want); e > 1e-15 || rep.Metrics["clusters"] != 6 {
		t.Fatalf("k >= m: differs from the mean by %g, %v clusters", e, rep.Metrics["clusters"])
	}

	// Identical gradients: one cluster whatever k = FedAvg.
	same := slices.Clone(ups)
	for k := range same {
		same[k].AnchorGrad = []float64{1, 2, 3, 4}
	}
	out, rep = aggregate(t, newCluster(t, 4, 1), g, same)
	want, _ = aggregate(t, FedAvg{}, g, same)
	if e := maxRelDiff(out, want); e > 1e-15 || rep.Metrics["clusters"] != 1 {
		t.Fatalf("identical gradients: %g from FedAvg, %v clusters", e, rep.Metrics["clusters"])
	}

	// Two distinct gradients (three copies each), k = 5: two clusters.
	for k := range same {
		same[k].AnchorGrad = []float64{float64(k % 2), 0.1, 1e6, -3}
	}
	_, rep = aggregate(t, newCluster(t, 5, 1), g, same)
	if rep.Metrics["clusters"] != 2 || !samePartition(rep.Clusters, []int{0, 1, 0, 1, 0, 1}) {
		t.Fatalf("duplicates: clusters %v", rep.Clusters)
	}

	// Same seed, same rounds: same result.
	a, b := newCluster(t, 3, 7), newCluster(t, 3, 7)
	for range 3 {
		oa, ra := aggregate(t, a, g, ups)
		ob, rb := aggregate(t, b, g, ups)
		if !slices.Equal(oa, ob) || !slices.Equal(ra.Clusters, rb.Clusters) {
			t.Fatal("same seed, different result")
		}
	}
}

// TestClusterErrors: missing, mismatched and non-finite gradients, negative
// sample counts, bad configs.
func TestClusterErrors(t *testing.T) {
	g := []float64{1, 2}
	cases := []struct {
		name string
		f    func([]Update)
		want error
	}{
		{"missing", func(u []Update) { u[1].AnchorGrad = nil }, ErrNoAnchorGrad},
		{"all missing", func(u []Update) {
			for k := range u {
				u[k].AnchorGrad = nil
			}
		}, ErrNoAnchorGrad},
		{"length mismatch", func(u []Update) { u[2].AnchorGrad = []float64{1} }, ErrDim},
		{"NaN", func(u []Update) { u[0].AnchorGrad[1] = math.NaN() }, ErrNonFinite},
		{"negative samples", func(u []Update) { u[0].Samples = -1 }, ErrSamples},
	}
	for _, c := range cases {
		for _, k := range []int{1, 3} {
			ups := constUpdates(3, g, []float64{1, 2})
			c.f(ups)
			_, err := newCluster(t, k, 1).Aggregate(g, ups, make([]float64, 2))
			if !errors.Is(err, c.want) {
				t.Errorf("%s, k = %d: err = %v, want %v", c.name, k, err, c.want)
			}
		}
	}
	for _, c := range []ClusterConfig{{K: 0, Variance: 0.9, MaxIter: 1}, {K: 2, Variance: 0, MaxIter: 1},
		{K: 2, Variance: 1.1, MaxIter: 1}, {K: 2, Variance: 0.9, MaxIter: 0}} {
		if _, err := NewFedSimCluster(c, newRand(1)); err == nil {
			t.Errorf("NewFedSimCluster(%+v) accepted", c)
		}
	}
	if _, err := NewFedSimCluster(DefaultClusterConfig(), nil); err == nil {
		t.Error("nil rand accepted")
	}
}

// TestPCAComponents: data spread along two directions plus tiny noise keep
// two components at 95 %; the scores preserve pairwise distances of the
// retained subspace.
func TestPCAComponents(t *testing.T) {
	for _, L := range []int{50, 3} { // Gram side and covariance side
		rng := newRand(31)
		m := 20
		u, v := randVec(rng, L, 0, 1), randVec(rng, L, 0, 1)
		rows := make([][]float64, m)
		for k := range rows {
			a, b := 10*rng.NormFloat64(), 5*rng.NormFloat64()
			rows[k] = make([]float64, L)
			for i := range rows[k] {
				rows[k][i] = a*u[i] + b*v[i] + 1e-3*rng.NormFloat64() + 100
			}
		}
		y, r, expl, err := pca(rows, 0.95)
		if err != nil {
			t.Fatal(err)
		}
		if L == 3 && r > 2 || L == 50 && r != 2 || expl < 0.95 {
			t.Fatalf("L = %d: %d components explaining %v", L, r, expl)
		}
		// Distances between scores are proportional to those of the data
		// (pca scales by a power of two), up to the 5 % of variance
		// dropped.
		ratio := 0.0
		for i := range 6 {
			for j := i + 1; j < 6; j++ {
				var dy, dx float64
				for c := range r {
					dy += sq(y[i*r+c] - y[j*r+c])
				}
				for c := range L {
					dx += sq(rows[i][c] - rows[j][c])
				}
				q := math.Sqrt(dy / dx)
				if ratio == 0 {
					ratio = q
				}
				if math.Abs(q/ratio-1) > 0.05 {
					t.Fatalf("L = %d: distance ratios %v vs %v", L, q, ratio)
				}
			}
		}
	}
}

// TestSketch: deterministic from the seed (golden values guard the
// projection against accidental change, since clients and server must
// agree), linear, and preserving norms and inner products in expectation.
func TestSketch(t *testing.T) {
	g := []float64{1, -2, 0.5, 0, 3, 1e-3, -7}
	golden := []float64{0.22315958415447887, -3.3536547526541844, 0.22315958415447887, 2.4601219888452683, -6.037830752844933}
	if s := Sketch(g, 5, 42); !slices.Equal(s, golden) {
		t.Fatalf("Sketch changed: %#v", s)
	}
	if s := Sketch(g, 70, 42)[64:]; !slices.Equal(s, []float64{-0.6574952579948499, -1.4941552845289257, -0.5379723970614105, -0.5379723970614105, -0.4184495361279712, -0.7770181189282893}) {
		t.Fatalf("Sketch changed past the first block: %#v", s)
	}
	if slices.Equal(Sketch(g, 5, 42), Sketch(g, 5, 43)) {
		t.Fatal("seed has no effect")
	}
	if Sketch(g, 0, 1) != nil || Sketch(g, -3, 1) != nil {
		t.Fatal("dim <= 0 must give nil")
	}
	if s := Sketch(nil, 4, 1); !slices.Equal(s, []float64{0, 0, 0, 0}) {
		t.Fatalf("empty gradient: %v", s)
	}

	rng := newRand(41)
	const d, k = 3000, 256
	a, b := randVec(rng, d, 0, 1), randVec(rng, d, 0, 1)
	ab := make([]float64, d)
	for i := range ab {
		ab[i] = a[i] + b[i]
	}
	sa, sb, sab := Sketch(a, k, 5), Sketch(b, k, 5), Sketch(ab, k, 5)
	for j := range sab {
		if !near(sab[j], sa[j]+sb[j], 1e-12) {
			t.Fatalf("not linear at %d: %v vs %v", j, sab[j], sa[j]+sb[j])
		}
	}
	// Norm ratio: relative standard deviation sqrt(2/k) ~ 0.09.
	var ratios []float64
	for seed := range uint64(20) {
		ratios = append(ratios, sumSq(Sketch(a, k, seed))/sumSq(a))
	}
	mean := sum(ratios) / float64(len(ratios))
	if math.Abs(mean-1) > 0.06 {
		t.Fatalf("mean squared-norm ratio %v over 20 seeds", mean)
	}
	for _, r := range ratios {
		if r < 0.6 || r > 1.4 {
			t.Fatalf("squared-norm ratio %v", r)
		}
	}
}

func sumSq(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x * x
	}
	return s
}

// TestPNI checks eq. 17-18 by hand, its invariances and its errors.
func TestPNI(t *testing.T) {
	cases := []struct {
		rmse []float64
		want float64
	}{
		{[]float64{0.3}, 0},
		{[]float64{1, 1, 1}, 0},
		{[]float64{0, 1}, 1},
		{[]float64{0, 3, 4}, (5 + math.Sqrt(10) + math.Sqrt(17)) / 3},
		{[]float64{4, 0, 3}, (5 + math.Sqrt(10) + math.Sqrt(17)) / 3},
		{[]float64{0, 3e300, 4e300}, (5 + math.Sqrt(10) + math.Sqrt(17)) / 3 * 1e300},
		{[]float64{0, 3e-310, 4e-310}, (5 + math.Sqrt(10) + math.Sqrt(17)) / 3 * 1e-310},
		{[]float64{math.MaxFloat64, 0}, math.MaxFloat64},
	}
	for _, c := range cases {
		got, err := PNI(c.rmse)
		if err != nil || !near(got, c.want, 1e-14) && math.Abs(got-c.want) > 1e-14*c.want {
			t.Errorf("PNI(%v) = %v, %v; want %v", c.rmse, got, err, c.want)
		}
	}
	for _, bad := range [][]float64{nil, {1, math.NaN()}, {math.Inf(1)}, {1, -0.5}} {
		if _, err := PNI(bad); err == nil {
			t.Errorf("PNI(%v) accepted", bad)
		}
	}
	// More heterogeneous errors, larger index.
	lo, _ := PNI([]float64{1, 1.1, 0.9, 1.05})
	hi, _ := PNI([]float64{1, 2, 0.3, 1.5})
	if !(hi > lo) {
		t.Errorf("PNI not increasing with spread: %v, %v", lo, hi)
	}
}

func TestRMSE(t *testing.T) {
	cases := []struct {
		pred, y []float64
		want    float64
		err     bool
	}{
		{[]float64{1, 2, 3}, []float64{1, 2, 3}, 0, false},
		{[]float64{0, 0}, []float64{3, 4}, math.Sqrt(12.5), false},
		{[]float64{1e300, -1e300}, []float64{-1e300, 1e300}, 2e300, false},
		{nil, nil, 0, true},
		{[]float64{1}, []float64{1, 2}, 0, true},
		{[]float64{math.NaN()}, []float64{1}, 0, true},
	}
	for _, c := range cases {
		got, err := RMSE(c.pred, c.y)
		if (err != nil) != c.err || !c.err && !near(got, c.want, 1e-15) {
			t.Errorf("RMSE(%v, %v) = %v, %v; want %v", c.pred, c.y, got, err, c.want)
		}
	}
}

func ExamplePNI() {
	// Each client's RMSE of the server's random model on its own data.
	pni, _ := PNI([]float64{0.9, 1.0, 1.4})
	fmt.Printf("%.4f\n", pni)
	// Output: 0.5208
}

// TestClusterOrderWithoutIDs: with empty or repeated client ids the
// canonical order falls back to gradients, sample counts and parameters, so
// the result still does not depend on the input order.
func TestClusterOrderWithoutIDs(t *testing.T) {
	g, ups, _ := groups(81, 12, 20)
	for k := range ups {
		ups[k].Client = ""
		if k%4 == 1 { // same gradient as the previous one: tie broken by samples
			ups[k].AnchorGrad = ups[k-1].AnchorGrad
		}
		if k%4 == 2 { // same gradient and samples: tie broken by params
			ups[k].AnchorGrad, ups[k].Samples = ups[k-1].AnchorGrad, ups[k-1].Samples
		}
	}
	out, rep := aggregate(t, newCluster(t, 3, 5), g, ups)
	for seed := range uint64(5) {
		perm := newRand(seed).Perm(len(ups))
		p := make([]Update, len(ups))
		for i, j := range perm {
			p[i] = ups[j]
		}
		pout, prep := aggregate(t, newCluster(t, 3, 5), g, p)
		if e := maxRelDiff(out, pout); e > 1e-14 {
			t.Fatalf("perm %d: output differs by %g", seed, e)
		}
		for i, j := range perm {
			if rep.Clusters[j] != prep.Clusters[i] {
				t.Fatalf("perm %d: clusters differ", seed)
			}
		}
	}
}

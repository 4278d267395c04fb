package aggregate

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
	"gonum.org/v1/gonum/mat"

	"github.com/edgefl/edgefl/learn/sketch"
)

// ClusterConfig are the clustered FedSim's parameters.
type ClusterConfig struct {
	// K is n_clusters (>= 1). The paper's tuned values are 3 to 11 (its
	// table 2); 5 is the default. K = 1 is FedAvg.
	K int
	// Variance is the fraction of the gradients' variance the PCA keeps,
	// in (0, 1] (the paper: 0.95).
	Variance float64
	// MaxIter bounds Lloyd's iterations after the k-means++ seeding.
	MaxIter int
}

// DefaultClusterConfig returns K = 5, Variance = 0.95, MaxIter = 100.
func DefaultClusterConfig() ClusterConfig {
	return ClusterConfig{K: 5, Variance: 0.95, MaxIter: 100}
}

// FedSimCluster is FedSim's similarity-guided aggregation (seeds/002,
// Algorithms 1-2, eq. 13-14): the round's clients are clustered on their
// gradients at the global model (Update.AnchorGrad, full or a Sketch of it),
// after PCA keeping Variance of the variance, by k-means++ with K clusters;
// each cluster's model is its sample-weighted mean, sum_{k in c} (n_k/n_c)
// w_k (eq. 13, n read as the cluster's total, which the text's "a function
// of a client's sample size given the cluster" and the K = 1 equivalence
// with FedAvg require); the new model is the uniform mean of the cluster
// models (eq. 14).
//
// Algorithm 2 line 6 clusters G' (the raw gradients) although line 5 has just
// reduced them to G; sec. 5.3 says the PCA coefficients "are selected for
// clustering", so the reduced G is clustered here.
//
// Determinism: updates are put in a canonical order (client id, then the
// gradient, the sample count and the parameters) before clustering, so the
// result does not depend on the order they arrive in; the k-means++ seeding
// draws from the *rand.Rand the aggregator was built with, one stream
// across rounds. PCA goes through the m×m Gram matrix when there are fewer
// clients than gradient coordinates, else through the covariance matrix.
// Fewer clusters than K are formed when there are fewer distinct gradients
// (k-means++ stops when every client coincides with a centre).
//
// Every update must carry an AnchorGrad of one common, non-zero length;
// otherwise Aggregate fails with ErrNoAnchorGrad (or ErrDim / ErrNonFinite).
// Report.Clusters gives each update's cluster; Report.Metrics: clusters,
// pca_components, explained_variance.
type FedSimCluster struct {
	cfg ClusterConfig
	rng *rand.Rand
}

// NewFedSimCluster validates cfg; rng seeds k-means++ (required).
func NewFedSimCluster(cfg ClusterConfig, rng *rand.Rand) (*FedSimCluster, error) {
	if cfg.K < 1 {
		return nil, fmt.Errorf("aggregate: fedsim-cluster: k = %d, want >= 1", cfg.K)
	}
	if !(cfg.Variance > 0 && cfg.Variance <= 1) {
		return nil, fmt.Errorf("aggregate: fedsim-cluster: var = %v, want it in (0, 1]", cfg.Variance)
	}
	if cfg.MaxIter < 1 {
		return nil, fmt.Errorf("aggregate: fedsim-cluster: iters = %d, want >= 1", cfg.MaxIter)
	}
	if rng == nil {
		return nil, fmt.Errorf("aggregate: fedsim-cluster: nil *rand.Rand")
	}
	return &FedSimCluster{cfg: cfg, rng: rng}, nil
}

func (f *FedSimCluster) Name() string {
	n := "fedsim-cluster:k=" + strconv.Itoa(f.cfg.K)
	if f.cfg.Variance != 0.95 {
		n += ":var=" + ftoa(f.cfg.Variance)
	}
	if f.cfg.MaxIter != 100 {
		n += ":iters=" + strconv.Itoa(f.cfg.MaxIter)
	}
	return n
}

func (f *FedSimCluster) Aggregate(global []float64, ups []Update, out []float64) (Report, error) {
	if err := check(global, ups, out); err != nil {
		return Report{}, err
	}
	L := len(ups[0].AnchorGrad)
	for k, u := range ups {
		if len(u.AnchorGrad) == 0 {
			return Report{}, fmt.Errorf("%w: update %d (%s) has none; fedsim-cluster clusters clients on Update.AnchorGrad (the gradient at the global model, or its Sketch)", ErrNoAnchorGrad, k, u.Client)
		}
		if len(u.AnchorGrad) != L {
			return Report{}, fmt.Errorf("%w: anchor gradient of update %d (%s) has %d, update 0 has %d", ErrDim, k, u.Client, len(u.AnchorGrad), L)
		}
		if !allFinite(u.AnchorGrad) {
			return Report{}, fmt.Errorf("%w in the anchor gradient of update %d (%s)", ErrNonFinite, k, u.Client)
		}
		if u.Samples < 0 {
			return Report{}, errNegSamples(u)
		}
	}
	m := len(ups)
	order := canonicalOrder(ups)
	labels := make([]int, m) // by canonical position
	metrics := map[string]float64{}
	if min(f.cfg.K, m) > 1 {
		grads := make([][]float64, m)
		for p, k := range order {
			grads[p] = ups[k].AnchorGrad
		}
		y, r, expl, err := pca(grads, f.cfg.Variance)
		if err != nil {
			return Report{}, err
		}
		metrics["pca_components"], metrics["explained_variance"] = float64(r), expl
		labels = kmeansPP(y, m, r, min(f.cfg.K, m), f.cfg.MaxIter, f.rng)
	}
	// Renumber clusters by first member in canonical order.
	id := map[int]int{}
	clusters := make([]int, m) // input order
	var size []int
	var ns []float64
	for p, k := range order {
		c, ok := id[labels[p]]
		if !ok {
			c = len(id)
			id[labels[p]] = c
			size, ns = append(size, 0), append(ns, 0)
		}
		clusters[k] = c
		size[c]++
		ns[c] += float64(ups[k].Samples)
	}
	nc := float64(len(size))
	w := make([]float64, m)
	for k, u := range ups {
		c := clusters[k]
		if ns[c] == 0 {
			w[k] = 1 / float64(size[c]) / nc
		} else {
			w[k] = float64(u.Samples) / ns[c] / nc
		}
	}
	weightedSum(ups, w, out)
	metrics["clusters"] = nc
	return Report{Weights: w, Metrics: metrics, Clusters: clusters}, nil
}

// canonicalOrder returns the update indices sorted by client id, then
// anchor gradient, sample count and parameters (lexicographically, as
// float64 bit patterns of the values), so that permuting the input does not
// change what the clustering sees.
func canonicalOrder(ups []Update) []int {
	o := seq(len(ups))
	cmpVec := func(a, b []float64) int {
		for i := range min(len(a), len(b)) {
			if c := cmp.Compare(a[i], b[i]); c != 0 {
				return c
			}
		}
		return cmp.Compare(len(a), len(b))
	}
	slices.SortStableFunc(o, func(i, j int) int {
		a, b := ups[i], ups[j]
		if c := cmp.Compare(a.Client, b.Client); c != 0 {
			return c
		}
		if c := cmpVec(a.AnchorGrad, b.AnchorGrad); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Samples, b.Samples); c != 0 {
			return c
		}
		return cmpVec(a.Params, b.Params)
	})
	return o
}

// pca projects the rows onto the principal axes that keep frac of their
// variance. It returns the m×r scores (row-major), r and the fraction
// explained. Identical rows give r = 0.
func pca(rows [][]float64, frac float64) ([]float64, int, float64, error) {
	m, L := len(rows), len(rows[0])
	// Translate by the first row (exact zeros for identical rows), scale by
	// a power of two, then centre on the column means.
	var mx float64
	for _, g := range rows {
		for i, v := range g {
			mx = max(mx, math.Abs(v*0.5-rows[0][i]*0.5))
		}
	}
	_, inv := pow2Scale(mx)
	z := make([]float64, m*L)
	mean := make([]float64, L)
	for k, g := range rows {
		row := z[k*L : (k+1)*L]
		for i, v := range g {
			row[i] = (v*0.5 - rows[0][i]*0.5) * inv
			mean[i] += row[i]
		}
	}
	for i := range mean {
		mean[i] /= float64(m)
	}
	for k := range m {
		row := z[k*L : (k+1)*L]
		for i := range row {
			row[i] -= mean[i]
		}
	}
	Z := blas64.General{Rows: m, Cols: L, Stride: L, Data: z}

	// Eigen-decompose the smaller of Z Z^T (m×m) and Z^T Z (L×L).
	gramSide := m <= L
	n := L
	t := blas.Trans
	if gramSide {
		n, t = m, blas.NoTrans
	}
	c := make([]float64, n*n)
	blas64.Syrk(t, 1, Z, 0, blas64.Symmetric{Uplo: blas.Upper, N: n, Stride: n, Data: c})
	for i := range n {
		for j := range i {
			c[i*n+j] = c[j*n+i]
		}
	}
	var total float64
	for i := range n {
		total += c[i*n+i]
	}
	if !(total > 0) {
		return nil, 0, 1, nil
	}
	var es mat.EigenSym
	if !es.Factorize(mat.NewSymDense(n, c), true) {
		return nil, 0, 0, fmt.Errorf("aggregate: fedsim-cluster: PCA eigendecomposition did not converge")
	}
	vals := es.Values(nil) // ascending
	var vecs mat.Dense
	es.VectorsTo(&vecs)
	var tot float64
	for _, v := range vals {
		tot += max(v, 0)
	}
	r := 0
	var cum float64
	for i := n - 1; i >= 0 && vals[i] > 0; i-- {
		cum += vals[i]
		r++
		if cum >= frac*tot*(1-1e-12) {
			break
		}
	}
	y := make([]float64, m*r)
	for c := range r {
		col := n - 1 - c
		lam := vals[col]
		if gramSide {
			// Scores of the Gram route: U sqrt(Lambda).
			s := math.Sqrt(lam)
			for k := range m {
				y[k*r+c] = vecs.At(k, col) * s
			}
		} else {
			// Scores Z V.
			for k := range m {
				var v float64
				for i := range L {
					v += z[k*L+i] * vecs.At(i, col)
				}
				y[k*r+c] = v
			}
		}
	}
	return y, r, cum / tot, nil
}

// kmeansPP clusters the m points (rows of y, r columns) into at most k
// clusters: k-means++ seeding from rng, then Lloyd's iterations until the
// assignment is stable or maxIter. Ties go to the lowest centre index.
func kmeansPP(y []float64, m, r, k, maxIter int, rng *rand.Rand) []int {
	labels := make([]int, m)
	if r == 0 || k <= 1 {
		return labels
	}
	d2 := func(a []float64, b []float64) float64 {
		var s float64
		for i := range a {
			s += sq(a[i] - b[i])
		}
		return s
	}
	pt := func(i int) []float64 { return y[i*r : (i+1)*r] }
	var spread float64 // sum of squared norms of the (centred) scores
	for i := range m {
		spread += d2(pt(i), make([]float64, r))
	}
	centres := [][]float64{append([]float64(nil), pt(rng.IntN(m))...)}
	dist := make([]float64, m)
	for i := range m {
		dist[i] = d2(pt(i), centres[0])
	}
	for len(centres) < k {
		var tot float64
		for _, v := range dist {
			tot += v
		}
		// Every point (numerically) on a centre: no further cluster.
		if !(tot > 1e-24*spread) {
			break
		}
		pick := walkWeights(dist, rng.Float64()*tot)
		c := append([]float64(nil), pt(pick)...)
		centres = append(centres, c)
		for i := range m {
			dist[i] = min(dist[i], d2(pt(i), c))
		}
	}
	for i := range labels {
		labels[i] = -1
	}
	for range maxIter {
		changed := false
		for i := range m {
			best, bd := 0, math.Inf(1)
			for c, ctr := range centres {
				if v := d2(pt(i), ctr); v < bd {
					best, bd = c, v
				}
			}
			if labels[i] != best {
				labels[i], changed = best, true
			}
		}
		if !changed {
			break
		}
		for c, ctr := range centres {
			cnt := 0
			sum := make([]float64, r)
			for i := range m {
				if labels[i] == c {
					cnt++
					for j, v := range pt(i) {
						sum[j] += v
					}
				}
			}
			if cnt == 0 {
				continue // keep an emptied centre where it was
			}
			for j := range ctr {
				ctr[j] = sum[j] / float64(cnt)
			}
		}
	}
	return labels
}

// Sketch is sketch.Of: the seeded random projection clients send as
// Update.AnchorGrad for FedSimCluster.
func Sketch(grad []float64, dim int, seed uint64) []float64 { return sketch.Of(grad, dim, seed) }

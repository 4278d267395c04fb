package aggregate

import (
	"fmt"
	"math"
	"strconv"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
)

// SimProxConfig are SimProx's parameters (seeds/000, sec. III).
type SimProxConfig struct {
	// Lambda0 is the base weight of cosine against Gaussian similarity, in
	// [0, 1] (the paper's tuned value is 0.7).
	Lambda0 float64
	// Tau is the heterogeneity threshold on the mean client-to-global cosine
	// s_bar, > 0 (the paper gives no value; 0.5 by default).
	Tau float64
	// On selects whether cosines compare models or updates (distances, hence
	// sigma and the Gaussian term, are the same either way).
	On Space
	// ProxToGlobal takes g_i = ||w_i - global||, the distance the client
	// moved this round, instead of the distance to the model the client
	// submitted the previous time it took part (the default).
	ProxToGlobal bool
	// NoSoftmax stops after eq. 13's normalisation, skipping the softmax the
	// paper applies last (see SimProx).
	NoSoftmax bool
}

// DefaultSimProxConfig returns lambda0 = 0.7, tau = 0.5, on weights, g_i
// against the client's previous model, softmax on.
func DefaultSimProxConfig() SimProxConfig {
	return SimProxConfig{Lambda0: 0.7, Tau: 0.5}
}

// SimProx is the similarity-proximal aggregator of seeds/000 sec. III.
// For the m updates w_i and the global model w:
//
//	sigma   = mean_{i<j} ||w_i - w_j||                                  (7)
//	S^G_ij  = exp(-||w_i - w_j||^2 / (2 sigma^2))                       (8)
//	S^C_ij  = cos(w_i, w_j)                                             (9)
//	s_bar   = mean_i cos(w_i, w);  lambda = lambda0 s_bar/tau if s_bar < tau, else lambda0
//	S_ij    = lambda S^C_ij + (1 - lambda) S^G_ij                       (10)
//	g_i     = ||w_i - w_i^prev||                                        (11)
//	alpha_i = exp(-g_i) (1 + sum_{j != i} S_ij / (m - 1))               (12)
//	alpha  <- alpha / sum alpha                                         (13)
//	alpha  <- softmax(alpha)                                            (Alg. 1, line 5)
//	w_new   = sum_i alpha_i w_i
//
// Every pairwise quantity comes from one Gram matrix: the rows w_i - w
// (and, on weights, the row w) are scaled by a power of two and multiplied by
// BLAS Syrk. Distances come from the rows centred on w, which keeps them
// accurate when the models are far from the origin but close to each other;
// cosines between models are recovered exactly from the same matrix through
// <w_i, w_j> = <x_i, x_j> + <x_i, w> + <x_j, w> + <w, w>. Eq. 12-13 are
// computed in the log domain (log alpha_i = -g_i + log(1 + ...), normalised
// by log-sum-exp), so g_i large enough for exp(-g_i) to underflow cannot give
// 0/0.
//
// Decisions where the paper is silent or loose:
//   - lambda is clamped into [0, lambda0]: the paper declares lambda in [0, 1],
//     and a negative s_bar would otherwise make it negative.
//   - A cosine involving a zero vector is 0 (so a zero global model gives
//     s_bar = 0, lambda = 0: pure Gaussian similarity).
//   - sigma = 0 (all models identical) gives S^G = 1.
//   - m = 1 gives the single model weight 1.
//   - w_i^prev is the model client i submitted the last time it took part,
//     kept by client id. A client seen for the first time uses the global
//     model it was sent: in Algorithm 1 (line 13) each round ends by setting
//     every client model to the new global model, so the global model is
//     the client's model at the start of its round and g_i is then "how much
//     the client model has changed during the current round" (sec. III.B).
//     ProxToGlobal uses that for every client.
//   - The paper normalises (eq. 13) and then applies a softmax (Algorithm 1,
//     line 5, and "Then a softmax function is applied to the weights to
//     provide more evenly weight distribution"). That is what is done by
//     default. Note its effect: the normalised alpha lie in [0, 1], so after
//     the softmax no weight exceeds e times another: with many clients the
//     result is close to the uniform mean. NoSoftmax keeps eq. 13's weights.
//
// Report.Metrics: sigma (in the units of the parameters, saturating at the
// largest float64), s_bar, lambda,
// g_min, g_max, max_weight, min_weight, weight_entropy. The aggregator keeps
// one vector per client ever seen (its previous model) and scratch space for
// the Gram matrix; it is not safe for concurrent use.
type SimProx struct {
	cfg  SimProxConfig
	prev map[string][]float64
	rows []float64 // scratch: the scaled rows handed to Syrk
	gram []float64 // scratch: their Gram matrix
}

// NewSimProx validates cfg and returns a SimProx with no client history.
func NewSimProx(cfg SimProxConfig) (*SimProx, error) {
	if !(cfg.Lambda0 >= 0 && cfg.Lambda0 <= 1) {
		return nil, fmt.Errorf("aggregate: simprox: lambda0 = %v, want it in [0, 1]", cfg.Lambda0)
	}
	if !(cfg.Tau > 0) || math.IsInf(cfg.Tau, 0) {
		return nil, fmt.Errorf("aggregate: simprox: tau = %v, want a finite value > 0", cfg.Tau)
	}
	if cfg.On != OnWeights && cfg.On != OnUpdates {
		return nil, fmt.Errorf("aggregate: simprox: unknown similarity space %v", cfg.On)
	}
	return &SimProx{cfg: cfg, prev: map[string][]float64{}}, nil
}

// Config returns the aggregator's parameters.
func (s *SimProx) Config() SimProxConfig { return s.cfg }

// Reset forgets every client's previous model.
func (s *SimProx) Reset() { clear(s.prev) }

// Stateful: SimProx remembers each client's previous model.
func (s *SimProx) Stateful() bool { return true }

func (s *SimProx) Name() string {
	c := s.cfg
	n := "simprox:lambda0=" + ftoa(c.Lambda0) + ":tau=" + ftoa(c.Tau) + ":on=" + c.On.String()
	if c.ProxToGlobal {
		n += ":prev=global"
	}
	if c.NoSoftmax {
		n += ":softmax=false"
	}
	return n
}

func ftoa(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// simproxTerms are the intermediate quantities of one SimProx round (kept
// together so the tests can compare them with a direct computation).
type simproxTerms struct {
	sigma   float64   // mean pairwise distance, parameter units
	sbar    float64   // mean cosine to the global model (or mean update)
	lambda  float64   // the dynamic lambda
	cos     []float64 // m×m S^C (diagonal 1 unless the vector is zero)
	gauss   []float64 // m×m S^G
	g       []float64 // proximal terms g_i
	logA    []float64 // log alpha_i of eq. 12
	norm    []float64 // alpha after eq. 13
	weights []float64 // final weights
}

func (s *SimProx) Aggregate(global []float64, ups []Update, out []float64) (Report, error) {
	if err := check(global, ups, out); err != nil {
		return Report{}, err
	}
	t := s.terms(global, ups)
	weightedSum(ups, t.weights, out)
	m := map[string]float64{"sigma": t.sigma, "s_bar": t.sbar, "lambda": t.lambda,
		"g_min": math.Inf(1), "g_max": 0}
	for _, g := range t.g {
		m["g_min"], m["g_max"] = min(m["g_min"], g), max(m["g_max"], g)
	}
	m["g_min"] = min(m["g_min"], math.MaxFloat64)
	m["g_max"] = min(m["g_max"], math.MaxFloat64)
	weightStats(m, t.weights)
	for _, u := range ups {
		p := s.prev[u.Client]
		if len(p) != len(u.Params) {
			p = make([]float64, len(u.Params))
		}
		copy(p, u.Params)
		s.prev[u.Client] = p
	}
	return Report{Weights: t.weights, Metrics: m}, nil
}

// terms computes one round's quantities; it reads but does not change the
// client history.
func (s *SimProx) terms(global []float64, ups []Update) simproxTerms {
	m, d := len(ups), len(global)
	t := simproxTerms{g: make([]float64, m), cos: make([]float64, m*m), gauss: make([]float64, m*m)}
	weights := s.cfg.On == OnWeights
	G, sc := s.gramMatrix(global, ups, weights)
	s.proximal(G, sc, ups, d, t.g)
	if m == 1 {
		t.cos[0], t.gauss[0] = 1, 1
		t.logA = []float64{-t.g[0]}
		t.norm, t.weights = []float64{1}, []float64{1}
		return t
	}
	t.sigma = gaussianSimilarity(G, m, sc, t.gauss)
	var sref []float64
	if weights {
		sref = cosinesOfModels(G, m, d, t.cos)
	} else {
		sref = cosinesOfUpdates(G, m, d, t.cos)
	}
	for _, v := range sref {
		t.sbar += v
	}
	t.sbar /= float64(m)
	t.lambda = dynamicLambda(s.cfg.Lambda0, s.cfg.Tau, t.sbar)
	t.logA = logAlpha(t.lambda, t.cos, t.gauss, t.g)
	t.norm = normaliseLog(t.logA)
	if s.cfg.NoSoftmax {
		t.weights = append([]float64(nil), t.norm...)
		return t
	}
	t.weights = softmax(t.norm)
	return t
}

// gram is an n×n symmetric Gram matrix stored in full, row-major.
type gram struct {
	v []float64
	n int
}

func (g gram) at(i, j int) float64 { return g.v[i*g.n+j] }

// gramMatrix forms the rows x_i = (w_i - w)/sc for i < m and, on weights,
// x_m = w/sc (sc a power of two, so the scaling is exact), and returns their
// Gram matrix (in s's scratch space) with sc.
func (s *SimProx) gramMatrix(global []float64, ups []Update, weights bool) (gram, float64) {
	m, d := len(ups), len(global)
	n := m
	if weights {
		n = m + 1
	}
	sc, inv := pow2Scale(maxAbs(global, ups))
	s.rows = grow(s.rows, n*d)
	for i, u := range ups {
		row := s.rows[i*d : (i+1)*d]
		for j, v := range u.Params {
			row[j] = v*inv - global[j]*inv
		}
	}
	if weights {
		row := s.rows[m*d : (m+1)*d]
		for j, v := range global {
			row[j] = v * inv
		}
	}
	s.gram = grow(s.gram, n*n)
	G := s.gram[:n*n]
	if d == 0 {
		clear(G)
	} else {
		blas64.Syrk(blas.NoTrans, 1,
			blas64.General{Rows: n, Cols: d, Stride: d, Data: s.rows[:n*d]}, 0,
			blas64.Symmetric{Uplo: blas.Upper, N: n, Stride: n, Data: G})
		for i := range n {
			for j := range i {
				G[i*n+j] = G[j*n+i]
			}
		}
	}
	return gram{v: G, n: n}, sc
}

// proximal sets g[i] to eq. 11's g_i: the distance from the client's
// previous model, or from the global model (ProxToGlobal, a client seen for
// the first time, or one whose previous model has another length).
func (s *SimProx) proximal(G gram, sc float64, ups []Update, d int, g []float64) {
	for i, u := range ups {
		p, seen := s.prev[u.Client]
		if s.cfg.ProxToGlobal || !seen || len(p) != d {
			g[i] = math.Sqrt(G.at(i, i)) * sc // ||w_i - w||
		} else {
			g[i] = dist(u.Params, p)
		}
	}
}

// gaussianSimilarity fills the m×m gauss with eq. 8's S^G and returns eq.
// 7's sigma in parameter units (saturating, never +Inf). Distances are
// translation-invariant, so they come from the centred rows; m >= 2.
func gaussianSimilarity(G gram, m int, sc float64, gauss []float64) float64 {
	dd := make([]float64, m*m)
	var sum float64
	for i := range m {
		for j := i + 1; j < m; j++ {
			v := math.Sqrt(max(G.at(i, i)+G.at(j, j)-2*G.at(i, j), 0))
			dd[i*m+j], dd[j*m+i] = v, v
			sum += v
		}
	}
	sigma := sum / (float64(m) * float64(m-1) / 2)
	for i := range m {
		for j := range m {
			g := 1.0
			if sigma > 0 {
				r := dd[i*m+j] / sigma
				g = math.Exp(-0.5 * r * r)
			}
			gauss[i*m+j] = g
		}
	}
	return min(sigma*sc, math.MaxFloat64) // a metric: saturates, never +Inf
}

// cosinesOfModels fills the m×m cos with eq. 9's cosines between the models
// w_i, recovered from the Gram matrix of the centred rows and the row w,
// and returns each model's cosine to the global model.
func cosinesOfModels(G gram, m, d int, cos []float64) []float64 {
	sref := make([]float64, m)
	// ||w_i||^2 = <x_i,x_i> + 2<x_i,w> + <w,w>, accurate to
	// (d+4) eps (||x_i|| + ||w||)^2: below that the model is zero
	// for all the arithmetic can tell.
	wn2 := G.at(m, m)
	un := make([]float64, m)
	for i := range m {
		u2 := G.at(i, i) + 2*G.at(i, m) + wn2
		tol := float64(d+4) * eps * sq(math.Sqrt(G.at(i, i))+math.Sqrt(wn2))
		if u2 > tol {
			un[i] = math.Sqrt(u2)
		}
	}
	for i := range m {
		for j := i; j < m; j++ {
			var c float64
			if un[i] > 0 && un[j] > 0 {
				c = clamp1((G.at(i, j) + G.at(i, m) + G.at(j, m) + wn2) / un[i] / un[j])
			}
			cos[i*m+j], cos[j*m+i] = c, c
		}
		if un[i] > 0 && wn2 > 0 {
			sref[i] = clamp1((G.at(i, m) + wn2) / un[i] / math.Sqrt(wn2))
		}
	}
	return sref
}

// cosinesOfUpdates fills the m×m cos with eq. 9's cosines between the
// updates x_i and returns each update's cosine to the mean update.
func cosinesOfUpdates(G gram, m, d int, cos []float64) []float64 {
	sref := make([]float64, m)
	xn := make([]float64, m)
	rs := make([]float64, m) // <x_i, sum_j x_j>
	var q, nsum float64      // ||sum_j x_j||^2, sum_i ||x_i||
	for i := range m {
		xn[i] = math.Sqrt(G.at(i, i))
		nsum += xn[i]
		for j := range m {
			rs[i] += G.at(i, j)
		}
		q += rs[i]
	}
	for i := range m {
		for j := i; j < m; j++ {
			var c float64
			if xn[i] > 0 && xn[j] > 0 {
				c = clamp1(G.at(i, j) / xn[i] / xn[j])
			}
			cos[i*m+j], cos[j*m+i] = c, c
		}
	}
	// The mean update: zero within rounding when q is below the
	// error of summing the Gram matrix.
	if q > float64(d+2*m+4)*eps*nsum*nsum {
		for i := range m {
			if xn[i] > 0 {
				sref[i] = clamp1(rs[i] / xn[i] / math.Sqrt(q))
			}
		}
	}
	return sref
}

// logAlpha is eq. 10 and 12 in the log domain: log alpha_i = -g_i +
// log(1 + sum_{j != i} S_ij / (m - 1)), m >= 2.
func logAlpha(lambda float64, cos, gauss, g []float64) []float64 {
	m := len(g)
	logA := make([]float64, m)
	for i := range m {
		var row float64
		for j := range m {
			if j != i {
				row += lambda*cos[i*m+j] + (1-lambda)*gauss[i*m+j]
			}
		}
		c := max(1+row/float64(m-1), 0) // >= 1 - lambda >= 0 up to rounding
		logA[i] = -g[i] + math.Log(c)
	}
	return logA
}

// normaliseLog is eq. 13 from the logarithms by log-sum-exp: alpha_i / sum
// alpha, or the uniform weights when every alpha is 0.
func normaliseLog(logA []float64) []float64 {
	mx := math.Inf(-1)
	for _, la := range logA {
		mx = max(mx, la)
	}
	if math.IsInf(mx, -1) {
		return uniform(len(logA)) // every alpha is 0: no preference
	}
	return expShiftNormalised(logA, mx)
}

// softmax is Algorithm 1's line 5: exp(a_i) / sum_j exp(a_j).
func softmax(a []float64) []float64 {
	mx := math.Inf(-1)
	for _, v := range a {
		mx = max(mx, v)
	}
	return expShiftNormalised(a, mx)
}

// expShiftNormalised returns exp(v_i - mx) / sum_j exp(v_j - mx).
func expShiftNormalised(v []float64, mx float64) []float64 {
	out := make([]float64, len(v))
	var z float64
	for i, x := range v {
		out[i] = math.Exp(x - mx)
		z += out[i]
	}
	for i := range out {
		out[i] /= z
	}
	return out
}

// dynamicLambda is sec. III.A.3's rule, lambda0 s_bar/tau below the
// threshold and lambda0 above it, clamped into [0, lambda0].
func dynamicLambda(lambda0, tau, sbar float64) float64 {
	if sbar >= tau {
		return lambda0
	}
	return min(max(lambda0*sbar/tau, 0), lambda0)
}

func sq(v float64) float64 { return v * v }

// grow returns a slice of length n, reusing buf's storage when it is large
// enough.
func grow(buf []float64, n int) []float64 {
	if cap(buf) < n {
		return make([]float64, n)
	}
	return buf[:n]
}

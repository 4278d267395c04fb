package model

import (
	"fmt"
	"math"
	"math/rand/v2"

	"gonum.org/v1/gonum/blas"
)

// Contrastive local objectives over the MLP's representation layer: the
// hidden layer's activations z = act(x W1 + b1) of a sample x.
//
// MOON (Li, He & Song 2021, model-contrastive learning) adds to the
// cross-entropy, per sample and averaged over the batch,
//
//	mu * -log( exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )
//
// with sim the cosine similarity, z_glob the global model's representation
// and z_prev the previous round's local model's (both fixed during the
// solve).
//
// FedSiam-DA (Yang et al., seed 004, Algorithm 1 line 21 and eq. 7, 10)
// adds mu * (L_hist + L_stop), where with D(a, b) = cos(a, b),
//
//	L_hist = D(stopgrad(z_prev), z)                 (pushes z from the previous local model's)
//	L_stop = 1/2 * -D(p_glob, stopgrad(z)) + 1/2 * -D(p, stopgrad(z_glob))
//
// and p = h(z) is the prediction head's output (SimSiam's predictor), p_glob
// the global model's head on the global model's representation. The global
// branch is frozen here, as MOON's is: the paper's alternating update of a
// copy of the global model (its eq. 8) is not made, so the first term of
// L_stop contributes to the loss's value and nothing to its gradient (the
// stop-gradient leaves it no path to the local parameters). The head is a
// two-layer bottleneck, p = relu(z A + a) B + b, of width Spec.Head: SimSiam's
// shape without its batch normalisation (which would make a sample's loss
// depend on its batch).
//
// A cosine similarity with a zero vector (a dead ReLU layer) is taken as 0
// with zero gradient.

// Contrastive objective kinds (ContrastConfig.Kind).
const (
	ContrastMOON    = "moon"
	ContrastFedSiam = "fedsiam"
)

// ContrastConfig selects a contrastive local objective.
type ContrastConfig struct {
	Kind string  // ContrastMOON or ContrastFedSiam
	Mu   float64 // weight of the contrastive term, finite and >= 0
	Tau  float64 // MOON's temperature, finite and > 0 (unused by FedSiam)
}

// Validate reports a parameter out of range.
func (c ContrastConfig) Validate() error {
	switch c.Kind {
	case ContrastMOON:
		if !(c.Tau > 0) || math.IsInf(c.Tau, 0) {
			return fmt.Errorf("%w: moon: tau must be a finite number > 0, got %v", ErrSpec, c.Tau)
		}
	case ContrastFedSiam:
	default:
		return fmt.Errorf("%w: unknown contrastive objective %q (want %s or %s)", ErrSpec, c.Kind, ContrastMOON, ContrastFedSiam)
	}
	if !(c.Mu >= 0) || math.IsInf(c.Mu, 0) {
		return fmt.Errorf("%w: %s: mu must be a finite number >= 0, got %v", ErrSpec, c.Kind, c.Mu)
	}
	return nil
}

// HeadWidth is the prediction head's bottleneck width FedSiam-DA's MLP uses
// for a hidden layer of h units: h/4 rounded up (SimSiam's 2048-512-2048
// ratio).
func HeadWidth(hidden int) int { return max(1, (hidden+3)/4) }

// ContrastSpec is the model spec a run of the contrastive objective kind
// trains: s with FedSiam's prediction head added (HeadWidth), s itself for
// MOON and for any other kind. One rule for the aggregator, the site and
// simulate: the head's parameters are part of the model vector.
func ContrastSpec(kind string, s Spec) Spec {
	if kind == ContrastFedSiam && s.Kind == KindMLP && s.Head == 0 {
		s.Head = HeadWidth(s.Hidden)
	}
	return s
}

// Contrastive is the MLP's loss plus a contrastive term against fixed global
// and previous local models. It is a Model: the local solver minimises it as
// it does any model's loss; Predict and Score are the MLP's.
type Contrastive struct {
	mlp, aux     *MLP // the local model's passes; the fixed models' passes
	cfg          ContrastConfig
	global, prev []float64

	// stopAt, when set (tests), is where the stop-gradient branch
	// stopgrad(z) is evaluated instead of at w: the loss is then a function
	// whose plain derivative at w = stopAt is the stop-gradient one, which
	// finite differences can check.
	stopAt []float64

	z, zg, zp, dz []float64 // n×h representations and the gradient wrt z
	zs            []float64 // stopgrad(z)'s value when stopAt is set
	u, p, ug, pg  []float64 // head: n×q hidden, n×h output (local, global)
	dp, du        []float64
}

// NewContrastive returns the objective cfg over m (an MLP; FedSiam needs its
// head) against global and prev, which it keeps (not copied: they must not
// change while it is used). prev is the previous round's local model; a site
// without one passes the global model.
func NewContrastive(m Model, cfg ContrastConfig, global, prev []float64) (*Contrastive, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	mlp, ok := m.(*MLP)
	if !ok {
		return nil, fmt.Errorf("%w: %s needs a representation layer: model %s has none (use mlp)", ErrSpec, cfg.Kind, m.Spec().Kind)
	}
	if cfg.Kind == ContrastFedSiam && mlp.q == 0 {
		return nil, fmt.Errorf("%w: fedsiam needs the MLP's prediction head (Spec.Head > 0)", ErrSpec)
	}
	if len(global) != mlp.NumParams() || len(prev) != mlp.NumParams() {
		return nil, fmt.Errorf("%w: %s: global and previous models have %d and %d parameters, the model %d", ErrSpec, cfg.Kind, len(global), len(prev), mlp.NumParams())
	}
	return &Contrastive{mlp: mlp.Clone().(*MLP), aux: mlp.Clone().(*MLP), cfg: cfg, global: global, prev: prev}, nil
}

func (c *Contrastive) Spec() Spec                          { return c.mlp.Spec() }
func (c *Contrastive) NumParams() int                      { return c.mlp.NumParams() }
func (c *Contrastive) InitParams(rng *rand.Rand) []float64 { return c.mlp.InitParams(rng) }
func (c *Contrastive) Predict(w []float64, d Data, out []float64) {
	c.mlp.Predict(w, d, out)
}
func (c *Contrastive) Score(w []float64, d Data) float64 { return c.mlp.Score(w, d) }
func (c *Contrastive) Layout() string                    { return c.mlp.Layout() }
func (c *Contrastive) Clone() Model {
	return &Contrastive{mlp: c.mlp.Clone().(*MLP), aux: c.aux.Clone().(*MLP), cfg: c.cfg, global: c.global, prev: c.prev}
}

// represent writes the hidden activations of the model w on d into dst.
func (c *Contrastive) represent(w []float64, d Data, dst []float64) []float64 {
	c.aux.forward(w, d)
	dst = grow(dst, d.N*c.aux.h)
	copy(dst, c.aux.a)
	return dst
}

// LossGrad returns the MLP's loss (with its L2 term) plus mu times the mean
// contrastive term over d, and its gradient when grad is non-nil.
func (c *Contrastive) LossGrad(w []float64, d Data, grad []float64) float64 {
	ce := c.mlp.LossGrad(w, d, grad)
	n, h := d.N, c.mlp.h
	if n == 0 || c.cfg.Mu == 0 {
		return ce
	}
	c.z = grow(c.z, n*h)
	copy(c.z, c.mlp.a) // the local representation, from LossGrad's forward pass
	c.zg = c.represent(c.global, d, c.zg)
	c.zp = c.represent(c.prev, d, c.zp)
	c.dz = grow(c.dz, n*h)
	clear(c.dz)
	scale := c.cfg.Mu / float64(n)
	var term float64
	if c.cfg.Kind == ContrastMOON {
		term = c.moon(scale)
	} else {
		term = c.fedsiam(w, grad, d, scale)
	}
	if grad != nil {
		c.backRepresentation(w, d, grad)
	}
	return ce + c.cfg.Mu*term/float64(n)
}

// moon returns the summed MOON term and sets dz to scale times its gradient
// with respect to z.
func (c *Contrastive) moon(scale float64) float64 {
	h, tau := c.mlp.h, c.cfg.Tau
	var sum float64
	for i := 0; i*h < len(c.z); i++ {
		z, zg, zp, dz := c.z[i*h:(i+1)*h], c.zg[i*h:(i+1)*h], c.zp[i*h:(i+1)*h], c.dz[i*h:(i+1)*h]
		sg, sp := cosine(z, zg), cosine(z, zp)
		// -log(e^{sg/tau} / (e^{sg/tau} + e^{sp/tau})) = softplus((sp - sg)/tau)
		t := (sp - sg) / tau
		sum += softplus(t)
		s := scale / (tau * (1 + math.Exp(-t))) // scale * sigmoid(t) / tau
		addCosineGrad(dz, s, z, zp, sp)
		addCosineGrad(dz, -s, z, zg, sg)
	}
	return sum
}

// fedsiam returns the summed FedSiam-DA term; with grad, it adds the head's
// gradient to grad and sets dz to scale times the term's gradient with
// respect to z.
func (c *Contrastive) fedsiam(w, grad []float64, d Data, scale float64) float64 {
	h, q := c.mlp.h, c.mlp.q
	c.u, c.p = c.mlp.head(w, c.z, c.u, c.p)
	c.ug, c.pg = c.mlp.head(c.global, c.zg, c.ug, c.pg)
	n := len(c.z) / h
	c.dp = grow(c.dp, n*h)
	zs := c.z
	if c.stopAt != nil {
		c.zs = c.represent(c.stopAt, d, c.zs)
		zs = c.zs
	}
	var sum float64
	for i := range n {
		r := func(v []float64) []float64 { return v[i*h : (i+1)*h] }
		z, zg, zp, p, pg := r(c.z), r(c.zg), r(c.zp), r(c.p), r(c.pg)
		hist := cosine(zp, z)
		stop1 := cosine(pg, r(zs)) // stopgrad(z): no gradient
		stop2 := cosine(p, zg)     // stopgrad(z_glob): gradient through p
		sum += hist - 0.5*stop1 - 0.5*stop2
		addCosineGrad(r(c.dz), scale, z, zp, hist)
		dp := r(c.dp)
		clear(dp)
		addCosineGrad(dp, -0.5*scale, p, zg, stop2)
	}
	if grad == nil {
		return sum
	}
	// Back through p = relu(z A + a) B + b.
	hA, ha, hB, hb := c.mlp.headOffsets()
	A, B := w[hA:ha], w[hB:hb]
	gemm(blas.Trans, blas.NoTrans, 1, general(n, q, c.u), general(n, h, c.dp), 1, general(q, h, grad[hB:hb]))
	addColSums(grad[hb:hb+h], c.dp)
	c.du = grow(c.du, n*q)
	gemm(blas.NoTrans, blas.Trans, 1, general(n, h, c.dp), general(q, h, B), 0, general(n, q, c.du))
	for i, v := range c.u {
		if v <= 0 {
			c.du[i] = 0
		}
	}
	gemm(blas.Trans, blas.NoTrans, 1, general(n, h, c.z), general(n, q, c.du), 1, general(h, q, grad[hA:ha]))
	addColSums(grad[ha:hB], c.du)
	gemm(blas.NoTrans, blas.Trans, 1, general(n, q, c.du), general(h, q, A), 1, general(n, h, c.dz))
	return sum
}

// backRepresentation adds the gradient of the term through z = act(x W1 +
// b1), given dz, to grad's W1 and b1.
func (c *Contrastive) backRepresentation(w []float64, d Data, grad []float64) {
	m := c.mlp
	b1, w2, _ := m.offsets()
	for i, a := range c.z {
		if m.act == ActivationTanh {
			c.dz[i] *= 1 - a*a
		} else if a <= 0 {
			c.dz[i] = 0
		}
	}
	gemm(blas.Trans, blas.NoTrans, 1, general(d.N, d.D, d.X), general(d.N, m.h, c.dz), 1, general(m.d, m.h, grad[:b1]))
	addColSums(grad[b1:w2], c.dz)
}

// headOffsets are the offsets of the head's A, a, B and b.
func (m *MLP) headOffsets() (hA, ha, hB, hb int) {
	hA = m.classifierParams()
	ha = hA + m.h*m.q
	hB = ha + m.q
	hb = hB + m.q*m.h
	return
}

// head computes the prediction head of w on the representations z (n×h):
// u = relu(z A + a) (n×q) and p = u B + b (n×h), in the given buffers.
func (m *MLP) head(w, z, u, p []float64) ([]float64, []float64) {
	n := len(z) / m.h
	hA, ha, hB, hb := m.headOffsets()
	u, p = grow(u, n*m.q), grow(p, n*m.h)
	setRows(u, w[ha:hB])
	gemm(blas.NoTrans, blas.NoTrans, 1, general(n, m.h, z), general(m.h, m.q, w[hA:ha]), 1, general(n, m.q, u))
	for i, v := range u {
		u[i] = max(v, 0)
	}
	setRows(p, w[hb:hb+m.h])
	gemm(blas.NoTrans, blas.NoTrans, 1, general(n, m.q, u), general(m.q, m.h, w[hB:hb]), 1, general(n, m.h, p))
	return u, p
}

// cosine is a·b / (|a| |b|), 0 when either is the zero vector.
func cosine(a, b []float64) float64 {
	var ab, aa, bb float64
	for i := range a {
		ab += a[i] * b[i]
		aa += a[i] * a[i]
		bb += b[i] * b[i]
	}
	if aa == 0 || bb == 0 {
		return 0
	}
	return ab / math.Sqrt(aa*bb)
}

// addCosineGrad adds s times the gradient of cos(a, b) with respect to a,
// b/(|a||b|) - cos a/|a|^2, to dst (nothing when a or b is zero).
func addCosineGrad(dst []float64, s float64, a, b []float64, cos float64) {
	var aa, bb float64
	for i := range a {
		aa += a[i] * a[i]
		bb += b[i] * b[i]
	}
	if aa == 0 || bb == 0 {
		return
	}
	inv := 1 / math.Sqrt(aa*bb)
	for i := range a {
		dst[i] += s * (b[i]*inv - cos*a[i]/aa)
	}
}

// softplus is log(1 + e^t), without overflow.
func softplus(t float64) float64 {
	if t > 0 {
		return t + math.Log1p(math.Exp(-t))
	}
	return math.Log1p(math.Exp(t))
}

// Algorithm names (the daemons' --algorithm, simulate's --algo) whose local
// solve is a contrastive objective. "fedsiam" alone names FedSiam-DA's dual
// aggregation over the FedProx local solve (learn/aggregate).
const (
	AlgoMOON      = "moon"       // MOON: the MOON objective, FedAvg's sample-weighted mean
	AlgoFedSiamDA = "fedsiam-da" // FedSiam-DA: its contrastive objective and its dual aggregation
)

// ContrastKindOf is the contrastive objective of an algorithm name, "" for
// the others.
func ContrastKindOf(algorithm string) string {
	switch algorithm {
	case AlgoMOON:
		return ContrastMOON
	case AlgoFedSiamDA:
		return ContrastFedSiam
	}
	return ""
}

// DefaultTau is MOON's temperature when none is given (MOON's paper's 0.5).
const DefaultTau = 0.5

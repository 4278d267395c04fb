package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

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
// FedSiam-DA (Yang et al., seed 004, Algorithm 1 line 21 and eq. 7-10)
// adds mu * (L_hist + L_stop), where with D(a, b) = cos(a, b),
//
//	L_hist = D(stopgrad(z_prev), z)                 (pushes z from the previous local model's)
//	L_stop = 1/2 * -D(p_glob, stopgrad(z)) + 1/2 * -D(p, stopgrad(z_glob))
//
// and p = h(z) is the prediction head's output (SimSiam's predictor), p_glob
// and z_glob those of the site's copy of the global model. The copy is
// trained too, alternately with the local model (the paper's eq. 8 and 9):
// before each mini-batch step of the local model (Step), the copy takes one
// SGD step of the same learning rate on the same batch for the only term
// that depends on it, mu/2 * -D(p_glob, stopgrad(z)), through its head and
// its representation layer; the local step then sees the moved copy. The
// copy starts every solve at the round's global model and is never sent.
// LossGrad alone (full-batch measurements, L-BFGS) does not move it.
//
// The head is SimSiam's predictor shape, p = relu(BN(z A)) B + b, of width
// Spec.Head: batch normalisation on its hidden layer (scale gamma, shift
// beta, the batch's own mean and biased variance, epsilon 1e-5; the
// mini-batch is the batch, a full-data measurement normalises over all the
// site's samples), none on its output. Only the training loss uses the head,
// so it has no running statistics.
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

	gw []float64 // the copy of the global model (eq. 8); global itself for MOON

	z, zg, zp, dz []float64 // n×h representations and the gradient wrt z
	zs            []float64 // stopgrad(z)'s value when stopAt is set
	hl, hg        headPass  // the head on the local and the copy's representations
	dp, gg        []float64 // gradient wrt p; the copy's gradient
	step          stepScratch
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
	c := &Contrastive{mlp: mlp.Clone().(*MLP), aux: mlp.Clone().(*MLP), cfg: cfg, global: global, prev: prev, gw: global}
	if cfg.Kind == ContrastFedSiam {
		c.gw = slices.Clone(global)
	}
	return c, nil
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
	k := &Contrastive{mlp: c.mlp.Clone().(*MLP), aux: c.aux.Clone().(*MLP), cfg: c.cfg, global: c.global, prev: c.prev, gw: c.gw}
	if c.cfg.Kind == ContrastFedSiam {
		k.gw = slices.Clone(c.gw)
	}
	return k
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
	c.zg = c.represent(c.gw, d, c.zg)
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
		c.mlp.backRep(d, c.z, c.dz, grad)
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
	h := c.mlp.h
	c.hl.forward(c.mlp, w, c.z)
	c.hg.forward(c.mlp, c.gw, c.zg)
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
		z, zg, zp, p := r(c.z), r(c.zg), r(c.zp), r(c.hl.p)
		hist := cosine(zp, z)
		stop1 := cosine(r(c.hg.p), r(zs)) // stopgrad(z): no gradient
		stop2 := cosine(p, zg)            // stopgrad(z_glob): gradient through p
		sum += hist - 0.5*stop1 - 0.5*stop2
		addCosineGrad(r(c.dz), scale, z, zp, hist)
		dp := r(c.dp)
		clear(dp)
		addCosineGrad(dp, -0.5*scale, p, zg, stop2)
	}
	if grad != nil {
		c.hl.backward(c.mlp, w, c.z, c.dp, grad, c.dz)
	}
	return sum
}

// Step implements Stepper: for FedSiam-DA, eq. 8's step of the global copy
// on the batch, then (eq. 9) the local model's step, which LossGrad's
// gradient followed by the update gives.
func (c *Contrastive) Step(w []float64, d Data, idx []int, lr, mu float64, anchor []float64) float64 {
	c.step.batch = d.Gather(idx, c.step.batch)
	if c.cfg.Kind == ContrastFedSiam && c.cfg.Mu != 0 && c.step.batch.N > 0 {
		c.zs = c.represent(w, c.step.batch, c.zs) // stopgrad(z)
		c.gg = grow(c.gg, len(w))
		clear(c.gg)
		c.copyTerm(c.step.batch, c.zs, c.gg)
		for i, g := range c.gg {
			c.gw[i] -= lr * g
		}
	}
	return batchStep(c, &c.step, w, lr, mu, anchor)
}

// copyTerm returns eq. 8's objective on the batch b, the mean over it of
// mu/2 * -cos(p_glob, z) with the local representations z held fixed, and
// adds its gradient with respect to the copy to grad.
func (c *Contrastive) copyTerm(b Data, z, grad []float64) float64 {
	n, h := b.N, c.mlp.h
	c.zg = c.represent(c.gw, b, c.zg)
	c.hg.forward(c.mlp, c.gw, c.zg)
	c.dp, c.dz = grow(c.dp, n*h), grow(c.dz, n*h)
	clear(c.dz)
	s := -0.5 * c.cfg.Mu / float64(n)
	var sum float64
	for i := range n {
		p, zi, dp := c.hg.p[i*h:(i+1)*h], z[i*h:(i+1)*h], c.dp[i*h:(i+1)*h]
		cs := cosine(p, zi)
		sum += cs
		clear(dp)
		addCosineGrad(dp, s, p, zi, cs)
	}
	c.hg.backward(c.mlp, c.gw, c.zg, c.dp, grad, c.dz)
	c.mlp.backRep(b, c.zg, c.dz, grad)
	return s * sum
}

// backRep adds the gradient through a = act(x W1 + b1), given da (the
// gradient with respect to a, overwritten), to grad's W1 and b1.
func (m *MLP) backRep(d Data, a, da, grad []float64) {
	b1, w2, _ := m.offsets()
	for i, v := range a {
		if m.act == ActivationTanh {
			da[i] *= 1 - v*v
		} else if v <= 0 {
			da[i] = 0
		}
	}
	productTN(m.d, m.h, d.N, d.X, da, grad[:b1], true)
	addColSums(grad[b1:w2], da)
}

// headOffsets are the offsets of the head's A, gamma (beta follows it), B
// and b.
func (m *MLP) headOffsets() (hA, hG, hB, hb int) {
	hA = m.classifierParams()
	hG = hA + m.h*m.q
	hB = hG + 2*m.q
	hb = hB + m.q*m.h
	return
}

// bnEps is the head's batch normalisation epsilon (PyTorch's default).
const bnEps = 1e-5

// headPass is one evaluation of the prediction head on n representations,
// with what its backward pass needs.
type headPass struct {
	xh, u, du []float64 // n×q: normalised pre-activations, hidden outputs, scratch
	inv       []float64 // q inverse batch standard deviations
	p         []float64 // n×h output
}

// forward computes p = relu(gamma xh + beta) B + b, xh = BN(z A), of the
// head of w on the representations z (n×h, n >= 1).
func (hp *headPass) forward(m *MLP, w, z []float64) {
	n, h, q := len(z)/m.h, m.h, m.q
	hA, hG, hB, hb := m.headOffsets()
	hp.xh, hp.u, hp.p, hp.inv = grow(hp.xh, n*q), grow(hp.u, n*q), grow(hp.p, n*h), grow(hp.inv, q)
	gemm(blas.NoTrans, blas.NoTrans, 1, general(n, h, z), general(h, q, w[hA:hG]), 0, general(n, q, hp.xh))
	for j := range q {
		var mean, v float64
		for i := j; i < n*q; i += q {
			mean += hp.xh[i]
		}
		mean /= float64(n)
		for i := j; i < n*q; i += q {
			v += (hp.xh[i] - mean) * (hp.xh[i] - mean)
		}
		hp.inv[j] = 1 / math.Sqrt(v/float64(n)+bnEps)
		for i := j; i < n*q; i += q {
			hp.xh[i] = (hp.xh[i] - mean) * hp.inv[j]
			hp.u[i] = max(w[hG+j]*hp.xh[i]+w[hG+q+j], 0)
		}
	}
	setRows(hp.p, w[hb:hb+h])
	gemm(blas.NoTrans, blas.NoTrans, 1, general(n, q, hp.u), general(q, h, w[hB:hb]), 1, general(n, h, hp.p))
}

// backward adds, for a loss whose gradient with respect to p is dp, its
// gradient to grad's head parameters and to dz (n×h), after forward(m, w, z).
func (hp *headPass) backward(m *MLP, w, z, dp, grad, dz []float64) {
	n, h, q := len(z)/m.h, m.h, m.q
	hA, hG, hB, hb := m.headOffsets()
	gemm(blas.Trans, blas.NoTrans, 1, general(n, q, hp.u), general(n, h, dp), 1, general(q, h, grad[hB:hb]))
	addColSums(grad[hb:hb+h], dp)
	du := grow(hp.du, n*q)
	hp.du = du
	gemm(blas.NoTrans, blas.Trans, 1, general(n, h, dp), general(q, h, w[hB:hb]), 0, general(n, q, du))
	nf := float64(n)
	for j := range q {
		// Through the ReLU, then batch normalisation's backward pass:
		// d(s) = gamma inv (dy - mean(dy) - xh mean(dy xh)).
		var sg, sb float64
		for i := j; i < n*q; i += q {
			if hp.u[i] <= 0 {
				du[i] = 0
			}
			sg += du[i] * hp.xh[i]
			sb += du[i]
		}
		grad[hG+j] += sg
		grad[hG+q+j] += sb
		k := w[hG+j] * hp.inv[j]
		for i := j; i < n*q; i += q {
			du[i] = k * (du[i] - (sb+hp.xh[i]*sg)/nf)
		}
	}
	gemm(blas.Trans, blas.NoTrans, 1, general(n, h, z), general(n, q, du), 1, general(h, q, grad[hA:hG]))
	gemm(blas.NoTrans, blas.Trans, 1, general(n, q, du), general(h, q, w[hA:hG]), 1, general(n, h, dz))
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

package model

import "math"

// Stepper is a model with a fused mini-batch SGD step: LogReg and MLP, and
// the contrastive objective, whose FedSiam-DA step also moves its copy of
// the global model first (contrast.go). proxsolver uses it for SGD when the
// model has it.
type Stepper interface {
	// Step takes one step of FedProx SGD with weight decay on the samples
	// idx of d, in place:
	//
	//	w <- w - lr (grad f_B(w) + mu (w - anchor)),
	//
	// where f_B is the mean loss over those samples plus the L2 term
	// (l2/2)||w||^2, as LossGrad computes it on the gathered batch. It
	// returns f_B(w) at the point before the step. anchor is not read when
	// mu is 0 (it may then be nil). The result equals LossGrad's gradient
	// followed by that update up to rounding: the products are summed in
	// another order (see gemmAcc).
	Step(w []float64, d Data, idx []int, lr, mu float64, anchor []float64) float64
}

// stepScratch is what a Step keeps between calls so that it does not
// allocate: the gathered batch and the gradient.
type stepScratch struct {
	batch Data
	grad  []float64
}

// fallbackStep is Step through LossGrad, for platforms where math.FMA is not
// one instruction.
func fallbackStep(m Model, s *stepScratch, w []float64, d Data, idx []int, lr, mu float64, anchor []float64) float64 {
	s.batch = d.Gather(idx, s.batch)
	return batchStep(m, s, w, lr, mu, anchor)
}

// batchStep is fallbackStep on the batch already gathered into s.batch.
func batchStep(m Model, s *stepScratch, w []float64, lr, mu float64, anchor []float64) float64 {
	s.grad = grow(s.grad, len(w))
	loss := m.LossGrad(w, s.batch, s.grad)
	if mu == 0 || anchor == nil {
		for i, g := range s.grad {
			w[i] -= lr * g
		}
		return loss
	}
	for i, g := range s.grad {
		w[i] -= lr * (g + mu*(w[i]-anchor[i]))
	}
	return loss
}

// stepAnchor is the anchor proxStep reads: w itself when mu is 0, so that
// the prox term is exactly 0 without reading anchor.
func stepAnchor(w []float64, mu float64, anchor []float64) []float64 {
	if mu == 0 || anchor == nil {
		return w
	}
	checkLen("Step anchor", len(anchor), len(w))
	return anchor
}

// Step implements Stepper: logits, softmax cross-entropy, gradient and update
// on the gathered batch, with the kernels of kernel.go.
func (m *LogReg) Step(w []float64, d Data, idx []int, lr, mu float64, anchor []float64) float64 {
	if !fastFMA {
		return fallbackStep(m, &m.step, w, d, idx, lr, mu, anchor)
	}
	a := stepAnchor(w, mu, anchor)
	checkShape("LogReg", m.NumParams(), m.d, w, d)
	b := d.Gather(idx, m.step.batch)
	m.step.batch = b
	n, dim, c := b.N, m.d, m.c
	m.z = grow(m.z, n*c)
	setRows(m.z, w[dim*c:])
	gemmAcc(n, c, dim, b.X, dim, 1, w, c, m.z, c, true)
	loss := softmaxXent(m.z, c, b.Y, true)
	// z now holds dLoss/dlogits: dW = Xᵀ G, db = column sums of G.
	g := grow(m.step.grad, len(w))
	m.step.grad = g
	gemmAcc(dim, c, n, b.X, 1, dim, m.z, c, g, c, false)
	gb := g[dim*c:]
	clear(gb)
	addColSums(gb, m.z)
	return loss + proxStep(w, g, a, lr, m.l2, mu)
}

// Step implements Stepper: forward, backward and update on the gathered
// batch, with the kernels of kernel.go.
func (m *MLP) Step(w []float64, d Data, idx []int, lr, mu float64, anchor []float64) float64 {
	if !fastFMA || m.q > 0 {
		// Without FMA, or with a prediction head behind the classifier
		// (contrast.go), the generic step on LossGrad.
		return fallbackStep(m, &m.step, w, d, idx, lr, mu, anchor)
	}
	an := stepAnchor(w, mu, anchor)
	checkShape("MLP", m.NumParams(), m.d, w, d)
	b := d.Gather(idx, m.step.batch)
	m.step.batch = b
	n, dim, h, c := b.N, m.d, m.h, m.c
	ob1, ow2, ob2 := m.offsets()

	// Forward: a = act(X W1 + b1), z = a W2 + b2.
	m.a = grow(m.a, n*h)
	setRows(m.a, w[ob1:ow2])
	gemmAcc(n, h, dim, b.X, dim, 1, w[:ob1], h, m.a, h, true)
	if m.act == ActivationTanh {
		for i, v := range m.a {
			m.a[i] = math.Tanh(v)
		}
	} else {
		for i, v := range m.a {
			m.a[i] = max(v, 0)
		}
	}
	m.z = grow(m.z, n*c)
	setRows(m.z, w[ob2:])
	gemmAcc(n, c, h, m.a, h, 1, w[ow2:ob2], c, m.z, c, true)
	loss := softmaxXent(m.z, c, b.Y, true)

	// Backward, from G = dLoss/dz in m.z.
	g := grow(m.step.grad, len(w))
	m.step.grad = g
	gemmAcc(h, c, n, m.a, 1, h, m.z, c, g[ow2:ob2], c, false) // dW2 = aᵀ G
	clear(g[ob2:])
	addColSums(g[ob2:], m.z)
	// da = G W2ᵀ, with W2 transposed into a c×h scratch so that the kernel
	// reads it by rows.
	m.transposeW2(w[ow2:ob2])
	m.da = grow(m.da, n*h)
	gemmAcc(n, h, c, m.z, c, 1, m.w2t, h, m.da, h, false)
	if m.act == ActivationTanh {
		for i, v := range m.a {
			m.da[i] *= 1 - v*v
		}
	} else {
		for i, v := range m.a {
			if v <= 0 {
				m.da[i] = 0
			}
		}
	}
	gemmAcc(dim, h, n, b.X, 1, dim, m.da, h, g[:ob1], h, false) // dW1 = Xᵀ da
	clear(g[ob1:ow2])
	addColSums(g[ob1:ow2], m.da)
	return loss + proxStep(w, g, an, lr, m.l2, mu)
}

// transposeW2 writes W2ᵀ (c×h) into m.w2t.
func (m *MLP) transposeW2(w2 []float64) {
	m.w2t = grow(m.w2t, m.c*m.h)
	for j := range m.h {
		for k := range m.c {
			m.w2t[k*m.h+j] = w2[j*m.c+k]
		}
	}
}

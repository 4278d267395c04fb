package model

import (
	"errors"
	"math"
	"testing"
)

// TestContrastiveGradient compares the contrastive objectives' gradients
// (MOON, FedSiam-DA with its head) with central differences of their loss,
// for ReLU and tanh MLPs, with and without L2, batches of 1 and more, and a
// previous model equal to the global one (a site's first round).
func TestContrastiveGradient(t *testing.T) {
	cases := []struct {
		name      string
		cfg       ContrastConfig
		spec      Spec
		n         int
		prevIsGlb bool
	}{
		{"moon/relu", ContrastConfig{Kind: ContrastMOON, Mu: 1, Tau: 0.5}, Spec{Kind: KindMLP, Inputs: 4, Hidden: 6, Classes: 3, Activation: ActivationReLU}, 9, false},
		{"moon/tanh/l2", ContrastConfig{Kind: ContrastMOON, Mu: 5, Tau: 0.1}, Spec{Kind: KindMLP, Inputs: 3, Hidden: 5, Classes: 2, Activation: ActivationTanh, L2: 0.3}, 7, false},
		{"moon/one-sample", ContrastConfig{Kind: ContrastMOON, Mu: 2, Tau: 1}, Spec{Kind: KindMLP, Inputs: 2, Hidden: 3, Classes: 2, Activation: ActivationTanh}, 1, false},
		{"moon/first-round", ContrastConfig{Kind: ContrastMOON, Mu: 1, Tau: 0.5}, Spec{Kind: KindMLP, Inputs: 4, Hidden: 6, Classes: 3, Activation: ActivationTanh}, 5, true},
		{"fedsiam/relu", ContrastConfig{Kind: ContrastFedSiam, Mu: 1}, Spec{Kind: KindMLP, Inputs: 4, Hidden: 8, Classes: 3, Activation: ActivationReLU, Head: 2}, 9, false},
		{"fedsiam/tanh/l2", ContrastConfig{Kind: ContrastFedSiam, Mu: 3}, Spec{Kind: KindMLP, Inputs: 3, Hidden: 5, Classes: 2, Activation: ActivationTanh, Head: 3, L2: 0.2}, 6, false},
		{"fedsiam/one-sample", ContrastConfig{Kind: ContrastFedSiam, Mu: 0.5}, Spec{Kind: KindMLP, Inputs: 2, Hidden: 4, Classes: 2, Activation: ActivationTanh, Head: 1}, 1, false},
		{"fedsiam/first-round", ContrastConfig{Kind: ContrastFedSiam, Mu: 1}, Spec{Kind: KindMLP, Inputs: 4, Hidden: 6, Classes: 3, Activation: ActivationTanh, Head: 2}, 5, true},
		{"fedsiam/wide", ContrastConfig{Kind: ContrastFedSiam, Mu: 1}, Spec{Kind: KindMLP, Inputs: 5, Hidden: 70, Classes: 3, Activation: ActivationTanh, Head: HeadWidth(70)}, 40, false},
	}
	rng := newRNG(7)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := mustNew(t, tc.spec)
			d := randData(rng, tc.spec, tc.n)
			glob, prev := randParams(rng, m, 0.7), randParams(rng, m, 0.7)
			if tc.prevIsGlb {
				prev = glob
			}
			c, err := NewContrastive(m, tc.cfg, glob, prev)
			if err != nil {
				t.Fatal(err)
			}
			w := randParams(rng, m, 0.7)
			// Finite differences see stopgrad(z) as a constant: held at w.
			c.stopAt = append([]float64(nil), w...)
			grad := make([]float64, m.NumParams())
			for i := range grad {
				grad[i] = math.NaN()
			}
			loss := c.LossGrad(w, d, grad)
			if got := c.LossGrad(w, d, nil); got != loss {
				t.Fatalf("loss without gradient %v, with %v", got, loss)
			}
			if ce := m.LossGrad(w, d, nil); loss == ce {
				t.Fatalf("the contrastive term is zero (loss %v = cross-entropy)", loss)
			}
			if !allFinite(grad) {
				t.Fatalf("non-finite gradient %v", grad)
			}
			step := max(1, len(w)/80)
			const h = 1e-6
			for i := 0; i < len(w); i += step {
				wi := w[i]
				w[i] = wi + h
				up := c.LossGrad(w, d, nil)
				w[i] = wi - h
				down := c.LossGrad(w, d, nil)
				w[i] = wi
				fd := (up - down) / (2 * h)
				if !near(grad[i], fd, 1e-5) {
					t.Errorf("param %d: gradient %.10g, finite difference %.10g", i, grad[i], fd)
				}
			}
		})
	}
}

// TestContrastiveTerms checks the terms' values against their definitions
// at points where they are known: MOON's term is log 2 when the previous
// model is the global one; FedSiam's is cos(z_prev, z) - 1/2 cos(p_glob, z)
// - 1/2 cos(p, z_glob), which is 0 when all three models are one (cos 1
// - 1/2 - 1/2) only if the head maps z to a multiple of z, so the test
// uses the general formula on one sample computed by hand.
func TestContrastiveTerms(t *testing.T) {
	spec := Spec{Kind: KindMLP, Inputs: 3, Hidden: 4, Classes: 2, Activation: ActivationTanh}
	m := mustNew(t, spec)
	rng := newRNG(3)
	d := randData(rng, spec, 5)
	w, g := randParams(rng, m, 0.8), randParams(rng, m, 0.8)
	for _, mu := range []float64{0.5, 2} {
		c, err := NewContrastive(m, ContrastConfig{Kind: ContrastMOON, Mu: mu, Tau: 0.3}, g, g)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := c.LossGrad(w, d, nil)-m.LossGrad(w, d, nil), mu*math.Ln2; math.Abs(got-want) > 1e-12 {
			t.Errorf("moon mu=%v, prev = global: term %v, want mu log 2 = %v", mu, got, want)
		}
	}
	hs := spec
	hs.Head = 2
	hm := mustNew(t, hs)
	w, g, p := randParams(rng, hm, 0.8), randParams(rng, hm, 0.8), randParams(rng, hm, 0.8)
	one := Data{N: 1, D: 3, X: d.X[:3], Y: d.Y[:1]}
	c, err := NewContrastive(hm, ContrastConfig{Kind: ContrastFedSiam, Mu: 1}, g, p)
	if err != nil {
		t.Fatal(err)
	}
	rep := func(v []float64) []float64 { // tanh(x W1 + b1)
		z := make([]float64, 4)
		for j := range z {
			s := v[12+j]
			for f := range 3 {
				s += one.X[f] * v[f*4+j]
			}
			z[j] = math.Tanh(s)
		}
		return z
	}
	head := func(v, z []float64) []float64 { // relu(z A + a) B + b, A at 14 (after 12+4+8+2)
		off := 4*3 + 4 + 4*2 + 2
		u := make([]float64, 2)
		for k := range u {
			s := v[off+8+k]
			for j := range 4 {
				s += z[j] * v[off+j*2+k]
			}
			u[k] = max(s, 0)
		}
		out := make([]float64, 4)
		for j := range out {
			s := v[off+8+2+8+j]
			for k := range 2 {
				s += u[k] * v[off+8+2+k*4+j]
			}
			out[j] = s
		}
		return out
	}
	z, zg, zp := rep(w), rep(g), rep(p)
	want := cosine(zp, z) - 0.5*cosine(head(g, zg), z) - 0.5*cosine(head(w, z), zg)
	if got := c.LossGrad(w, one, nil) - hm.LossGrad(w, one, nil); math.Abs(got-want) > 1e-12 {
		t.Errorf("fedsiam term %v, by hand %v", got, want)
	}
}

// TestContrastiveRefusals: the objectives need an MLP (and FedSiam its
// head), matching dimensions and parameters in range.
func TestContrastiveRefusals(t *testing.T) {
	mlp := Spec{Kind: KindMLP, Inputs: 3, Hidden: 4, Classes: 2, Activation: ActivationReLU}
	withHead := ContrastSpec(ContrastFedSiam, mlp)
	if withHead.Head != HeadWidth(4) || ContrastSpec(ContrastMOON, mlp).Head != 0 {
		t.Fatalf("ContrastSpec: fedsiam head %d, moon head %d", withHead.Head, ContrastSpec(ContrastMOON, mlp).Head)
	}
	logreg := Spec{Kind: KindLogReg, Inputs: 3, Classes: 2}
	if _, err := New(Spec{Kind: KindLogReg, Inputs: 3, Classes: 2, Head: 1}); !errors.Is(err, ErrSpec) {
		t.Errorf("logreg with a head: %v, want ErrSpec", err)
	}
	cases := []struct {
		name string
		spec Spec
		cfg  ContrastConfig
		dim  int // 0: the model's
	}{
		{"logreg", logreg, ContrastConfig{Kind: ContrastMOON, Mu: 1, Tau: 0.5}, 0},
		{"fedsiam without head", mlp, ContrastConfig{Kind: ContrastFedSiam, Mu: 1}, 0},
		{"moon tau 0", mlp, ContrastConfig{Kind: ContrastMOON, Mu: 1}, 0},
		{"moon tau inf", mlp, ContrastConfig{Kind: ContrastMOON, Mu: 1, Tau: math.Inf(1)}, 0},
		{"negative mu", withHead, ContrastConfig{Kind: ContrastFedSiam, Mu: -1}, 0},
		{"NaN mu", withHead, ContrastConfig{Kind: ContrastFedSiam, Mu: math.NaN()}, 0},
		{"unknown kind", mlp, ContrastConfig{Kind: "simclr", Mu: 1}, 0},
		{"short global", mlp, ContrastConfig{Kind: ContrastMOON, Mu: 1, Tau: 1}, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := mustNew(t, tc.spec)
			dim := m.NumParams()
			if tc.dim > 0 {
				dim = tc.dim
			}
			_, err := NewContrastive(m, tc.cfg, make([]float64, dim), make([]float64, m.NumParams()))
			if !errors.Is(err, ErrSpec) {
				t.Fatalf("err = %v, want ErrSpec", err)
			}
		})
	}
}

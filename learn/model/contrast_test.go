package model

import (
	"errors"
	"math"
	"slices"
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
	c, err := NewContrastive(hm, ContrastConfig{Kind: ContrastFedSiam, Mu: 1}, g, p)
	if err != nil {
		t.Fatal(err)
	}
	rep := func(v []float64, i int) []float64 { // tanh(x W1 + b1) of sample i
		z := make([]float64, 4)
		for j := range z {
			s := v[12+j]
			for f := range 3 {
				s += d.X[i*3+f] * v[f*4+j]
			}
			z[j] = math.Tanh(s)
		}
		return z
	}
	// relu(BN(z A)) B + b over the batch, by the textbook formulas: the
	// head's A at 26 (after W1 12, b1 4, W2 8, b2 2), gamma and beta after
	// it, then B and b.
	head := func(v []float64, zs [][]float64) [][]float64 {
		const A, G, B = 26, 26 + 8, 26 + 8 + 4
		s := make([][]float64, len(zs))
		for i, z := range zs {
			s[i] = make([]float64, 2)
			for k := range 2 {
				for j := range 4 {
					s[i][k] += z[j] * v[A+j*2+k]
				}
			}
		}
		out := make([][]float64, len(zs))
		for i := range out {
			out[i] = append([]float64(nil), v[B+8:B+12]...)
		}
		for k := range 2 {
			var mean, vr float64
			for i := range s {
				mean += s[i][k] / float64(len(s))
			}
			for i := range s {
				vr += (s[i][k] - mean) * (s[i][k] - mean) / float64(len(s))
			}
			for i := range s {
				u := max(v[G+k]*(s[i][k]-mean)/math.Sqrt(vr+1e-5)+v[G+2+k], 0)
				for j := range 4 {
					out[i][j] += u * v[B+k*4+j]
				}
			}
		}
		return out
	}
	var z, zg, zp [][]float64
	for i := range d.N {
		z, zg, zp = append(z, rep(w, i)), append(zg, rep(g, i)), append(zp, rep(p, i))
	}
	pw, pg := head(w, z), head(g, zg)
	var want float64
	for i := range d.N {
		want += (cosine(zp[i], z[i]) - 0.5*cosine(pg[i], z[i]) - 0.5*cosine(pw[i], zg[i])) / float64(d.N)
	}
	if got := c.LossGrad(w, d, nil) - hm.LossGrad(w, d, nil); math.Abs(got-want) > 1e-12 {
		t.Errorf("fedsiam term %v, by hand %v", got, want)
	}
}

// TestFedSiamCopyGradient compares the gradient of eq. 8's objective (the
// copy of the global model's term, the local representations fixed) with
// central differences in the copy's parameters, and checks that it reaches
// only the copy's representation layer and head.
func TestFedSiamCopyGradient(t *testing.T) {
	rng := newRNG(11)
	for _, spec := range []Spec{
		{Kind: KindMLP, Inputs: 4, Hidden: 8, Classes: 3, Activation: ActivationReLU, Head: 2},
		{Kind: KindMLP, Inputs: 3, Hidden: 5, Classes: 2, Activation: ActivationTanh, Head: 3, L2: 0.2},
		{Kind: KindMLP, Inputs: 5, Hidden: 12, Classes: 3, Activation: ActivationTanh, Head: 3},
	} {
		for _, n := range []int{1, 7} {
			m := mustNew(t, spec)
			d := randData(rng, spec, n)
			c, err := NewContrastive(m, ContrastConfig{Kind: ContrastFedSiam, Mu: 2}, randParams(rng, m, 0.7), randParams(rng, m, 0.7))
			if err != nil {
				t.Fatal(err)
			}
			z := c.represent(randParams(rng, m, 0.7), d, nil)
			grad := make([]float64, m.NumParams())
			f := c.copyTerm(d, z, grad)
			if f == 0 {
				t.Fatalf("%+v n=%d: the copy's term is 0", spec, n)
			}
			_, w2, b2 := c.mlp.offsets()
			for i, g := range grad[w2 : b2+spec.Classes] {
				if g != 0 {
					t.Fatalf("classifier parameter %d gets gradient %v", w2+i, g)
				}
			}
			const h = 1e-6
			for i := range c.gw {
				gi := c.gw[i]
				c.gw[i] = gi + h
				up := c.copyTerm(d, z, make([]float64, len(grad)))
				c.gw[i] = gi - h
				down := c.copyTerm(d, z, make([]float64, len(grad)))
				c.gw[i] = gi
				if fd := (up - down) / (2 * h); !near(grad[i], fd, 1e-5) {
					t.Errorf("%+v n=%d param %d: gradient %.10g, finite difference %.10g", spec, n, i, grad[i], fd)
				}
			}
		}
	}
}

// TestFedSiamStepAlternates: FedSiam-DA's SGD step first moves the copy of
// the global model by one step of eq. 8's objective on the batch (eq. 8),
// then the local model by the step of its loss against the moved copy
// (eq. 9); the global model given to the objective is not written. MOON's
// step is LossGrad's step against the fixed global model, bit for bit.
func TestFedSiamStepAlternates(t *testing.T) {
	rng := newRNG(5)
	spec := Spec{Kind: KindMLP, Inputs: 4, Hidden: 8, Classes: 3, Activation: ActivationReLU, Head: 2, L2: 0.01}
	m := mustNew(t, spec)
	d := randData(rng, spec, 12)
	idx := []int{3, 0, 7, 11, 5}
	batch := d.Gather(idx, Data{})
	const lr = 0.3
	for _, cfg := range []ContrastConfig{{Kind: ContrastFedSiam, Mu: 1.5}, {Kind: ContrastMOON, Mu: 1, Tau: 0.5}} {
		glob, prev, w := randParams(rng, m, 0.7), randParams(rng, m, 0.7), randParams(rng, m, 0.7)
		globIn := append([]float64(nil), glob...)
		c, err := NewContrastive(m, cfg, glob, prev)
		if err != nil {
			t.Fatal(err)
		}
		// The expected step, from the definitions.
		ref, _ := NewContrastive(m, cfg, glob, prev)
		wantCopy := append([]float64(nil), glob...)
		if cfg.Kind == ContrastFedSiam {
			g := make([]float64, len(w))
			ref.copyTerm(batch, ref.represent(w, batch, nil), g)
			for i := range wantCopy {
				wantCopy[i] -= lr * g[i]
			}
		}
		ref.gw = wantCopy
		g := make([]float64, len(w))
		wantLoss := ref.LossGrad(w, batch, g)
		wantW := append([]float64(nil), w...)
		for i := range wantW {
			wantW[i] -= lr * g[i]
		}

		loss := c.Step(w, d, idx, lr, 0, nil)
		if loss != wantLoss || !slices.Equal(w, wantW) || !slices.Equal(c.gw, wantCopy) {
			t.Errorf("%s: step loss %v (want %v), local model equal %v, copy equal %v", cfg.Kind, loss, wantLoss, slices.Equal(w, wantW), slices.Equal(c.gw, wantCopy))
		}
		if moved := !slices.Equal(c.gw, globIn); moved != (cfg.Kind == ContrastFedSiam) {
			t.Errorf("%s: copy of the global model moved: %v", cfg.Kind, moved)
		}
		if !slices.Equal(glob, globIn) {
			t.Errorf("%s: the global model given to the objective was written", cfg.Kind)
		}
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

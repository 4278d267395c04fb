package model

import (
	"math"
	"testing"
)

// naiveGemm is gemmAcc's definition with plain float64 products summed in
// the same order, for tolerance checks of the kernels.
func naiveGemm(m, n, k int, a []float64, lda, inca int, b []float64, ldb int, c []float64, ldc int, load bool) {
	for r := range m {
		for j := range n {
			s := 0.0
			if load {
				s = c[r*ldc+j]
			}
			for l := range k {
				s += a[r*lda+l*inca] * b[l*ldb+j]
			}
			c[r*ldc+j] = s
		}
	}
}

// gemmCase is one product of the kernel tests: a is m×k (read transposed
// when trans is set), b k×n, c m×n with a row stride of n+pad.
type gemmCase struct {
	m, n, k, pad int
	trans, load  bool
	zeros        float64 // fraction of a's entries set to 0
}

var gemmCases = []gemmCase{
	{m: 1, n: 1, k: 1},
	{m: 10, n: 10, k: 784, load: true, zeros: 0.5},
	{m: 784, n: 10, k: 10, trans: true, zeros: 0.5},
	{m: 10, n: 64, k: 784, load: true},
	{m: 784, n: 64, k: 10, trans: true},
	{m: 3, n: 31, k: 7, pad: 3},
	{m: 5, n: 32, k: 9, load: true},
	{m: 4, n: 33, k: 5, trans: true, pad: 1},
	{m: 2, n: 47, k: 6, load: true, zeros: 0.3},
	{m: 7, n: 79, k: 3, trans: true, pad: 5, zeros: 0.9},
	{m: 6, n: 100, k: 13},
	{m: 9, n: 64, k: 50, load: true, zeros: 0.5}, // row pairs and a last odd row
	{m: 11, n: 40, k: 7, trans: true, pad: 2, zeros: 0.5},
	{m: 2, n: 17, k: 3, load: true},
	{m: 2, n: 4, k: 0, load: true},
	{m: 2, n: 5, k: 0},
}

// operands draws a case's a, b and c (c filled with values the product must
// overwrite or add to), and the strides.
func (tc gemmCase) operands(seed uint64) (a []float64, lda, inca int, b, c []float64, ldc int) {
	rng := newRNG(seed)
	a = make([]float64, tc.m*tc.k)
	for i := range a {
		if rng.Float64() >= tc.zeros {
			a[i] = rng.NormFloat64()
		}
	}
	lda, inca = tc.k, 1
	if tc.trans { // a holds aᵀ, k×m
		lda, inca = 1, tc.m
	}
	b = make([]float64, tc.k*tc.n)
	for i := range b {
		b[i] = rng.NormFloat64()
	}
	ldc = tc.n + tc.pad
	c = make([]float64, tc.m*ldc)
	for i := range c {
		c[i] = rng.NormFloat64()
	}
	return
}

// TestGemmAccNaive checks the kernel that runs on this machine against the
// plain definition, and that it leaves the padding between c's rows alone.
func TestGemmAccNaive(t *testing.T) {
	for i, tc := range gemmCases {
		a, lda, inca, b, c, ldc := tc.operands(uint64(i))
		want := append([]float64(nil), c...)
		naiveGemm(tc.m, tc.n, tc.k, a, lda, inca, b, tc.n, want, ldc, tc.load)
		gemmAcc(tc.m, tc.n, tc.k, a, lda, inca, b, tc.n, c, ldc, tc.load)
		for j := range c {
			if !near(c[j], want[j], 1e-12*float64(tc.k+1)) {
				t.Fatalf("case %d %+v: c[%d] = %v, want %v", i, tc, j, c[j], want[j])
			}
		}
	}
}

// TestGemmAccNaN checks that a NaN in a is not taken for a zero and skipped:
// it poisons its row, as in gonum.
func TestGemmAccNaN(t *testing.T) {
	a := []float64{1, math.NaN(), 0, 2}
	b := make([]float64, 4*20)
	for i := range b {
		b[i] = 1
	}
	c := make([]float64, 20)
	gemmAcc(1, 20, 4, a, 4, 1, b, 20, c, 20, false)
	for j, v := range c {
		if !math.IsNaN(v) {
			t.Fatalf("c[%d] = %v, want NaN", j, v)
		}
	}
}

// TestGemmAccShortPanics: operands too short for the shape are a programmer
// error, caught before any assembly reads past them.
func TestGemmAccShortPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	gemmAcc(2, 3, 4, make([]float64, 7), 4, 1, make([]float64, 12), 3, make([]float64, 6), 3, false)
}

// TestProxStepDefinition checks proxStep against its formula and the L2
// term it returns, at lengths around the vector width.
func TestProxStepDefinition(t *testing.T) {
	rng := newRNG(3)
	for n := range 37 {
		w, g, a := make([]float64, n), make([]float64, n), make([]float64, n)
		for i := range w {
			w[i], g[i], a[i] = rng.NormFloat64(), rng.NormFloat64(), rng.NormFloat64()
		}
		const lr, l2, mu = 0.05, 1e-3, 0.7
		want := make([]float64, n)
		var ss float64
		for i := range w {
			// Each operation rounded on its own: the conversions stop
			// the compiler fusing them (as it does on arm64).
			d := float64(g[i] + float64(l2*w[i]))
			e := float64(mu * float64(w[i]-a[i]))
			want[i] = w[i] - float64(lr*float64(d+e))
			ss += w[i] * w[i]
		}
		got := proxStep(w, g, a, lr, l2, mu)
		if !near(got, 0.5*l2*ss, 1e-13) {
			t.Fatalf("n=%d: L2 term %v, want %v", n, got, 0.5*l2*ss)
		}
		for i := range w {
			if w[i] != want[i] {
				t.Fatalf("n=%d: w[%d] = %v, want %v", n, i, w[i], want[i])
			}
		}
		if got := proxStep(w, g, w, lr, 0, 0); got != 0 {
			t.Fatalf("n=%d: L2 term with l2 = 0 is %v", n, got)
		}
	}
}

var stepSpecs = []Spec{
	{Kind: KindLogReg, Inputs: 784, Classes: 10, L2: 1e-4},
	{Kind: KindLogReg, Inputs: 7, Classes: 3},
	{Kind: KindLogReg, Inputs: 33, Classes: 37, L2: 0.1},
	{Kind: KindMLP, Inputs: 784, Hidden: 64, Classes: 10, Activation: ActivationReLU, L2: 1e-4},
	{Kind: KindMLP, Inputs: 9, Hidden: 37, Classes: 4, Activation: ActivationTanh, L2: 0.01},
	{Kind: KindMLP, Inputs: 20, Hidden: 5, Classes: 2, Activation: ActivationReLU},
}

// TestStepMatchesLossGrad checks Step against LossGrad on the gathered batch
// followed by the FedProx update, over several steps, batch sizes and mu
// (0 with a nil anchor included): the same numbers up to rounding.
func TestStepMatchesLossGrad(t *testing.T) {
	for _, s := range stepSpecs {
		for _, mu := range []float64{0, 0.5} {
			m := mustNew(t, s)
			ref := m.Clone()
			rng := newRNG(11)
			d := randData(rng, s, 57)
			w := randParams(rng, m, 0.1)
			var anchor []float64
			if mu != 0 {
				anchor = randParams(rng, m, 0.1)
			}
			want := append([]float64(nil), w...)
			grad := make([]float64, len(w))
			const lr = 0.05
			for step, bs := range []int{10, 1, 7, 10, 3} {
				idx := rng.Perm(d.N)[:bs]
				got := m.(Stepper).Step(w, d, idx, lr, mu, anchor)
				f := ref.LossGrad(want, d.Gather(idx, Data{}), grad)
				for i, g := range grad {
					if mu != 0 {
						g += mu * (want[i] - anchor[i])
					}
					want[i] -= lr * g
				}
				if !near(got, f, 1e-12) {
					t.Fatalf("%s mu=%v step %d: loss %v, want %v", s.Kind, mu, step, got, f)
				}
				for i := range w {
					if !near(w[i], want[i], 1e-12) {
						t.Fatalf("%s %s mu=%v step %d: w[%d] = %v, want %v", s.Kind, s.Activation, mu, step, i, w[i], want[i])
					}
				}
			}
		}
	}
}

// TestStepAllocs: once its buffers have grown, Step allocates nothing.
func TestStepAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts")
	}
	for _, s := range stepSpecs {
		m := mustNew(t, s)
		rng := newRNG(12)
		d := randData(rng, s, 50)
		w, anchor := randParams(rng, m, 0.1), randParams(rng, m, 0.1)
		idx := rng.Perm(d.N)[:10]
		st := m.(Stepper)
		st.Step(w, d, idx, 0.01, 0.1, anchor)
		if a := testing.AllocsPerRun(10, func() { st.Step(w, d, idx, 0.01, 0.1, anchor) }); a != 0 {
			t.Errorf("%s: %v allocations per Step, want 0", s.Kind, a)
		}
	}
}

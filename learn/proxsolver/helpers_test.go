package proxsolver

import (
	"math"
	"math/rand/v2"
	"testing"

	"gonum.org/v1/gonum/mat"

	"github.com/edgefl/edgefl/learn/model"
)

// linearData draws n samples of y = x·w + b + noise over dim standard normal
// features.
func linearData(rng *rand.Rand, n, dim int, noise float64) model.Data {
	w := make([]float64, dim)
	for i := range w {
		w[i] = rng.NormFloat64()
	}
	b := rng.NormFloat64()
	d := model.Data{N: n, D: dim, X: make([]float64, n*dim), Y: make([]float64, n)}
	for i := range n {
		y := b
		for j := range dim {
			x := rng.NormFloat64()
			d.X[i*dim+j] = x
			y += x * w[j]
		}
		d.Y[i] = y + noise*rng.NormFloat64()
	}
	return d
}

// exactProx is the closed-form prox of least squares with bias:
// (A'A/n + (l2 + mu) I)^-1 (A'y/n + mu a), where A is X with a column of
// ones appended (the bias is the last parameter and is regularised too).
func exactProx(t *testing.T, d model.Data, l2, mu float64, a []float64) []float64 {
	t.Helper()
	p := d.D + 1
	A := mat.NewDense(d.N, p, nil)
	for i := range d.N {
		for j := range d.D {
			A.Set(i, j, d.X[i*d.D+j])
		}
		A.Set(i, d.D, 1)
	}
	n := float64(d.N)
	var M mat.Dense
	M.Mul(A.T(), A)
	M.Scale(1/n, &M)
	for i := range p {
		M.Set(i, i, M.At(i, i)+l2+mu)
	}
	var rhs mat.VecDense
	rhs.MulVec(A.T(), mat.NewVecDense(d.N, d.Y))
	rhs.ScaleVec(1/n, &rhs)
	if mu != 0 {
		rhs.AddScaledVec(&rhs, mu, mat.NewVecDense(p, a))
	}
	var x mat.VecDense
	if err := x.SolveVec(&M, &rhs); err != nil {
		t.Fatalf("closed form: %v", err)
	}
	return x.RawVector().Data
}

// smoothness is the largest eigenvalue of the Hessian A'A/n + (l2 + mu) I of
// h for least squares (see exactProx).
func smoothness(t *testing.T, d model.Data, l2, mu float64) float64 {
	t.Helper()
	p := d.D + 1
	M := mat.NewSymDense(p, nil)
	for i := range d.N {
		row := append(append([]float64(nil), d.X[i*d.D:(i+1)*d.D]...), 1)
		for j := range p {
			for k := j; k < p; k++ {
				M.SetSym(j, k, M.At(j, k)+row[j]*row[k]/float64(d.N))
			}
		}
	}
	var eig mat.EigenSym
	if !eig.Factorize(M, false) {
		t.Fatal("eigen decomposition failed")
	}
	vals := eig.Values(nil)
	return vals[len(vals)-1] + l2 + mu
}

// gradH recomputes grad h(w; a) = grad f(w) + mu (w - a) with a fresh model
// and returns it with its norm.
func gradH(m model.Model, d model.Data, w, a []float64, mu float64) ([]float64, float64) {
	g := make([]float64, m.NumParams())
	m.Clone().LossGrad(w, d, g)
	var ss float64
	for i := range g {
		g[i] += mu * (w[i] - a[i])
		ss += g[i] * g[i]
	}
	return g, math.Sqrt(ss)
}

func dist(a, b []float64) float64 {
	var ss float64
	for i := range a {
		ss += (a[i] - b[i]) * (a[i] - b[i])
	}
	return math.Sqrt(ss)
}

func randVec(rng *rand.Rand, p int, scale float64) []float64 {
	v := make([]float64, p)
	for i := range v {
		v[i] = scale * rng.NormFloat64()
	}
	return v
}

// logregData draws n samples of a softmax model over dim features and
// classes classes: x standard normal (shifted per class), labels sampled from
// the model's probabilities, so the classes overlap and the optimum is
// finite even without the L2 term.
func logregData(rng *rand.Rand, n, dim, classes int) model.Data {
	w := randVec(rng, dim*classes, 1/math.Sqrt(float64(dim)))
	d := model.Data{N: n, D: dim, X: make([]float64, n*dim), Y: make([]float64, n)}
	z := make([]float64, classes)
	for i := range n {
		x := d.X[i*dim : (i+1)*dim]
		for j := range x {
			x[j] = rng.NormFloat64()
		}
		var sum float64
		for k := range z {
			var s float64
			for j, v := range x {
				s += v * w[j*classes+k]
			}
			z[k] = math.Exp(2 * s)
			sum += z[k]
		}
		u := rng.Float64() * sum
		k := 0
		for ; k < classes-1 && u > z[k]; k++ {
			u -= z[k]
		}
		d.Y[i] = float64(k)
	}
	return d
}

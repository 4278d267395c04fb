package split

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"gonum.org/v1/gonum/mat"
)

// client is a least-squares site: f_j(w) = (1/(2 n_j))||A_j w - b_j||^2 + (lambda/2)||w||^2.
type client struct {
	a      *mat.Dense
	b      *mat.VecDense
	n      int
	lambda float64
}

// prox returns the exact argmin_w f_j(w) + (1/(2 step))||w - v||^2:
// (A'A/n + (lambda + 1/step) I)^-1 (A'b/n + v/step).
func (c client) prox(v []float64, step float64) ([]float64, error) {
	d := len(v)
	var h mat.Dense
	h.Mul(c.a.T(), c.a)
	h.Scale(1/float64(c.n), &h)
	for i := 0; i < d; i++ {
		h.Set(i, i, h.At(i, i)+c.lambda+1/step)
	}
	var rhs mat.VecDense
	rhs.MulVec(c.a.T(), c.b)
	rhs.ScaleVec(1/float64(c.n), &rhs)
	rhs.AddScaledVec(&rhs, 1/step, mat.NewVecDense(d, append([]float64(nil), v...)))
	var w mat.VecDense
	if err := w.SolveVec(&h, &rhs); err != nil {
		return nil, err
	}
	return w.RawVector().Data, nil
}

func federation(seed uint64, m, d int, lambda float64) []client {
	return federationSized(seed, m, d, lambda, 2, 5, 40)
}

// federationSized is federation with the sites' shifts drawn with standard
// deviation hetero (0: identically distributed sites) and each site's size
// from n0 + [0, spread).
func federationSized(seed uint64, m, d int, lambda, hetero float64, n0, spread int) []client {
	rng := rand.New(rand.NewPCG(seed, 1))
	cs := make([]client, m)
	for j := range cs {
		n := n0 + rng.IntN(spread) // unequal sizes: sample weighting matters
		a := mat.NewDense(n, d, nil)
		b := mat.NewVecDense(n, nil)
		shift := rng.NormFloat64() * hetero // heterogeneous sites
		for i := 0; i < n; i++ {
			for k := 0; k < d; k++ {
				a.Set(i, k, rng.NormFloat64()+shift)
			}
			b.SetVec(i, rng.NormFloat64()*3+shift)
		}
		cs[j] = client{a: a, b: b, n: n, lambda: lambda}
	}
	return cs
}

// pooledOptimum solves sum_j p_j grad f_j(w) = 0 with p_j = n_j / n.
func pooledOptimum(cs []client, d int) []float64 {
	h := mat.NewDense(d, d, nil)
	rhs := mat.NewVecDense(d, nil)
	var total float64
	for _, c := range cs {
		total += float64(c.n)
	}
	for _, c := range cs {
		var ata mat.Dense
		ata.Mul(c.a.T(), c.a)
		// p_j (A'A/n_j + lambda I) = (A'A + n_j lambda I) / n
		for i := 0; i < d; i++ {
			ata.Set(i, i, ata.At(i, i)+float64(c.n)*c.lambda)
		}
		h.Add(h, &ata)
		var atb mat.VecDense
		atb.MulVec(c.a.T(), c.b)
		rhs.AddVec(rhs, &atb)
	}
	h.Scale(1/total, h)
	rhs.ScaleVec(1/total, rhs)
	var w mat.VecDense
	if err := w.SolveVec(h, rhs); err != nil {
		panic(err)
	}
	return w.RawVector().Data
}

// With an exact prox, FedSplit's x^t converges to the minimiser of the
// sample-weighted pooled objective, for Peaceman-Rachford and
// Douglas-Rachford alike.
func TestConvergesToPooledOptimum(t *testing.T) {
	const m, d = 8, 5
	for _, tt := range []struct {
		name  string
		p     Params
		iters int
	}{
		{"peaceman-rachford", Params{Step: 0.5, Relax: 1}, 400},
		{"douglas-rachford", Params{Step: 0.5, Relax: 0.5}, 800},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cs := federation(3, m, d, 0.1)
			want := pooledOptimum(cs, d)
			total, x, zs := start(cs, d)
			for it := 0; it < tt.iters; it++ {
				for j, c := range cs {
					step := ClientStepSize(tt.p.Step, m, float64(c.n)/total)
					zNew, zHalf, err := ClientStep(x, zs[j], step, tt.p, c.prox)
					if err != nil {
						t.Fatal(err)
					}
					if len(zHalf) != d {
						t.Fatalf("zHalf has %d values", len(zHalf))
					}
					zs[j] = zNew
				}
				var err error
				if x, err = ServerStep(x, zs); err != nil {
					t.Fatal(err)
				}
			}
			var dist float64
			for i := range x {
				dist = math.Max(dist, math.Abs(x[i]-want[i]))
			}
			if dist > 1e-10 {
				t.Errorf("after %d rounds max |x - x*| = %.3e, want <= 1e-10", tt.iters, dist)
			}
		})
	}
}

func TestClientStepDoesNotModifyZ(t *testing.T) {
	x, z := []float64{1, 2}, []float64{3, 4}
	id := func(v []float64, _ float64) ([]float64, error) { return append([]float64(nil), v...), nil }
	zNew, zHalf, err := ClientStep(x, z, 1, Params{Step: 1, Relax: 1}, id)
	if err != nil {
		t.Fatal(err)
	}
	// v = 2x - z = (-1, 0); zHalf = v; zNew = z + 2 (v - x) = (3 - 4, 4 - 4).
	if z[0] != 3 || z[1] != 4 || zHalf[0] != -1 || zHalf[1] != 0 || zNew[0] != -1 || zNew[1] != 0 {
		t.Errorf("z %v, zHalf %v, zNew %v", z, zHalf, zNew)
	}
}

func TestErrors(t *testing.T) {
	id := func(v []float64, _ float64) ([]float64, error) { return v, nil }
	short := func(v []float64, _ float64) ([]float64, error) { return v[:1], nil }
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"zero step", Params{Step: 0, Relax: 1}.Validate(), "step size"},
		{"negative step", Params{Step: -1, Relax: 1}.Validate(), "step size"},
		{"infinite step", Params{Step: math.Inf(1), Relax: 1}.Validate(), "step size"},
		{"NaN step", Params{Step: math.NaN(), Relax: 1}.Validate(), "step size"},
		{"zero relax", Params{Step: 1, Relax: 0}.Validate(), "relaxation"},
		{"relax above one", Params{Step: 1, Relax: 1.5}.Validate(), "relaxation"},
		{"dimension", func() error { _, _, err := ClientStep([]float64{1}, []float64{1, 2}, 1, Params{1, 1}, id); return err }(), "dimensions"},
		{"prox dimension", func() error {
			_, _, err := ClientStep([]float64{1, 2}, []float64{1, 2}, 1, Params{1, 1}, short)
			return err
		}(), "prox returned"},
		{"no clients", func() error { _, err := ServerStep(nil, nil); return err }(), "no client"},
		{"ragged clients", func() error { _, err := ServerStep(nil, [][]float64{{1, 2}, {1}}); return err }(), "client 1"},
	}
	for _, tt := range tests {
		if tt.err == nil || !strings.Contains(tt.err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want it to mention %q", tt.name, tt.err, tt.want)
		}
	}
	if err := (Params{Step: 2, Relax: 0.5}).Validate(); err != nil {
		t.Errorf("valid params rejected: %v", err)
	}
}

// start is a FedSplit federation's starting point: the clients' total
// sample count, x = 0 in dimension d and every client's z = x.
func start(cs []client, d int) (total float64, x []float64, zs [][]float64) {
	for _, c := range cs {
		total += float64(c.n)
	}
	x = make([]float64, d)
	zs = make([][]float64, len(cs))
	for j := range zs {
		zs[j] = make([]float64, d)
	}
	return total, x, zs
}

package uplink

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/proto/secagg"
)

// TestSecAggSumExact: sum mode under secure aggregation, both sides,
// without DP: sites join in different rounds (against x on the grid), send
// their quantised deltas, some are left out of a round's sum (not in U3:
// their records do not advance); after every round S is exactly the sum
// of the counted sites' records, bit for bit, every record is on the
// grid, and a site's record is within the quantiser's resolution of its z
// once its delta fits the clip (error feedback).
func TestSecAggSumExact(t *testing.T) {
	const dim, sites, rounds = 6, 5, 12
	q, err := secagg.NewQuantizer(2, 20, sites)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	st := &SumState{}
	x := make([]float64, dim)
	for i := range x {
		x[i] = rng.NormFloat64() / 3 // off the grid
	}
	recs := make([]*Record, sites)
	z := make([][]float64, sites)
	for r := uint64(1); r <= rounds; r++ {
		var inputs [][]uint32
		var joins []Joiner
		pend := map[int]Pending{}
		for j := range sites {
			if r == 1 && j >= 3 { // sites 3 and 4 join later
				continue
			}
			z[j] = make([]float64, dim)
			for i := range z[j] {
				z[j][i] = math.Sin(float64(j+1)*float64(i+1)) + rng.NormFloat64()*0.01
			}
			in, p, err := SecAggSumInput(q, SumUpdate{Round: r, Z: z[j], Global: x, Record: recs[j]}, nil, streams.Reader(rand.New(rand.NewPCG(r, uint64(j)))))
			if err != nil {
				t.Fatal(err)
			}
			if p.Join != (recs[j] == nil) {
				t.Fatalf("round %d site %d: join %v with record %v", r, j, p.Join, recs[j])
			}
			if r%4 == 2 && j == 1 {
				continue // a dropout: not in U3, its record stays
			}
			inputs = append(inputs, in)
			pend[j] = p
			if p.Join {
				joins = append(joins, Joiner{Client: string(rune('a' + j))})
			}
		}
		next, err := SecAggSumClose(q, st, r, x, SecAggPlainSum(inputs, dim), joins)
		if err != nil {
			t.Fatalf("round %d: %v", r, err)
		}
		for j, p := range pend {
			if recs[j], err = Advance(recs[j], r, p); err != nil {
				t.Fatal(err)
			}
		}
		want := make([]float64, dim)
		counted := 0
		for _, rec := range recs {
			if rec == nil {
				continue
			}
			counted++
			for i, v := range rec.C {
				if g := math.Ldexp(v, q.ScaleBits); g != math.Trunc(g) {
					t.Fatalf("round %d: a record is off the grid: %v", r, v)
				}
				want[i] += v
			}
		}
		if !slices.Equal(st.S, want) || st.M != uint64(counted) {
			t.Fatalf("round %d: S %v (m %d), the records sum to %v (%d counted)", r, st.S, st.M, want, counted)
		}
		for i := range next {
			if next[i] != st.S[i]/float64(st.M) {
				t.Fatalf("round %d: x = %v, not S/m", r, next)
			}
		}
		x = next
	}
	for j, rec := range recs {
		for i := range rec.C {
			if d := math.Abs(rec.C[i] - z[j][i]); d > math.Ldexp(1, -q.ScaleBits) {
				t.Errorf("site %d: its record is %g from its z at %d, more than the resolution", j, d, i)
			}
		}
	}
}

// TestSecAggSumDP: under distributed DP the record advances by the clipped
// delta (plus x on the grid for a join), without the noise, which only the
// sum carries; the delta is clipped below C by the rounding's margin.
func TestSecAggSumDP(t *testing.T) {
	q, err := secagg.NewQuantizer(SecAggDPRange(1, 1, 2), 16, 3)
	if err != nil {
		t.Fatal(err)
	}
	x := []float64{0.3, -0.2, 0.1, 0.05}
	z := []float64{3, -2, 1, 0.5}
	var key [32]byte
	d := &SecAggDP{Clip: 1, Std: dp.SiteStd(1, 1, 2), Noise: dp.NoiseRand(key, 1)}
	in, p, err := SecAggSumInput(q, SumUpdate{Round: 1, Z: z, Global: x}, d, streams.Reader(rand.New(rand.NewPCG(3, 4))))
	if err != nil {
		t.Fatal(err)
	}
	xg := SecAggGrid(q, x)
	var norm2 float64
	for i := range p.V {
		u := p.V[i] - xg[i]
		norm2 += u * u
	}
	if c := 1 - 2*math.Ldexp(1, -q.ScaleBits); math.Sqrt(norm2) > c+1e-12 || !p.Join {
		t.Fatalf("pending %+v: delta norm %g, want the clip %g", p, math.Sqrt(norm2), c)
	}
	noisy := q.Dequantize(in)
	same := true
	for i := range noisy {
		same = same && math.Abs(noisy[i]-(p.V[i]-xg[i])) < math.Ldexp(1, -q.ScaleBits)
	}
	if same {
		t.Fatal("the input carries no noise")
	}
}

// TestSecAggSumCloseRefuses: an S off the grid (not this run's) and one
// past float64's exact range are refused, and S is left as it was.
func TestSecAggSumCloseRefuses(t *testing.T) {
	q, err := secagg.NewQuantizer(0.5, 30, 2)
	if err != nil {
		t.Fatal(err)
	}
	sum := []uint32{1, 2}
	for name, s := range map[string][]float64{"off the grid": {0.1, 0}, "too large": {math.Ldexp(1, 23), 0}} {
		st := &SumState{S: slices.Clone(s), M: 1}
		if _, err := SecAggSumClose(q, st, 2, []float64{0, 0}, sum, nil); err == nil || !slices.Equal(st.S, s) || st.M != 1 {
			t.Errorf("%s: %v, state %+v", name, err, st)
		}
	}
}

package uplink

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// TestControlInvariant: over every codec and several rounds of partial
// participation, the server's c stays the mean of the sites' c_i (each
// site keeping c_i plus its decoded delta, the server adding the decoded
// deltas over N): what a codec drops is dropped on both sides alike.
func TestControlInvariant(t *testing.T) {
	const sites = 5
	for _, spec := range codecs {
		t.Run(spec, func(t *testing.T) {
			cd := codec(t, spec)
			rng := rand.New(rand.NewPCG(7, 8))
			c := make([]float64, dim)
			ci := make([][]float64, sites) // nil: a site not yet counted
			for round := range 6 {
				var deltas [][]float64
				for s := range sites {
					if (s+round)%2 == 0 {
						continue // not selected
					}
					x, y := randVec(rng, 1), randVec(rng, 1)
					d, err := ControlDelta(c, x, y, 1+s, 0.1)
					if err != nil {
						t.Fatal(err)
					}
					payload, next, err := EncodeControl(cd, ci[s], d, rng)
					if err != nil {
						t.Fatal(err)
					}
					got, err := cd.Decode(payload, nil) // the aggregator's side
					if err != nil {
						t.Fatal(err)
					}
					deltas = append(deltas, got)
					ci[s] = next
				}
				var err error
				if c, err = NextControl(c, deltas, sites); err != nil {
					t.Fatal(err)
				}
				for k := range c {
					var mean float64
					for s := range sites {
						if ci[s] != nil {
							mean += ci[s][k]
						}
					}
					mean /= sites
					if math.Abs(mean-c[k]) > 1e-9*(1+math.Abs(c[k])) {
						t.Fatalf("round %d: c[%d] = %v, the sites' mean %v", round, k, c[k], mean)
					}
				}
			}
		})
	}
}

// TestControlDelta: delta c = (x - y)/(K lr) - c for the K steps taken;
// none taken (a solve stopped before its first step) changes nothing.
func TestControlDelta(t *testing.T) {
	c, x, y := []float64{1, -2}, []float64{0.5, 0.5}, []float64{0.3, 0.9}
	for _, tc := range []struct {
		steps int
		want  []float64
	}{
		{0, []float64{0, 0}},
		{1, []float64{(0.5-0.3)/0.1 - 1, (0.5-0.9)/0.1 + 2}},
		{4, []float64{(0.5-0.3)/0.4 - 1, (0.5-0.9)/0.4 + 2}},
	} {
		d, err := ControlDelta(c, x, y, tc.steps, 0.1)
		if err != nil {
			t.Fatal(err)
		}
		for k := range d {
			if math.Abs(d[k]-tc.want[k]) > 1e-12 {
				t.Fatalf("steps %d: delta = %v, want %v", tc.steps, d, tc.want)
			}
		}
	}
	if _, err := ControlDelta(c, x, y[:1], 1, 0.1); err == nil {
		t.Fatal("mismatched lengths: no error")
	}
	if _, err := NextControl(c, [][]float64{{1}}, 3); !errors.Is(err, ErrControl) {
		t.Fatalf("a delta of another length: %v, want ErrControl", err)
	}
}

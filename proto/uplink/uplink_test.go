package uplink

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/proto/wire"
)

// codecs covers every stage: lossless, half precision, linear and
// stochastic quantisation, top-k, and the dct and ac stages (12 values as a
// 2x2 image of 3 channels).
var codecs = []string{"fp32", "fp16", "q8", "qsgd:4:b=4", "topk:0.25+q8", "dct:2x2x3+topk:0.3+q4+ac"}

const dim = 12

func codec(t *testing.T, spec string) *quant.Codec {
	t.Helper()
	c, err := quant.Parse(spec)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func randVec(rng *rand.Rand, scale float64) []float64 {
	v := make([]float64, dim)
	for i := range v {
		v[i] = scale * rng.NormFloat64()
	}
	return v
}

// aggregator is the server side as the aggregator runs it: the frame
// decoded by its own codec, then Receive against its own copies.
type aggregator struct {
	codec  *quant.Codec
	copies map[string]*Copy
}

func (a *aggregator) receive(t *testing.T, site string, round uint64, f Frame, x []float64) []float64 {
	t.Helper()
	d, err := a.codec.Decode(f.Payload, nil)
	if err != nil {
		t.Fatal(err)
	}
	v, err := Receive(f.Header, d, x, a.copies[site])
	if err != nil {
		t.Fatalf("round %d: %v", round, err)
	}
	if f.Kind == wire.UpdateKind_UPDATE_KIND_Z_DELTA {
		a.copies[site] = &Copy{Round: round, Z: v}
	}
	return v
}

// Over many rounds and every codec, what the site expects the aggregator to
// hold (Frame.Applied) is bit for bit what the aggregator computes from the
// frame alone, in both families; the site's record of the copy and the
// aggregator's copy stay identical.
func TestSiteAndAggregatorAgree(t *testing.T) {
	for _, spec := range codecs {
		for _, split := range []bool{false, true} {
			name := spec + "/fedprox"
			if split {
				name = spec + "/fedsplit"
			}
			t.Run(name, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(1, 2))
				site := codec(t, spec)
				agg := &aggregator{codec: codec(t, "fp32"), copies: map[string]*Copy{}}
				x := make([]float64, dim)
				z := slices.Clone(x)
				var residual []float64
				var cp *Copy
				for round := uint64(1); round <= 20; round++ {
					sent := randVec(rng, 1)
					if split {
						for i := range z {
							z[i] += 0.1 * sent[i]
						}
						sent = z
					}
					f, err := Encode(site, Update{Split: split, Round: round, Sent: sent, Global: x, Residual: residual, Copy: cp},
						rand.New(rand.NewPCG(round, 3)))
					if err != nil {
						t.Fatal(err)
					}
					got := agg.receive(t, "s", round, f, x)
					if !bitsEqual(got, f.Applied) {
						t.Fatalf("round %d: the aggregator holds %v, the site expects %v", round, got, f.Applied)
					}
					if split {
						if f.Kind != wire.UpdateKind_UPDATE_KIND_Z_DELTA || (round == 1) != (f.BaseRound == 0) || f.Residual != nil {
							t.Fatalf("round %d: header %+v, residual %v", round, f.Header, f.Residual)
						}
						cp = &Copy{Round: round, Z: f.Applied}
					} else {
						if f.Kind != wire.UpdateKind_UPDATE_KIND_DELTA || f.BaseRound != 0 {
							t.Fatalf("round %d: header %+v", round, f.Header)
						}
						if (f.Residual == nil) != (spec == "fp32") {
							t.Fatalf("round %d: residual %v with %s (only the lossless codec keeps none)", round, f.Residual, spec)
						}
						residual = f.Residual
						x = f.Applied // one site: the mean is its w
					}
				}
			})
		}
	}
}

func bitsEqual(a, b []float64) bool {
	return slices.EqualFunc(a, b, func(x, y float64) bool { return math.Float64bits(x) == math.Float64bits(y) })
}

// Error feedback: with a lossy codec, what arrives plus the new residual is
// what was meant (delta plus the old residual), to rounding; a residual of
// another length counts as none; the caller's residual is not written.
func TestResidualKeepsWhatWasNotSent(t *testing.T) {
	c := codec(t, "topk:0.25+q8")
	rng := rand.New(rand.NewPCG(4, 5))
	x, w, old := randVec(rng, 1), randVec(rng, 1), randVec(rng, 0.1)
	keep := slices.Clone(old)
	f, err := Encode(c, Update{Round: 3, Sent: w, Global: x, Residual: old}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(old, keep) {
		t.Fatal("Encode wrote the caller's residual")
	}
	for i := range w {
		meant := w[i] - x[i] + old[i]
		got := f.Applied[i] - x[i] + f.Residual[i]
		if math.Abs(meant-got) > 1e-12 {
			t.Fatalf("value %d: meant %v, arrived + residual %v", i, meant, got)
		}
	}
	none, err := Encode(c, Update{Round: 3, Sent: w, Global: x}, nil)
	if err != nil {
		t.Fatal(err)
	}
	other, err := Encode(c, Update{Round: 3, Sent: w, Global: x, Residual: make([]float64, dim+1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(none.Payload, other.Payload) || !bitsEqual(none.Residual, other.Residual) {
		t.Fatal("a residual of another length is not taken as none")
	}
}

// The FedSplit base-round rules: a copy of an earlier round and the model's
// dimension is the base; a copy of this round or a later one, or of another
// dimension, is not used (the delta is against x with base round 0); no copy
// is not a warning.
func TestCopyRules(t *testing.T) {
	c := codec(t, "q8")
	rng := rand.New(rand.NewPCG(6, 7))
	x, z := randVec(rng, 1), randVec(rng, 1)
	for _, tc := range []struct {
		name   string
		cp     *Copy
		base   uint64
		unused bool
	}{
		{"none", nil, 0, false},
		{"earlier", &Copy{Round: 4, Z: randVec(rng, 1)}, 4, false},
		{"this round", &Copy{Round: 5, Z: randVec(rng, 1)}, 0, true},
		{"later", &Copy{Round: 9, Z: randVec(rng, 1)}, 0, true},
		{"other dimension", &Copy{Round: 2, Z: make([]float64, dim-1)}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var keep []float64
			if tc.cp != nil {
				keep = slices.Clone(tc.cp.Z)
			}
			f, err := Encode(c, Update{Split: true, Round: 5, Sent: z, Global: x, Copy: tc.cp}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if f.Kind != wire.UpdateKind_UPDATE_KIND_Z_DELTA || f.BaseRound != tc.base || f.CopyUnused != tc.unused {
				t.Fatalf("header %+v, copy unused %v; want base round %d, unused %v", f.Header, f.CopyUnused, tc.base, tc.unused)
			}
			if tc.cp != nil && !slices.Equal(tc.cp.Z, keep) {
				t.Fatal("Encode wrote the copy")
			}
			want := BaseGlobal
			if tc.base > 0 {
				want = BaseCopy
			}
			if BaseOf(f.Header) != want {
				t.Fatalf("BaseOf %v, want %v", BaseOf(f.Header), want)
			}
		})
	}
}

// The aggregator's base-round check: a Z_DELTA against a copy it does not
// hold, holds for another round, holds with another dimension, or holds
// damaged is ErrBaseMismatch, with the receipt's wording.
func TestReceiveBaseRoundCheck(t *testing.T) {
	d := make([]float64, dim)
	h := Header{Kind: wire.UpdateKind_UPDATE_KIND_Z_DELTA, BaseRound: 3}
	for _, tc := range []struct {
		name string
		held *Copy
		want string
	}{
		{"none", nil, "base round mismatch: a delta against the copy of round 3, this server holds none"},
		{"other round", &Copy{Round: 4, Z: make([]float64, dim)}, "base round mismatch: a delta against the copy of round 3, this server holds round 4's"},
		{"other dimension", &Copy{Round: 3, Z: make([]float64, dim+1)}, "base round mismatch: a delta against the copy of round 3, this server holds round 3's"},
	} {
		_, err := Receive(h, d, nil, tc.held)
		if !errors.Is(err, ErrBaseMismatch) || err.Error() != tc.want {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if err := DamagedCopy(3); !errors.Is(err, ErrBaseMismatch) || !strings.Contains(err.Error(), "round 3 is damaged") {
		t.Errorf("DamagedCopy: %v", err)
	}
	// A FULL vector is the model itself; base round 0 is the global model.
	full, err := Receive(Header{Kind: wire.UpdateKind_UPDATE_KIND_FULL}, d, nil, nil)
	if err != nil || &full[0] != &d[0] {
		t.Errorf("FULL: %v", err)
	}
	x := make([]float64, dim)
	x[0] = 2
	d[0] = 0.5
	got, err := Receive(Header{Kind: wire.UpdateKind_UPDATE_KIND_Z_DELTA}, d, x, &Copy{Round: 3, Z: make([]float64, dim)})
	if err != nil || got[0] != 2.5 {
		t.Errorf("base round 0: %v %v, want x + d", got, err)
	}
	if _, err := Receive(Header{Kind: wire.UpdateKind_UPDATE_KIND_DELTA}, d, x[:dim-1], nil); err == nil {
		t.Error("a global model of another dimension was accepted")
	}
}

// Tamper changes the delta before it is encoded, and the site's record
// follows what was sent.
func TestTamper(t *testing.T) {
	c := codec(t, "fp32")
	x := make([]float64, dim)
	w := make([]float64, dim)
	w[0] = 1
	f, err := Encode(c, Update{Round: 1, Sent: w, Global: x, Tamper: func(d []float64) {
		for i := range d {
			d[i] *= 1000
		}
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.Applied[0] != 1000 || w[0] != 1 {
		t.Fatalf("applied %v, sent %v", f.Applied[0], w[0])
	}
}

// Errors: a vector that is not the global model's length, and a codec
// failure (qsgd needs its random stream), leave nothing half done.
func TestEncodeErrors(t *testing.T) {
	x := make([]float64, dim)
	if _, err := Encode(codec(t, "fp32"), Update{Round: 1, Sent: make([]float64, dim+1), Global: x}, nil); err == nil {
		t.Error("a vector longer than the global model was encoded")
	}
	f, err := Encode(codec(t, "qsgd:4"), Update{Round: 1, Sent: make([]float64, dim), Global: x}, nil)
	if !errors.Is(err, quant.ErrInput) || f.Payload != nil {
		t.Errorf("qsgd without a random stream: %v, frame %v", err, f.Payload)
	}
}

package agent

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/wire"
	"github.com/edgefl/edgefl/testkit"
)

const (
	testFed     = "ward7"
	testSite    = "site-a"
	testInputs  = 4
	testClasses = 3
	testDim     = (testInputs + 1) * testClasses // logreg: W and b
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// testData is a small, learnable multinomial problem, deterministic in seed.
func testData(seed uint64, n int) model.Data {
	rng := rand.New(rand.NewPCG(seed, 7))
	d := model.Data{N: n, D: testInputs, X: make([]float64, n*testInputs), Y: make([]float64, n)}
	for i := range n {
		c := i % testClasses
		for j := range testInputs {
			v := rng.NormFloat64()
			if j == c {
				v += 2
			}
			d.X[i*testInputs+j] = v
		}
		d.Y[i] = float64(c)
	}
	return d
}

func testSpec() *wire.ModelSpec {
	return &wire.ModelSpec{Kind: model.KindLogReg, Inputs: testInputs, Classes: testClasses, L2: 1e-3}
}

// frame encodes x with codec spec (fp32 by default).
func frame(t testing.TB, spec string, x []float64) []byte {
	t.Helper()
	if spec == "" {
		spec = "fp32"
	}
	c, err := quant.Parse(spec)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Encode(nil, x, nil, rand.New(rand.NewPCG(1, 1)))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func decodeFrame(t testing.TB, b []byte) []float64 {
	t.Helper()
	c, err := quant.Parse("fp32")
	if err != nil {
		t.Fatal(err)
	}
	v, err := c.Decode(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// nanFrame is a valid fp32+raw frame (checksum included) whose first value
// is NaN.
func nanFrame(t testing.TB, dim int) []byte {
	t.Helper()
	b := frame(t, "fp32+raw", make([]float64, dim))
	// fp32 values are byte-plane shuffled: byte k of value 0 is at 32 + k*dim.
	nan := math.Float32bits(float32(math.NaN()))
	for k := range 4 {
		b[32+k*dim] = byte(nan >> (8 * k))
	}
	end := len(b) - 4
	binary.LittleEndian.PutUint32(b[end:], crc32.Checksum(b[:end], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

func testGlobal(round uint64) []float64 {
	x := make([]float64, testDim)
	for i := range x {
		x[i] = 0.01 * float64(int(round)*(i%5)-2)
	}
	return x
}

// announce builds a round announcement of the test federation.
func announce(t testing.TB, round uint64, algo string, x []float64) *wire.RoundAnnouncement {
	t.Helper()
	return &wire.RoundAnnouncement{
		Federation:  testFed,
		Round:       round,
		Algorithm:   algo,
		Params:      &wire.Params{Mu: 0.1, Step: 1, Relax: 1, Solver: proxsolver.LBFGS, Gamma: 1e-4},
		Model:       testSpec(),
		Budget:      &wire.WorkBudget{MaxEpochs: 30},
		Global:      &wire.Vector{Codec: "fp32", Dimension: uint32(len(x)), Payload: frame(t, "", x)},
		UplinkCodec: "fp32",
	}
}

func openStore(t testing.TB, path string) *edgestore.EdgeStore {
	t.Helper()
	s, err := edgestore.OpenEdge(path, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newHandler returns a handler over a fresh store in t.TempDir().
func newHandler(t testing.TB) (*RoundHandler, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "edge.db")
	s := openStore(t, path)
	t.Cleanup(func() { s.Close() })
	if _, err := s.InitIdentity(testSite, t0); err != nil {
		t.Fatal(err)
	}
	return &RoundHandler{
		ClientID: testSite, Federation: testFed, Store: s, Data: testData(1, 90),
		Clock: clock.NewFake(t0), Seed: 3, Log: testkit.Logger(t),
	}, path
}

// edgeState is everything a round may change in the store.
type edgeState struct {
	seen, applied uint64
	globalRound   uint64
	global        []float64
	zRound        uint64
	z             []float64
	serverZRound  uint64
	serverZ       []float64
	outbox        []edgestore.OutboxEntry
}

func snapshot(t testing.TB, s *edgestore.EdgeStore) edgeState {
	t.Helper()
	var st edgeState
	var err error
	if st.seen, err = s.SeenRound(); err != nil {
		t.Fatal(err)
	}
	if st.applied, err = s.AppliedRound(); err != nil {
		t.Fatal(err)
	}
	if st.globalRound, st.global, err = s.Global(); err != nil && !errors.Is(err, storage.ErrNotFound) {
		t.Fatal(err)
	}
	if st.zRound, st.z, err = s.Z(); err != nil && !errors.Is(err, storage.ErrNotFound) {
		t.Fatal(err)
	}
	if st.serverZRound, st.serverZ, err = s.ServerZ(); err != nil && !errors.Is(err, storage.ErrNotFound) {
		t.Fatal(err)
	}
	if st.outbox, err = s.Outbox(); err != nil {
		t.Fatal(err)
	}
	return st
}

func (a edgeState) equal(b edgeState) bool {
	if a.seen != b.seen || a.applied != b.applied || a.globalRound != b.globalRound || a.zRound != b.zRound ||
		!slices.Equal(a.global, b.global) || !slices.Equal(a.z, b.z) || len(a.outbox) != len(b.outbox) ||
		a.serverZRound != b.serverZRound || !slices.Equal(a.serverZ, b.serverZ) {
		return false
	}
	for i := range a.outbox {
		if a.outbox[i].Round != b.outbox[i].Round || !slices.Equal(a.outbox[i].Msg, b.outbox[i].Msg) {
			return false
		}
	}
	return true
}

// f32 is what an fp32 frame carries for x.
func f32(x []float64) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(float32(v))
	}
	return out
}

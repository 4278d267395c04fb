package agent

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/proto/wire"
)

// lossyCodec keeps 3 of the 15 test parameters, at 8 bits.
const lossyCodec = "topk:0.2+q8"

// lossyCodecs are lossyCodec and one with every newer stage: the 4 inputs
// as a 2×2 image of 3 classes through a DCT, 4-bit values, the range coder.
var lossyCodecs = []string{lossyCodec, "dct:2x2x3+topk:0.3+q4+ac"}

func decodeAny(t testing.TB, msg []byte) (*wire.ClientUpdate, []float64) {
	t.Helper()
	u, err := wire.DecodeUpdate(msg, wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := quant.Parse("fp32") // any codec decodes any frame
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.Decode(u.Vector.Payload, nil)
	if err != nil {
		t.Fatal(err)
	}
	return u, d
}

func maxAbsDiff(a, b []float64) float64 {
	m := 0.0
	for i := range a {
		m = max(m, math.Abs(a[i]-b[i]))
	}
	return m
}

// FedSplit over a lossy codec: the aggregator's copy of z_j, rebuilt here
// from the published frames alone (copy + decoded delta), equals the site's
// stored copy bit for bit every round, across a restart of the site; and
// since what a frame leaves out stays in z_j - copy, the copy catches up
// with z_j as the federation (one site: x = its copy) converges.
func TestFedSplitCopyTracksZOverALossyCodec(t *testing.T) {
	for _, codec := range lossyCodecs {
		t.Run(codec, func(t *testing.T) { testFedSplitCopyTracksZ(t, codec) })
	}
}

func testFedSplitCopyTracksZ(t *testing.T, codec string) {
	h, path := newHandler(t)
	x := f32(testGlobal(1))
	var aggCopy []float64
	var aggRound uint64
	var gaps []float64
	const rounds = 60
	for round := uint64(1); round <= rounds; round++ {
		if round == 30 { // a power cut: a new handler on the same file
			h.Store.Close()
			s := openStore(t, path)
			t.Cleanup(func() { s.Close() })
			h = &RoundHandler{ClientID: testSite, Federation: testFed, Store: s, Data: h.Data, Clock: h.Clock, Seed: h.Seed, Log: h.Log}
		}
		ann := announce(t, round, AlgoFedSplit, x)
		ann.UplinkCodec, ann.Params.Step, ann.Params.Gamma = codec, 5, 1e-8
		ann.Model.L2 = 0.1 // strongly convex: z_j has a fixed point to reach
		res, err := h.Handle(context.Background(), ann)
		if err != nil || res.Action != ActionSolved {
			t.Fatalf("round %d: %v %v", round, res.Action, err)
		}
		u, d := decodeAny(t, res.Msg)
		if u.Kind != wire.UpdateKind_UPDATE_KIND_Z_DELTA || u.BaseRound != aggRound {
			t.Fatalf("round %d: kind %v base round %d, the aggregator holds the copy of round %d", round, u.Kind, u.BaseRound, aggRound)
		}
		base := aggCopy
		if u.BaseRound == 0 {
			base = x
		}
		aggCopy, aggRound = plus(base, d), round
		st := snapshot(t, h.Store)
		if st.serverZRound != round || !slices.Equal(st.serverZ, aggCopy) || !slices.Equal(res.Sent, aggCopy) {
			t.Fatalf("round %d: the site's copy (round %d) differs from the aggregator's", round, st.serverZRound)
		}
		gaps = append(gaps, maxAbsDiff(st.z, aggCopy))
		x = f32(aggCopy) // the server step with one site, sent as fp32
		if _, err := h.Store.Ack(round); err != nil {
			t.Fatal(err)
		}
	}
	st := snapshot(t, h.Store)
	zMax := maxAbsDiff(st.z, make([]float64, len(st.z)))
	t.Logf("max |z - copy| at rounds 1, 10, 30, 60: %.3g %.3g %.3g %.3g (max |z| %.3g)", gaps[0], gaps[9], gaps[29], gaps[rounds-1], zMax)
	if gaps[0] == 0 {
		t.Fatal("the codec sent z exactly in round 1: the test needs a lossy codec")
	}
	if last := gaps[rounds-1]; last > 1e-6*zMax {
		t.Fatalf("after %d rounds the copy is still %.3g from z (round 1: %.3g, max |z| %.3g)", rounds, last, gaps[0], zMax)
	}
}

// FedProx over a lossy codec with error feedback: after T rounds the sum of
// what the aggregator received plus the site's stored residual is the sum
// of the true deltas w - x.
func TestFedProxResidualKeepsWhatWasNotSent(t *testing.T) {
	h, _ := newHandler(t)
	x := f32(testGlobal(1))
	cfg := proxsolver.Config{Solver: proxsolver.LBFGS, Mu: 0.1, Gamma: 1e-4}
	w, _, err := proxsolver.Solve(context.Background(), mustModel(t), h.Data, x, nil, cfg,
		proxsolver.Budget{MaxEpochs: 30, Deadline: t0.Add(time.Hour), Clock: clock.NewFake(t0)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const rounds = 8
	received := make([]float64, len(x))
	for round := uint64(1); round <= rounds; round++ {
		ann := announce(t, round, AlgoFedProx, x) // the same x: the same w every round
		ann.UplinkCodec = lossyCodec
		res, err := h.Handle(context.Background(), ann)
		if err != nil || res.Action != ActionSolved {
			t.Fatalf("round %d: %v %v", round, res.Action, err)
		}
		u, d := decodeAny(t, res.Msg)
		if u.Kind != wire.UpdateKind_UPDATE_KIND_DELTA || u.BaseRound != 0 {
			t.Fatalf("round %d: kind %v base round %d", round, u.Kind, u.BaseRound)
		}
		if !slices.Equal(res.Sent, plus(x, d)) {
			t.Fatalf("round %d: Result.Sent is not x + the decoded delta", round)
		}
		for i := range d {
			received[i] += d[i]
		}
	}
	r, err := h.Store.Residual(edgestore.ResidualUplink)
	if err != nil {
		t.Fatal(err)
	}
	for i := range w {
		want := rounds * (w[i] - x[i])
		if got := received[i] + r[i]; math.Abs(got-want) > 1e-9*max(1, math.Abs(want)) {
			t.Fatalf("parameter %d: received %v + residual %v = %v, want the true deltas' sum %v", i, received[i], r[i], got, want)
		}
	}
	if slices.Equal(r, make([]float64, len(r))) {
		t.Fatal("the residual is zero: the codec was not lossy")
	}
}

package agent

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// sumAnnounce is a FedProx:FedSplit round in sum mode under central DP,
// with a fixed roster of 3 sites whose initial model is sumX0.
func sumAnnounce(t *testing.T, round uint64, x []float64, clip float64) *wire.RoundAnnouncement {
	ann := announce(t, round, AlgoFedProxSplit, x)
	ann.SplitSum = true
	ann.Dp = &wire.DPParams{Mode: wire.DPMode_DP_MODE_CENTRAL, ClipNorm: clip, NoiseMultiplier: 1, Delta: 1e-5}
	ann.SplitRoster = 3
	ann.SplitInitial = &wire.Vector{Codec: "fp32", Dimension: uint32(len(x)), Payload: frame(t, "", sumX0())}
	return ann
}

// sumX0 is the roster's initial model in sumAnnounce: another vector than
// any round's, so that a delta against the round's model shows.
func sumX0() []float64 { return f32(testGlobal(7)) }

// record is the store's sum-mode record (nil: none).
func record(t *testing.T, s *edgestore.EdgeStore) *uplink.Record {
	t.Helper()
	r, c, err := s.Contribution()
	if errors.Is(err, storage.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return &uplink.Record{Round: r, C: c}
}

// TestHandleSumMode walks a site through FedSplit's sum mode over a real
// bbolt file (docs/privacy.md, "FedSplit"): its first update joins
// (against x, base round 0), its record advances by exactly what the
// aggregator re-clipped only on an accepted receipt, and once for a
// duplicate receipt and across a kill between the commit and the receipt;
// the next round waits while an update is unreceipted; a rejected update's
// content goes out again in the next delta; every delta is within C.
func TestHandleSumMode(t *testing.T) {
	const c = 0.05
	h, path := newHandler(t)
	x1 := f32(testGlobal(1))
	res, err := h.Handle(context.Background(), sumAnnounce(t, 1, x1, c))
	if err != nil || res.Action != ActionSolved {
		t.Fatalf("round 1: %v, %v", res.Action, err)
	}
	_, d := decodeUpdate(t, res.Msg, wire.UpdateKind_UPDATE_KIND_SUM_DELTA, 0)
	if n := dp.Norm(d); n > c*(1+1e-6) {
		t.Fatalf("a delta of norm %v > C = %v", n, c)
	}
	if r := res.Update.Report; r.LocalLoss != 0 || r.AnchorLoss != 0 || r.AchievedGamma != 0 {
		t.Fatalf("report %v: the losses must be 0 under DP", r)
	}
	if err := uplink.Reclip(d, c); err != nil {
		t.Fatal(err)
	}
	join := plus(sumX0(), d)
	if !bitsEqual(res.Sent, join) || record(t, h.Store) != nil {
		t.Fatal("the first update's pending contribution is not x_0 + the re-clipped delta, or the record advanced before the receipt")
	}

	// Round 2 while round 1 is unreceipted: nothing solved or written.
	x2 := f32(testGlobal(2))
	before := snapshot(t, h.Store)
	if res, err := h.Handle(context.Background(), sumAnnounce(t, 2, x2, c)); err != nil || res.Action != ActionWaiting {
		t.Fatalf("round 2 before the receipt: %v, %v", res.Action, err)
	}
	if !before.equal(snapshot(t, h.Store)) {
		t.Fatal("a waiting round wrote to the store")
	}

	// kill -9 between the commit and the receipt: the file has it all.
	h.Store.Close()
	h.Store = openStore(t, path)
	t.Cleanup(func() { h.Store.Close() })
	acks := sumStore{h.Store}
	for range 2 { // STORED, then the re-send's DUPLICATE
		if _, err := acks.Ack(1); err != nil {
			t.Fatal(err)
		}
	}
	if rec := record(t, h.Store); rec == nil || rec.Round != 1 || !bitsEqual(rec.C, join) {
		t.Fatalf("record after the receipts: %+v, want round 1, x + d", rec)
	}

	// Round 2: a delta against the record, then rejected.
	res, err = h.Handle(context.Background(), sumAnnounce(t, 2, x2, c))
	if err != nil || res.Action != ActionSolved {
		t.Fatalf("round 2: %v, %v", res.Action, err)
	}
	_, d2 := decodeUpdate(t, res.Msg, wire.UpdateKind_UPDATE_KIND_SUM_DELTA, 1)
	if n := dp.Norm(d2); n > c*(1+1e-6) {
		t.Fatalf("round 2: a delta of norm %v > C", n)
	}
	_, z2, err := h.Store.Z()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Store.AckRejected(2); err != nil {
		t.Fatal(err)
	}
	if rec := record(t, h.Store); rec.Round != 1 {
		t.Fatalf("a rejected update advanced the record to round %d", rec.Round)
	}

	// Round 3: the delta is again against the record of round 1, so it
	// carries what round 2 did not deliver.
	res, err = h.Handle(context.Background(), sumAnnounce(t, 3, f32(testGlobal(3)), 1e3))
	if err != nil {
		t.Fatal(err)
	}
	_, d3 := decodeUpdate(t, res.Msg, wire.UpdateKind_UPDATE_KIND_SUM_DELTA, 1)
	_, z3, _ := h.Store.Z()
	for i := range d3 {
		if want := float64(float32(z3[i] - join[i])); d3[i] != want {
			t.Fatalf("round 3: delta[%d] = %v, want z_j - c_j = %v (z of round 2 was %v)", i, d3[i], want, z2[i])
		}
	}
	if _, err := acks.Ack(3); err != nil {
		t.Fatal(err)
	}
	if rec := record(t, h.Store); rec.Round != 3 || !bitsEqual(rec.C, plus(join, d3)) {
		t.Fatalf("record after round 3: %+v", rec)
	}
}

// TestHandleSumModeFixedRoster: under a fixed roster a site's z_j starts
// at x_0 and its first update is a delta against x_0 (the record the
// aggregator counted it with from round 1), not against the round's model;
// an announcement under central DP without a roster (an aggregator that
// counts a site when it is first drawn, publishing that round through m)
// is refused before anything is solved, and so is a bad initial model.
func TestHandleSumModeFixedRoster(t *testing.T) {
	h, _ := newHandler(t)
	x4 := f32(testGlobal(4))
	res, err := h.Handle(context.Background(), sumAnnounce(t, 4, x4, 1e3))
	if err != nil || res.Action != ActionSolved {
		t.Fatalf("round 4: %v, %v", res.Action, err)
	}
	_, d := decodeUpdate(t, res.Msg, wire.UpdateKind_UPDATE_KIND_SUM_DELTA, 0)
	_, z, err := h.Store.Z()
	if err != nil {
		t.Fatal(err)
	}
	for i := range d {
		if want := float64(float32(z[i] - sumX0()[i])); d[i] != want {
			t.Fatalf("delta[%d] = %v, want z_j - x_0 = %v", i, d[i], want)
		}
	}
	if !bitsEqual(res.Sent, plus(sumX0(), d)) {
		t.Fatal("the pending contribution is not x_0 + the delta")
	}
	for name, mod := range map[string]func(*wire.RoundAnnouncement){
		"no roster": func(a *wire.RoundAnnouncement) { a.SplitRoster, a.SplitInitial = 0, nil },
		"short x_0": func(a *wire.RoundAnnouncement) {
			a.SplitInitial.Dimension = 2
			a.SplitInitial.Payload = frame(t, "", []float64{1, 2})
		},
		"bad frame": func(a *wire.RoundAnnouncement) { a.SplitInitial.Payload = []byte{1, 2, 3} },
	} {
		h, _ := newHandler(t)
		ann := sumAnnounce(t, 1, f32(testGlobal(1)), 1)
		mod(ann)
		before := snapshot(t, h.Store)
		if res, err := h.Handle(context.Background(), ann); err == nil || res.Action == ActionSolved {
			t.Errorf("%s: %v, %v: not refused", name, res.Action, err)
		}
		if !before.equal(snapshot(t, h.Store)) {
			t.Errorf("%s: a refused round wrote to the store", name)
		}
	}
}

// TestHandleSplitDPNeedsSumMode: a FedSplit-family round under DP without
// sum mode is refused (the per-site copy of z_j is not privatised).
func TestHandleSplitDPNeedsSumMode(t *testing.T) {
	h, _ := newHandler(t)
	ann := sumAnnounce(t, 1, f32(testGlobal(1)), 1)
	ann.SplitSum, ann.SplitRoster, ann.SplitInitial = false, 0, nil
	if _, err := h.Handle(context.Background(), ann); err == nil || !strings.Contains(err.Error(), uplink.ErrSplitDP.Error()) {
		t.Fatalf("Handle = %v, want uplink.ErrSplitDP", err)
	}
}

// TestSessionDefersSumRound: a round the handler hands back (ActionWaiting)
// goes to the solver again when an update receipt comes, unless a newer
// announcement superseded it; an INTERNAL receipt keeps it waiting; when
// the receipt came while the handler looked, the round goes back at once.
func TestSessionDefersSumRound(t *testing.T) {
	h := newSessionHarness()
	s := h.s
	st := s.store.(*memStore)
	st.outbox[1] = []byte("u1")
	ann := &wire.RoundAnnouncement{Federation: testFed, Round: 2, RunId: "R"}
	h.carry(announced{ann})
	if acts := h.carry(idle{}); len(acts) == 0 || acts[len(acts)-1].kind != actStartSolve {
		t.Fatalf("idle: %+v", acts)
	}
	h.carry(solveDone{ann: ann, res: Result{Round: 2, Action: ActionWaiting}})
	if s.pending != nil || s.deferred != ann {
		t.Fatal("the waiting round is not deferred")
	}
	internal := &wire.Receipt{ClientId: testSite, Round: 1, Code: wire.ReceiptCode_RECEIPT_CODE_INTERNAL}
	h.carry(receiptArrived{internal})
	if s.pending != nil {
		t.Fatal("an INTERNAL receipt released the deferred round")
	}
	acts := h.carry(receiptArrived{&wire.Receipt{ClientId: testSite, Round: 1, Accepted: true, Code: wire.ReceiptCode_RECEIPT_CODE_STORED}})
	if s.pending != ann || s.deferred != nil || !slices.ContainsFunc(acts, func(a action) bool { return a.kind == actWake }) {
		t.Fatalf("the receipt did not hand the round back: pending %v, actions %+v", s.pending, acts)
	}
	// The receipt came while the handler looked: no wait.
	h.carry(idle{})
	acts = h.carry(solveDone{ann: ann, res: Result{Round: 2, Action: ActionWaiting}})
	if s.pending != ann || s.deferred != nil || !slices.ContainsFunc(acts, func(a action) bool { return a.kind == actWake }) {
		t.Fatalf("a round waiting for a receipt already handled was deferred: pending %v, actions %+v", s.pending, acts)
	}
	// Superseded by a newer round before the receipt.
	st.outbox[1] = []byte("u1")
	h.carry(idle{})
	h.carry(solveDone{ann: ann, res: Result{Round: 2, Action: ActionWaiting}})
	newer := &wire.RoundAnnouncement{Federation: testFed, Round: 3, RunId: "R"}
	h.carry(announced{newer})
	if s.deferred != nil || s.pending != newer {
		t.Fatal("a newer announcement did not supersede the deferred round")
	}
}

func bitsEqual(a, b []float64) bool {
	return len(a) > 0 && slices.EqualFunc(a, b, func(x, y float64) bool { return math.Float64bits(x) == math.Float64bits(y) })
}

package aggregator

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/proto/wire"
)

// TestServerScaffold: a scaffold federation announces c (zero in round
// 1), refuses an update without a usable control delta (a counter and a
// BAD_UPDATE receipt, the round untouched), ignores one of another run
// (a counter, no receipt), takes the mean of the
// updates as the next model, and announces the next c = c + (1/N) sum of
// the round's control deltas, N the three known sites (two selected).
func TestServerScaffold(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.Algorithm, cfg.K = AlgoScaffold, 2
	r := f.start(cfg)
	agents := map[string]*fakeAgent{}
	for _, id := range []string{"site-a", "site-b", "site-c"} {
		agents[id] = f.agent(id, 10)
	}
	ann := agents["site-a"].nextRound(t, 1)
	fp, _ := quant.Parse("fp32")
	if ann.Control == nil {
		t.Fatal("round 1 announces no control variate")
	}
	if c, err := fp.Decode(ann.Control.Payload, nil); err != nil || slices.ContainsFunc(c, func(v float64) bool { return v != 0 }) || len(c) != len(vec(0)) {
		t.Fatalf("round 1's c = %v, %v; want zeros", c, err)
	}
	if len(ann.Selected) != 2 {
		t.Fatalf("selected %v", ann.Selected)
	}
	first, second := agents[ann.Selected[0]], agents[ann.Selected[1]]
	withControl := func(id string, w, d []float64) *wire.ClientUpdate {
		u := update(t, id, 1, w, 10)
		u.RunId = ann.RunId
		if d != nil {
			u.ControlDelta = &wire.Vector{Codec: "fp32", Dimension: uint32(len(d)), Payload: fp32(t, d)}
		}
		return u
	}
	nan := vec(2)
	nan[1] = math.NaN()
	for _, tc := range []struct {
		name, reason string
		u            *wire.ClientUpdate
	}{
		{"no control delta", "no_control", withControl(first.id, vec(1), nil)},
		{"control delta of another dimension", "wrong_dimension", withControl(first.id, vec(1), []float64{1, 2})},
		{"non-finite control delta", "non_finite", func() *wire.ClientUpdate {
			u := withControl(first.id, vec(1), nil)
			u.ControlDelta = &wire.Vector{Codec: "fp32", Dimension: 6, Payload: rawFP32(nan)}
			return u
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := r.s.Watch()
			first.send(t, tc.u)
			wantReceipt(t, first.receipt(t), 1, false, wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE)
			waitView(t, r.s, "rejection "+tc.reason, func(v ServerView) bool { return v.Rejected[tc.reason] == before.Rejected[tc.reason]+1 })
		})
	}
	// An update of another run (re-sent from a site's outbox after a
	// rollback): counted and ignored, without a receipt (the next one the
	// site gets is its valid update's).
	before, _ := r.s.Watch()
	old := withControl(first.id, vec(5), vec(7))
	old.RunId = "a-run-rolled-back"
	first.send(t, old)
	waitView(t, r.s, "rejection other_run", func(v ServerView) bool { return v.Rejected["other_run"] == before.Rejected["other_run"]+1 })
	d1, d2 := vec(2), vec(-4)
	first.send(t, withControl(first.id, vec(1), d1))
	wantReceipt(t, first.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	second.send(t, withControl(second.id, vec(3), d2))
	wantReceipt(t, second.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	rr := r.round(t)
	if err := closeTo(rr.Global, vec(2), 1e-12); err != nil { // the mean of vec(1) and vec(3)
		t.Fatalf("model: %v", err)
	}
	ann2 := first.nextRound(t, 2)
	c, err := fp.Decode(ann2.Control.Payload, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]float64, len(d1))
	for i := range want {
		want[i] = (d1[i] + d2[i]) / 3 // N = 3 known sites, not the 2 that took part
	}
	if err := closeTo(c, want, 1e-6); err != nil {
		t.Fatalf("round 2's c: %v", err)
	}
}

// TestServerScaffoldLateReceipts: once a round has closed, a SCAFFOLD
// update the round log holds (a copy re-sent because its receipt was
// lost, after the site's later update) gets an accepted DUPLICATE receipt,
// as within the round, so that the site keeps the delta c the aggregator
// counted; a straggler's update the round closed without (quorum below 1),
// and a copy that differs from the stored one, are rejected STALE_ROUND,
// so that the site takes their delta c back out of c_i.
func TestServerScaffoldLateReceipts(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.Algorithm, cfg.QuorumFraction, cfg.Settle = AlgoScaffold, 2.0/3, time.Second
	r := f.start(cfg)
	a, b, c := f.agent("site-a", 10), f.agent("site-b", 10), f.agent("site-c", 10)
	waitView(t, r.s, "3 online", func(v ServerView) bool { return v.Online == 3 })
	f.clock.Advance(time.Second) // Settle
	ann := a.nextRound(t, 1)
	if len(ann.Selected) != 3 {
		t.Fatalf("selected %v", ann.Selected)
	}
	withControl := func(id string, round uint64, w, d []float64) *wire.ClientUpdate {
		u := update(t, id, round, w, 10)
		u.RunId = ann.RunId
		u.ControlDelta = &wire.Vector{Codec: "fp32", Dimension: uint32(len(d)), Payload: fp32(t, d)}
		return u
	}
	a1 := withControl("site-a", 1, vec(1), vec(2))
	a.send(t, a1)
	wantReceipt(t, a.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	b.send(t, withControl("site-b", 1, vec(3), vec(-4)))
	wantReceipt(t, b.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	f.clock.Advance(time.Minute) // the deadline: the quorum closes round 1 without site-c
	if rr := r.round(t); !slices.Equal(rr.Stragglers, []string{"site-c"}) {
		t.Fatalf("round 1: stragglers %v", rr.Stragglers)
	}
	f.clock.Advance(time.Second) // Settle before the next draw
	a.nextRound(t, 2)
	a.send(t, withControl("site-a", 2, vec(1), vec(1)))
	wantReceipt(t, a.receipt(t), 2, true, wire.ReceiptCode_RECEIPT_CODE_STORED)

	a.send(t, a1) // round 1's update again, after round 2's
	wantReceipt(t, a.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_DUPLICATE)
	c.send(t, withControl("site-c", 1, vec(9), vec(5))) // the straggler's, never counted
	wantReceipt(t, c.receipt(t), 1, false, wire.ReceiptCode_RECEIPT_CODE_STALE_ROUND)
	a.send(t, withControl("site-a", 1, vec(1), vec(3))) // not the copy stored
	wantReceipt(t, a.receipt(t), 1, false, wire.ReceiptCode_RECEIPT_CODE_STALE_ROUND)
}

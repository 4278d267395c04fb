package agent

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// scaffoldAnn is a SCAFFOLD announcement of round with global model x and
// control variate c, SGD for one epoch.
func scaffoldAnn(t *testing.T, round uint64, x, c []float64) *wire.RoundAnnouncement {
	ann := announce(t, round, AlgoScaffold, x)
	ann.Params.Solver, ann.Params.Lr, ann.Params.Batch, ann.Params.Gamma = proxsolver.SGD, 0.05, 16, 0
	ann.Budget.MaxEpochs = 1
	if c != nil {
		ann.Control = &wire.Vector{Codec: "fp32", Dimension: uint32(len(c)), Payload: frame(t, "", c)}
	}
	return ann
}

// TestCoreScaffold: a SCAFFOLD round commits c_i + the decoded delta c
// with its update, the update carries that delta c, computed from the
// steps the solve took; the next round's solve is shifted by c - c_i with
// the stored c_i. Refused, with nothing written: no control variate, one
// of another dimension, and a site forced to L-BFGS.
func TestCoreScaffold(t *testing.T) {
	sr, m := testRules(), &memState{}
	x := f32(testGlobal(1))
	c := make([]float64, len(x))
	for i := range c {
		c[i] = 0.01 * float64(i%7-3)
	}
	c = f32(c)
	res, _, err := stepRound(t, sr, m, scaffoldAnn(t, 1, x, c))
	if err != nil || res.Action != ActionSolved {
		t.Fatalf("%v %v", res.Action, err)
	}
	u := res.Update
	if u.ControlDelta == nil || m.control == nil {
		t.Fatalf("control delta sent: %v, c_i stored: %v", u.ControlDelta != nil, m.control != nil)
	}
	fp32, _ := quant.Parse("fp32")
	d, err := fp32.Decode(u.ControlDelta.Payload, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d, m.control) { // c_i was zero: the new c_i is the decoded delta
		t.Fatal("the stored c_i is not the decoded control delta")
	}
	// delta c from the steps taken: one epoch of 90 samples in batches of 16.
	y := res.Sent
	want, err := uplink.ControlDelta(c, x, y, 6, 0.05)
	if err != nil {
		t.Fatal(err)
	}
	if e := maxAbsDiff(want, d); e > 1e-5*(1+maxAbs(want)) {
		t.Fatalf("delta c differs from (x - y)/(K lr) - c with K = 6 by %g", e)
	}

	// The next round reads c_i back: the solve's shift is c - c_i.
	m.ack(1, false)
	pl := sr.round(m, scaffoldAnn(t, 2, x, c), testData(1, 90), false, t0, Result{Round: 2})
	if pl.err != nil || pl.solve == nil {
		t.Fatalf("round 2: %v", pl.err)
	}
	if !slices.Equal(pl.solve.work.Solver.Shift, uplink.Shift(c, m.control)) {
		t.Fatal("round 2's shift is not c - the stored c_i")
	}

	for _, tc := range []struct {
		name string
		ann  func() *wire.RoundAnnouncement
		sr   siteRules
	}{
		{"no control variate", func() *wire.RoundAnnouncement { return scaffoldAnn(t, 3, x, nil) }, sr},
		{"control of another dimension", func() *wire.RoundAnnouncement { return scaffoldAnn(t, 3, x, c[:5]) }, sr},
		{"lbfgs at the site", func() *wire.RoundAnnouncement { return scaffoldAnn(t, 3, x, c) }, func() siteRules {
			s := sr
			s.Local.Solver = proxsolver.LBFGS
			return s
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl := tc.sr.round(m, tc.ann(), testData(1, 90), false, t0, Result{Round: 3})
			if !errors.Is(pl.err, ErrBadAnnouncement) || len(pl.records) != 0 {
				t.Fatalf("err %v, records %v; want ErrBadAnnouncement and nothing written", pl.err, pl.records)
			}
		})
	}
}

// TestCoreScaffoldControlEpoch: in the round a rollback reopened (the
// announcement's control_epoch is the round), a site solves with c_i = 0
// whatever it has stored and commits c_i = 0 (the aggregator counts no
// delta c of that round), still sending its delta c and its run id; an
// epoch after the round is refused with nothing written.
func TestCoreScaffoldControlEpoch(t *testing.T) {
	sr, m := testRules(), &memState{}
	x := f32(testGlobal(1))
	c := make([]float64, len(x))
	for i := range c {
		c[i] = 0.02 * float64(i%5-2)
	}
	c = f32(c)
	first := scaffoldAnn(t, 1, x, c)
	first.RunId = "run-B"
	if res, _, err := stepRound(t, sr, m, first); err != nil || res.Action != ActionSolved || maxAbs(m.control) == 0 {
		t.Fatalf("round 1: %v %v, c_i %v", res.Action, err, m.control)
	}
	m.ack(1, false)
	ann := scaffoldAnn(t, 2, x, c)
	ann.RunId, ann.ControlEpoch = "run-B", 2
	pl := sr.round(m, ann, testData(1, 90), false, t0, Result{Round: 2})
	if pl.err != nil || pl.solve == nil {
		t.Fatalf("round 2: %v", pl.err)
	}
	if !slices.Equal(pl.solve.work.Solver.Shift, uplink.Shift(c, nil)) {
		t.Fatal("the epoch round's shift is not c - 0")
	}
	res, _, err := stepRound(t, sr, m, ann)
	if err != nil || res.Action != ActionSolved {
		t.Fatalf("round 2: %v %v", res.Action, err)
	}
	if len(m.control) != len(x) || maxAbs(m.control) != 0 {
		t.Fatalf("c_i after the epoch round: %d values, max |c_i| %g; want zeros", len(m.control), maxAbs(m.control))
	}
	if res.Update.ControlDelta == nil || res.Update.RunId != ann.RunId {
		t.Fatalf("update: control delta %v, run id %q (announced %q)", res.Update.ControlDelta != nil, res.Update.RunId, ann.RunId)
	}
	m.ack(2, false)
	bad := scaffoldAnn(t, 3, x, c)
	bad.RunId, bad.ControlEpoch = "run-B", 4
	if pl := sr.round(m, bad, testData(1, 90), false, t0, Result{Round: 3}); !errors.Is(pl.err, ErrBadAnnouncement) || len(pl.records) != 0 {
		t.Fatalf("epoch after the round: err %v, records %v", pl.err, pl.records)
	}
}

func maxAbs(a []float64) float64 {
	var m float64
	for _, v := range a {
		m = max(m, math.Abs(v))
	}
	return m
}

// ack is a receipt of round's update as edgestore.EdgeStore.Ack (accepted)
// or AckRejected applies it to SCAFFOLD's state: the outbox entry goes and
// a rejection puts back c_i as it was before the round.
func (m *memState) ack(round uint64, rejected bool) {
	n := len(m.outbox)
	m.outbox = slices.DeleteFunc(m.outbox, func(e edgestore.OutboxEntry) bool { return e.Round == round })
	if len(m.outbox) == n || m.controlUndo == nil || m.undoRound != round {
		return
	}
	if rejected {
		m.control = m.controlUndo
	}
	m.undoRound, m.controlUndo = 0, nil
}

// TestCoreScaffoldRejected: a SCAFFOLD site commits, with its update, c_i
// as it was before the round (the undo a rejection puts back), and answers
// the next round only once that update is receipted (ActionWaiting,
// nothing written): then no later commit builds on a delta c the
// aggregator may never count. After a rejection the next round solves
// with c_i back where it was, so c stays the mean of the c_i; after an
// accepted receipt, with the advanced c_i.
func TestCoreScaffoldRejected(t *testing.T) {
	x := f32(testGlobal(1))
	c := make([]float64, len(x))
	for i := range c {
		c[i] = 0.01 * float64(i%7-3)
	}
	c = f32(c)
	for _, rejected := range []bool{true, false} {
		t.Run(fmt.Sprintf("rejected=%v", rejected), func(t *testing.T) {
			sr, m := testRules(), &memState{}
			if res, _, err := stepRound(t, sr, m, scaffoldAnn(t, 1, x, c)); err != nil || res.Action != ActionSolved {
				t.Fatalf("round 1: %v %v", res.Action, err)
			}
			ci1 := slices.Clone(m.control)
			if m.undoRound != 1 || len(m.controlUndo) != len(x) || maxAbs(m.controlUndo) != 0 {
				t.Fatalf("round 1's undo: round %d, %d values, max %g; want round 1, zeros", m.undoRound, len(m.controlUndo), maxAbs(m.controlUndo))
			}
			res, recs, err := stepRound(t, sr, m, scaffoldAnn(t, 2, x, c))
			if err != nil || res.Action != ActionWaiting || res.Waiting != 1 {
				t.Fatalf("round 2 before round 1's receipt: %v (waiting for %d) %v; want waiting for 1", res.Action, res.Waiting, err)
			}
			if slices.ContainsFunc(recs, func(c change) bool { return c.kind == recCommit || c.kind == recGlobal }) || m.applied != 1 {
				t.Fatalf("round 2 wrote %v while waiting", recs)
			}
			m.ack(1, rejected)
			want := ci1
			if rejected {
				want = make([]float64, len(x))
			}
			pl := sr.round(m, scaffoldAnn(t, 2, x, c), testData(1, 90), false, t0, Result{Round: 2})
			if pl.err != nil || pl.solve == nil {
				t.Fatalf("round 2 after the receipt: %v", pl.err)
			}
			if !slices.Equal(pl.solve.work.Solver.Shift, uplink.Shift(c, want)) {
				t.Fatal("round 2's shift is not c - c_i as the receipt left it")
			}
			if res, _, err := stepRound(t, sr, m, scaffoldAnn(t, 2, x, c)); err != nil || res.Action != ActionSolved {
				t.Fatalf("round 2: %v %v", res.Action, err)
			}
			if m.undoRound != 2 || !slices.Equal(m.controlUndo, want) {
				t.Fatalf("round 2's undo is not c_i before round 2")
			}
		})
	}
}

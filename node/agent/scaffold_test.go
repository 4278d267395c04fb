package agent

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/quant"
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

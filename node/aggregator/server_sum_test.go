package aggregator

import (
	"errors"
	"github.com/edgefl/edgefl/node/aggstore"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/internal/metrics"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
	"github.com/edgefl/edgefl/testkit"
)

// sumDelta is a sum-mode update: a join (base 0) or a delta against the
// record of round base.
func sumDelta(t *testing.T, id string, round, base uint64, d []float64) *wire.ClientUpdate {
	u := update(t, id, round, d, 10)
	u.Kind, u.BaseRound = wire.UpdateKind_UPDATE_KIND_SUM_DELTA, base
	u.Report.AnchorLoss = 0
	return u
}

func scaled(v []float64, a float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = a * x
	}
	return out
}

// TestServerSumMode runs FedProx:FedSplit under central DP through the
// real server and a real state file (docs/privacy.md, "FedSplit"): the
// announcement says sum mode; the first updates join (S += x + delta,
// m += 1 each); a second join of a counted site is refused
// (BASE_MISMATCH; uplink's TestSumCheck has the rule) and changes nothing;
// a delta
// longer than C is re-clipped; the aggregator keeps no per-site z; after
// a restart with an update stored and receipted, its re-send is a
// DUPLICATE and the sum holds it once; S and m come back from the state
// file. The noise is negligible (z = 1e-9), so each model is checked
// against the plain sum.
func TestServerSumMode(t *testing.T) {
	const c = 2.0
	f := newFixture(t)
	cfg := f.config()
	cfg.K, cfg.Algorithm, cfg.Params.Step, cfg.Params.Relax = 2, AlgoFedProxSplit, 0.5, 1
	cfg.Init, cfg.InitSeed = InitModel, 3
	var logs *testkit.SyncBuffer
	cfg.Logger, logs = testkit.FailureLog(t, "the aggregator")
	cfg.DP = &dp.Config{Clip: c, Noise: 1e-9, Delta: 1e-5}
	r := f.start(cfg)
	a, b := f.agent("site-a", 10), f.agent("site-b", 10)
	ann := a.nextRound(t, 1)
	if !ann.SplitSum || ann.Dp == nil {
		t.Fatalf("round 1 announces split_sum %v, dp %v", ann.SplitSum, ann.Dp)
	}
	b.nextRound(t, 1)
	x1 := decodeGlobal(t, ann)
	// The roster (a and b, registered when round 1 was drawn) and x_0 are
	// announced: every site starts from x_0 whenever it is first drawn.
	if ann.SplitRoster != 2 || ann.SplitInitial == nil || !slices.Equal(decodeGlobal(t, &wire.RoundAnnouncement{Global: ann.SplitInitial}), x1) {
		t.Fatalf("round 1 announces a roster of %d, initial model %v", ann.SplitRoster, ann.SplitInitial)
	}
	da, db := scaled(vec(0), 0.1), scaled(vec(1), 0.1) // within C
	a.send(t, sumDelta(t, "site-a", 1, 0, da))
	wantReceipt(t, a.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	b.send(t, sumDelta(t, "site-b", 1, 0, db))
	wantReceipt(t, b.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	x2 := make([]float64, 6)
	for i := range x2 {
		x2[i] = x1[i] + (float64(float32(da[i]))+float64(float32(db[i])))/2
	}
	rr := r.round(t)
	if err := closeTo(rr.Global, x2, 1e-6); err != nil {
		t.Fatalf("x2: %v", err)
	}
	if rr.Metrics["split_counted"] != 2 || rr.Metrics["split_joined"] != 2 {
		t.Fatalf("round 1 metrics %v", rr.Metrics)
	}
	// A site first seen after round 1 was drawn is not on the roster: the
	// operator is told why it never gets a round.
	f.agent("site-c", 10)
	for {
		v, changed := r.s.Watch()
		if v.Clients >= 3 {
			break
		}
		select {
		case <-changed:
		case <-time.After(waitLong):
			t.Fatalf("the late site's status was not applied: %d clients", v.Clients)
		}
	}
	if l := logs.Lines("site not on this run's roster"); len(l) != 1 || !strings.Contains(l[0], "site-c") {
		t.Fatalf("the late site was not reported: %q", l)
	}

	// Round 2: a joins again (refused), then a delta far longer than C.
	a.nextRound(t, 2)
	b.nextRound(t, 2)
	a.send(t, sumDelta(t, "site-a", 2, 0, da))
	wantReceipt(t, a.receipt(t), 2, false, wire.ReceiptCode_RECEIPT_CODE_BASE_MISMATCH)
	long := scaled(vec(1), 100)
	a.send(t, sumDelta(t, "site-a", 2, 1, long))
	wantReceipt(t, a.receipt(t), 2, true, wire.ReceiptCode_RECEIPT_CODE_STORED)

	// The aggregator stops with a's update stored and receipted, and b's
	// not yet sent; a re-sends after the restart (its receipt lost).
	r.stop(t)
	r = f.start(cfg)
	a.send(t, sumDelta(t, "site-a", 2, 1, long))
	wantReceipt(t, a.receipt(t), 2, true, wire.ReceiptCode_RECEIPT_CODE_DUPLICATE)
	b.send(t, sumDelta(t, "site-b", 2, 1, db))
	wantReceipt(t, b.receipt(t), 2, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	clipped := f32s(long)
	if err := uplink.Reclip(clipped, c); err != nil {
		t.Fatal(err)
	}
	x3 := make([]float64, 6)
	for i := range x3 {
		x3[i] = rr.Global[i] + (clipped[i]+float64(float32(db[i])))/2
	}
	rr = r.round(t)
	if err := closeTo(rr.Global, x3, 1e-6); err != nil {
		t.Fatalf("x3 (a's re-clipped delta once): %v", err)
	}

	// A restart between rounds: S and m come back; zero deltas keep x.
	r.stop(t)
	r = f.start(cfg)
	a.nextRound(t, 3)
	a.send(t, sumDelta(t, "site-a", 3, 2, make([]float64, 6)))
	wantReceipt(t, a.answer(t, wire.ReceiptSubject_RECEIPT_SUBJECT_UPDATE, 3), 3, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	b.send(t, sumDelta(t, "site-b", 3, 2, make([]float64, 6)))
	wantReceipt(t, b.answer(t, wire.ReceiptSubject_RECEIPT_SUBJECT_UPDATE, 3), 3, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	if x4 := r.round(t).Global; closeTo(x4, x3, 1e-6) != nil {
		t.Fatalf("x4 = %v after zero deltas, want x3 = %v: S or m was not restored", x4, x3)
	}
	r.stop(t)

	st, err := aggstore.OpenAgg(cfg.StatePath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if zs, err := st.LatestZ(); err != nil || len(zs) != 0 {
		t.Fatalf("the aggregator kept per-site z: %d, %v", len(zs), err)
	}
	cur, err := st.CurrentRound()
	if err != nil {
		t.Fatal(err)
	}
	var sum uplink.SumState
	if err := sum.UnmarshalBinary(cur.Sum); err != nil || sum.M != 2 || len(sum.Members) != 2 {
		t.Fatalf("stored sum state: %+v, %v", sum, err)
	}
}

// TestServerSumModeRefusals: the robust server step and late updates are
// refused under DP; FedSplit itself is not.
func TestServerSumModeRefusals(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.Algorithm, cfg.Params.Step, cfg.Params.Relax = AlgoFedSplit, 0.5, 1
	cfg.DP = &dp.Config{Clip: 1, Noise: 1, Delta: 1e-5}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("fedsplit under DP: %v", err)
	}
	for _, agg := range []string{"fedsplit-robust", "fedsplit-robust:mult=3"} {
		cfg.Aggregator = agg
		if err := cfg.Validate(); !errors.Is(err, coordinator.ErrConfig) || !strings.Contains(err.Error(), "needs each site's z_j") {
			t.Errorf("--aggregator %s under DP: %v, want a refusal", agg, err)
		}
	}
	cfg.Aggregator = "fedsplit-mean"
	if err := cfg.Validate(); err != nil {
		t.Errorf("fedsplit-mean under DP: %v", err)
	}
}

// TestPrivacyFamilies: /metrics carries the open round's clip norm (which
// adaptive clipping moves) with the accountant's figures.
func TestPrivacyFamilies(t *testing.T) {
	st := &coordinator.DPState{Accountant: dp.NewAccountant(nil), Clip: 0.37}
	var b strings.Builder
	if err := metrics.Write(&b, privacyFamilies(newPrivacyStatus(&dp.Config{Clip: 1, Noise: 1, Delta: 1e-5}, st, 0, 0))); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"edgefl_dp_clip 0.37\n", "edgefl_dp_rounds 0\n", "edgefl_dp_delta 1e-05\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, b.String())
		}
	}
}

// TestRestoreSumCounting: a round log whose FedSplit sum counts sites on
// their first update (written by a version before the fixed roster, "EFS1")
// is refused under central DP with a clear error, not converted or read as
// a roster; a fixed-roster state reads back; a roster state outside
// central DP is corrupt.
func TestRestoreSumCounting(t *testing.T) {
	joined := &uplink.SumState{S: []float64{1, 2}, M: 1, Members: map[string]uplink.Member{"a": {Joined: 1}}}
	roster := &uplink.SumState{Fixed: true}
	if err := roster.StartRoster([]string{"a", "b"}, []float64{1, 2}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		fixed  bool
		stored *uplink.SumState
		want   string
	}{
		{"old state under central DP", true, joined, "cannot convert a run in progress"},
		{"roster under central DP", true, roster, ""},
		{"roster under secagg", false, roster, "fixed roster, outside central DP"},
		{"joins under secagg", false, joined, ""},
	} {
		b, err := tc.stored.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		s := &Server{sum: newSumMode(tc.fixed), globalR: 2, dim: 2}
		s.cfg.StatePath = "state.db"
		err = s.restoreSum(aggstore.Round{Number: 2, Sum: b})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		case err == nil && (s.sum.cur.Fixed != tc.fixed || s.sum.cur.M != tc.stored.M):
			t.Errorf("%s: restored %+v", tc.name, s.sum.cur)
		}
	}
}

// TestAnnouncementSampleCount: the total sample count, a function of the
// sites' data (one patient's row changes it), travels in the announcement
// without DP (FedSplit's sample-weighted steps use it) and not under DP,
// for both families.
func TestAnnouncementSampleCount(t *testing.T) {
	for _, tc := range []struct {
		algo    string
		private bool
		want    uint64
	}{
		{AlgoFedProx, false, 30}, {AlgoFedProxSplit, false, 30},
		{AlgoFedProx, true, 0}, {AlgoFedProxSplit, true, 0},
	} {
		f := newFixture(t)
		cfg := f.config()
		cfg.K, cfg.Algorithm, cfg.Params.Step, cfg.Params.Relax = 2, tc.algo, 0.5, 1
		if tc.private {
			cfg.DP = &dp.Config{Clip: 1, Noise: 1, Delta: 1e-5}
		}
		r := f.start(cfg)
		a, b := f.agent("site-a", 10), f.agent("site-b", 20)
		ann := a.nextRound(t, 1)
		b.nextRound(t, 1)
		if got := ann.Params.GetTotalSamples(); got != tc.want || ann.Params.GetClients() != 2 {
			t.Errorf("%s, DP %v: the announcement says %d samples over %d sites, want %d over 2", tc.algo, tc.private, got, ann.Params.GetClients(), tc.want)
		}
		r.stop(t)
	}
}

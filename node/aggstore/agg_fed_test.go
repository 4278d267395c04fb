package aggstore

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/testkit/storetest"
)

// Statistics, the fit, evaluation reports and the final bundle: stored once
// (a second copy is not stored and reported so), read back after a reopen,
// bounded by the current round, and rolled back with the rounds they judge.
func TestAggFederationRecords(t *testing.T) {
	path := storetest.TempPath(t, "agg.db")
	s := openAgg(t, path)
	if _, err := s.Fit(); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Fit on an empty file: %v", err)
	}
	if err := s.PutFit([]byte("fit"), []float64{1}); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("PutFit before round 1: %v", err)
	}
	// The statistics phase: round 1 open, no checkpoint yet.
	if err := s.OpenRound(Round{Number: 1, OpenedAt: t0, Config: []byte("cfg")}, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id    string
		msg   string
		first bool
	}{{"site-b", "stats b", true}, {"site-a", "stats a", true}, {"site-a", "stats a again", false}} {
		idx, err := s.PutStatistics(c.id, t0.Add(time.Second), []byte(c.msg))
		if stored := idx > 0; err != nil || stored != c.first {
			t.Fatalf("PutStatistics(%s) = %v, %v; want stored %v", c.id, idx, err, c.first)
		}
	}
	if _, err := s.PutStatistics("site-c", t0, nil); !errors.Is(err, storage.ErrInvalid) {
		t.Fatalf("empty statistics: %v", err)
	}
	if err := s.PutFit([]byte("fit record"), []float64{0.5, -1}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutFit([]byte("other"), []float64{0}); !errors.Is(err, storage.ErrExists) {
		t.Fatalf("a second fit: %v", err)
	}
	if _, err := s.PutEval(2, "site-a", t0, []byte("e")); !errors.Is(err, storage.ErrInvalid) {
		t.Fatalf("eval of a future round: %v", err)
	}
	if _, err := s.PutEval(0, "site-a", t0, []byte("e")); !errors.Is(err, storage.ErrInvalid) {
		t.Fatalf("eval round 0: %v", err)
	}
	for r := uint64(2); r <= 4; r++ {
		if err := s.OpenRound(Round{Number: r, OpenedAt: t0.Add(time.Duration(r) * time.Minute)}, []float64{float64(r), 0}); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range []struct {
		round uint64
		id    string
		first bool
	}{{1, "site-a", true}, {1, "site-b", true}, {3, "site-a", true}, {3, "site-a", false}, {4, "site-b", true}} {
		idx, err := s.PutEval(e.round, e.id, t0.Add(time.Hour), []byte("report "+e.id))
		if stored := idx > 0; err != nil || stored != e.first {
			t.Fatalf("PutEval(%d, %s) = %v, %v", e.round, e.id, idx, err)
		}
	}
	if err := s.PutFinalBundle([]byte("bundle")); err != nil {
		t.Fatal(err)
	}
	storetest.CloseT(t, s)

	s = openAgg(t, path)
	st, err := s.Statistics()
	if err != nil || len(st) != 2 || st[0].ClientID != "site-a" || string(st[0].Msg) != "stats a" || !st[0].StoredAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("statistics %+v %v", st, err)
	}
	if f, err := s.Fit(); err != nil || string(f) != "fit record" {
		t.Fatalf("fit %q %v", f, err)
	}
	if x, err := s.Checkpoint(1); err != nil || !slices.Equal(x, []float64{0.5, -1}) {
		t.Fatalf("checkpoint 1 %v %v", x, err)
	}
	if rs, err := s.EvalRounds(); err != nil || !slices.Equal(rs, []uint64{1, 3, 4}) {
		t.Fatalf("eval rounds %v %v", rs, err)
	}
	if ev, err := s.Evals(1); err != nil || len(ev) != 2 || ev[1].ClientID != "site-b" || string(ev[1].Msg) != "report site-b" || ev[1].Round != 1 {
		t.Fatalf("evals of 1: %+v %v", ev, err)
	}
	if ev, err := s.Evals(2); err != nil || len(ev) != 0 {
		t.Fatalf("evals of 2: %+v %v", ev, err)
	}
	if b, err := s.FinalBundle(); err != nil || string(b) != "bundle" {
		t.Fatalf("final bundle %q %v", b, err)
	}
	storetest.CloseT(t, s)

	// Rolling back to round 3 keeps the model of round 3 (two
	// aggregations): the reports of eval rounds 3 and 4 judged later
	// models and go, with the final bundle; the statistics and the fit stay.
	res, err := Rollback(path, 3, t0.Add(2*time.Hour), nil)
	if err != nil || res.Round != 3 {
		t.Fatalf("rollback %+v %v", res, err)
	}
	s = openAgg(t, path)
	defer storetest.CloseT(t, s)
	if rs, err := s.EvalRounds(); err != nil || !slices.Equal(rs, []uint64{1}) {
		t.Fatalf("eval rounds after rollback %v %v", rs, err)
	}
	if _, err := s.FinalBundle(); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("final bundle after rollback: %v", err)
	}
	if st, err := s.Statistics(); err != nil || len(st) != 2 {
		t.Fatalf("statistics after rollback %d %v", len(st), err)
	}
	if f, err := s.Fit(); err != nil || string(f) != "fit record" {
		t.Fatalf("fit after rollback %q %v", f, err)
	}
}

// A site's error travels with its online status and stays through an
// offline one (a last will carries none); a later online status without
// one clears it.
func TestAggClientError(t *testing.T) {
	s := openAgg(t, filepath.Join(t.TempDir(), "agg.db"))
	defer storetest.CloseT(t, s)
	steps := []struct {
		st         ClientStatus
		wantReason string
	}{
		{ClientStatus{ID: "site-a", Online: true, ErrorReason: "schema_mismatch", ErrorMessage: "site.csv: line 1: no column \"age\""}, "schema_mismatch"},
		{ClientStatus{ID: "site-a", Online: false}, "schema_mismatch"},
		{ClientStatus{ID: "site-a", Online: true}, ""},
	}
	for i, st := range steps {
		if err := s.PutClientStatus(st.st); err != nil {
			t.Fatal(err)
		}
		c, err := s.Client("site-a")
		if err != nil || c.ErrorReason != st.wantReason || (st.wantReason != "" && c.ErrorMessage == "") {
			t.Fatalf("step %d: %+v %v", i, c, err)
		}
	}
}

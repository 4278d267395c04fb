package aggstore

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/testkit/storetest"
)

// logSummary is the replay log as "kind round client" lines and its last
// index.
func logSummary(t *testing.T, s *AggStore) (uint64, []string) {
	t.Helper()
	last, es, err := s.Log()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, fmt.Sprintf("%d %s %d %s %s", e.Index, e.Kind, e.Round, e.ClientID, e.Msg))
		if e.StoredAt.IsZero() {
			t.Errorf("log entry %d without its stored time", e.Index)
		}
	}
	return last, out
}

func wantLog(t *testing.T, s *AggStore, last uint64, want ...string) {
	t.Helper()
	gotLast, got := logSummary(t, s)
	if gotLast != last || !slices.Equal(got, want) {
		t.Fatalf("replay log: last %d, %q\nwant last %d, %q", gotLast, got, last, want)
	}
}

// TestReplayLog: every stored site message gets the next log index in its
// own transaction, a copy gets none, a state write clears the log, indices
// only grow, and the log survives a reopen.
func TestReplayLog(t *testing.T) {
	path := storetest.TempPath(t, "agg.db")
	s := openAgg(t, path)
	if err := s.OpenRound(Round{Number: 1, OpenedAt: t0, State: []byte("s1")}, []float64{0}); err != nil {
		t.Fatal(err)
	}
	wantLog(t, s, 0)
	put := func(r uint64, id, msg string) uint64 {
		t.Helper()
		idx, err := s.PutUpdate(Update{Round: r, ClientID: id, StoredAt: t0.Add(time.Second), Msg: []byte(msg)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return idx
	}
	if i := put(1, "b", "ub"); i != 1 {
		t.Fatalf("first index %d", i)
	}
	if i := put(1, "a", "ua"); i != 2 {
		t.Fatalf("second index %d", i)
	}
	if i := put(1, "a", "copy"); i != 0 {
		t.Fatalf("a copy got index %d", i)
	}
	if i, err := s.PutStatistics("a", t0, []byte("sa")); err != nil || i != 3 {
		t.Fatalf("statistics: %d %v", i, err)
	}
	if i, err := s.PutEval(1, "b", t0, []byte("eb")); err != nil || i != 4 {
		t.Fatalf("evaluation: %d %v", i, err)
	}
	// Stored order, not key order.
	wantLog(t, s, 4, "1 update 1 b ub", "2 update 1 a ua", "3 statistics 0 a sa", "4 evaluation 1 b eb")
	storetest.CloseT(t, s)
	s = openAgg(t, path)
	defer storetest.CloseT(t, s)
	wantLog(t, s, 4, "1 update 1 b ub", "2 update 1 a ua", "3 statistics 0 a sa", "4 evaluation 1 b eb")

	for _, write := range []struct {
		name string
		fn   func() error
	}{
		{"PutRoundState", func() error { return s.PutRoundState(1, []byte("s1b")) }},
		{"OpenRound", func() error {
			return s.OpenRound(Round{Number: 2, OpenedAt: t0, State: []byte("s2")}, []float64{1})
		}},
		{"CloseRound", func() error { return s.CloseRound(2, t0, []byte("s2b")) }},
	} {
		before, _ := logSummary(t, s)
		if i := put(1, "c"+write.name, "late"); i != before+1 {
			t.Fatalf("%s: index %d after %d", write.name, i, before)
		}
		if err := write.fn(); err != nil {
			t.Fatal(err)
		}
		wantLog(t, s, before+1)
	}
	// A round opened without a state, and a close without one, keep it.
	if i := put(2, "a", "ua2"); i != 8 {
		t.Fatalf("index %d", i)
	}
	if err := s.OpenRound(Round{Number: 3, OpenedAt: t0}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseRound(3, t0, nil); err != nil {
		t.Fatal(err)
	}
	wantLog(t, s, 8, "8 update 2 a ua2")
}

// TestReplayLogRollback: rolling back to the current round keeps the
// entries whose messages stay; rolling back before it drops them all.
func TestReplayLogRollback(t *testing.T) {
	for _, to := range []uint64{3, 2} {
		t.Run(fmt.Sprint("to", to), func(t *testing.T) {
			path := storetest.TempPath(t, "agg.db")
			s := openAgg(t, path)
			for r := uint64(1); r <= 3; r++ {
				if err := s.OpenRound(Round{Number: r, OpenedAt: t0, Config: []byte(`{}`), State: []byte("s")}, []float64{float64(r)}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.PutUpdate(Update{Round: 3, ClientID: "a", StoredAt: t0, Msg: []byte("u")}, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := s.PutUpdate(Update{Round: 2, ClientID: "b", StoredAt: t0, Msg: []byte("late")}, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := s.PutEval(3, "a", t0, []byte("e3")); err != nil { // dropped by any rollback to 3 or before
				t.Fatal(err)
			}
			storetest.CloseT(t, s)
			if _, err := Rollback(path, to, t0, nil); err != nil {
				t.Fatal(err)
			}
			s = openAgg(t, path)
			defer storetest.CloseT(t, s)
			if to == 3 {
				wantLog(t, s, 3, "1 update 3 a u", "2 update 2 b late")
			} else {
				wantLog(t, s, 3)
			}
		})
	}
}

// TestReplayLogNamesStoredMessages: an entry whose message is not stored
// (written by a path that bypassed PutUpdate, with the counts retaken) is
// refused on open, naming the message.
func TestReplayLogNamesStoredMessages(t *testing.T) {
	path := storetest.TempPath(t, "agg.db")
	s := openAgg(t, path)
	if err := s.OpenRound(Round{Number: 1, OpenedAt: t0, State: []byte("s")}, []float64{0}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutUpdate(Update{Round: 1, ClientID: "a", StoredAt: t0, Msg: []byte("u")}, nil); err != nil {
		t.Fatal(err)
	}
	storetest.CloseT(t, s)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketUpdates).Bucket(storage.EncodeU64(1)).Delete([]byte("a")); err != nil {
			return err
		}
		return storage.WriteCensus(&storage.Tx{Tx: tx})
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	_, err = OpenAgg(path, storage.Options{})
	if !errors.Is(err, storage.ErrCorrupt) || !strings.Contains(err.Error(), `update (1, "a") named by log entry 1 is not stored`) {
		t.Fatalf("open with a dangling log entry: %v", err)
	}
}

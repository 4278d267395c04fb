package aggstore

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgefl/edgefl/node/storage"
)

// TestSecAggAggregatorRecords: messages are stored idempotently (a
// conflicting second copy refused), each with its replay log entry (the
// session and kind in it, read back with the message and its stored time),
// listed per session, survive a reopen; a phase advance stores the server
// state and drops the messages it took in (but the session's AdvertiseKeys) in one transaction, and refuses
// while the replay log still names one of them.
func TestSecAggAggregatorRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agg.db")
	s := openAgg(t, path)
	if err := s.OpenRound(Round{Number: 1, OpenedAt: t0, State: []byte("s1")}, []float64{0}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := s.SecAggServer(); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("server state of a fresh file: %v", err)
	}
	at := t0.Add(time.Second)
	put := func(r SecAggRecord) (uint64, error) { return s.PutSecAggMessage(r, at) }
	for i, r := range []SecAggRecord{
		{Round: 1, Attempt: 0, Kind: 1, ClientID: "a", Msg: []byte("adv-a")},
		{Round: 1, Attempt: 0, Kind: 1, ClientID: "b", Msg: []byte("adv-b")},
		{Round: 1, Attempt: 0, Kind: 3, ClientID: "a", Msg: []byte("share-a")},
		{Round: 1, Attempt: 1, Kind: 1, ClientID: "a", Msg: []byte("adv-a1")},
	} {
		if idx, err := put(r); idx != uint64(i+1) || err != nil {
			t.Fatalf("put %+v: index %d, %v", r, idx, err)
		}
	}
	if idx, err := put(SecAggRecord{Round: 1, Kind: 1, ClientID: "a", Msg: []byte("adv-a")}); idx != 0 || err != nil {
		t.Fatalf("the same copy again: index %d, %v", idx, err)
	}
	if _, err := put(SecAggRecord{Round: 1, Kind: 1, ClientID: "a", Msg: []byte("other")}); !errors.Is(err, storage.ErrConflict) {
		t.Fatalf("a conflicting copy: %v", err)
	}
	if _, err := put(SecAggRecord{Round: 1, Kind: 1, ClientID: "", Msg: []byte("x")}); err == nil {
		t.Fatal("an empty client id accepted")
	}
	got, err := s.SecAggMessages(1, 0)
	if err != nil || len(got) != 3 || got[0].ClientID != "a" || got[1].ClientID != "b" || got[2].Kind != 3 || string(got[2].Msg) != "share-a" || !got[0].StoredAt.Equal(at) {
		t.Fatalf("session (1, 0): %+v, %v", got, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openAgg(t, path)
	last, logged, err := s.Log()
	if err != nil || last != 4 || len(logged) != 4 {
		t.Fatalf("replay log after a reopen: last %d, %+v, %v", last, logged, err)
	}
	if e := logged[2]; e.Kind != LogSecAgg || e.Round != 1 || e.Attempt != 0 || e.SecAggKind != 3 || e.ClientID != "a" || string(e.Msg) != "share-a" || !e.StoredAt.Equal(at) {
		t.Fatalf("log entry 3: %+v", e)
	}
	if e := logged[3]; e.Attempt != 1 || e.SecAggKind != 1 || string(e.Msg) != "adv-a1" {
		t.Fatalf("log entry 4: %+v", e)
	}
	if err := s.PutSecAggServer(1, 0, []byte("server after advertise"), 3); !errors.Is(err, storage.ErrInvalid) {
		t.Fatalf("an advance while the log names the messages it drops: %v", err)
	}
	if _, _, _, err := s.SecAggServer(); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("the refused advance wrote the server state: %v", err)
	}
	if err := s.PutRoundState(1, []byte("s1 counting them")); err != nil { // clears the log
		t.Fatal(err)
	}
	if err := s.PutSecAggServer(1, 0, []byte("server after advertise"), 3); err != nil {
		t.Fatal(err)
	}
	r, a, st, err := s.SecAggServer()
	if err != nil || r != 1 || a != 0 || string(st) != "server after advertise" {
		t.Fatalf("server state: %d %d %q %v", r, a, st, err)
	}
	got, err = s.SecAggMessages(1, 0)
	if err != nil || len(got) != 3 || got[0].Kind != 1 || got[1].Kind != 1 || got[2].Kind != 3 {
		t.Fatalf("after the advance, the session's AdvertiseKeys and the share keys message only: %+v, %v", got, err)
	}
	if got, err := s.SecAggMessages(1, 1); err != nil || len(got) != 0 {
		t.Fatalf("another session's messages kept: %+v, %v", got, err)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

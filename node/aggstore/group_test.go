package aggstore

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/testkit/storetest"
)

// TestPutUpdatesGroupCommit: a group of updates is stored in one
// transaction with consecutive replay log indexes, exactly as the same
// updates stored one by one; a group that does not find the log where it
// expects it (an update stored already, a wrong first index) writes
// nothing at all.
func TestPutUpdatesGroupCommit(t *testing.T) {
	path := storetest.TempPath(t, "agg.db")
	s := openAgg(t, path)
	if err := s.OpenRound(Round{Number: 1, OpenedAt: t0, Config: []byte("cfg")}, []float64{0, 0}); err != nil {
		t.Fatal(err)
	}
	up := func(c int) Update {
		return Update{Round: 1, ClientID: fmt.Sprintf("site-%d", c), StoredAt: t0, SampleCount: 10, Loss: math.NaN(), Msg: []byte{byte(c + 1)}}
	}
	if _, err := s.PutUpdate(up(0), nil); err != nil {
		t.Fatal(err)
	}
	next, err := s.NextLogIndex()
	if err != nil || next != 2 {
		t.Fatalf("NextLogIndex = %d, %v; want 2", next, err)
	}
	before, err := s.Commits()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutUpdates(next, []Update{up(1), up(2), up(3)}); err != nil {
		t.Fatal(err)
	}
	if after, _ := s.Commits(); after != before+1 {
		t.Errorf("a group of 3 took %d commits, want 1", after-before)
	}
	tests := []struct {
		name  string
		first uint64
		group []Update
	}{
		{"one stored already", 5, []Update{up(4), up(2)}},
		{"first index behind the log", 4, []Update{up(4), up(5)}},
		{"first index ahead of the log", 6, []Update{up(4), up(5)}},
		{"bad client id", 5, []Update{up(4), {Round: 1, ClientID: "", Msg: []byte{1}}}},
		{"round not open", 5, []Update{up(4), {Round: 7, ClientID: "x", Msg: []byte{1}}}},
	}
	for _, tt := range tests {
		err := s.PutUpdates(tt.first, tt.group)
		if err == nil {
			t.Errorf("%s: stored", tt.name)
		}
		if tt.name == "one stored already" && !errors.Is(err, ErrGroupMoved) {
			t.Errorf("%s: %v, want ErrGroupMoved", tt.name, err)
		}
		if _, err := s.GetUpdate(1, "site-4"); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("%s: site-4 stored by a failed group: %v", tt.name, err)
		}
	}
	storetest.CloseT(t, s)
	s = openAgg(t, path) // the file reopens clean: census and invariants hold
	last, log, err := s.Log()
	if err != nil {
		t.Fatal(err)
	}
	if last != 4 || len(log) != 4 {
		t.Fatalf("log: last %d, %d entries; want 4, 4", last, len(log))
	}
	for i, e := range log {
		if e.Index != uint64(i+1) || e.ClientID != fmt.Sprintf("site-%d", i) || e.Kind != LogUpdate {
			t.Errorf("log entry %d: %+v", i, e)
		}
	}
	c, err := s.Client("site-2")
	if err != nil || c.Participation != 1 || c.SampleCount != 10 {
		t.Errorf("site-2's record: %+v, %v", c, err)
	}
	storetest.CloseT(t, s)
}

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

// TestPutUpdatesZ: a group of FedSplit updates stores each one's z as its
// client's latest in the same transaction (LatestZRounds lists them
// without their values, ClientZ reads one, ClientZRound its round); a group holding a z older
// than the stored one writes nothing; ForEachUpdateMeta gives the counts
// without the messages.
func TestPutUpdatesZ(t *testing.T) {
	path := storetest.TempPath(t, "agg.db")
	s := openAgg(t, path)
	for r := uint64(1); r <= 2; r++ {
		if err := s.OpenRound(Round{Number: r, OpenedAt: t0, Config: []byte("cfg")}, []float64{0, 0}); err != nil {
			t.Fatal(err)
		}
	}
	up := func(r uint64, c int) Update {
		return Update{Round: r, ClientID: fmt.Sprintf("site-%d", c), StoredAt: t0, SampleCount: uint64(10 + c), Loss: 0.5, Msg: []byte{byte(c + 1), 9}}
	}
	before, _ := s.Commits()
	if err := s.PutUpdatesZ(1, []Update{up(2, 0), up(2, 1), up(2, 2)}, [][]float64{{1, 2}, nil, {5, 6}}); err != nil {
		t.Fatal(err)
	}
	if after, _ := s.Commits(); after != before+1 {
		t.Errorf("a group of 3 took %d commits, want 1", after-before)
	}
	zs, err := s.LatestZRounds()
	if err != nil {
		t.Fatal(err)
	}
	want := []ZRound{{"site-0", 2, 2}, {"site-2", 2, 2}}
	if fmt.Sprint(zs) != fmt.Sprint(want) {
		t.Fatalf("LatestZRounds = %v, want %v", zs, want)
	}
	if r, z, err := s.ClientZ("site-2"); err != nil || r != 2 || z[0] != 5 || z[1] != 6 {
		t.Fatalf("ClientZ(site-2) = %d, %v, %v", r, z, err)
	}
	if r, err := s.ClientZRound("site-0"); err != nil || r != 2 {
		t.Fatalf("ClientZRound(site-0) = %d, %v; want 2", r, err)
	}
	if _, err := s.ClientZRound("site-1"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("ClientZRound(site-1): %v, want ErrNotFound (its update carried no z)", err)
	}
	tests := []struct {
		name string
		us   []Update
		zs   [][]float64
	}{
		{"an older z", []Update{up(1, 3), up(1, 0)}, [][]float64{{1, 1}, {7, 7}}},
		{"a z with a NaN", []Update{up(1, 3)}, [][]float64{{math.NaN(), 1}}},
		{"a z for each but one", []Update{up(1, 3), up(1, 4)}, [][]float64{{1, 1}}},
	}
	for _, tt := range tests {
		if err := s.PutUpdatesZ(4, tt.us, tt.zs); err == nil {
			t.Errorf("%s: stored", tt.name)
		}
		if _, err := s.GetUpdate(1, "site-3"); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("%s: site-3 stored by a failed group: %v", tt.name, err)
		}
	}
	var metas []Update
	if err := s.ForEachUpdateMeta(2, func(u Update) error { metas = append(metas, u); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(metas) != 3 {
		t.Fatalf("ForEachUpdateMeta: %d updates, want 3", len(metas))
	}
	for i, u := range metas {
		if u.ClientID != fmt.Sprintf("site-%d", i) || u.SampleCount != uint64(10+i) || u.Loss != 0.5 || u.Msg != nil {
			t.Errorf("ForEachUpdateMeta %d: %+v", i, u)
		}
	}
	storetest.CloseT(t, s)
	s = openAgg(t, path) // the file reopens clean
	storetest.CloseT(t, s)
}

package aggstore

import (
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/testkit/storetest"
)

var t0 = time.Unix(1700000000, 0)

func TestAggRoundsAndCheckpoints(t *testing.T) {
	path := storetest.TempPath(t, "agg.db")
	s := openAgg(t, path)
	if _, err := s.CurrentRound(); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("CurrentRound on empty db: %v", err)
	}
	if _, _, err := s.LatestCheckpoint(); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("LatestCheckpoint on empty db: %v", err)
	}
	if err := s.OpenRound(Round{Number: 1, OpenedAt: t0, Config: []byte("cfg1")}, []float64{0, 0}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutRoundState(1, []byte("st1")); err != nil {
		t.Fatal(err)
	}
	// Opening round 2 closes round 1 in the same transaction.
	if err := s.OpenRound(Round{Number: 2, OpenedAt: t0.Add(time.Minute), Config: []byte("cfg2")}, []float64{1, 1}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"reopen 2", s.OpenRound(Round{Number: 2}, nil), storage.ErrStale},
		{"open 1", s.OpenRound(Round{Number: 1}, nil), storage.ErrStale},
		{"open 0", s.OpenRound(Round{Number: 0}, nil), storage.ErrInvalid},
		{"open NaN global", s.OpenRound(Round{Number: 3}, []float64{math.NaN()}), storage.ErrInvalid},
		{"state of missing round", s.PutRoundState(9, []byte("x")), storage.ErrNotFound},
		{"close missing round", s.CloseRound(9, t0, nil), storage.ErrNotFound},
		{"checkpoint round 0", s.PutCheckpoint(0, []float64{1}), storage.ErrInvalid},
		{"checkpoint empty", s.PutCheckpoint(1, nil), storage.ErrInvalid},
	}
	for _, tt := range tests {
		if !errors.Is(tt.err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, tt.err, tt.want)
		}
	}
	if err := s.PutCheckpoint(2, []float64{1.5, 1.5}); err != nil { // overwrite
		t.Fatal(err)
	}
	storetest.CloseT(t, s)

	s = openAgg(t, path)
	defer storetest.CloseT(t, s)
	r1, err := s.Round(1)
	if err != nil {
		t.Fatal(err)
	}
	if r1.Status != RoundClosed || !r1.ClosedAt.Equal(t0.Add(time.Minute)) || string(r1.Config) != "cfg1" || string(r1.State) != "st1" || !r1.OpenedAt.Equal(t0) {
		t.Fatalf("round 1 = %+v", r1)
	}
	cur, err := s.CurrentRound()
	if err != nil {
		t.Fatal(err)
	}
	if cur.Number != 2 || cur.Status != RoundOpen || string(cur.Config) != "cfg2" || cur.State != nil || !cur.ClosedAt.IsZero() {
		t.Fatalf("current = %+v", cur)
	}
	if err := s.CloseRound(2, t0.Add(2*time.Minute), []byte("final")); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseRound(2, t0.Add(time.Hour), []byte("later")); err != nil { // no-op
		t.Fatal(err)
	}
	cur, _ = s.CurrentRound()
	if cur.Status != RoundClosed || !cur.ClosedAt.Equal(t0.Add(2*time.Minute)) || string(cur.State) != "final" {
		t.Fatalf("closed current = %+v", cur)
	}
	if cur.Status.String() != "closed" || RoundOpen.String() != "open" {
		t.Fatalf("status strings %v %v", cur.Status, RoundOpen)
	}
	r, v, err := s.LatestCheckpoint()
	if err != nil || r != 2 || !slices.Equal(v, []float64{1.5, 1.5}) {
		t.Fatalf("LatestCheckpoint = %d %v %v", r, v, err)
	}
	v, err = s.Checkpoint(1)
	if err != nil || !slices.Equal(v, []float64{0, 0}) {
		t.Fatalf("Checkpoint(1) = %v %v", v, err)
	}
	if _, err := s.Checkpoint(7); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Checkpoint(7) = %v", err)
	}
}

func TestAggPutUpdateIdempotent(t *testing.T) {
	path := storetest.TempPath(t, "agg.db")
	s := openAgg(t, path)
	if err := s.OpenRound(Round{Number: 3, OpenedAt: t0}, []float64{0, 0}); err != nil {
		t.Fatal(err)
	}
	u := Update{Round: 3, ClientID: "site-1", StoredAt: t0.Add(time.Second), SampleCount: 100, Loss: 0.7, Msg: []byte("first")}
	idx, err := s.PutUpdate(u, []float64{1, 2})
	if err != nil || idx != 1 {
		t.Fatalf("PutUpdate = %v, %v, want log index 1", idx, err)
	}
	// A redelivery (QoS 1) with different bytes and z: ignored, nothing written.
	dup := u
	dup.Msg, dup.StoredAt, dup.Loss = []byte("second"), t0.Add(time.Hour), 0.1
	idx, err = s.PutUpdate(dup, []float64{9, 9})
	if err != nil || idx != 0 {
		t.Fatalf("duplicate PutUpdate = %v, %v", idx, err)
	}
	storetest.CloseT(t, s)

	s = openAgg(t, path)
	defer storetest.CloseT(t, s)
	got, err := s.GetUpdate(3, "site-1")
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Msg) != "first" || !got.StoredAt.Equal(u.StoredAt) || got.SampleCount != 100 || got.Loss != 0.7 || got.Round != 3 || got.ClientID != "site-1" {
		t.Fatalf("stored update = %+v", got)
	}
	zr, z, err := s.ClientZ("site-1")
	if err != nil || zr != 3 || !slices.Equal(z, []float64{1, 2}) {
		t.Fatalf("ClientZ = %d %v %v", zr, z, err)
	}
	c, err := s.Client("site-1")
	if err != nil {
		t.Fatal(err)
	}
	if c.Participation != 1 || c.SampleCount != 100 || c.RecentLoss != 0.7 || !c.LastSeen.Equal(u.StoredAt) {
		t.Fatalf("client = %+v", c)
	}
}

func TestAggPutUpdateRejects(t *testing.T) {
	s := openAgg(t, storetest.TempPath(t, "agg.db"))
	defer storetest.CloseT(t, s)
	for r := uint64(1); r <= 2; r++ {
		if err := s.OpenRound(Round{Number: r}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.PutUpdate(Update{Round: 2, ClientID: "a", Msg: []byte("m2")}, []float64{2}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		u    Update
		z    []float64
		want error
	}{
		{"round 0", Update{ClientID: "a", Msg: []byte("m")}, nil, storage.ErrInvalid},
		{"no client", Update{Round: 1, Msg: []byte("m")}, nil, storage.ErrInvalid},
		{"no msg", Update{Round: 1, ClientID: "b"}, nil, storage.ErrInvalid},
		{"NaN z", Update{Round: 1, ClientID: "b", Msg: []byte("m")}, []float64{math.NaN()}, storage.ErrInvalid},
		{"unknown round", Update{Round: 5, ClientID: "b", Msg: []byte("m")}, nil, storage.ErrNotFound},
		// A straggler's round-1 z must not replace its round-2 z.
		{"stale z", Update{Round: 1, ClientID: "a", Msg: []byte("m1")}, []float64{1}, storage.ErrStale},
	}
	for _, tt := range tests {
		idx, err := s.PutUpdate(tt.u, tt.z)
		if !errors.Is(err, tt.want) || idx != 0 {
			t.Errorf("%s: %v, %v, want %v", tt.name, idx, err, tt.want)
		}
	}
	// The stale attempt wrote nothing: no round-1 update, z still round 2,
	// participation still 1.
	if _, err := s.GetUpdate(1, "a"); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("stale update stored: %v", err)
	}
	if zr, _, _ := s.ClientZ("a"); zr != 2 {
		t.Errorf("z round = %d", zr)
	}
	if c, _ := s.Client("a"); c.Participation != 1 {
		t.Errorf("participation = %d", c.Participation)
	}
	// Without a z a late update for round 1 is fine.
	if idx, err := s.PutUpdate(Update{Round: 1, ClientID: "a", Msg: []byte("m1"), Loss: math.NaN()}, nil); err != nil || idx == 0 {
		t.Fatalf("late update without z: %v %v", idx, err)
	}
	// Its NaN loss (unknown) keeps the loss of the first update (0).
	if c, _ := s.Client("a"); c.Participation != 2 || c.RecentLoss != 0 {
		t.Errorf("client after late update = %+v", c)
	}
}

func TestAggIterateAndPrune(t *testing.T) {
	path := storetest.TempPath(t, "agg.db")
	s := openAgg(t, path)
	clients := []string{"c", "a", "b"}
	for r := uint64(1); r <= 4; r++ {
		if err := s.OpenRound(Round{Number: r, OpenedAt: t0}, []float64{float64(r)}); err != nil {
			t.Fatal(err)
		}
		for _, c := range clients {
			u := Update{Round: r, ClientID: c, StoredAt: t0, SampleCount: 10, Loss: 1, Msg: []byte(fmt.Sprintf("%d/%s", r, c))}
			if _, err := s.PutUpdate(u, []float64{float64(r)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	us, err := s.Updates(3)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, u := range us {
		ids = append(ids, u.ClientID)
		if string(u.Msg) != fmt.Sprintf("3/%s", u.ClientID) || u.Round != 3 {
			t.Errorf("update %+v", u)
		}
	}
	if !slices.Equal(ids, []string{"a", "b", "c"}) {
		t.Fatalf("iteration order %v", ids)
	}
	stop := errors.New("stop")
	n := 0
	if err := s.ForEachUpdate(3, func(Update) error { n++; return stop }); !errors.Is(err, stop) || n != 1 {
		t.Fatalf("ForEachUpdate stop: %v after %d", err, n)
	}
	if us, err := s.Updates(99); err != nil || len(us) != 0 {
		t.Fatalf("Updates(99) = %v %v", us, err)
	}
	zs, err := s.LatestZ()
	if err != nil || len(zs) != 3 || zs["b"][0] != 4 {
		t.Fatalf("LatestZ = %v %v", zs, err)
	}
	cs, err := s.Clients()
	if err != nil || len(cs) != 3 || cs[0].ID != "a" || cs[0].Participation != 4 {
		t.Fatalf("Clients = %+v %v", cs, err)
	}

	// The replay log names every update stored since the last state
	// write (log.go): their rounds are kept.
	if pruned, err := s.PruneUpdates(3); err != nil || pruned != 0 {
		t.Fatalf("PruneUpdates with every update in the replay log = %d %v", pruned, err)
	}
	if err := s.PutRoundState(3, []byte("state")); err != nil {
		t.Fatal(err)
	}
	pruned, err := s.PruneUpdates(3)
	if err != nil || pruned != 2 {
		t.Fatalf("PruneUpdates = %d %v", pruned, err)
	}
	if us, _ := s.Updates(2); len(us) != 0 {
		t.Fatalf("round 2 updates survived: %v", us)
	}
	if us, _ := s.Updates(3); len(us) != 3 {
		t.Fatalf("round 3 updates pruned: %v", us)
	}
	storetest.CloseT(t, s)
}

func TestAggClientStatus(t *testing.T) {
	s := openAgg(t, storetest.TempPath(t, "agg.db"))
	defer storetest.CloseT(t, s)
	if _, err := s.Client("x"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Client(x) = %v", err)
	}
	if err := s.PutClient(ClientRecord{ID: "x", Participation: 5, RecentLoss: 0.3, SampleCount: 10}); err != nil {
		t.Fatal(err)
	}
	st := ClientStatus{ID: "x", Online: true, SampleCount: 20, Capabilities: []string{"sgd"}, SoftwareVersion: "v1", At: t0}
	if err := s.PutClientStatus(st); err != nil {
		t.Fatal(err)
	}
	// The last will: offline, nothing else known; an older timestamp does
	// not move last seen back.
	if err := s.PutClientStatus(ClientStatus{ID: "x", At: t0.Add(-time.Hour)}); err != nil {
		t.Fatal(err)
	}
	c, err := s.Client("x")
	if err != nil {
		t.Fatal(err)
	}
	if c.Online || c.Participation != 5 || c.RecentLoss != 0.3 || c.SampleCount != 20 ||
		!slices.Equal(c.Capabilities, []string{"sgd"}) || c.SoftwareVersion != "v1" || !c.LastSeen.Equal(t0) {
		t.Fatalf("client = %+v", c)
	}
	if err := s.PutClient(ClientRecord{ID: "y", RecentLoss: math.Inf(1)}); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.Client("y"); !math.IsNaN(c.RecentLoss) {
		t.Fatalf("non-finite loss stored as %v", c.RecentLoss)
	}
	if err := s.PutClientStatus(ClientStatus{}); !errors.Is(err, storage.ErrInvalid) {
		t.Fatalf("PutClientStatus(no id) = %v", err)
	}
	if err := s.PutLatestZ("x", 4, []float64{1}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutLatestZ("x", 3, []float64{1}); !errors.Is(err, storage.ErrStale) {
		t.Fatalf("PutLatestZ(older) = %v", err)
	}
	if _, _, err := s.ClientZ("nobody"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("ClientZ(nobody) = %v", err)
	}
}

func TestAggCompact(t *testing.T) {
	dir := t.TempDir()
	src := dir + "/agg.db"
	s := openAgg(t, src)
	big := make([]float64, 4096)
	for r := uint64(1); r <= 20; r++ {
		if err := s.OpenRound(Round{Number: r, OpenedAt: t0}, big); err != nil {
			t.Fatal(err)
		}
		for c := 0; c < 4; c++ {
			u := Update{Round: r, ClientID: fmt.Sprintf("c%d", c), StoredAt: t0, Msg: make([]byte, 16<<10)}
			if _, err := s.PutUpdate(u, big); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.PutRoundState(20, []byte("state")); err != nil { // clears the replay log (log.go)
		t.Fatal(err)
	}
	if _, err := s.PruneUpdates(20); err != nil {
		t.Fatal(err)
	}
	dst := dir + "/compacted.db"
	if err := s.Compact(dst); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(dst); !errors.Is(err, storage.ErrExists) {
		t.Fatalf("Compact over an existing file: %v", err)
	}
	storetest.CloseT(t, s)
	if _, err := os.Stat(dst + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary file left behind: %v", err)
	}
	before, _ := os.Stat(src)
	after, _ := os.Stat(dst)
	if after.Size() >= before.Size() {
		t.Fatalf("compaction did not shrink: %d -> %d", before.Size(), after.Size())
	}
	c := openAgg(t, dst)
	defer storetest.CloseT(t, c)
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
	cur, err := c.CurrentRound()
	if err != nil || cur.Number != 20 {
		t.Fatalf("compacted CurrentRound = %+v %v", cur, err)
	}
	if us, _ := c.Updates(20); len(us) != 4 {
		t.Fatalf("compacted updates of round 20: %d", len(us))
	}
	if zs, _ := c.LatestZ(); len(zs) != 4 {
		t.Fatalf("compacted latest z: %d", len(zs))
	}
}

func TestAggCorruptValues(t *testing.T) {
	tests := []struct {
		name  string
		write func(tx *storage.Tx) error
		read  func(*AggStore) error
	}{
		{"client json", func(tx *storage.Tx) error { return tx.Bucket(bucketClients).Put([]byte("a"), []byte("{nope")) },
			func(s *AggStore) error { _, err := s.Client("a"); return err }},
		{"client id mismatch", func(tx *storage.Tx) error { return tx.Bucket(bucketClients).Put([]byte("a"), []byte(`{"id":"b"}`)) },
			func(s *AggStore) error { _, err := s.Clients(); return err }},
		{"client blocks PutUpdate", func(tx *storage.Tx) error { return tx.Bucket(bucketClients).Put([]byte("a"), []byte("[]")) },
			func(s *AggStore) error {
				_, err := s.PutUpdate(Update{Round: 1, ClientID: "a", Msg: []byte("m")}, nil)
				return err
			}},
		{"update short", func(tx *storage.Tx) error {
			b, err := tx.Bucket(bucketUpdates).CreateBucketIfNotExists(storage.EncodeU64(1))
			if err != nil {
				return err
			}
			return b.Put([]byte("a"), make([]byte, 10))
		}, func(s *AggStore) error { _, err := s.Updates(1); return err }},
		{"latest z", func(tx *storage.Tx) error { return tx.Bucket(bucketLatestZ).Put([]byte("a"), make([]byte, 9)) },
			func(s *AggStore) error { _, err := s.LatestZ(); return err }},
		{"latest z blocks PutLatestZ", func(tx *storage.Tx) error { return tx.Bucket(bucketLatestZ).Put([]byte("a"), make([]byte, 9)) },
			func(s *AggStore) error { return s.PutLatestZ("a", 2, []float64{1}) }},
		{"checkpoint", func(tx *storage.Tx) error {
			return tx.Bucket(bucketCheckpoints).Put(storage.EncodeU64(5), make([]byte, 7))
		},
			func(s *AggStore) error { _, _, err := s.LatestCheckpoint(); return err }},
		{"checkpoint key", func(tx *storage.Tx) error { return tx.Bucket(bucketCheckpoints).Put([]byte{0xff}, make([]byte, 8)) },
			func(s *AggStore) error { _, _, err := s.LatestCheckpoint(); return err }},
		{"round meta", func(tx *storage.Tx) error {
			return tx.Bucket(bucketRounds).Bucket(storage.EncodeU64(1)).Put(keyRoundMeta, []byte(`{"status":7}`))
		}, func(s *AggStore) error { _, err := s.Round(1); return err }},
		{"round meta blocks OpenRound", func(tx *storage.Tx) error {
			return tx.Bucket(bucketRounds).Bucket(storage.EncodeU64(1)).Put(keyRoundMeta, []byte("x"))
		}, func(s *AggStore) error { return s.OpenRound(Round{Number: 2}, nil) }},
		{"current round", func(tx *storage.Tx) error { return tx.Bucket(bucketAgg).Put(keyCurrentRound, []byte{1}) },
			func(s *AggStore) error { _, err := s.CurrentRound(); return err }},
		{"current round dangling", func(tx *storage.Tx) error { return tx.Bucket(bucketAgg).Put(keyCurrentRound, storage.EncodeU64(9)) },
			func(s *AggStore) error { _, err := s.CurrentRound(); return err }},
		{"round as value", func(tx *storage.Tx) error { return tx.Bucket(bucketRounds).Put(storage.EncodeU64(4), []byte("v")) },
			func(s *AggStore) error { _, err := s.Round(4); return err }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openAgg(t, storetest.TempPath(t, "agg.db"))
			defer storetest.CloseT(t, s)
			if err := s.OpenRound(Round{Number: 1}, []float64{1}); err != nil {
				t.Fatal(err)
			}
			if err := s.db.Update(tt.write); err != nil {
				t.Fatal(err)
			}
			if err := tt.read(s); !errors.Is(err, storage.ErrCorrupt) {
				t.Fatalf("read = %v, want ErrCorrupt", err)
			}
		})
	}
}

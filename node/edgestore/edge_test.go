package edgestore

import (
	"errors"
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/testkit/storetest"
)

func TestEdgeIdentity(t *testing.T) {
	path := storetest.TempPath(t, "edge.db")
	s := openEdge(t, path)
	if _, err := s.Identity(); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Identity before init: %v", err)
	}
	t0 := time.Unix(1700000000, 0)
	id, err := s.InitIdentity("site-1", t0)
	if err != nil || id.ClientID != "site-1" || !id.CreatedAt.Equal(t0) {
		t.Fatalf("InitIdentity = %+v, %v", id, err)
	}
	// Same id later: unchanged, original creation time.
	id, err = s.InitIdentity("site-1", t0.Add(time.Hour))
	if err != nil || !id.CreatedAt.Equal(t0) {
		t.Fatalf("InitIdentity again = %+v, %v", id, err)
	}
	if _, err := s.InitIdentity("site-2", t0); !errors.Is(err, storage.ErrMismatch) {
		t.Fatalf("InitIdentity(other) = %v, want ErrMismatch", err)
	}
	if _, err := s.InitIdentity("", t0); !errors.Is(err, storage.ErrInvalid) {
		t.Fatalf("InitIdentity(empty) = %v, want ErrInvalid", err)
	}
	storetest.CloseT(t, s)
	s = openEdge(t, path)
	defer storetest.CloseT(t, s)
	if id, err := s.Identity(); err != nil || id.ClientID != "site-1" || !id.CreatedAt.Equal(t0) {
		t.Fatalf("Identity after reopen = %+v, %v", id, err)
	}
}

func TestEdgeRoundTripAndReopen(t *testing.T) {
	path := storetest.TempPath(t, "edge.db")
	s := openEdge(t, path)
	z0 := []float64{0.5, -1, 2}
	if err := s.SetGlobal(4, z0); err != nil {
		t.Fatal(err)
	}
	if wrote, err := s.InitZ(4, z0); err != nil || !wrote {
		t.Fatalf("InitZ = %v, %v", wrote, err)
	}
	if wrote, err := s.InitZ(5, []float64{9, 9, 9}); err != nil || wrote {
		t.Fatalf("second InitZ = %v, %v, want no write", wrote, err)
	}
	z1 := []float64{0.25, -0.75, 1.5}
	r1 := []float64{1e-3, 0, -1e-3}
	if err := s.CommitRound(4, z1, r1, []byte("u4")); err != nil {
		t.Fatal(err)
	}
	if err := s.SetResidual("downlink", []float64{7}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetGlobal(5, []float64{1, 1, 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.CommitRound(5, nil, nil, []byte("u5")); err != nil { // FedProx round: no z
		t.Fatal(err)
	}
	storetest.CloseT(t, s)

	s = openEdge(t, path)
	defer storetest.CloseT(t, s)
	check := func(name string, got, want any) {
		t.Helper()
		if !equalAny(got, want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	zr, z, err := s.Z()
	if err != nil {
		t.Fatal(err)
	}
	check("z round", zr, uint64(4))
	check("z", z, z1)
	res, err := s.Residual(ResidualUplink)
	if err != nil {
		t.Fatal(err)
	}
	check("uplink residual", res, r1)
	res, err = s.Residual("downlink")
	if err != nil {
		t.Fatal(err)
	}
	check("downlink residual", res, []float64{7})
	gr, g, err := s.Global()
	if err != nil {
		t.Fatal(err)
	}
	check("global round", gr, uint64(5))
	check("global", g, []float64{1, 1, 1})
	applied, _ := s.AppliedRound()
	check("applied", applied, uint64(5))
	seen, _ := s.SeenRound()
	check("seen", seen, uint64(5))
	out, err := s.Outbox()
	if err != nil {
		t.Fatal(err)
	}
	check("outbox", out, []OutboxEntry{{4, []byte("u4")}, {5, []byte("u5")}})

	if found, err := s.Ack(4); err != nil || !found {
		t.Fatalf("Ack(4) = %v, %v", found, err)
	}
	if found, err := s.Ack(4); err != nil || found {
		t.Fatalf("duplicate Ack(4) = %v, %v", found, err)
	}
	out, _ = s.Outbox()
	check("outbox after ack", out, []OutboxEntry{{5, []byte("u5")}})
	if err := s.DeleteResidual("downlink"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Residual("downlink"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("deleted residual: %v", err)
	}
}

func equalAny(a, b any) bool {
	switch a := a.(type) {
	case []float64:
		return slices.Equal(a, b.([]float64))
	case []OutboxEntry:
		b := b.([]OutboxEntry)
		return slices.EqualFunc(a, b, func(x, y OutboxEntry) bool { return x.Round == y.Round && string(x.Msg) == string(y.Msg) })
	}
	return a == b
}

func TestEdgeAlreadyApplied(t *testing.T) {
	path := storetest.TempPath(t, "edge.db")
	s := openEdge(t, path)
	z := []float64{1, 2}
	if err := s.CommitRound(7, z, z, []byte("u7")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ack(7); err != nil {
		t.Fatal(err)
	}
	storetest.CloseT(t, s)
	// After a restart the same round announcement arrives again.
	s = openEdge(t, path)
	defer storetest.CloseT(t, s)
	tests := []struct {
		round uint64
		want  error
	}{
		{7, storage.ErrAlreadyApplied},
		{6, storage.ErrAlreadyApplied},
		{8, nil},
		{8, storage.ErrAlreadyApplied},
	}
	for _, tt := range tests {
		err := s.CommitRound(tt.round, []float64{float64(tt.round), 0}, []float64{9, 9}, []byte("again"))
		if !errors.Is(err, tt.want) && !(tt.want == nil && err == nil) {
			t.Fatalf("CommitRound(%d) = %v, want %v", tt.round, err, tt.want)
		}
	}
	// The refused commits wrote nothing: z is round 8's, the outbox has only 8.
	zr, zv, _ := s.Z()
	if zr != 8 || zv[0] != 8 {
		t.Fatalf("z = %d %v", zr, zv)
	}
	out, _ := s.Outbox()
	if len(out) != 1 || out[0].Round != 8 {
		t.Fatalf("outbox = %v", out)
	}
}

func TestEdgeRejectsBadInput(t *testing.T) {
	s := openEdge(t, storetest.TempPath(t, "edge.db"))
	defer storetest.CloseT(t, s)
	if err := s.SetGlobal(5, []float64{1}); err != nil {
		t.Fatal(err)
	}
	nan := []float64{1, math.NaN()}
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"commit round 0", s.CommitRound(0, nil, nil, []byte("x")), storage.ErrInvalid},
		{"commit no msg", s.CommitRound(1, nil, nil, nil), storage.ErrInvalid},
		{"commit NaN z", s.CommitRound(1, nan, nil, []byte("x")), storage.ErrInvalid},
		{"commit Inf residual", s.CommitRound(1, nil, []float64{math.Inf(1)}, []byte("x")), storage.ErrInvalid},
		{"global round 0", s.SetGlobal(0, []float64{1}), storage.ErrInvalid},
		{"global empty", s.SetGlobal(6, nil), storage.ErrInvalid},
		{"global NaN", s.SetGlobal(6, nan), storage.ErrInvalid},
		{"global stale", s.SetGlobal(4, []float64{1}), storage.ErrStale},
		{"seen stale", s.SetSeenRound(4), storage.ErrStale},
		{"seen 0", s.SetSeenRound(0), storage.ErrInvalid},
		{"residual empty name", s.SetResidual("", []float64{1}), storage.ErrInvalid},
		{"residual NaN", s.SetResidual("r", nan), storage.ErrInvalid},
		{"initz empty", func() error { _, err := s.InitZ(1, nil); return err }(), storage.ErrInvalid},
	}
	for _, tt := range tests {
		if !errors.Is(tt.err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, tt.err, tt.want)
		}
	}
	// None of that changed anything.
	if r, _ := s.AppliedRound(); r != 0 {
		t.Errorf("applied = %d", r)
	}
	if out, _ := s.Outbox(); len(out) != 0 {
		t.Errorf("outbox = %v", out)
	}
	if _, _, err := s.Z(); !errors.Is(err, storage.ErrNotFound) {
		t.Errorf("z: %v", err)
	}
	if r, g, _ := s.Global(); r != 5 || len(g) != 1 {
		t.Errorf("global = %d %v", r, g)
	}
	if err := s.SetSeenRound(5); err != nil {
		t.Errorf("SetSeenRound(same) = %v", err)
	}
	if err := s.SetSeenRound(9); err != nil {
		t.Errorf("SetSeenRound(9) = %v", err)
	}
	if r, _ := s.SeenRound(); r != 9 {
		t.Errorf("seen = %d", r)
	}
}

func TestEdgeCorruptValues(t *testing.T) {
	tests := []struct {
		name   string
		bucket []byte
		key    []byte
		value  []byte
		read   func(*EdgeStore) error
	}{
		{"z short", bucketEdge, keyZ, make([]byte, 12), func(s *EdgeStore) error { _, _, err := s.Z(); return err }},
		{"z round only", bucketEdge, keyZ, make([]byte, 8), func(s *EdgeStore) error { _, _, err := s.Z(); return err }},
		{"global odd", bucketEdge, keyGlobal, make([]byte, 23), func(s *EdgeStore) error { _, _, err := s.Global(); return err }},
		{"global blocks SetGlobal", bucketEdge, keyGlobal, make([]byte, 5), func(s *EdgeStore) error { return s.SetGlobal(9, []float64{1}) }},
		{"applied round", bucketEdge, keyAppliedRound, []byte{1, 2, 3}, func(s *EdgeStore) error { _, err := s.AppliedRound(); return err }},
		{"applied round blocks commit", bucketEdge, keyAppliedRound, []byte{1, 2, 3}, func(s *EdgeStore) error {
			return s.CommitRound(1, []float64{1}, nil, []byte("x"))
		}},
		{"seen round", bucketEdge, keySeenRound, []byte{1}, func(s *EdgeStore) error { _, err := s.SeenRound(); return err }},
		{"created at", bucketEdge, keyCreatedAt, []byte{1}, func(s *EdgeStore) error { _, err := s.Identity(); return err }},
		{"residual", bucketResiduals, []byte(ResidualUplink), make([]byte, 5), func(s *EdgeStore) error { _, err := s.Residual(ResidualUplink); return err }},
		{"outbox key", bucketOutbox, []byte{1, 2, 3}, []byte("x"), func(s *EdgeStore) error { _, err := s.Outbox(); return err }},
		{"outbox empty value", bucketOutbox, storage.EncodeU64(3), []byte{}, func(s *EdgeStore) error { _, err := s.Outbox(); return err }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := openEdge(t, storetest.TempPath(t, "edge.db"))
			defer storetest.CloseT(t, s)
			if _, err := s.InitIdentity("c", time.Unix(1, 0)); err != nil {
				t.Fatal(err)
			}
			if err := s.db.Update(func(tx *storage.Tx) error { return tx.Bucket(tt.bucket).Put(tt.key, tt.value) }); err != nil {
				t.Fatal(err)
			}
			if err := tt.read(s); !errors.Is(err, storage.ErrCorrupt) {
				t.Fatalf("read = %v, want ErrCorrupt", err)
			}
		})
	}
	// A missing bucket is corruption too, not a nil-pointer panic.
	s := openEdge(t, storetest.TempPath(t, "edge.db"))
	defer storetest.CloseT(t, s)
	if err := s.db.Update(func(tx *storage.Tx) error { return tx.DeleteBucket(bucketOutbox) }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Outbox(); !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("Outbox without bucket: %v", err)
	}
	if err := s.CommitRound(1, nil, nil, []byte("x")); !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("CommitRound without outbox bucket: %v", err)
	}
	if r, _ := s.AppliedRound(); r != 0 {
		t.Fatalf("failed commit moved the applied round to %d", r)
	}
}

// The aggregator's copy of z: written by Commit with the round, kept by a
// plain Ack, forgotten (with the outbox entry) by AckRejected, and it
// survives a reopen.
func TestEdgeServerZ(t *testing.T) {
	path := storetest.TempPath(t, "edge.db")
	s := openEdge(t, path)
	if _, _, err := s.ServerZ(); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("ServerZ on a new store = %v, want ErrNotFound", err)
	}
	z, zs := []float64{1, 2, 3}, []float64{1, 2, 2.5}
	if err := s.Commit(Commit{Round: 3, Z: z, ServerZ: zs, Msg: []byte("u3")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(Commit{Round: 4, Z: []float64{4, 4, 4}, Msg: []byte("u4")}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ack(3); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openEdge(t, path)
	r, got, err := s.ServerZ()
	if err != nil || r != 3 || !slices.Equal(got, zs) {
		t.Fatalf("ServerZ after Ack and reopen = %d %v %v, want 3 %v", r, got, err, zs)
	}
	// A rejection of an update not in the outbox (one never sent, or
	// receipted already) keeps the copy.
	if had, err := s.AckRejected(3); err != nil || had {
		t.Fatalf("AckRejected(3) of a receipted round = %v %v", had, err)
	}
	if r, _, err := s.ServerZ(); err != nil || r != 3 {
		t.Fatalf("ServerZ after a rejection of no pending update = %d %v", r, err)
	}
	if had, err := s.AckRejected(4); err != nil || !had {
		t.Fatalf("AckRejected(4) = %v %v", had, err)
	}
	if _, _, err := s.ServerZ(); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("ServerZ after a rejection = %v, want ErrNotFound", err)
	}
	if out, err := s.Outbox(); err != nil || len(out) != 0 {
		t.Fatalf("outbox after the rejection = %v %v", out, err)
	}
	if r, got, err := s.Z(); err != nil || r != 4 || got[0] != 4 {
		t.Fatalf("z after the rejection = %d %v %v, want round 4 kept", r, got, err)
	}
	if err := s.Commit(Commit{Round: 5, ServerZ: []float64{math.NaN(), 0, 0}, Msg: []byte("u5")}); !errors.Is(err, storage.ErrInvalid) {
		t.Fatalf("Commit with a NaN server z = %v, want ErrInvalid", err)
	}
}

// TestEdgeNextConnection: connection numbers only grow, across a reopen,
// and never fall below the floor (the wall clock), nor does a floor below
// the last number pull them back.
func TestEdgeNextConnection(t *testing.T) {
	path := storetest.TempPath(t, "edge.db")
	s := openEdge(t, path)
	steps := []struct {
		floor, want uint64
	}{
		{0, 1}, {0, 2}, {1000, 1000}, {5, 1001}, {1001, 1002},
	}
	for i, st := range steps {
		if got, err := s.NextConnection(st.floor); err != nil || got != st.want {
			t.Fatalf("step %d: NextConnection(%d) = %d, %v; want %d", i, st.floor, got, err, st.want)
		}
	}
	storetest.CloseT(t, s)
	s = openEdge(t, path)
	defer storetest.CloseT(t, s)
	if got, err := s.NextConnection(0); err != nil || got != 1003 {
		t.Fatalf("after reopen: NextConnection = %d, %v; want 1003", got, err)
	}
	if got, err := s.NextConnection(math.MaxUint64); err != nil || got != math.MaxUint64 {
		t.Fatalf("NextConnection(max) = %d, %v", got, err)
	}
	if _, err := s.NextConnection(0); !errors.Is(err, storage.ErrInvalid) {
		t.Fatalf("NextConnection past the last number = %v, want ErrInvalid", err)
	}
}

// TestEdgeStartRun: the same run keeps the state; a fresh state adopts a run
// id; another run id (also over state of an unnamed run) clears the round
// state in one go and keeps the identity and the connection counter.
func TestEdgeStartRun(t *testing.T) {
	path := storetest.TempPath(t, "edge.db")
	s := openEdge(t, path)
	t0 := time.Unix(1700000000, 0)
	if _, err := s.InitIdentity("site-1", t0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.StartRun(""); !errors.Is(err, storage.ErrInvalid) {
		t.Fatalf("StartRun(\"\") = %v, want ErrInvalid", err)
	}
	if rs, err := s.StartRun("A"); err != nil || rs != (RunStart{}) {
		t.Fatalf("fresh state: StartRun(A) = %+v, %v; want adopted, no reset", rs, err)
	}
	commitTwo := func() {
		t.Helper()
		if err := s.SetGlobal(2, []float64{1, 1}); err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(Commit{Round: 1, Z: []float64{1, 2}, ServerZ: []float64{1, 1}, Residual: []float64{0.5, 0}, Msg: []byte("u1")}); err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(Commit{Round: 2, Z: []float64{2, 2}, Msg: []byte("u2")}); err != nil {
			t.Fatal(err)
		}
	}
	commitTwo()
	conn, err := s.NextConnection(0)
	if err != nil {
		t.Fatal(err)
	}
	if rs, err := s.StartRun("A"); err != nil || rs.Reset || rs.Previous != "A" {
		t.Fatalf("same run: StartRun(A) = %+v, %v", rs, err)
	}
	if out, _ := s.Outbox(); len(out) != 2 {
		t.Fatalf("the same run dropped the outbox: %d entries", len(out))
	}
	wantCleared := func(what string) {
		t.Helper()
		if r, err := s.SeenRound(); err != nil || r != 0 {
			t.Fatalf("%s: seen round %d, %v", what, r, err)
		}
		if r, err := s.AppliedRound(); err != nil || r != 0 {
			t.Fatalf("%s: applied round %d, %v", what, r, err)
		}
		if _, _, err := s.Global(); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("%s: global: %v", what, err)
		}
		if _, _, err := s.Z(); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("%s: z: %v", what, err)
		}
		if _, _, err := s.ServerZ(); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("%s: server z: %v", what, err)
		}
		if r, err := s.Residual(ResidualUplink); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("%s: residual %v, %v", what, r, err)
		}
		if out, err := s.Outbox(); err != nil || len(out) != 0 {
			t.Fatalf("%s: outbox %d, %v", what, len(out), err)
		}
		if id, err := s.Identity(); err != nil || id.ClientID != "site-1" {
			t.Fatalf("%s: identity %+v, %v", what, id, err)
		}
	}
	rs, err := s.StartRun("B")
	if err != nil || !rs.Reset || rs.Previous != "A" || rs.Dropped != 2 {
		t.Fatalf("new run: StartRun(B) = %+v, %v; want a reset dropping 2", rs, err)
	}
	wantCleared("after StartRun(B)")
	storetest.CloseT(t, s)
	s = openEdge(t, path)
	defer storetest.CloseT(t, s)
	if id, err := s.RunID(); err != nil || id != "B" {
		t.Fatalf("RunID after reopen = %q, %v", id, err)
	}
	if n, err := s.NextConnection(0); err != nil || n != conn+1 {
		t.Fatalf("connection counter after the reset: %d, %v; want %d", n, err, conn+1)
	}
	// The new run goes on from round 1 (Commit refuses rounds already applied).
	commitTwo()
	if err := s.update(func(b *storage.Bucket, _ *storage.Tx) error { return b.Delete(keyRunID) }); err != nil {
		t.Fatal(err)
	}
	// Round state with no run id (written before run ids) is another run.
	if rs, err := s.StartRun("C"); err != nil || !rs.Reset || rs.Previous != "" || rs.Dropped != 2 {
		t.Fatalf("unnamed run with state: StartRun(C) = %+v, %v", rs, err)
	}
	wantCleared("after StartRun(C)")
}

// TestEdgeRunOrder: StartRunAt records the run's since, the creation time
// of its oldest announcement seen; it survives a reopen, a new run replaces
// it, an unknown time (0) clears it.
func TestEdgeRunOrder(t *testing.T) {
	path := storetest.TempPath(t, "edge.db")
	s := openEdge(t, path)
	if _, err := s.InitIdentity("site-1", time.Unix(1700000000, 0)); err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		run       string
		at        int64
		wantRun   string
		wantSince int64
		reset     bool
	}{
		{"A", 1000, "A", 1000, false},
		{"A", 1500, "A", 1000, false}, // a later round of A
		{"A", 900, "A", 900, false},   // an older round of A seen late
		{"B", 5000, "B", 5000, true},
		{"B", 0, "B", 5000, false},
		{"C", 0, "C", 0, true}, // an aggregator that does not date its announcements
		{"C", 7000, "C", 7000, false},
	} {
		rs, err := s.StartRunAt(c.run, c.at)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		run, since, err := s.RunOrder()
		if err != nil || run != c.wantRun || since != c.wantSince || rs.Reset != c.reset && rs.Previous != "" {
			t.Fatalf("step %d: StartRunAt(%s, %d) = %+v; RunOrder %s %d %v; want %s %d", i, c.run, c.at, rs, run, since, err, c.wantRun, c.wantSince)
		}
	}
	storetest.CloseT(t, s)
	s = openEdge(t, path)
	defer storetest.CloseT(t, s)
	if run, since, err := s.RunOrder(); err != nil || run != "C" || since != 7000 {
		t.Fatalf("after reopen: %s %d %v", run, since, err)
	}
}

// The final bundle of a finished run: stored with its run, round and
// digest, byte for byte; storing it empties the outbox (the run is over);
// it survives a reopen and the start of another run, and the next run's
// replaces it.
func TestEdgeFinal(t *testing.T) {
	path := storetest.TempPath(t, "edge.db")
	s := openEdge(t, path)
	if _, err := s.InitIdentity("site-1", time.Unix(1700000000, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Final(); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Final before SetFinal: %v, want ErrNotFound", err)
	}
	if _, err := s.StartRun("A"); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(Commit{Round: 1, Msg: []byte("u1")}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []Final{
		{RunID: "A", Round: 1, Digest: "d"},
		{RunID: "A", Round: 1, Bundle: []byte("{}")},
		{RunID: "A", Round: 1, Digest: "d", Bundle: make([]byte, MaxFinalBundle+1)},
	} {
		if err := s.SetFinal(bad); !errors.Is(err, storage.ErrInvalid) {
			t.Fatalf("SetFinal(%d bytes, digest %q) = %v, want ErrInvalid", len(bad.Bundle), bad.Digest, err)
		}
	}
	if out, _ := s.Outbox(); len(out) != 1 {
		t.Fatalf("a refused SetFinal changed the outbox: %d entries", len(out))
	}
	fa := Final{RunID: "A", Round: 7, Digest: "abc123", Bundle: []byte("{\"format\": \"edgefl-bundle\"}\n")}
	if err := s.SetFinal(fa); err != nil {
		t.Fatal(err)
	}
	if out, err := s.Outbox(); err != nil || len(out) != 0 {
		t.Fatalf("outbox after SetFinal: %d entries, %v", len(out), err)
	}
	if r, err := s.AppliedRound(); err != nil || r != 1 {
		t.Fatalf("applied round after SetFinal: %d, %v (round state must stay)", r, err)
	}
	check := func(what string, want Final) {
		t.Helper()
		got, err := s.Final()
		if err != nil || got.RunID != want.RunID || got.Round != want.Round || got.Digest != want.Digest || string(got.Bundle) != string(want.Bundle) {
			t.Fatalf("%s: Final = %+v, %v; want %+v", what, got, err, want)
		}
	}
	check("after SetFinal", fa)
	storetest.CloseT(t, s)
	s = openEdge(t, path)
	check("after reopen", fa)
	if rs, err := s.StartRun("B"); err != nil || !rs.Reset {
		t.Fatalf("StartRun(B) = %+v, %v", rs, err)
	}
	check("after StartRun of another run", fa)
	fb := Final{RunID: "B", Round: 3, Digest: "def", Bundle: []byte("bundle of B")}
	if err := s.SetFinal(fb); err != nil {
		t.Fatal(err)
	}
	check("replaced", fb)
	storetest.CloseT(t, s)
}

// A damaged or half-present final bundle is refused on open like any other
// damaged value.
func TestEdgeFinalCorrupt(t *testing.T) {
	tests := []struct {
		name   string
		damage func(b *storage.Bucket) error
	}{
		{"bundle byte flipped", func(b *storage.Bucket) error {
			v := slices.Clone(b.Get(keyEdgeFinalBundle))
			v[3] ^= 0x20
			return b.Put(keyEdgeFinalBundle, v)
		}},
		{"meta without bundle", func(b *storage.Bucket) error { return b.Delete(keyEdgeFinalBundle) }},
		{"bundle without meta", func(b *storage.Bucket) error { return b.Delete(keyEdgeFinalMeta) }},
		{"meta not JSON", func(b *storage.Bucket) error {
			return b.Put(keyEdgeFinalMeta, storage.Seal(keyEdgeFinalMeta, []byte("{")))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := storetest.TempPath(t, "edge.db")
			s := openEdge(t, path)
			if err := s.SetFinal(Final{RunID: "A", Round: 2, Digest: "d", Bundle: []byte("the bundle")}); err != nil {
				t.Fatal(err)
			}
			if err := s.db.Update(func(tx *storage.Tx) error { return tt.damage(tx.Bucket(bucketEdge)) }); err != nil {
				t.Fatal(err)
			}
			_, err := s.Final()
			storetest.CloseT(t, s)
			if !errors.Is(err, storage.ErrCorrupt) {
				t.Fatalf("Final = %v, want ErrCorrupt", err)
			}
			if tt.name == "meta not JSON" {
				return // a sealed value of the wrong shape: found when read
			}
			if s, err := OpenEdge(path, storage.Options{}); !errors.Is(err, storage.ErrCorrupt) {
				if s != nil {
					s.Close()
				}
				t.Fatalf("OpenEdge = %v, want ErrCorrupt", err)
			}
		})
	}
}

// An edge file of schema version 2 (before the final bundle keys) opens
// with its round state intact and is stamped version 3; the version-2 code
// then refuses the file as newer instead of calling its keys damage.
func TestEdgeMigrationToFinalKeys(t *testing.T) {
	v2 := edgeSchema
	v2.Migrations = edgeSchema.Migrations[:2]
	v2.Layout = maps.Clone(edgeSchema.Layout)
	v2.Layout[string(bucketEdge)] = slices.DeleteFunc(slices.Clone(v2.Layout[string(bucketEdge)]), func(k string) bool {
		return k == string(keyEdgeFinalMeta) || k == string(keyEdgeFinalBundle)
	})
	v2.Invariants = nil
	path := storetest.TempPath(t, "edge.db")
	db, err := storage.Open(path, v2, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	old := &EdgeStore{db: db}
	if _, err := old.InitIdentity("site-1", time.Unix(1700000000, 0)); err != nil {
		t.Fatal(err)
	}
	if err := old.Commit(Commit{Round: 2, Z: []float64{1, 2}, Msg: []byte("u2")}); err != nil {
		t.Fatal(err)
	}
	storetest.CloseT(t, old)

	s := openEdge(t, path)
	if v, _ := storage.SchemaVersion(s.db); v != edgeSchema.Version() || v < 3 {
		t.Fatalf("version %d after open (schema %d), want the schema's (>= 3)", v, edgeSchema.Version())
	}
	if r, z, err := s.Z(); err != nil || r != 2 || !slices.Equal(z, []float64{1, 2}) {
		t.Fatalf("z after migration: %d %v %v", r, z, err)
	}
	if err := s.SetFinal(Final{RunID: "A", Round: 2, Digest: "d", Bundle: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	storetest.CloseT(t, s)
	if _, err := storage.Open(path, v2, storage.Options{}); !errors.Is(err, storage.ErrSchemaTooNew) {
		t.Fatalf("the version-2 code opening a version-3 file: %v, want ErrSchemaTooNew", err)
	}
}

// A rejection of an older update that is still in the outbox (a re-send
// answered round_closed after a later update's z became the copy, as a
// redelivering broker brings it) keeps the later copy; the later round's
// own rejection forgets it.
func TestEdgeServerZKeptByOlderRejection(t *testing.T) {
	s := openEdge(t, storetest.TempPath(t, "edge.db"))
	if err := s.Commit(Commit{Round: 5, Z: []float64{5, 5}, ServerZ: []float64{5, 5}, Msg: []byte("u5")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(Commit{Round: 6, Z: []float64{6, 6}, ServerZ: []float64{6, 6}, Msg: []byte("u6")}); err != nil {
		t.Fatal(err)
	}
	if had, err := s.AckRejected(5); err != nil || !had {
		t.Fatalf("AckRejected(5) = %v %v", had, err)
	}
	if r, z, err := s.ServerZ(); err != nil || r != 6 || z[0] != 6 {
		t.Fatalf("ServerZ after an older round's rejection = %d %v %v, want round 6's copy kept", r, z, err)
	}
	if had, err := s.AckRejected(6); err != nil || !had {
		t.Fatalf("AckRejected(6) = %v %v", had, err)
	}
	if _, _, err := s.ServerZ(); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("ServerZ after its own round's rejection = %v, want ErrNotFound", err)
	}
}

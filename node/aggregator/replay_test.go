package aggregator

import (
	"github.com/edgefl/edgefl/node/aggstore"
	"testing"
	"time"

	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/proto/wire"
)

func commits(t *testing.T, s *Server) uint64 {
	t.Helper()
	n, err := s.store.Commits()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func replayLogOf(t *testing.T, store *aggstore.AggStore) []aggstore.Logged {
	t.Helper()
	_, es, err := store.Log()
	if err != nil {
		t.Fatal(err)
	}
	return es
}

// restartServer closes s's state file and opens a new server on it, as a
// restart after kill -9 does (nothing is flushed on the way down).
func restartServer(t *testing.T, s *Server) *Server {
	t.Helper()
	if err := s.store.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := NewServer(s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.store.Close() })
	s2.runCtx, s2.client = s.runCtx, quietClient{}
	return s2
}

// An accepted update that closes nothing costs one write transaction on a
// real bbolt file (the update, its registry entry and its replay log entry)
// and no encoding of the coordinator's state; a restart rebuilds the state
// from the last stored one and the replay log, the update stored before a
// crash cut off its Stored included; the round's last update, which closes
// it, writes the state, which clears the log.
func TestLoneAcceptOneTransaction(t *testing.T) {
	const sites = 4
	ab := newAcceptBench(t, sites)
	s := ab.s
	for i, u := range ab.ups[:2] {
		before, enc := commits(t, s), s.encodes
		if err := s.onUpdate(ab.ctx, u); err != nil {
			t.Fatal(err)
		}
		if got := commits(t, s) - before; got != 1 {
			t.Fatalf("update %d: %d write transactions, want 1", i, got)
		}
		if s.encodes != enc {
			t.Fatalf("update %d: the coordinator's state was encoded %d times, want 0", i, s.encodes-enc)
		}
		if n := len(replayLogOf(t, s.store)); n != i+1 {
			t.Fatalf("update %d: replay log of %d entries", i, n)
		}
	}
	live := s.coord.Snapshot()
	if len(live.Received) != 2 || live.Applied != 2 || live.Counters.Accepted != 2 {
		t.Fatalf("live state %+v", live)
	}
	view, err := StoredState(s.store)
	if err != nil {
		t.Fatal(err)
	}
	mustEqual(t, "StoredState", view, live)

	// kill -9 and restart: the stored state is the round's announcement;
	// the two updates come back from the replay log.
	s = restartServer(t, s)
	mustEqual(t, "state after restart", s.coord.Snapshot(), live)
	if err := s.apply(ab.ctx, s.coord.Resume(), nil, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if n := len(replayLogOf(t, s.store)); n != 0 {
		t.Fatalf("the state written on resume left %d log entries", n)
	}
	// A re-send of a replayed update is a duplicate (an accepted receipt),
	// not a second accept.
	if err := s.onUpdate(ab.ctx, ab.ups[1]); err != nil {
		t.Fatal(err)
	}
	if c := s.coord.Counters(); c.Accepted != 2 || c.Rejected[coordinator.Duplicate] != 1 {
		t.Fatalf("counters after a re-send: %+v", c)
	}

	// A crash between storing an update and stepping Stored: the replay
	// applies it.
	if _, err := s.storeUpdate(ab.ups[2], s.clock.Now()); err != nil {
		t.Fatal(err)
	}
	s = restartServer(t, s)
	if got := s.coord.Snapshot(); len(got.Received) != 3 || got.Counters.Accepted != 3 {
		t.Fatalf("after a crash before Stored: received %v, accepted %d; want the stored update applied", got.Received, got.Counters.Accepted)
	}

	// The round's last update closes it: that batch writes the state.
	enc := s.encodes
	if err := s.onUpdate(ab.ctx, ab.ups[3]); err != nil {
		t.Fatal(err)
	}
	if s.encodes == enc || s.coord.Round() != 2 {
		t.Fatalf("the closing update: %d state encodings, round %d", s.encodes-enc, s.coord.Round())
	}
	if n := len(replayLogOf(t, s.store)); n != 0 {
		t.Fatalf("after the round closed: %d log entries", n)
	}
	rep, err := ReadStatus(s.store)
	if err != nil || rep.Round != 2 || rep.Counters.Accepted != 4 {
		t.Fatalf("status: round %d, accepted %d, %v", rep.Round, rep.Counters.Accepted, err)
	}
}

// A FedSplit late update (AcceptLate) is logged and replayed like any
// other accept: after a restart the client's last round and the late count
// come back, and the copy of z_j it set is the one stored with it.
func TestReplayLateUpdate(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.K, cfg.QuorumFraction, cfg.Algorithm, cfg.Params.Step, cfg.Params.Relax = 2, 0.5, AlgoFedSplit, 0.5, 1
	cfg.Settle = time.Second // both sites are drawn
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.store.Close() })
	ctx := t.Context()
	s.runCtx, s.client = ctx, quietClient{}
	for _, id := range []string{"site-a", "site-b"} {
		if err := s.onStatus(ctx, &wire.ClientStatus{ClientId: id, Online: true, SampleCount: 10}); err != nil {
			t.Fatal(err)
		}
	}
	in := func(m *wire.ClientUpdate, d []float64) *inUpdate {
		raw, err := wire.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		return &inUpdate{msg: m, raw: raw, vec: d}
	}
	f.clock.Advance(cfg.Settle)
	if err := s.step(ctx, coordinator.Tick{At: f.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	if sel := s.coord.Summary().Selected; len(sel) != 2 {
		t.Fatalf("round 1 selected %v", sel)
	}
	// Round 1 closes at its deadline with site-a's update (quorum 1).
	if err := s.onUpdate(ctx, in(zDelta(t, "site-a", 1, 0, vec(1)), vec(1))); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(cfg.RoundTimeout)
	if err := s.step(ctx, coordinator.Tick{At: f.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	if s.coord.Round() != 2 {
		t.Fatalf("round %d, phase %s", s.coord.Round(), s.coord.Phase())
	}
	enc := s.encodes
	if err := s.onUpdate(ctx, in(zDelta(t, "site-b", 1, 0, vec(2)), vec(2))); err != nil {
		t.Fatal(err)
	}
	live := s.coord.Snapshot()
	if live.Counters.AcceptedLate != 1 || live.Late != 1 || s.encodes != enc {
		t.Fatalf("late update: %+v, %d state encodings", live.Counters, s.encodes-enc)
	}
	_, z, err := s.store.ClientZ("site-b")
	if err != nil {
		t.Fatal(err)
	}
	s = restartServer(t, s)
	mustEqual(t, "state after restart", s.coord.Snapshot(), live)
	if r, z2, err := s.store.ClientZ("site-b"); err != nil || r != 1 || !equalFloats(z2, z) {
		t.Fatalf("z of the late update after restart: round %d, %v", r, err)
	}
}

func equalFloats(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

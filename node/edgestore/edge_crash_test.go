package edgestore

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/testkit/storetest"
)

// The kill test (storetest.RunAndKill) re-executes the test binary as a
// child that writes in a loop (TestCrashChild) and SIGKILLs it at a random
// moment, then reopens the file and checks that every committed step is
// whole.

// TestCrashChild is the child's body for TestKillDuringWrites (storetest's
// CrashEnv names the file); without the environment variable it does
// nothing.
func TestCrashChild(t *testing.T) {
	mode, path, ok := storetest.CrashChild()
	if !ok {
		t.Skip("helper process for TestKillDuringWrites")
	}
	if mode != "edge" {
		storetest.CrashFail(fmt.Errorf("unknown mode %q", mode))
	}
	deadline := time.Now().Add(30 * time.Second) // in case the parent is gone
	fail := storetest.CrashFail
	s, err := OpenEdge(path, storage.Options{LockTimeout: 5 * time.Second})
	if err != nil {
		fail(err)
	}
	if _, err := s.InitIdentity("crash-child", time.Unix(1, 0)); err != nil {
		fail(err)
	}
	applied, err := s.AppliedRound()
	if err != nil {
		fail(err)
	}
	// After a restart the agent re-sends its outbox and receipts come
	// back: ack what the previous run committed but did not ack.
	out, err := s.Outbox()
	if err != nil {
		fail(err)
	}
	for _, e := range out {
		if (e.Round+2)%3 == 0 && e.Round+2 <= applied {
			if _, err := s.Ack(e.Round); err != nil {
				fail(err)
			}
		}
	}
	for r := applied + 1; time.Now().Before(deadline); r++ {
		// The agent's sequence: the announcement, then the step.
		if err := s.SetGlobal(r, storetest.CrashGlobal(r)); err != nil {
			fail(err)
		}
		if r == 1 {
			if _, err := s.InitZ(r, storetest.CrashGlobal(r)); err != nil {
				fail(err)
			}
		}
		if err := s.CommitRound(r, storetest.CrashZ(r, 0), storetest.CrashZ(r, 1), storetest.CrashMsg(r, 0)); err != nil {
			fail(err)
		}
		if r%3 == 0 && r > 2 {
			if _, err := s.Ack(r - 2); err != nil {
				fail(err)
			}
		}
		fmt.Println("committed", r)
	}
	os.Exit(0)
}

// TestKillDuringWrites SIGKILLs a child writing in a loop, three times,
// and checks after each kill that every committed step is whole and that
// progress never goes back.
func TestKillDuringWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	storetest.KillDuringWrites(t, "edge", storetest.TempPath(t, "edge.db"), func(p string, o storage.Options) error {
		s, err := OpenEdge(p, o)
		storetest.CloseIf(s, err)
		return err
	}, checkEdgeAfterCrash)
}

func checkEdgeAfterCrash(t *testing.T, path string) uint64 {
	t.Helper()
	s := openEdge(t, path)
	defer storetest.CloseT(t, s)
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	a, err := s.AppliedRound()
	if err != nil || a == 0 {
		t.Fatalf("applied round %d, %v", a, err)
	}
	zr, z, err := s.Z()
	if err != nil || zr != a || !slices.Equal(z, storetest.CrashZ(a, 0)) {
		t.Fatalf("z (round %d) does not match applied round %d: %v", zr, a, err)
	}
	res, err := s.Residual(ResidualUplink)
	if err != nil || !slices.Equal(res, storetest.CrashZ(a, 1)) {
		t.Fatalf("residual does not match applied round %d: %v", a, err)
	}
	g, gv, err := s.Global()
	if err != nil || (g != a && g != a+1) || !slices.Equal(gv, storetest.CrashGlobal(g)) {
		t.Fatalf("global round %d (applied %d) wrong: %v", g, a, err)
	}
	if seen, _ := s.SeenRound(); seen != g {
		t.Fatalf("seen %d, global %d", seen, g)
	}
	out, err := s.Outbox()
	if err != nil {
		t.Fatal(err)
	}
	have := map[uint64]bool{}
	for _, e := range out {
		if e.Round > a {
			t.Fatalf("outbox has round %d beyond applied %d", e.Round, a)
		}
		if !bytes.Equal(e.Msg, storetest.CrashMsg(e.Round, 0)) {
			t.Fatalf("outbox entry %d does not match its z", e.Round)
		}
		have[e.Round] = true
	}
	for r := uint64(1); r <= a; r++ {
		acked := (r+2)%3 == 0 && r+2 <= a
		mayBeAcked := (r+2)%3 == 0 && r+2 == a // the ack after commit a may not have run
		if !have[r] && !acked && !mayBeAcked {
			t.Fatalf("committed round %d missing from the outbox (applied %d)", r, a)
		}
		if have[r] && acked && !mayBeAcked {
			t.Fatalf("acked round %d still in the outbox", r)
		}
	}
	return a
}

package aggstore

import (
	"bytes"
	"errors"
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
	if mode != "agg" {
		storetest.CrashFail(fmt.Errorf("unknown mode %q", mode))
	}
	deadline := time.Now().Add(30 * time.Second) // in case the parent is gone
	fail := storetest.CrashFail
	s, err := OpenAgg(path, storage.Options{LockTimeout: 5 * time.Second})
	if err != nil {
		fail(err)
	}
	var start uint64 = 1
	if cur, err := s.CurrentRound(); err == nil {
		start = cur.Number // resume the open round
	} else if !errors.Is(err, storage.ErrNotFound) {
		fail(err)
	}
	for r := start; time.Now().Before(deadline); r++ {
		if cur, err := s.CurrentRound(); err != nil || cur.Number < r {
			rec := Round{Number: r, OpenedAt: time.Unix(int64(r), 0), Config: storetest.CrashMsg(r, 99)}
			if err := s.OpenRound(rec, storetest.CrashGlobal(r)); err != nil {
				fail(err)
			}
		}
		for c := 0; c < storetest.CrashClients; c++ {
			u := Update{Round: r, ClientID: storetest.CrashClient(c), StoredAt: time.Unix(int64(r), 1), SampleCount: 10, Loss: float64(r), Msg: storetest.CrashMsg(r, c)}
			if _, err := s.PutUpdate(u, storetest.CrashZ(r, c)); err != nil {
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
	storetest.KillDuringWrites(t, "agg", storetest.TempPath(t, "agg.db"), func(p string, o storage.Options) error {
		s, err := OpenAgg(p, o)
		storetest.CloseIf(s, err)
		return err
	}, checkAggAfterCrash)
}

func checkAggAfterCrash(t *testing.T, path string) uint64 {
	t.Helper()
	s := openAgg(t, path)
	defer storetest.CloseT(t, s)
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	cur, err := s.CurrentRound()
	if err != nil {
		t.Fatal(err)
	}
	if cur.Status != RoundOpen || !bytes.Equal(cur.Config, storetest.CrashMsg(cur.Number, 99)) {
		t.Fatalf("current round %+v", cur)
	}
	cr, cp, err := s.LatestCheckpoint()
	if err != nil || cr != cur.Number || !slices.Equal(cp, storetest.CrashGlobal(cr)) {
		t.Fatalf("checkpoint %d vs current round %d: %v", cr, cur.Number, err)
	}
	participation := map[string]uint64{}
	for r := uint64(1); r <= cur.Number; r++ {
		rec, err := s.Round(r)
		if err != nil {
			t.Fatal(err)
		}
		if r < cur.Number && rec.Status != RoundClosed {
			t.Fatalf("round %d still open under current round %d", r, cur.Number)
		}
		us, err := s.Updates(r)
		if err != nil {
			t.Fatal(err)
		}
		if r < cur.Number && len(us) != storetest.CrashClients {
			t.Fatalf("closed round %d has %d updates", r, len(us))
		}
		for _, u := range us {
			var c int
			if _, err := fmt.Sscanf(u.ClientID, "site-%d", &c); err != nil || !bytes.Equal(u.Msg, storetest.CrashMsg(r, c)) {
				t.Fatalf("update (%d, %s) corrupt", r, u.ClientID)
			}
			participation[u.ClientID]++
		}
	}
	zs, err := s.LatestZ()
	if err != nil {
		t.Fatal(err)
	}
	for c := 0; c < storetest.CrashClients; c++ {
		id := storetest.CrashClient(c)
		zr, z, err := s.ClientZ(id)
		if err != nil {
			t.Fatal(err)
		}
		// The latest z is the z of the client's newest stored update.
		if _, err := s.GetUpdate(zr, id); err != nil {
			t.Fatalf("z of %s is from round %d without an update: %v", id, zr, err)
		}
		if _, err := s.GetUpdate(zr+1, id); err == nil {
			t.Fatalf("%s has an update for round %d newer than its z", id, zr+1)
		}
		if !slices.Equal(z, storetest.CrashZ(zr, c)) || !slices.Equal(zs[id], z) {
			t.Fatalf("z of %s does not match round %d", id, zr)
		}
		rec, err := s.Client(id)
		if err != nil || rec.Participation != participation[id] {
			t.Fatalf("%s participation %d, stored updates %d: %v", id, rec.Participation, participation[id], err)
		}
	}
	return cur.Number
}

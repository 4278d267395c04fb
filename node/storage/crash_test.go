package storage

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// The kill test re-executes the test binary as a child that writes in a loop
// (TestCrashChild) and SIGKILLs it at a random moment, then reopens the file
// and checks that every committed step is whole. SIGKILL does not lose the
// page cache, so this tests atomicity of each transaction and the recovery
// path, not fsync against power loss.

const crashEnv = "EDGEFL_STORAGE_CRASH_CHILD"

const crashDim = 257 // odd and over a page when combined, to span pages

// The expected content of every step is a function of its round (and
// client), so the parent can verify without talking to the child.
func crashZ(r uint64, client int) []float64 {
	v := make([]float64, crashDim)
	for i := range v {
		v[i] = float64(r)*1e3 + float64(client)*1e-1 + float64(i)*1e-6
	}
	return v
}

func crashMsg(r uint64, client int) []byte {
	return append([]byte(fmt.Sprintf("update r=%d c=%d;", r, client)), encodeFloats(crashZ(r, client))...)
}

func crashGlobal(r uint64) []float64 { return crashZ(r, 99) }

func crashClient(c int) string { return fmt.Sprintf("site-%d", c) }

const crashClients = 3

// TestCrashChild is the child's body; without the environment variable it
// does nothing.
func TestCrashChild(t *testing.T) {
	spec := os.Getenv(crashEnv)
	if spec == "" {
		t.Skip("helper process for TestKillDuringWrites")
	}
	mode, path, _ := strings.Cut(spec, ":")
	deadline := time.Now().Add(30 * time.Second) // in case the parent is gone
	fail := func(err error) {
		fmt.Println("error", err)
		os.Exit(3)
	}
	switch mode {
	case "edge":
		s, err := OpenEdge(path, Options{LockTimeout: 5 * time.Second})
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
			if err := s.SetGlobal(r, crashGlobal(r)); err != nil {
				fail(err)
			}
			if r == 1 {
				if _, err := s.InitZ(r, crashGlobal(r)); err != nil {
					fail(err)
				}
			}
			if err := s.CommitRound(r, crashZ(r, 0), crashZ(r, 1), crashMsg(r, 0)); err != nil {
				fail(err)
			}
			if r%3 == 0 && r > 2 {
				if _, err := s.Ack(r - 2); err != nil {
					fail(err)
				}
			}
			fmt.Println("committed", r)
		}
	case "agg":
		s, err := OpenAgg(path, Options{LockTimeout: 5 * time.Second})
		if err != nil {
			fail(err)
		}
		var start uint64 = 1
		if cur, err := s.CurrentRound(); err == nil {
			start = cur.Number // resume the open round
		} else if !errors.Is(err, ErrNotFound) {
			fail(err)
		}
		for r := start; time.Now().Before(deadline); r++ {
			if cur, err := s.CurrentRound(); err != nil || cur.Number < r {
				rec := Round{Number: r, OpenedAt: time.Unix(int64(r), 0), Config: crashMsg(r, 99)}
				if err := s.OpenRound(rec, crashGlobal(r)); err != nil {
					fail(err)
				}
			}
			for c := 0; c < crashClients; c++ {
				u := Update{Round: r, ClientID: crashClient(c), StoredAt: time.Unix(int64(r), 1), SampleCount: 10, Loss: float64(r), Msg: crashMsg(r, c)}
				if _, err := s.PutUpdate(u, crashZ(r, c)); err != nil {
					fail(err)
				}
			}
			fmt.Println("committed", r)
		}
	default:
		fail(fmt.Errorf("unknown mode %q", mode))
	}
	os.Exit(0)
}

// runAndKill starts the child on path, waits until it has committed at
// least `after` steps plus a random delay, checks that the file is locked
// against this process meanwhile, and SIGKILLs it.
func runAndKill(t *testing.T, mode, path string, after int, rng *rand.Rand) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashEnv+"="+mode+":"+path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	n := 0
	for n < after && sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "committed") {
			n++
		} else if strings.HasPrefix(line, "error") {
			t.Fatalf("child: %s", line)
		}
	}
	if n < after {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child stopped after %d commits: %s", n, stderr.String())
	}
	// Another process holds the lock: we must fail fast, not hang.
	if mode == "edge" {
		if _, err := OpenEdge(path, Options{LockTimeout: 100 * time.Millisecond}); !errors.Is(err, ErrLocked) {
			t.Errorf("open while the child runs: %v, want ErrLocked", err)
		}
	} else if _, err := OpenAgg(path, Options{LockTimeout: 100 * time.Millisecond}); !errors.Is(err, ErrLocked) {
		t.Errorf("open while the child runs: %v, want ErrLocked", err)
	}
	time.Sleep(time.Duration(rng.IntN(20_000)) * time.Microsecond)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = bufio.NewReader(out).WriteTo(devNull{}) }()
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != -1 {
		t.Fatalf("child was not killed: %v; stderr: %s", err, stderr.String())
	}
}

type devNull struct{}

func (devNull) Write(p []byte) (int, error) { return len(p), nil }

func TestKillDuringWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for _, mode := range []string{"edge", "agg"} {
		t.Run(mode, func(t *testing.T) {
			path := tempPath(t, mode+".db")
			last := uint64(0)
			for kill := 0; kill < 3; kill++ {
				runAndKill(t, mode, path, 5, rng)
				var got uint64
				if mode == "edge" {
					got = checkEdgeAfterCrash(t, path)
				} else {
					got = checkAggAfterCrash(t, path)
				}
				if got < last {
					t.Fatalf("progress went back from %d to %d", last, got)
				}
				last = got
				t.Logf("kill %d: consistent at round %d", kill, got)
			}
		})
	}
}

func checkEdgeAfterCrash(t *testing.T, path string) uint64 {
	t.Helper()
	s := openEdge(t, path)
	defer closeT(t, s)
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	a, err := s.AppliedRound()
	if err != nil || a == 0 {
		t.Fatalf("applied round %d, %v", a, err)
	}
	zr, z, err := s.Z()
	if err != nil || zr != a || !slices.Equal(z, crashZ(a, 0)) {
		t.Fatalf("z (round %d) does not match applied round %d: %v", zr, a, err)
	}
	res, err := s.Residual(ResidualUplink)
	if err != nil || !slices.Equal(res, crashZ(a, 1)) {
		t.Fatalf("residual does not match applied round %d: %v", a, err)
	}
	g, gv, err := s.Global()
	if err != nil || (g != a && g != a+1) || !slices.Equal(gv, crashGlobal(g)) {
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
		if !bytes.Equal(e.Msg, crashMsg(e.Round, 0)) {
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

func checkAggAfterCrash(t *testing.T, path string) uint64 {
	t.Helper()
	s := openAgg(t, path)
	defer closeT(t, s)
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	cur, err := s.CurrentRound()
	if err != nil {
		t.Fatal(err)
	}
	if cur.Status != RoundOpen || !bytes.Equal(cur.Config, crashMsg(cur.Number, 99)) {
		t.Fatalf("current round %+v", cur)
	}
	cr, cp, err := s.LatestCheckpoint()
	if err != nil || cr != cur.Number || !slices.Equal(cp, crashGlobal(cr)) {
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
		if r < cur.Number && len(us) != crashClients {
			t.Fatalf("closed round %d has %d updates", r, len(us))
		}
		for _, u := range us {
			var c int
			if _, err := fmt.Sscanf(u.ClientID, "site-%d", &c); err != nil || !bytes.Equal(u.Msg, crashMsg(r, c)) {
				t.Fatalf("update (%d, %s) corrupt", r, u.ClientID)
			}
			participation[u.ClientID]++
		}
	}
	zs, err := s.LatestZ()
	if err != nil {
		t.Fatal(err)
	}
	for c := 0; c < crashClients; c++ {
		id := crashClient(c)
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
		if !slices.Equal(z, crashZ(zr, c)) || !slices.Equal(zs[id], z) {
			t.Fatalf("z of %s does not match round %d", id, zr)
		}
		rec, err := s.Client(id)
		if err != nil || rec.Participation != participation[id] {
			t.Fatalf("%s participation %d, stored updates %d: %v", id, rec.Participation, participation[id], err)
		}
	}
	return cur.Number
}

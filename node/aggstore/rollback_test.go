package aggstore

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/edgefl/edgefl/node/storage"
)

// A flipped bit in round 5's checkpoint: the file is refused on open with
// ErrCorrupt; rounds 1..4 are intact; Rollback to the last intact round
// keeps a copy, reopens round 4 with its checkpoint and coordinator state,
// removes the later rounds and the z they set, and the file opens again.
func TestRollbackPastDamage(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "agg.db")
	makeAggFile(t, path, 6, 50)
	a, err := OpenAgg(path, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cp4, _ := a.Checkpoint(4)
	cp5, _ := a.Checkpoint(5)
	r4, _ := a.Round(4)
	a.Close()

	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(b, storage.EncodeFloats(cp5))
	if at < 0 {
		t.Fatal("checkpoint 5 not found in the file")
	}
	b[at+13] ^= 0x04 // one mantissa bit
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenAgg(path, storage.Options{}); !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("open of a file with a flipped checkpoint bit = %v, want ErrCorrupt", err)
	}
	if n, err := LastIntactRound(path); err != nil || n != 4 {
		t.Fatalf("last intact round %d, %v; want 4", n, err)
	}
	if _, err := Rollback(path, 5, time.Unix(100, 0), nil); !errors.Is(err, storage.ErrInvalid) {
		t.Fatalf("rollback to the damaged round 5 = %v, want ErrInvalid", err)
	}
	res, err := Rollback(path, 0, time.Unix(100, 0), func(c []byte) ([]byte, error) { return append(c, " new"...), nil })
	if err != nil {
		t.Fatal(err)
	}
	if res.Round != 4 || res.Rounds != 2 || len(res.ZsRemoved) != 3 || !slices.Equal(res.Checkpoint, cp4) {
		t.Fatalf("rollback %+v", res)
	}
	if kept, err := os.ReadFile(res.Backup); err != nil || !bytes.Equal(kept, b) {
		t.Fatalf("backup %s: %v (equal: %v)", res.Backup, err, bytes.Equal(kept, b))
	}
	a, err = OpenAgg(path, storage.Options{})
	if err != nil {
		t.Fatalf("open after rollback: %v", err)
	}
	defer a.Close()
	cur, err := a.CurrentRound()
	if err != nil || cur.Number != 4 || cur.Status != RoundOpen || !bytes.Equal(cur.State, r4.State) {
		t.Fatalf("current round after rollback %+v, %v", cur, err)
	}
	if r1, err := a.Round(1); err != nil || string(r1.Config) != `{"federation":"fx"} new` {
		t.Fatalf("round 1 config after rollback %q %v", r1.Config, err)
	}
	if x, err := a.Checkpoint(4); err != nil || !slices.Equal(x, cp4) {
		t.Fatalf("checkpoint 4 %v %v", x, err)
	}
	if _, err := a.Checkpoint(5); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("checkpoint 5 after rollback: %v", err)
	}
	if zs, err := a.LatestZ(); err != nil || len(zs) != 0 {
		t.Fatalf("latest z after rollback %v %v", zs, err)
	}
	if ups, err := a.Updates(4); err != nil || len(ups) != 3 {
		t.Fatalf("updates of round 4: %d %v", len(ups), err)
	}
	// The log goes on from round 4.
	if err := a.OpenRound(Round{Number: 5, OpenedAt: time.Unix(200, 0)}, cp4); err != nil {
		t.Fatal(err)
	}
}

package edgestore

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/testkit/storetest"
)

// The fixture testdata/v1/edge.db was written by the schema-1 code (before
// values were sealed) with the calls of makeEdgeFile below at round 2 and vectors of 3 values; opening it must migrate it
// and read back exactly what was written.
func TestMigrationFromV1Fixtures(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"edge.db"} {
		b, err := os.ReadFile(filepath.Join("testdata", "v1", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	e, err := OpenEdge(filepath.Join(dir, "edge.db"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if id, err := e.Identity(); err != nil || id.ClientID != "site-a" {
		t.Fatalf("identity %+v %v", id, err)
	}
	if r, z, err := e.Z(); err != nil || r != 2 || !slices.Equal(z, []float64{4, 5, 6}) {
		t.Fatalf("z %d %v %v", r, z, err)
	}
	if r, z, err := e.ServerZ(); err != nil || r != 2 || !slices.Equal(z, []float64{4, 5, 6.5}) {
		t.Fatalf("server z %d %v %v", r, z, err)
	}
	if res, err := e.Residual(ResidualUplink); err != nil || !slices.Equal(res, []float64{0.1, 0.2, 0.3}) {
		t.Fatalf("residual %v %v", res, err)
	}
	if out, err := e.Outbox(); err != nil || len(out) != 1 || string(out[0].Msg) != "update-2" {
		t.Fatalf("outbox %+v %v", out, err)
	}
	if id, err := e.RunID(); err != nil || id != "run-1" {
		t.Fatalf("run id %q %v", id, err)
	}
	storetest.CloseT(t, e)
}

func makeEdgeFile(t testing.TB, path string, dim int) {
	e, err := OpenEdge(path, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	defer storetest.SettleMeta(t, e.db)
	v := make([]float64, dim)
	for i := range v {
		v[i] = float64(i) / 7
	}
	if _, err := e.InitIdentity("site-a", time.Unix(1700000000, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.StartRunAt("run-1", 1700000000000); err != nil {
		t.Fatal(err)
	}
	for r := uint64(1); r <= 3; r++ {
		if err := e.SetGlobal(r, v); err != nil {
			t.Fatal(err)
		}
		if r == 1 {
			if _, err := e.InitZ(r, v); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.Commit(Commit{Round: r, Z: v, ServerZ: v, Residual: v, Msg: []byte(strings.Repeat("u", 100))}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Ack(1); err != nil {
		t.Fatal(err)
	}
	// FedSplit's sum mode: a join confirmed (contrib), an update pending.
	for r := uint64(4); r <= 5; r++ {
		if err := e.Commit(Commit{Round: r, Z: v, Msg: []byte(strings.Repeat("s", 50)), Pending: &SumPending{Join: r == 4, V: v}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.AckSum(4, 0, v); err != nil {
		t.Fatal(err)
	}
	// Secure aggregation: the site's session record with the next
	// message's outbox entry (its noise key is drawn from crypto/rand: not
	// in a golden file).
	if err := e.SetSecAgg(5, []byte(strings.Repeat("record", 40)), []byte(strings.Repeat("m", 60))); err != nil {
		t.Fatal(err)
	}
}

func dumpEdge(e *EdgeStore) (string, error) {
	id, err := e.Identity()
	if err != nil {
		return "", err
	}
	gr, g, err := e.Global()
	if err != nil {
		return "", err
	}
	zr, z, err := e.Z()
	if err != nil {
		return "", err
	}
	sr, sz, err := e.ServerZ()
	if err != nil {
		return "", err
	}
	res, err := e.Residual(ResidualUplink)
	if err != nil {
		return "", err
	}
	out, err := e.Outbox()
	if err != nil {
		return "", err
	}
	seen, err := e.SeenRound()
	if err != nil {
		return "", err
	}
	applied, err := e.AppliedRound()
	if err != nil {
		return "", err
	}
	run, err := e.RunID()
	if err != nil {
		return "", err
	}
	cr, c, err := e.Contribution()
	if err != nil {
		return "", err
	}
	p, ok, err := e.Pending(5)
	if err != nil || !ok {
		return "", fmt.Errorf("pending of round 5: %v, %w", ok, err)
	}
	sa, err := e.SecAgg()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%+v %d %v %d %v %d %v %v %+v %d %d %s %d %v %+v %q", id, gr, g, zr, z, sr, sz, res, out, seen, applied, run, cr, c, p, sa), nil
}

// edgeFile is the site's file for the damage tests: the sweep's fixture
// testdata/sweep/edge.db and the fuzzer's smaller file.
var edgeFile = storetest.File{
	Kind: "edge",
	Build: func(t testing.TB, path string, small bool) {
		if small {
			makeEdgeFile(t, path, 40)
		} else {
			makeEdgeFile(t, path, 600)
		}
	},
	Dump: dumpEdgeFile,
	// The instance id is drawn anew by each build.
	Fresh: func(fresh, fixture string) string {
		id := func(s string) string {
			_, rest, _ := strings.Cut(s, "InstanceID:")
			id, _, _ := strings.Cut(rest, " ")
			return id
		}
		return strings.Replace(fresh, id(fresh), id(fixture), 1)
	},
}

// dumpEdgeFile opens path, reads everything back and closes it.
func dumpEdgeFile(path string) (got string, err error) {
	e, err := OpenEdge(path, storage.Options{})
	if err != nil {
		return "", err
	}
	got, err = dumpEdge(e)
	if cerr := e.Close(); err == nil {
		err = cerr
	}
	return got, err
}

// TestCorruptionSweep damages the site's file every way a disk or an
// operator does (storetest.Sweep).
func TestCorruptionSweep(t *testing.T) { storetest.Sweep(t, edgeFile) }

// TestZeroedMetaPage: a damaged meta page of the site's file is
// refused as a damaged file (storetest.ZeroedMetaPage).
func TestZeroedMetaPage(t *testing.T) { storetest.ZeroedMetaPage(t, edgeFile) }

// TestLostEntriesRefused: a lowered element count in any leaf page of
// the site's file is read back intact or refused (storetest.LostEntries).
func TestLostEntriesRefused(t *testing.T) { storetest.LostEntries(t, edgeFile) }

func FuzzEdgeFile(f *testing.F) { storetest.Fuzz(f, edgeFile) }

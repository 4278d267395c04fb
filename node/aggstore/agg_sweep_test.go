package aggstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/testkit/storetest"
)

// The fixture testdata/v1/agg.db was written by the schema-1 code (before
// values were sealed) with the calls of makeAggFile below at round 3 and vectors of 3 values; opening it must migrate it
// and read back exactly what was written.
func TestMigrationFromV1Fixtures(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"agg.db"} {
		b, err := os.ReadFile(filepath.Join("testdata", "v1", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a, err := OpenAgg(filepath.Join(dir, "agg.db"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := storage.SchemaVersion(a.db); v != aggSchema.Version() {
		t.Fatalf("agg version %d after migration, want %d", v, aggSchema.Version())
	}
	cur, err := a.CurrentRound()
	if err != nil || cur.Number != 3 || string(cur.Config) != `{"federation":"fx"}` || string(cur.State) != `{"round":1}` {
		t.Fatalf("current round %+v, %v", cur, err)
	}
	for r := uint64(1); r <= 3; r++ {
		x, err := a.Checkpoint(r)
		if err != nil || !slices.Equal(x, []float64{float64(r), 0.5, -1.25}) {
			t.Fatalf("checkpoint %d = %v, %v", r, x, err)
		}
		ups, err := a.Updates(r)
		if err != nil || len(ups) != 2 || string(ups[1].Msg) != "msg-site-b" || ups[0].SampleCount != 10 || ups[0].Loss != 0.25 {
			t.Fatalf("updates of %d = %+v, %v", r, ups, err)
		}
	}
	if r, z, err := a.ClientZ("site-b"); err != nil || r != 3 || !slices.Equal(z, []float64{3, math.Pi, 1e-300}) {
		t.Fatalf("z of site-b = %d %v %v", r, z, err)
	}
	if c, err := a.Client("site-a"); err != nil || !c.Online || c.Participation != 3 {
		t.Fatalf("client site-a %+v %v", c, err)
	}
	storetest.CloseT(t, a)
}

// makeAggFile writes an aggregator file the way a FedSplit run does:
// rounds, updates with z, checkpoints, registry entries. dim spreads it over
// several pages.
func makeAggFile(t testing.TB, path string, rounds, dim int) {
	a, err := OpenAgg(path, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer storetest.SettleMeta(t, a.db)
	at := time.Unix(1700000000, 0)
	rng := rand.New(rand.NewPCG(1, 2))
	vec := func() []float64 {
		v := make([]float64, dim)
		for i := range v {
			v[i] = rng.NormFloat64()
		}
		return v
	}
	for r := 1; r <= rounds; r++ {
		if err := a.OpenRound(Round{Number: uint64(r), OpenedAt: at, Config: []byte(`{"federation":"fx"}`), State: []byte(fmt.Sprintf(`{"round":%d}`, r)), Sum: []byte(fmt.Sprintf("sum of round %d", r))}, vec()); err != nil {
			t.Fatal(err)
		}
		for _, c := range []string{"site-a", "site-b", "site-c"} {
			if _, err := a.PutUpdate(Update{Round: uint64(r), ClientID: c, StoredAt: at, SampleCount: 10, Loss: 0.25, Msg: []byte(strings.Repeat(c, 20))}, vec()); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Secure aggregation: the server state of the last round's session
	// and two ShareKeys after it, in the replay log.
	if err := a.PutRoundState(uint64(rounds), []byte(`{"secagg":true}`)); err != nil {
		t.Fatal(err)
	}
	if err := a.PutSecAggServer(uint64(rounds), 1, []byte(strings.Repeat("server", 30)), 3); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"site-a", "site-b"} {
		if _, err := a.PutSecAggMessage(SecAggRecord{Round: uint64(rounds), Attempt: 1, Kind: 3, ClientID: c, Msg: []byte(strings.Repeat("k"+c, 12))}, at); err != nil {
			t.Fatal(err)
		}
	}
}

// dumpAgg reads everything an aggregator restarts from.
func dumpAgg(a *AggStore) (string, error) {
	var b strings.Builder
	cur, err := a.CurrentRound()
	if err != nil {
		return "", err
	}
	for r := uint64(1); r <= cur.Number; r++ {
		rd, err := a.Round(r)
		if err != nil {
			return "", err
		}
		x, err := a.Checkpoint(r)
		if err != nil {
			return "", err
		}
		ups, err := a.Updates(r)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "%d %v %s %s %q %v %+v\n", r, rd.Status, rd.Config, rd.State, rd.Sum, x, ups)
	}
	zs, err := a.LatestZ()
	if err != nil {
		return "", err
	}
	cs, err := a.Clients()
	if err != nil {
		return "", err
	}
	last, logged, err := a.Log()
	if err != nil {
		return "", err
	}
	sr, sa, sst, err := a.SecAggServer()
	if err != nil {
		return "", err
	}
	sms, err := a.SecAggMessages(sr, sa)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(&b, "%v %+v\nlog %d %+v\nsecagg %d %d %q %+v\n", zs, cs, last, logged, sr, sa, sst, sms)
	return b.String(), nil
}

// aggFile is the aggregator's file for the damage tests: the sweep's
// fixture testdata/sweep/agg.db and the fuzzer's smaller file.
var aggFile = storetest.File{
	Kind: "agg",
	Build: func(t testing.TB, path string, small bool) {
		if small {
			makeAggFile(t, path, 3, 40)
		} else {
			makeAggFile(t, path, 6, 300)
		}
	},
	Dump: dumpAggFile,
}

// dumpAggFile opens path, reads everything back and closes it.
func dumpAggFile(path string) (got string, err error) {
	a, err := OpenAgg(path, storage.Options{})
	if err != nil {
		return "", err
	}
	got, err = dumpAgg(a)
	if cerr := a.Close(); err == nil {
		err = cerr
	}
	return got, err
}

// TestCorruptionSweep damages the aggregator's file every way a disk or
// an operator does (storetest.Sweep).
func TestCorruptionSweep(t *testing.T) { storetest.Sweep(t, aggFile) }

// TestZeroedMetaPage: a damaged meta page of the aggregator's file is
// refused as a damaged file (storetest.ZeroedMetaPage).
func TestZeroedMetaPage(t *testing.T) { storetest.ZeroedMetaPage(t, aggFile) }

// TestLostEntriesRefused: a lowered element count in any leaf page of
// the aggregator's file is read back intact or refused
// (storetest.LostEntries).
func TestLostEntriesRefused(t *testing.T) { storetest.LostEntries(t, aggFile) }

func FuzzAggFile(f *testing.F) { storetest.Fuzz(f, aggFile) }

// TestLostEntriesWithoutCensus shows the defect itself: a lowered
// element count in a round's updates, with the counts recomputed from the
// damaged file (what a file without counts amounts to), opens cleanly and
// lists an update less; with the counts as written it is refused.
func TestLostEntriesWithoutCensus(t *testing.T) {
	dir := t.TempDir()
	_, base := storetest.SweepFile(t, dir, aggFile)
	for _, off := range storetest.CountFields(base, 4096) {
		n := binary.LittleEndian.Uint16(base[off:])
		if n != 3 { // a round's updates: site-a, site-b, site-c
			continue
		}
		b := slices.Clone(base)
		binary.LittleEndian.PutUint16(b[off:], n-1)
		path := filepath.Join(dir, fmt.Sprintf("at%d.db", off))
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		err := dumpAggFileErr(path)
		if err == nil || !strings.Contains(err.Error(), "sealed count") {
			continue // some other check's case (or a round record's keys)
		}
		if !errors.Is(err, storage.ErrCorrupt) || !strings.Contains(err.Error(), path) {
			t.Fatalf("lowered count at %d: %v, want ErrCorrupt naming the file", off, err)
		}
		// The same damage with the counts taken from the damaged file.
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Update(func(tx *bolt.Tx) error { return storage.WriteCensus(&storage.Tx{Tx: tx}) }); err != nil {
			t.Fatal(err)
		}
		db.Close()
		a, err := OpenAgg(path, storage.Options{})
		if err != nil {
			t.Fatalf("lowered count at %d, counts retaken: %v", off, err)
		}
		cur, err := a.CurrentRound()
		if err != nil {
			t.Fatal(err)
		}
		for r := uint64(1); r <= cur.Number; r++ {
			if ups, err := a.Updates(r); err == nil && len(ups) == 2 {
				t.Logf("lowered count at %d: without its sealed count, round %d lists %d updates, no error", off, r, len(ups))
				a.Close()
				return
			}
		}
		// Another bucket of three entries (the replay log of the last
		// round's updates): its loss is not a short listing of updates.
		a.Close()
	}
	t.Fatal("no round's updates page with a lowered count was refused by the sealed counts")
}

func dumpAggFileErr(path string) error {
	_, err := dumpAggFile(path)
	return err
}

// TestCensusCatchesBypass: a write that goes around the census wrappers
// (bbolt's own Put, Delete or CreateBucket under a Tx) leaves the sealed
// counts behind the file; a binary has no self-check (main_test.go), and
// the next open refuses the file, naming the bucket, as it refuses an entry
// lost to damage.
func TestCensusCatchesBypass(t *testing.T) {
	storage.SelfCheckCensus = false
	defer func() { storage.SelfCheckCensus = true }()
	for _, tt := range []struct {
		name   string
		bypass func(tx *storage.Tx) error
		bucket string
	}{
		{"put", func(tx *storage.Tx) error {
			return tx.Tx.Bucket(bucketClients).Put([]byte("ghost"), storage.Seal([]byte("ghost"), []byte(`{"id":"ghost"}`)))
		}, "clients"},
		{"delete", func(tx *storage.Tx) error {
			return tx.Tx.Bucket(bucketUpdates).Bucket(storage.EncodeU64(1)).Delete([]byte("site-a"))
		}, "updates"},
		{"nested bucket", func(tx *storage.Tx) error {
			_, err := tx.Tx.Bucket(bucketUpdates).CreateBucket(storage.EncodeU64(2))
			return err
		}, "updates"},
		{"cursor delete", func(tx *storage.Tx) error {
			c := tx.Bucket(bucketCheckpoints).Cursor()
			c.First()
			return c.Delete()
		}, "checkpoints"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := storetest.TempPath(t, "agg.db")
			s := openAgg(t, path)
			if err := s.OpenRound(Round{Number: 1, OpenedAt: t0, State: []byte("s")}, []float64{1}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.PutUpdate(Update{Round: 1, ClientID: "site-a", StoredAt: t0, Msg: []byte("u")}, nil); err != nil {
				t.Fatal(err)
			}
			if err := s.db.Update(tt.bypass); err != nil {
				t.Fatal(err)
			}
			storetest.CloseT(t, s)
			_, err := OpenAgg(path, storage.Options{})
			if !errors.Is(err, storage.ErrCorrupt) || !strings.Contains(err.Error(), "bucket "+tt.bucket+" holds") {
				t.Fatalf("open after a write around the wrappers: %v, want ErrCorrupt naming bucket %s", err, tt.bucket)
			}
		})
	}
}

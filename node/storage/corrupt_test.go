package storage

import (
	"bytes"
	"errors"
	"flag"

	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The fixtures in testdata/v1 were written by the schema-1 code (before
// values were sealed) with the calls of makeAggFile/makeEdgeFile below at
// rounds 3 and 2 and vectors of 3 values; opening them must migrate them
// and read back exactly what was written.
func TestMigrationFromV1Fixtures(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"agg.db", "edge.db"} {
		b, err := os.ReadFile(filepath.Join("testdata", "v1", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a, err := OpenAgg(filepath.Join(dir, "agg.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := schemaVersion(a.db); v != aggSchema.version() {
		t.Fatalf("agg version %d after migration, want %d", v, aggSchema.version())
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
	closeT(t, a)

	e, err := OpenEdge(filepath.Join(dir, "edge.db"), Options{})
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
	closeT(t, e)
}

// makeAggFile writes an aggregator file the way a FedSplit run does:
// rounds, updates with z, checkpoints, registry entries. dim spreads it over
// several pages.
func makeAggFile(t testing.TB, path string, rounds, dim int) {
	a, err := OpenAgg(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer settleMeta(t, a.db)
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

// settleMeta commits two empty transactions, so both of bbolt's meta pages
// describe the same data. bbolt falls back to the older meta page when the
// newer one is damaged (a torn last commit looks exactly like that, and
// that commit was never acknowledged); with both alike, damage to either
// meta page must read back intact or be refused, like any other page.
func settleMeta(t testing.TB, db *guardedDB) {
	for range 2 {
		if err := db.Update(func(*wtx) error { return nil }); err != nil {
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

func makeEdgeFile(t testing.TB, path string, dim int) {
	e, err := OpenEdge(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	defer settleMeta(t, e.db)
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

// outcome of opening and reading one damaged file.
type outcome int

const (
	intact  outcome = iota // opened, every value read back equal
	refused                // an error wrapping ErrCorrupt
)

// openDamaged opens b (written to a fresh file) with the real open path and
// reads everything back, under a time limit. Any other outcome than an
// intact read or an ErrCorrupt error fails the test: a panic kills the test
// binary, a hang fails here, silently different numbers fail here.
func openDamaged(t testing.TB, dir string, b []byte, agg bool, want, what string) outcome {
	path := filepath.Join(dir, "damaged.db")
	_ = os.Remove(path)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	type result struct {
		got string
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.got, r.err = dumpFile(path, map[bool]string{true: "agg", false: "edge"}[agg])
		done <- r
	}()
	select {
	case r := <-done:
		switch {
		case r.err == nil && r.got == want:
			return intact
		case r.err == nil:
			t.Fatalf("%s: opened and read different values:\n got %.300s\nwant %.300s", what, r.got, want)
		case !errors.Is(r.err, ErrCorrupt):
			t.Fatalf("%s: error not wrapping ErrCorrupt: %v", what, r.err)
		case !strings.Contains(r.err.Error(), path) && !strings.Contains(r.err.Error(), "damaged.db"):
			t.Fatalf("%s: error does not name the file: %v", what, r.err)
		case strings.Contains(r.err.Error(), "panic") || strings.Contains(r.err.Error(), "assertion") || strings.Contains(r.err.Error(), "\n"):
			// The file is damaged; nothing crashed: bbolt's own words
			// for a page it trips on must not read like a crash.
			t.Fatalf("%s: the refusal reads like a crash or is not one line: %q", what, r.err)
		}
		return refused
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: open and read did not finish in 5 s (a hang)", what)
	}
	return refused
}

// TestCorruptionSweep damages real state files every way a disk or an
// operator does (truncation at every page boundary, each page zeroed, random
// bit flips) and checks each is either read back intact or refused with an
// ErrCorrupt error naming the file: never a panic, a hang or a wrong value.
//
// The files are fixtures (sweepFile), so every run damages the same bytes;
// the random flips run over several seeds.
func TestCorruptionSweep(t *testing.T) {
	for _, kind := range []string{"agg", "edge"} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			want, base := sweepFile(t, dir, kind)
			const page = 4096
			counts := map[string][2]int{}
			note := func(what string, o outcome) {
				c := counts[what]
				c[o]++
				counts[what] = c
			}
			for off := 0; off < len(base); off += page {
				note("truncate", openDamaged(t, dir, base[:off], kind == "agg", want, fmt.Sprintf("truncated to %d", off)))
				if off > 0 {
					note("truncate", openDamaged(t, dir, base[:off+page/2], kind == "agg", want, fmt.Sprintf("truncated to %d", off+page/2)))
				}
				z := slices.Clone(base)
				clear(z[off : off+page])
				note("zero page", openDamaged(t, dir, z, kind == "agg", want, fmt.Sprintf("page %d zeroed", off/page)))
			}
			for _, seed := range []uint64{7, 8, 9} {
				rng := rand.New(rand.NewPCG(seed, uint64(len(kind))))
				for i := 0; i < 300; i++ {
					f := slices.Clone(base)
					var flips []int
					for j := 0; j <= i%3; j++ {
						bit := rng.IntN(8 * len(f))
						f[bit/8] ^= 1 << (bit % 8)
						flips = append(flips, bit)
					}
					note("bit flips", openDamaged(t, dir, f, kind == "agg", want, fmt.Sprintf("seed %d: bits %v flipped", seed, flips)))
				}
			}
			for what, c := range counts {
				t.Logf("%s file (%d bytes), %s: %d read back intact, %d refused with ErrCorrupt", kind, len(base), what, c[intact], c[refused])
			}
		})
	}
}

// TestZeroedMetaPage: a zeroed or overwritten meta page (either of the
// two) is refused as a damaged file, in the words the other damage gets:
// it names the file and the page, and says nothing of a panic or a failed
// assertion (bbolt's consistency check said "panic: assertion failed:
// page 0: has unexpected type/flags: 0", which reads like a crash).
func TestZeroedMetaPage(t *testing.T) {
	for _, kind := range []string{"agg", "edge"} {
		dir := t.TempDir()
		_, base := sweepFile(t, dir, kind)
		for _, c := range []struct {
			name string
			page int
			fill func(p []byte)
			want string
		}{
			{"page 0 zeroed", 0, func(p []byte) { clear(p) }, "meta page 0 is zeroed"},
			{"page 1 zeroed", 1, func(p []byte) { clear(p) }, "meta page 1 is zeroed"},
			{"page 0 overwritten", 0, func(p []byte) { copy(p, base[2*4096:3*4096]) }, "meta page 0 is overwritten (its header says page 2"},
			{"page 1 overwritten", 1, func(p []byte) { copy(p, base[2*4096:3*4096]) }, "meta page 1 is overwritten"},
		} {
			t.Run(kind+"/"+c.name, func(t *testing.T) {
				b := slices.Clone(base)
				c.fill(b[c.page*4096 : (c.page+1)*4096])
				path := filepath.Join(dir, "damaged.db")
				if err := os.WriteFile(path, b, 0o600); err != nil {
					t.Fatal(err)
				}
				_, err := dumpFile(path, kind)
				if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), path+" is damaged: "+c.want) ||
					strings.Contains(err.Error(), "panic") || strings.Contains(err.Error(), "assertion") {
					t.Fatalf("%v, want ErrCorrupt with %q and no panic or assertion", err, path+" is damaged: "+c.want)
				}
			})
		}
	}
}

// fuzzFile damages a small real state file as data says: each 5-byte group
// is a little-endian uint32 offset and a byte XORed in there; a trailing
// group of fewer than 5 bytes truncates the file to (its first byte) pages.
func fuzzFile(f *testing.F, agg bool) {
	dir := f.TempDir()
	orig := filepath.Join(dir, "orig.db")
	var want string
	var err error
	if agg {
		makeAggFile(f, orig, 3, 40)
		a, err2 := OpenAgg(orig, Options{})
		if err2 != nil {
			f.Fatal(err2)
		}
		want, err = dumpAgg(a)
		a.Close()
	} else {
		makeEdgeFile(f, orig, 40)
		e, err2 := OpenEdge(orig, Options{})
		if err2 != nil {
			f.Fatal(err2)
		}
		want, err = dumpEdge(e)
		e.Close()
	}
	if err != nil {
		f.Fatal(err)
	}
	base, err := os.ReadFile(orig)
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte{})
	f.Add([]byte{3})
	f.Add([]byte{0x10, 0, 0, 0, 0xff})
	f.Add([]byte{0x20, 0x10, 0, 0, 0x01, 0x40, 0x30, 0, 0, 0x80})
	for pg := 0; pg < len(base)/4096; pg++ {
		f.Add([]byte{byte(pg*4096 + 20), byte((pg*4096 + 20) >> 8), 0, 0, 0x5a})
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		b := slices.Clone(base)
		for ; len(data) >= 5; data = data[5:] {
			off := uint32(data[0]) | uint32(data[1])<<8 | uint32(data[2])<<16 | uint32(data[3])<<24
			b[off%uint32(len(b))] ^= data[4]
		}
		if len(data) > 0 {
			b = b[:min(len(b), int(data[0])*4096)]
		}
		openDamaged(t, dir, b, agg, want, fmt.Sprintf("mutation %x", data))
	})
}

func FuzzAggFile(f *testing.F)  { fuzzFile(f, true) }
func FuzzEdgeFile(f *testing.F) { fuzzFile(f, false) }

var updateSweep = flag.Bool("update", false, "rewrite the golden files: node/storage/testdata/sweep/*.db with makeAggFile and makeEdgeFile")

// sweepFile returns what the sweep's file of kind reads back as and its
// bytes: testdata/sweep/<kind>.db, written by makeAggFile or makeEdgeFile
// (go test -run TestCorruptionSweep -update ./node/storage/). A file built
// anew differs from run to run (bbolt places the pages of the buckets a
// transaction wrote in map order, and the edge file draws its instance id),
// so the seeded flips would land on other bytes each run; the fixture keeps
// the damage the same. It must be of the current schema version and hold
// what the builders write today.
func sweepFile(t *testing.T, dir, kind string) (string, []byte) {
	t.Helper()
	fixture := filepath.Join("testdata", "sweep", kind+".db")
	fresh := filepath.Join(dir, "fresh.db")
	freshWant, freshBytes := makeSweepFile(t, fresh, kind)
	if *updateSweep {
		if err := os.MkdirAll(filepath.Dir(fixture), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(fixture, freshBytes, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	base, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatalf("%v (write it with -update)", err)
	}
	orig := filepath.Join(dir, "orig.db")
	if err := os.WriteFile(orig, base, 0o600); err != nil {
		t.Fatal(err)
	}
	want, err := dumpFile(orig, kind)
	if err != nil {
		t.Fatal(err)
	}
	if after, err := os.ReadFile(orig); err != nil || !bytes.Equal(after, base) {
		t.Fatalf("%s changes when opened (migrated?): rewrite it with -update", fixture)
	}
	if kind == "edge" { // the instance id is drawn anew
		id := func(s string) string {
			_, rest, _ := strings.Cut(s, "InstanceID:")
			id, _, _ := strings.Cut(rest, " ")
			return id
		}
		freshWant = strings.Replace(freshWant, id(freshWant), id(want), 1)
	}
	if want != freshWant {
		t.Fatalf("%s no longer holds what the builder writes: rewrite it with -update", fixture)
	}
	return want, base
}

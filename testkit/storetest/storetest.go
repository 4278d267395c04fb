// Package storetest is what the tests of the two stores (node/edgestore,
// node/aggstore) share: the damage tests that take a real state file apart
// (Sweep, ZeroedMetaPage, LostEntries, Fuzz, on the golden file
// testdata/sweep/<kind>.db of the calling package) and the kill test's
// child protocol (RunAndKill). Imported by tests only.
package storetest

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgefl/edgefl/node/storage"
)

// File is one kind of state file the damage tests take apart.
type File struct {
	// Kind names the fixture (testdata/sweep/<Kind>.db, in the test's
	// package) and seeds the random flips: "agg" or "edge".
	Kind string
	// Build writes a file of this kind at path; small makes the fuzzers'
	// smaller file.
	Build func(t testing.TB, path string, small bool)
	// Dump opens path, reads back everything a restart reads, and closes
	// it.
	Dump func(path string) (string, error)
	// Fresh, when set, makes what a freshly built file reads back as
	// comparable with the fixture's (a value drawn anew on each build).
	Fresh func(fresh, fixture string) string
}

// TempPath is name in a fresh temporary directory of the test.
func TempPath(t *testing.T, name string) string {
	t.Helper()
	return filepath.Join(t.TempDir(), name)
}

// CloseT closes c and fails the test on an error.
func CloseT(t *testing.T, c interface{ Close() error }) {
	t.Helper()
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// CloseIf closes c when err is nil (c came with err from an open).
func CloseIf(c interface{ Close() error }, err error) {
	if err == nil {
		_ = c.Close()
	}
}

// SettleMeta commits two empty transactions, so both of bbolt's meta pages
// describe the same data. bbolt falls back to the older meta page when the
// newer one is damaged (a torn last commit looks exactly like that, and
// that commit was never acknowledged); with both alike, damage to either
// meta page must read back intact or be refused, like any other page.
func SettleMeta(t testing.TB, db *storage.DB) {
	for range 2 {
		if err := db.Update(func(*storage.Tx) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
}

// Outcome of opening and reading one damaged file.
type Outcome int

const (
	Intact  Outcome = iota // opened, every value read back equal
	Refused                // an error wrapping ErrCorrupt
)

// OpenDamaged opens b (written to dir/damaged.db) with the real open path
// and reads everything back, under a time limit. Any other outcome than an
// intact read or an ErrCorrupt error fails the test: a panic kills the test
// binary, a hang fails here, silently different numbers fail here.
func OpenDamaged(t testing.TB, dir string, b []byte, f File, want, what string) Outcome {
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
		r.got, r.err = f.Dump(path)
		done <- r
	}()
	select {
	case r := <-done:
		switch {
		case r.err == nil && r.got == want:
			return Intact
		case r.err == nil:
			t.Fatalf("%s: opened and read different values:\n got %.300s\nwant %.300s", what, r.got, want)
		case !errors.Is(r.err, storage.ErrCorrupt):
			t.Fatalf("%s: error not wrapping ErrCorrupt: %v", what, r.err)
		case !strings.Contains(r.err.Error(), path) && !strings.Contains(r.err.Error(), "damaged.db"):
			t.Fatalf("%s: error does not name the file: %v", what, r.err)
		case strings.Contains(r.err.Error(), "panic") || strings.Contains(r.err.Error(), "assertion") || strings.Contains(r.err.Error(), "\n"):
			// The file is damaged; nothing crashed: bbolt's own words
			// for a page it trips on must not read like a crash.
			t.Fatalf("%s: the refusal reads like a crash or is not one line: %q", what, r.err)
		}
		return Refused
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: open and read did not finish in 5 s (a hang)", what)
	}
	return Refused
}

// Sweep damages the fixture of f every way a disk or an operator does
// (truncation at every page boundary, each page zeroed, random bit flips)
// and checks each is either read back intact or refused with an ErrCorrupt
// error naming the file: never a panic, a hang or a wrong value.
//
// The file is a fixture (SweepFile), so every run damages the same bytes;
// the random flips run over several seeds.
func Sweep(t *testing.T, f File) {
	t.Run(f.Kind, func(t *testing.T) {
		dir := t.TempDir()
		want, base := SweepFile(t, dir, f)
		const page = 4096
		counts := map[string][2]int{}
		note := func(what string, o Outcome) {
			c := counts[what]
			c[o]++
			counts[what] = c
		}
		for off := 0; off < len(base); off += page {
			note("truncate", OpenDamaged(t, dir, base[:off], f, want, fmt.Sprintf("truncated to %d", off)))
			if off > 0 {
				note("truncate", OpenDamaged(t, dir, base[:off+page/2], f, want, fmt.Sprintf("truncated to %d", off+page/2)))
			}
			z := slices.Clone(base)
			clear(z[off : off+page])
			note("zero page", OpenDamaged(t, dir, z, f, want, fmt.Sprintf("page %d zeroed", off/page)))
		}
		for _, seed := range []uint64{7, 8, 9} {
			rng := rand.New(rand.NewPCG(seed, uint64(len(f.Kind))))
			for i := 0; i < 300; i++ {
				b := slices.Clone(base)
				var flips []int
				for j := 0; j <= i%3; j++ {
					bit := rng.IntN(8 * len(b))
					b[bit/8] ^= 1 << (bit % 8)
					flips = append(flips, bit)
				}
				note("bit flips", OpenDamaged(t, dir, b, f, want, fmt.Sprintf("seed %d: bits %v flipped", seed, flips)))
			}
		}
		for what, c := range counts {
			t.Logf("%s file (%d bytes), %s: %d read back intact, %d refused with ErrCorrupt", f.Kind, len(base), what, c[Intact], c[Refused])
		}
	})
}

// ZeroedMetaPage: a zeroed or overwritten meta page (either of the two) is
// refused as a damaged file, in the words the other damage gets: it names
// the file and the page, and says nothing of a panic or a failed assertion
// (bbolt's consistency check said "panic: assertion failed: page 0: has
// unexpected type/flags: 0", which reads like a crash).
func ZeroedMetaPage(t *testing.T, f File) {
	dir := t.TempDir()
	_, base := SweepFile(t, dir, f)
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
		t.Run(f.Kind+"/"+c.name, func(t *testing.T) {
			b := slices.Clone(base)
			c.fill(b[c.page*4096 : (c.page+1)*4096])
			path := filepath.Join(dir, "damaged.db")
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := f.Dump(path)
			if !errors.Is(err, storage.ErrCorrupt) || !strings.Contains(err.Error(), path+" is damaged: "+c.want) ||
				strings.Contains(err.Error(), "panic") || strings.Contains(err.Error(), "assertion") {
				t.Fatalf("%v, want ErrCorrupt with %q and no panic or assertion", err, path+" is damaged: "+c.want)
			}
		})
	}
}

// Fuzz damages a small real state file of f as data says: each 5-byte
// group is a little-endian uint32 offset and a byte XORed in there; a
// trailing group of fewer than 5 bytes truncates the file to (its first
// byte) pages.
func Fuzz(fz *testing.F, f File) {
	dir := fz.TempDir()
	orig := filepath.Join(dir, "orig.db")
	f.Build(fz, orig, true)
	want, err := f.Dump(orig)
	if err != nil {
		fz.Fatal(err)
	}
	base, err := os.ReadFile(orig)
	if err != nil {
		fz.Fatal(err)
	}
	fz.Add([]byte{})
	fz.Add([]byte{3})
	fz.Add([]byte{0x10, 0, 0, 0, 0xff})
	fz.Add([]byte{0x20, 0x10, 0, 0, 0x01, 0x40, 0x30, 0, 0, 0x80})
	for pg := 0; pg < len(base)/4096; pg++ {
		fz.Add([]byte{byte(pg*4096 + 20), byte((pg*4096 + 20) >> 8), 0, 0, 0x5a})
	}
	fz.Fuzz(func(t *testing.T, data []byte) {
		b := slices.Clone(base)
		for ; len(data) >= 5; data = data[5:] {
			off := uint32(data[0]) | uint32(data[1])<<8 | uint32(data[2])<<16 | uint32(data[3])<<24
			b[off%uint32(len(b))] ^= data[4]
		}
		if len(data) > 0 {
			b = b[:min(len(b), int(data[0])*4096)]
		}
		OpenDamaged(t, dir, b, f, want, fmt.Sprintf("mutation %x", data))
	})
}

var updateSweep = flag.Bool("update", false, "rewrite the golden files testdata/sweep/*.db of the store under test with its builder")

// SweepFile returns what the sweep's file of f reads back as and its
// bytes: testdata/sweep/<kind>.db, written by f.Build (go test -run
// TestCorruptionSweep -update ./node/edgestore/ or ./node/aggstore/). A
// file built anew differs from run to run (bbolt places the pages of the
// buckets a transaction wrote in map order, and the edge file draws its
// instance id), so the seeded flips would land on other bytes each run;
// the fixture keeps the damage the same. It must be of the current schema
// version and hold what the builder writes today.
func SweepFile(t *testing.T, dir string, f File) (string, []byte) {
	t.Helper()
	fixture := filepath.Join("testdata", "sweep", f.Kind+".db")
	fresh := filepath.Join(dir, "fresh.db")
	f.Build(t, fresh, false)
	freshWant, err := f.Dump(fresh)
	if err != nil {
		t.Fatal(err)
	}
	freshBytes, err := os.ReadFile(fresh)
	if err != nil {
		t.Fatal(err)
	}
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
	want, err := f.Dump(orig)
	if err != nil {
		t.Fatal(err)
	}
	if after, err := os.ReadFile(orig); err != nil || !bytes.Equal(after, base) {
		t.Fatalf("%s changes when opened (migrated?): rewrite it with -update", fixture)
	}
	if f.Fresh != nil {
		freshWant = f.Fresh(freshWant, want)
	}
	if want != freshWant {
		t.Fatalf("%s no longer holds what the builder writes: rewrite it with -update", fixture)
	}
	return want, base
}

// bbolt's page layout (internal/common): a 16-byte header (id u64, flags
// u16, count u16, overflow u32), then 16-byte leaf elements (flags, pos,
// ksize, vsize; u32 each) whose key and value sit pos bytes after the
// element. A bucket's value is its header (root u64, sequence u64),
// followed by the bucket's own page when it is inline (root 0).
const (
	boltPageHeader = 16
	boltLeafPage   = 0x02
	boltBucketLeaf = 0x01
	boltElem       = 16
)

// CountFields returns the file offsets of the element count of every leaf
// page of b, and of every inline bucket's page inside those leaves.
func CountFields(b []byte, page int) []int {
	var offs []int
	var inPage func(start, end int)
	inPage = func(start, end int) {
		if start+boltPageHeader > end || binary.LittleEndian.Uint16(b[start+8:]) != boltLeafPage {
			return
		}
		offs = append(offs, start+10)
		n := int(binary.LittleEndian.Uint16(b[start+10:]))
		for i := range n {
			e := start + boltPageHeader + i*boltElem
			if e+boltElem > end {
				return
			}
			flags, pos := binary.LittleEndian.Uint32(b[e:]), int(binary.LittleEndian.Uint32(b[e+4:]))
			ks, vs := int(binary.LittleEndian.Uint32(b[e+8:])), int(binary.LittleEndian.Uint32(b[e+12:]))
			v := e + pos + ks
			if flags&boltBucketLeaf == 0 || v+vs > end || vs < 16+boltPageHeader || binary.LittleEndian.Uint64(b[v:]) != 0 {
				continue
			}
			inPage(v+16, v+vs) // an inline bucket
		}
	}
	for p := 2 * page; p+page <= len(b); p += page {
		over := int(binary.LittleEndian.Uint32(b[p+12:]))
		inPage(p, min(len(b), p+(1+over)*page))
	}
	return offs
}

// LostEntries is the deterministic form of what the sweep found about 1
// run in 25: a flipped bit in a leaf page's element count (a page of its
// own or an inline bucket's) leaves a file that passes the page walk,
// bbolt's check and every seal, but one entry short, so Updates(2) listed
// 2 updates instead of 3. Every such damage must now be read back intact
// or refused with ErrCorrupt naming the file; and some of it is refused by
// the sealed counts alone.
func LostEntries(t *testing.T, f File) {
	t.Run(f.Kind, func(t *testing.T) {
		dir := t.TempDir()
		want, base := SweepFile(t, dir, f)
		offs := CountFields(base, 4096)
		if len(offs) < 3 {
			t.Fatalf("found %d element counts in the file, the page scan is off", len(offs))
		}
		var byCensus []string
		for _, off := range offs {
			n := binary.LittleEndian.Uint16(base[off:])
			for _, m := range []uint16{n &^ 1, n &^ 2, n - 1, 0} {
				if m >= n {
					continue
				}
				b := slices.Clone(base)
				binary.LittleEndian.PutUint16(b[off:], m)
				what := fmt.Sprintf("element count at %d: %d -> %d", off, n, m)
				if OpenDamaged(t, dir, b, f, want, what) == Intact {
					continue
				}
				if _, err := f.Dump(filepath.Join(dir, "damaged.db")); err != nil && strings.Contains(err.Error(), "sealed count") {
					byCensus = append(byCensus, what)
				}
			}
		}
		t.Logf("%s: %d element counts, %d lowered counts refused only by the sealed counts", f.Kind, len(offs), len(byCensus))
		if len(byCensus) == 0 {
			t.Fatal("no lowered count reached the sealed counts: the reproduction lost its case")
		}
	})
}

// The kill test re-executes the test binary as a child that writes in a
// loop (the package's TestCrashChild) and SIGKILLs it at a random moment;
// the parent then reopens the file and checks that every committed step is
// whole. SIGKILL does not lose the page cache, so this tests atomicity of
// each transaction and the recovery path, not fsync against power loss.

// CrashEnv is the environment variable that makes TestCrashChild the
// child: "<mode>:<path>".
const CrashEnv = "EDGEFL_STORAGE_CRASH_CHILD"

const crashDim = 257 // odd and over a page when combined, to span pages

// CrashClients is the number of sites the aggregator's child stores
// updates of.
const CrashClients = 3

// The expected content of every step is a function of its round (and
// client), so the parent can verify without talking to the child.

// CrashZ is the z the child writes for client in round r.
func CrashZ(r uint64, client int) []float64 {
	v := make([]float64, crashDim)
	for i := range v {
		v[i] = float64(r)*1e3 + float64(client)*1e-1 + float64(i)*1e-6
	}
	return v
}

// CrashMsg is the message the child writes for client in round r.
func CrashMsg(r uint64, client int) []byte {
	return append([]byte(fmt.Sprintf("update r=%d c=%d;", r, client)), storage.EncodeFloats(CrashZ(r, client))...)
}

// CrashGlobal is the global model of round r.
func CrashGlobal(r uint64) []float64 { return CrashZ(r, 99) }

// CrashClient is the id of client c.
func CrashClient(c int) string { return fmt.Sprintf("site-%d", c) }

// CrashChild returns the child's mode and path, or ok false in the parent.
func CrashChild() (mode, path string, ok bool) {
	spec := os.Getenv(CrashEnv)
	if spec == "" {
		return "", "", false
	}
	mode, path, _ = strings.Cut(spec, ":")
	return mode, path, true
}

// CrashFail ends the child with err.
func CrashFail(err error) {
	fmt.Println("error", err)
	os.Exit(3)
}

// RunAndKill starts the child on path, waits until it has committed at
// least `after` steps plus a random delay, checks that the file is locked
// against this process meanwhile (open opens it as the child's store
// does), and SIGKILLs it.
func RunAndKill(t *testing.T, mode, path string, after int, rng *rand.Rand, open func(path string, opts storage.Options) error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), CrashEnv+"="+mode+":"+path)
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
	if err := open(path, storage.Options{LockTimeout: 100 * time.Millisecond}); !errors.Is(err, storage.ErrLocked) {
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

// KillDuringWrites SIGKILLs the child writing path three times (RunAndKill
// after 5 commits) and checks after each kill, with check, that every
// committed step is whole; check returns the progress it found, which
// must never go back. The stores' TestKillDuringWrites.
func KillDuringWrites(t *testing.T, mode, path string, open func(path string, opts storage.Options) error, check func(t *testing.T, path string) uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	last := uint64(0)
	for kill := 0; kill < 3; kill++ {
		RunAndKill(t, mode, path, 5, rng, open)
		got := check(t, path)
		if got < last {
			t.Fatalf("progress went back from %d to %d", last, got)
		}
		last = got
		t.Logf("kill %d: consistent at round %d", kill, got)
	}
}

type devNull struct{}

func (devNull) Write(p []byte) (int, error) { return len(p), nil }

// LockTimeout checks that a second open of a file another handle holds
// fails with ErrLocked within its lock timeout instead of hanging, and
// that the file opens once the holder is gone. open opens (and closes) the
// store of the kind under test.
func LockTimeout(t *testing.T, open func(path string, opts storage.Options) error) {
	path := TempPath(t, "db")
	first, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	start := time.Now()
	err = open(path, storage.Options{LockTimeout: 150 * time.Millisecond})
	elapsed := time.Since(start)
	if !errors.Is(err, storage.ErrLocked) {
		t.Fatalf("second open: %v, want ErrLocked", err)
	}
	if !strings.Contains(err.Error(), "database is locked by another process") {
		t.Fatalf("unclear error: %v", err)
	}
	if elapsed > 2*time.Second {
		t.Fatalf("second open took %v", elapsed)
	}
	// Once the holder closes, the file opens.
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if err := open(path, storage.Options{LockTimeout: 150 * time.Millisecond}); err != nil {
		t.Fatalf("open after release: %v", err)
	}
}

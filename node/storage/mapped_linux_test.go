package storage

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// rssFileKB is this process's file-backed resident memory (RssFile of
// /proc/self/status), which holds the pages of bbolt's map that were read.
func rssFileKB(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(l, "RssFile:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			if err != nil {
				t.Fatal(err)
			}
			return kb
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// TestReleaseMapped: reading a file's values back through bbolt's map
// leaves them resident until ReleaseMapped gives the pages back; the values
// read afterwards are the same bytes; after Open, whose checks read every
// value, ReleaseMapped does the same; and the census walk of
// SForEachReleasing, which reads keys, leaves no more than a fraction of
// the file resident, counting what SForEach's does.
func TestReleaseMapped(t *testing.T) {
	const n, size = 512, 32 << 10 // 16 MiB of values
	path := filepath.Join(t.TempDir(), "things.db")
	sc := testSchema("things")
	db, err := Open(path, sc, Options{})
	if err != nil {
		t.Fatal(err)
	}
	val := func(i int) []byte { return bytes.Repeat([]byte{byte(i), byte(i >> 8), 7}, size/3) }
	if err := db.Update(InBucket(bucketThings, func(b *Bucket) error {
		for i := range n {
			if err := SPut(b, []byte(fmt.Sprintf("k%04d", i)), val(i)); err != nil {
				return err
			}
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	readAll := func() {
		t.Helper()
		i := 0
		if err := db.View(InBucket(bucketThings, func(b *Bucket) error {
			return SForEach(b, "things", func(k, v []byte) error {
				if !bytes.Equal(v, val(i)) {
					return fmt.Errorf("value %s differs", k)
				}
				i++
				return nil
			})
		})); err != nil || i != n {
			t.Fatalf("read %d of %d values: %v", i, n, err)
		}
	}
	readAll()
	read := rssFileKB(t)
	if err := ReleaseMapped(db); err != nil {
		t.Fatal(err)
	}
	released := rssFileKB(t)
	const total = n * size / 1024
	if read-released < total*3/4 {
		t.Errorf("RssFile %d kB after reading %d kB of values, %d kB after ReleaseMapped: want at least %d kB released",
			read, total, released, total*3/4)
	}
	readAll() // the same bytes, mapped back from the page cache
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	before := rssFileKB(t)
	db, err = Open(path, sc, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := ReleaseMapped(db); err != nil { // as aggstore.OpenAgg does
		t.Fatal(err)
	}
	after := rssFileKB(t)
	if after-before > total/4 {
		t.Errorf("Open and ReleaseMapped left %d kB of the %d kB file resident (RssFile %d -> %d kB): want at most %d kB", after-before, total, before, after, total/4)
	}
	// A census of the bucket (what every sealed listing checks first)
	// reads only keys, but the faults map the values' pages around them:
	// SForEachReleasing's walk gives them back, and counts the same.
	var walked, want tally
	if err := db.View(func(tx *Tx) error {
		b := tx.Tx.Bucket(bucketThings)
		if err := tallyBucket(b, fnvOffset, &want); err != nil {
			return err
		}
		if err := ReleaseMapped(db); err != nil {
			return err
		}
		after = rssFileKB(t)
		return tallyReleasing(b, fnvOffset, &walked)
	}); err != nil {
		t.Fatal(err)
	}
	if census := rssFileKB(t); census-after > total/4 {
		t.Errorf("the census of %d values left %d kB of the %d kB file resident (RssFile %d -> %d kB): want at most %d kB",
			n, census-after, total, after, census, total/4)
	}
	if walked != want {
		t.Errorf("tallyReleasing counted %+v, tallyBucket %+v", walked, want)
	}
	var listed [2]int
	for i, each := range []func(*Bucket, string, func(k, v []byte) error) error{SForEach, SForEachReleasing} {
		if err := db.View(InBucket(bucketThings, func(b *Bucket) error {
			return each(b, "things", func(k, v []byte) error { listed[i]++; return nil })
		})); err != nil {
			t.Fatal(err)
		}
	}
	if listed != [2]int{n, n} {
		t.Errorf("SForEach and SForEachReleasing listed %v values, want %d each", listed, n)
	}
}

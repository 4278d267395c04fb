package storage

import (
	"bytes"
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Sealed entry counts ("the census"). Seals (seal.go) protect the bytes of
// each value, and the page walk (walk.go) the shape of the page tree, but
// neither notices an entry that is simply not there: a flipped bit in a
// leaf page's element count makes the page hold fewer entries, the tree
// stays well formed, every remaining value passes its checksum, and a
// listing comes back one update short (a round aggregated without a
// site). So the meta bucket also holds, sealed, for every top-level bucket
// of the file: how many entries its whole subtree holds (values and nested
// buckets, at any depth) and an order-independent digest of their keys
// and paths (a sum of 64-bit hashes, so a changed key is caught as well as
// a lost one).
//
// The census is kept incrementally (wtx.go): every put, delete and bucket
// creation or deletion goes through wrappers that know the bucket's path
// and move its top-level bucket's count and digest (a sum of hashes, so one
// hash is added or subtracted) in the same transaction, which writes the
// census back (DB.Update). So a count is always written in the same
// transaction as the changes it counts, whatever helper made them (rollback
// and the migrations included), at a cost that does not grow with the file:
// until 2026-11 every write recounted the whole file before and after its
// change, about 0.7 us per stored entry, 6 ms per stored update on a round
// log of 1,000 rounds of 10 sites (go test -run '^$' -bench PutUpdate
// ./node/storage/). The full recount runs on open (every bucket, with every
// value read back: a write that went around the wrappers, or damage at
// rest, is refused there) and before every listing (SForEach, viewWritten,
// LatestCheckpoint), for the listed top-level bucket: a listing is never
// silently short. That recount walks the top-level bucket's whole subtree
// (for updates/<round>, every round's updates), which is affordable
// because listings come per round closed, restart or status, not per
// stored message; a per-round count would make it cheaper at the price of
// a new census format and migration. Writes no longer check the counts
// before they build on the file: damage after the open check is found by
// the next listing of its bucket or the next open. A mismatch is an error
// wrapping ErrCorrupt that names the bucket (and, through DB, the
// file). Compaction copies the meta bucket with the entries it counts, so
// the copy's census is right as it stands.
//
// The census came with schema version 3 of the aggregator's file and 5 of
// the edge agent's; the migration step computes it once from a file that
// has passed the page walk and bbolt's check (and whose values are then
// all read back): an older file has no counts, so there is nothing to
// compare with, and refusing it would only make the operator reset a file
// that reads back as well as it did before.

var keyCensus = []byte("census")

// tally counts the entries of one top-level bucket's subtree.
type tally struct {
	name string
	n    uint64 // entries, nested buckets included, at any depth
	sum  uint64 // sum of entryHash over them
}

// fnv-1a, 64 bits, inline (no allocation per entry).
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnvAdd(h uint64, b []byte) uint64 {
	for _, c := range b {
		h ^= uint64(c)
		h *= fnvPrime
	}
	return h
}

// keyHash continues the hash h of a bucket's path (the length-prefixed
// keys from the top-level bucket down, fnvOffset for the top-level bucket
// itself) with key k: the hash of an entry, and the path hash of a nested
// bucket.
func keyHash(h uint64, k []byte) uint64 {
	var n [binary.MaxVarintLen64]byte
	h = fnvAdd(h, n[:binary.PutUvarint(n[:], uint64(len(k)))])
	return fnvAdd(h, k)
}

func tallyBucket(b *bolt.Bucket, path uint64, t *tally) error {
	return b.ForEach(func(k, v []byte) error {
		h := keyHash(path, k)
		t.n++
		t.sum += h
		if v != nil {
			return nil
		}
		nb := b.Bucket(k)
		if nb == nil {
			return fmt.Errorf("%w: %s/%q is neither a value nor a bucket", ErrCorrupt, t.name, k)
		}
		return tallyBucket(nb, h, t)
	})
}

// takeCensus counts every top-level bucket but meta, in name order.
func takeCensus(tx *bolt.Tx) ([]tally, error) {
	var ts []tally
	err := tx.ForEach(func(name []byte, b *bolt.Bucket) error {
		if bytes.Equal(name, BucketMeta) {
			return nil
		}
		t := tally{name: string(name)}
		if err := tallyBucket(b, fnvOffset, &t); err != nil {
			return err
		}
		ts = append(ts, t)
		return nil
	})
	return ts, err
}

// encodeCensus: per bucket, a length byte, the name, n and sum (u64 each).
func encodeCensus(ts []tally) []byte {
	var out []byte
	for _, t := range ts {
		out = append(out, byte(len(t.name)))
		out = append(out, t.name...)
		out = binary.BigEndian.AppendUint64(out, t.n)
		out = binary.BigEndian.AppendUint64(out, t.sum)
	}
	return out
}

func decodeCensus(b []byte) ([]tally, error) {
	var ts []tally
	for len(b) > 0 {
		n := int(b[0])
		if len(b) < 1+n+16 {
			return nil, fmt.Errorf("%w: meta/census is cut short", ErrCorrupt)
		}
		ts = append(ts, tally{name: string(b[1 : 1+n]), n: binary.BigEndian.Uint64(b[1+n:]), sum: binary.BigEndian.Uint64(b[9+n:])})
		b = b[1+n+16:]
	}
	return ts, nil
}

// storedCensus returns the sealed census, ok == false when the file has
// none (a file being migrated from an older version).
func storedCensus(tx *bolt.Tx) (ts []tally, ok bool, err error) {
	meta := tx.Bucket(BucketMeta)
	if meta == nil {
		return nil, false, nil
	}
	v, err := SGet(meta, keyCensus, "meta/census")
	if err != nil || v == nil {
		return nil, false, err
	}
	ts, err = decodeCensus(v)
	return ts, err == nil, err
}

// WriteCensus stores the census of the file as it is now, counted from
// scratch (when it changed). It is the body of the migration step that
// introduces it; from then on the census is kept by the writes themselves
// (wtx.go).
func WriteCensus(tx *Tx) error {
	ts, err := takeCensus(tx.Tx)
	if err != nil {
		return err
	}
	meta, err := tx.Tx.CreateBucketIfNotExists(BucketMeta)
	if err != nil {
		return err
	}
	enc := encodeCensus(ts)
	if old := meta.Get(keyCensus); old != nil {
		if v, err := Unseal(keyCensus, old, "meta/census"); err == nil && bytes.Equal(v, enc) {
			return nil // unchanged: leave the meta page clean
		}
	}
	return meta.Put(keyCensus, Seal(keyCensus, enc))
}

// CheckCensus compares the file with its sealed census (in a write
// transaction: the census as its changes so far moved it): every top-level
// bucket when only is "", else only that one (which may be absent if the
// census says so). A file without a census passes unless required.
func CheckCensus(tx *Tx, only string, required bool) error {
	var want []tally
	if tx.cen != nil {
		want = tx.cen.ts
	} else {
		var ok bool
		var err error
		want, ok, err = storedCensus(tx.Tx)
		if err != nil {
			return err
		}
		if !ok {
			if required {
				return fmt.Errorf("%w: meta has no census (sealed entry counts)", ErrCorrupt)
			}
			return nil
		}
	}
	var have []tally
	if only == "" {
		var err error
		if have, err = takeCensus(tx.Tx); err != nil {
			return err
		}
	} else {
		want = censusOf(want, only)
		if b := tx.Tx.Bucket([]byte(only)); b != nil {
			t := tally{name: only}
			if err := tallyBucket(b, fnvOffset, &t); err != nil {
				return err
			}
			have = []tally{t}
		}
	}
	for _, w := range want {
		h := censusOf(have, w.name)
		if h == nil {
			return fmt.Errorf("%w: bucket %s is missing (its sealed count says %d entries)", ErrCorrupt, w.name, w.n)
		}
		if h[0] != w {
			return fmt.Errorf("%w: bucket %s holds %d entries (key digest %016x), its sealed count says %d (%016x)",
				ErrCorrupt, w.name, h[0].n, h[0].sum, w.n, w.sum)
		}
	}
	for _, h := range have {
		if censusOf(want, h.name) == nil {
			return fmt.Errorf("%w: bucket %s (%d entries) is not in the sealed counts", ErrCorrupt, h.name, h.n)
		}
	}
	return nil
}

// censusOf returns the tally of bucket name as a slice of at most one.
func censusOf(ts []tally, name string) []tally {
	for i := range ts {
		if ts[i].name == name {
			return ts[i : i+1]
		}
	}
	return nil
}

package storage

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// Every value the stores write outside the meta bucket is sealed: its bytes
// followed by a 4-byte CRC-32C of key and value. bbolt checksums only its
// meta pages, so without the seal a flipped bit in a stored checkpoint or z
// is read back as a valid number and trained on. Sealing
// the key too catches a value that landed under another key. Schema version
// 2 of both kinds introduced the seal; the migration seals every value of an
// older file in place.

// SealLen is the length of the seal after every value.
const SealLen = 4

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func sealSum(k, v []byte) uint32 {
	return crc32.Update(crc32.Checksum(k, castagnoli), castagnoli, v)
}

// Seal returns v with its seal appended (a new slice).
func Seal(k, v []byte) []byte {
	out := make([]byte, len(v), len(v)+SealLen)
	copy(out, v)
	return binary.BigEndian.AppendUint32(out, sealSum(k, v))
}

// Unseal checks raw's seal and returns the value without it (a sub-slice of
// raw: bbolt memory, valid only inside the transaction).
func Unseal(k, raw []byte, what string) ([]byte, error) {
	if len(raw) < SealLen {
		return nil, fmt.Errorf("%w: %s is %d bytes, shorter than its checksum", ErrCorrupt, what, len(raw))
	}
	v := raw[:len(raw)-SealLen]
	if got, want := binary.BigEndian.Uint32(raw[len(v):]), sealSum(k, v); got != want {
		return nil, fmt.Errorf("%w: %s fails its checksum (stored %08x, computed %08x)", ErrCorrupt, what, got, want)
	}
	return v, nil
}

// getter is a bucket to read from (bbolt's, or a Bucket).
type getter interface{ Get(k []byte) []byte }

// SGet returns the unsealed value of k in b, nil (no error) when absent.
func SGet(b getter, k []byte, what string) ([]byte, error) {
	raw := b.Get(k)
	if raw == nil {
		return nil, nil
	}
	return Unseal(k, raw, what)
}

// SPut stores v sealed under k.
func SPut(b *Bucket, k, v []byte) error { return b.Put(k, Seal(k, v)) }

// SForEach calls fn with every unsealed key/value of b (nested buckets are
// skipped); a broken seal stops the iteration with ErrCorrupt.
// what is the bucket's path; the sealed count of its top-level bucket is
// checked first (census.go), so a listing is never silently short.
func SForEach(b *Bucket, what string, fn func(k, v []byte) error) error {
	top, _, _ := strings.Cut(what, "/")
	if err := CheckCensus(b.tx, top, false); err != nil {
		return err
	}
	return b.ForEach(func(k, raw []byte) error {
		if raw == nil {
			return nil // a nested bucket
		}
		v, err := Unseal(k, raw, fmt.Sprintf("%s/%q", what, k))
		if err != nil {
			return err
		}
		return fn(k, v)
	})
}

// SealAll is the migration that seals every value of every bucket but meta,
// recursively.
func SealAll(tx *Tx) error {
	return tx.ForEach(func(name []byte, b *bolt.Bucket) error { // bbolt's buckets: no census before its migration step
		if string(name) == string(BucketMeta) {
			return nil
		}
		return sealBucket(b)
	})
}

func sealBucket(b *bolt.Bucket) error {
	type kv struct{ k, v []byte }
	var vals []kv
	var nested [][]byte
	if err := b.ForEach(func(k, v []byte) error {
		if v == nil {
			nested = append(nested, append([]byte(nil), k...))
		} else {
			vals = append(vals, kv{append([]byte(nil), k...), Seal(k, v)})
		}
		return nil
	}); err != nil {
		return err
	}
	for _, e := range vals {
		if err := b.Put(e.k, e.v); err != nil {
			return err
		}
	}
	for _, k := range nested {
		nb := b.Bucket(k)
		if nb == nil {
			return fmt.Errorf("%w: nested bucket %q vanished", ErrCorrupt, k)
		}
		if err := sealBucket(nb); err != nil {
			return err
		}
	}
	return nil
}

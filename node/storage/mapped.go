package storage

import (
	"fmt"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// censusRelease is how many entries SForEachReleasing's census walks
// between two releases of the pages it mapped (releaseMapped). The walk
// reads only keys, but each page fault maps the file's cached pages around
// it too (the kernel's fault-around, 64 KB), so walking a bucket of large
// values, such as every stored update of every round, would otherwise
// bring the whole bucket into the process's RSS: 125 MB at 1,000 sites
// after four rounds, at every round's close.
const censusRelease = 128

// SForEachReleasing is SForEach in a read transaction, for a bucket nested
// in a top-level bucket of large values: the census of the top-level
// bucket (every entry of every nested bucket) gives back the pages it maps
// as it goes. (Separate from SForEach so that binaries that never list
// such a bucket, edge-agent, link none of it.)
func SForEachReleasing(b *Bucket, what string, fn func(k, v []byte) error) error {
	top, _, _ := strings.Cut(what, "/")
	want, ok, err := storedCensus(b.tx.Tx)
	if err != nil {
		return err
	}
	if ok {
		var have []tally
		if tb := b.tx.Tx.Bucket([]byte(top)); tb != nil {
			t := tally{name: top}
			if err := tallyReleasing(tb, fnvOffset, &t); err != nil {
				return err
			}
			have = []tally{t}
		}
		// CheckCensus's comparison, for the one bucket (its messages).
		switch w := censusOf(want, top); {
		case len(w) == 1 && len(have) == 0:
			return fmt.Errorf("%w: bucket %s is missing (its sealed count says %d entries)", ErrCorrupt, top, w[0].n)
		case len(w) == 1 && have[0] != w[0]:
			return fmt.Errorf("%w: bucket %s holds %d entries (key digest %016x), its sealed count says %d (%016x)",
				ErrCorrupt, top, have[0].n, have[0].sum, w[0].n, w[0].sum)
		case len(w) == 0 && len(have) == 1:
			return fmt.Errorf("%w: bucket %s (%d entries) is not in the sealed counts", ErrCorrupt, top, have[0].n)
		}
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

// tallyReleasing is tallyBucket giving back the map's pages every
// censusRelease entries.
func tallyReleasing(b *bolt.Bucket, path uint64, t *tally) error {
	return b.ForEach(func(k, v []byte) error {
		h := keyHash(path, k)
		t.n++
		t.sum += h
		if t.n%censusRelease == 0 {
			if err := releaseMapped(b.Tx()); err != nil {
				return fmt.Errorf("storage: release the map during the census of %s: %w", t.name, err)
			}
		}
		if v != nil {
			return nil
		}
		nb := b.Bucket(k)
		if nb == nil {
			return fmt.Errorf("%w: %s/%q is neither a value nor a bucket", ErrCorrupt, t.name, k)
		}
		return tallyReleasing(nb, h, t)
	})
}

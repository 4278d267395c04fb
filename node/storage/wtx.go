package storage

import (
	"fmt"
	"sort"

	bolt "go.etcd.io/bbolt"
)

// The census kept incrementally (census.go). Every transaction function of
// this package gets a *Tx, and every bucket it reaches through it is a
// *Bucket that knows its top-level bucket and its path; their Put, Delete,
// CreateBucket, CreateBucketIfNotExists and DeleteBucket shadow bbolt's and
// update that top-level bucket's tally (count, digest) in the transaction's
// census as they change the file. The digest is a sum of hashes, so a change
// adds or subtracts one hash (a deleted nested bucket: its subtree's, counted
// once). DB.Update writes the census back, in the same transaction,
// when a change moved it. A write that goes around the wrappers (bbolt's own
// methods through .Tx or .Bucket, Cursor.Delete) leaves the census behind
// the file; the next open's full recount refuses the file
// (TestCensusCatchesBypass), so such a write is a bug caught by the first
// restart of any test that makes it.

// Tx is a transaction with the census it keeps (cen is nil in a read
// transaction, and in a write transaction on a file without a census yet:
// the migration steps before "count entries").
type Tx struct {
	*bolt.Tx
	cen *census
}

// census is a write transaction's running census: the stored one, moved by
// every change made through the wrappers.
type census struct {
	ts    []tally // in name order, as takeCensus lists them
	dirty bool
}

// Bucket is a bucket reached through a Tx. Its reads are bbolt's; its
// writes keep the census.
type Bucket struct {
	b    *bolt.Bucket
	tx   *Tx
	top  string // the top-level bucket whose tally counts this one's entries
	path uint64 // keyHash chain of this bucket's path (fnvOffset: a top-level bucket)
}

// moved moves the running tally of b's top-level bucket by n entries
// whose hashes sum to sum, added or removed (nothing without a census, or
// for meta, which is not counted).
func (b *Bucket) moved(add bool, n, sum uint64) {
	c := b.tx.cen
	if c == nil || b.top == string(BucketMeta) {
		return
	}
	i, ok := c.find(b.top)
	if !ok {
		return // not counted: a top-level bucket made around the wrappers, which the next open refuses
	}
	t := &c.ts[i]
	if add {
		t.n, t.sum = t.n+n, t.sum+sum
	} else {
		t.n, t.sum = t.n-n, t.sum-sum
	}
	c.dirty = true
}

// find is the index of name's tally in the census, or where it would be
// inserted. It and counted's insert are written out rather than the
// slices generics, which instantiated for tally cost edge-agent 2 kB.
func (c *census) find(name string) (int, bool) {
	i := sort.Search(len(c.ts), func(i int) bool { return c.ts[i].name >= name })
	return i, i < len(c.ts) && c.ts[i].name == name
}

func (b *Bucket) child(nb *bolt.Bucket, k []byte) *Bucket {
	if nb == nil {
		return nil
	}
	return &Bucket{b: nb, tx: b.tx, top: b.top, path: keyHash(b.path, k)}
}

// Bucket is the nested bucket k (nil when there is none).
func (b *Bucket) Bucket(k []byte) *Bucket { return b.child(b.b.Bucket(k), k) }

// Reads, as bbolt's.
func (b *Bucket) Get(k []byte) []byte                      { return b.b.Get(k) }
func (b *Bucket) ForEach(fn func(k, v []byte) error) error { return b.b.ForEach(fn) }
func (b *Bucket) Cursor() *bolt.Cursor                     { return b.b.Cursor() } // reads only: Cursor.Delete bypasses the census
func (b *Bucket) Stats() bolt.BucketStats                  { return b.b.Stats() }

// Put stores v under k (callers seal it: SPut), counting a new key.
func (b *Bucket) Put(k, v []byte) error {
	isNew := b.b.Get(k) == nil
	if err := b.b.Put(k, v); err != nil {
		return err
	}
	if isNew {
		b.moved(true, 1, keyHash(b.path, k))
	}
	return nil
}

// Delete removes the value under k (none: nothing happens).
func (b *Bucket) Delete(k []byte) error {
	if b.b.Get(k) == nil {
		return b.b.Delete(k) // a nested bucket's key: bbolt's error; absent: nothing
	}
	if err := b.b.Delete(k); err != nil {
		return err
	}
	b.moved(false, 1, keyHash(b.path, k))
	return nil
}

// CreateBucket creates the nested bucket k (it must not exist).
func (b *Bucket) CreateBucket(k []byte) (*Bucket, error) {
	nb, err := b.b.CreateBucket(k)
	if err != nil {
		return nil, err
	}
	b.moved(true, 1, keyHash(b.path, k))
	return b.child(nb, k), nil
}

// CreateBucketIfNotExists returns the nested bucket k, creating it.
func (b *Bucket) CreateBucketIfNotExists(k []byte) (*Bucket, error) {
	if nb := b.Bucket(k); nb != nil {
		return nb, nil
	}
	return b.CreateBucket(k)
}

// DeleteBucket deletes the nested bucket k and everything under it.
func (b *Bucket) DeleteBucket(k []byte) error {
	var sub tally
	h := keyHash(b.path, k)
	if nb := b.b.Bucket(k); nb != nil {
		sub.name = b.top
		if err := tallyBucket(nb, h, &sub); err != nil {
			return err
		}
	}
	if err := b.b.DeleteBucket(k); err != nil {
		return err
	}
	b.moved(false, sub.n+1, sub.sum+h)
	return nil
}

// Bucket is the top-level bucket name (nil when there is none).
func (tx *Tx) Bucket(name []byte) *Bucket {
	b := tx.Tx.Bucket(name)
	if b == nil {
		return nil
	}
	return &Bucket{b: b, tx: tx, top: string(name), path: fnvOffset}
}

// counted adds an empty top-level bucket to the census.
func (tx *Tx) counted(name []byte) {
	c := tx.cen
	if c == nil || string(name) == string(BucketMeta) {
		return
	}
	i, ok := c.find(string(name))
	if !ok {
		c.ts = append(c.ts, tally{})
		copy(c.ts[i+1:], c.ts[i:])
		c.ts[i] = tally{name: string(name)}
		c.dirty = true
	}
}

// CreateBucket creates the top-level bucket name.
func (tx *Tx) CreateBucket(name []byte) (*Bucket, error) {
	if _, err := tx.Tx.CreateBucket(name); err != nil {
		return nil, err
	}
	tx.counted(name)
	return tx.Bucket(name), nil
}

// CreateBucketIfNotExists returns the top-level bucket name, creating it.
func (tx *Tx) CreateBucketIfNotExists(name []byte) (*Bucket, error) {
	if b := tx.Bucket(name); b != nil {
		return b, nil
	}
	return tx.CreateBucket(name)
}

// DeleteBucket deletes the top-level bucket name and drops it from the
// census.
func (tx *Tx) DeleteBucket(name []byte) error {
	if err := tx.Tx.DeleteBucket(name); err != nil {
		return err
	}
	if c := tx.cen; c != nil {
		if i, ok := c.find(string(name)); ok {
			c.ts = append(c.ts[:i], c.ts[i+1:]...)
		}
		c.dirty = true
	}
	return nil
}

// SelfCheckCensus makes every write transaction recount the file and
// compare it with the census it kept (set by the package's tests, so that
// every test's writes check the wrappers; never in a binary).
var SelfCheckCensus bool

// loadCensus starts a write transaction's running census from the stored
// one (none: the file has no census yet, and none is kept).
func loadCensus(tx *bolt.Tx) (*census, error) {
	ts, ok, err := storedCensus(tx)
	if err != nil || !ok {
		return nil, err
	}
	return &census{ts: ts}, nil
}

// saveCensus writes the running census back when a change moved it.
func (c *census) save(tx *bolt.Tx) error {
	if c == nil || !c.dirty {
		return nil
	}
	for _, t := range c.ts {
		if t.n > 1<<62 {
			return fmt.Errorf("%w: bucket %s's count went below zero: the census was behind the file", ErrCorrupt, t.name)
		}
	}
	meta, err := tx.CreateBucketIfNotExists(BucketMeta)
	if err != nil {
		return err
	}
	return meta.Put(keyCensus, Seal(keyCensus, encodeCensus(c.ts)))
}

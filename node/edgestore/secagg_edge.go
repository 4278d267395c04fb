package edgestore

import (
	"bytes"
	"fmt"

	"github.com/edgefl/edgefl/node/storage"
)

// The site's secure-aggregation record (docs/privacy.md, "Persistence"):
// like the aggregator's, its bucket is created by its first write, so a run
// without --secagg writes exactly the file it wrote before.
//
//	secagg       state = the agent's record of its session (opaque here:
//	             round, attempt, its quantised input and the secagg.Client
//	             state with its private keys; a secret, like the whole file)
//	             noise_key = 32 bytes from crypto/rand, drawn once per run:
//	             the key of the site's distributed-DP noise (dp.NoiseRand)
var (
	bucketSecAgg   = []byte("secagg")
	keySecAggEdge  = []byte("state")
	keySecAggNoise = []byte("noise_key")
)

func init() {
	edgeSchema.Layout[string(bucketSecAgg)] = []string{string(keySecAggEdge), string(keySecAggNoise)}
}

// SetSecAgg stores the agent's secure-aggregation record together with the
// outbox entry of round (the message it sends next) in one transaction:
// commit, then publish. round must be the applied round (Commit wrote the
// round's first record and message). A nil msg leaves the outbox as it is.
func (s *EdgeStore) SetSecAgg(round uint64, rec, msg []byte) error {
	if len(rec) == 0 {
		return fmt.Errorf("storage: set secagg: %w: empty record", storage.ErrInvalid)
	}
	err := s.db.Update(func(tx *storage.Tx) error {
		eb, err := storage.NeedBucket(tx, bucketEdge)
		if err != nil {
			return err
		}
		applied, err := getU64(eb, keyAppliedRound)
		if err != nil {
			return err
		}
		if round != applied {
			return fmt.Errorf("%w: secagg record of round %d, the applied round is %d", storage.ErrStale, round, applied)
		}
		b, err := storage.MakeBucket(tx, bucketSecAgg)
		if err != nil {
			return err
		}
		if err := storage.SPut(b, keySecAggEdge, rec); err != nil {
			return err
		}
		if msg == nil {
			return nil
		}
		out, err := storage.NeedBucket(tx, bucketOutbox)
		if err != nil {
			return err
		}
		return storage.SPut(out, storage.EncodeU64(round), msg)
	})
	if err != nil {
		return wrapErr("storage: set secagg", err)
	}
	return nil
}

// SecAgg returns the agent's secure-aggregation record, or ErrNotFound. A
// read transaction.
func (s *EdgeStore) SecAgg() ([]byte, error) {
	var out []byte
	err := s.db.View(func(tx *storage.Tx) error {
		b, _ := storage.OptBucket(tx, bucketSecAgg)
		if b == nil {
			return fmt.Errorf("%w: secagg record", storage.ErrNotFound)
		}
		v, err := storage.SGet(b, keySecAggEdge, "secagg/state")
		if err != nil {
			return err
		}
		if v == nil {
			return fmt.Errorf("%w: secagg record", storage.ErrNotFound)
		}
		out = bytes.Clone(v)
		return nil
	})
	return out, err
}

// AckIf removes the outbox entry of round if match says it is the one a
// receipt answers (a receipt of an earlier secagg message of the round must
// not remove the next one's entry), and reports whether it did. One
// transaction.
func (s *EdgeStore) AckIf(round uint64, match func(msg []byte) bool) (bool, error) {
	found := false
	err := s.db.Update(func(tx *storage.Tx) error {
		b, err := storage.NeedBucket(tx, bucketOutbox)
		if err != nil {
			return err
		}
		k := storage.EncodeU64(round)
		v, err := storage.SGet(b, k, "outbox entry")
		if err != nil || v == nil || !match(v) {
			return err
		}
		found = true
		return b.Delete(k)
	})
	if err != nil {
		return false, fmt.Errorf("storage: ack round %d: %w", round, err)
	}
	return found, nil
}

// NoiseKey returns the site's distributed-DP noise key, or ErrNotFound
// before InitNoiseKey stored one (a new run draws a new one: StartRun drops
// the bucket).
func (s *EdgeStore) NoiseKey() ([32]byte, error) {
	var key [32]byte
	err := s.db.View(func(tx *storage.Tx) error {
		b, _ := storage.OptBucket(tx, bucketSecAgg)
		if b == nil {
			return storage.ErrNotFound
		}
		v, err := storage.SGet(b, keySecAggNoise, "secagg/noise_key")
		switch {
		case err != nil:
			return err
		case v == nil:
			return storage.ErrNotFound
		case len(v) != len(key):
			return fmt.Errorf("%w: secagg/noise_key of %d bytes", storage.ErrCorrupt, len(v))
		}
		copy(key[:], v)
		return nil
	})
	if err != nil {
		return key, wrapErr("storage: secagg noise key", err)
	}
	return key, nil
}

// InitNoiseKey stores key as the site's distributed-DP noise key (the
// agent draws it from crypto/rand) unless the run has one already, which
// it keeps: a key, once used, never changes within a run.
func (s *EdgeStore) InitNoiseKey(key [32]byte) error {
	err := s.db.Update(func(tx *storage.Tx) error {
		b, err := storage.MakeBucket(tx, bucketSecAgg)
		if err != nil {
			return err
		}
		v, err := storage.SGet(b, keySecAggNoise, "secagg/noise_key")
		if err != nil || v != nil {
			return err
		}
		return storage.SPut(b, keySecAggNoise, key[:])
	})
	if err != nil {
		return wrapErr("storage: secagg noise key", err)
	}
	return nil
}

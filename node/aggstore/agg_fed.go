package aggstore

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/edgefl/edgefl/node/storage"
)

// The records of a run with a federation schema: each site's
// statistics of its training rows (before round 1), the fitted
// preprocessing, each site's evaluation report per eval round, and the final
// model bundle. Messages are stored as the caller hands them in (the encoded
// wire messages as received), behind the time they were stored; every value
// is sealed like the rest of the file.

var (
	bucketStatistics = []byte("statistics")
	bucketEvals      = []byte("evals")
	bucketFederation = []byte("federation")

	keyFit         = []byte("fit")
	keyFinalBundle = []byte("final_bundle")
)

// Record is one stored site message: a site's statistics (Round 0) or its
// evaluation report of an eval round.
type Record struct {
	Round    uint64
	ClientID string
	StoredAt time.Time
	Msg      []byte
}

func encodeRecord(at time.Time, msg []byte) []byte {
	b := make([]byte, 0, 8+len(msg))
	b = binary.BigEndian.AppendUint64(b, uint64(unixNs(at)))
	return append(b, msg...)
}

func decodeRecord(round uint64, client, v []byte, what string) (Record, error) {
	if len(v) <= 8 {
		return Record{}, fmt.Errorf("%w: %s is %d bytes, want more than 8", storage.ErrCorrupt, what, len(v))
	}
	return Record{Round: round, ClientID: string(client), StoredAt: fromUnixNs(int64(binary.BigEndian.Uint64(v))),
		Msg: bytes.Clone(v[8:])}, nil
}

// viewWritten runs fn on bucket name in a read transaction, and does
// nothing when the bucket has not been written yet.
func (s *AggStore) viewWritten(name []byte, fn func(b *storage.Bucket) error) error {
	return s.db.View(func(tx *storage.Tx) error {
		if err := storage.CheckCensus(tx, string(name), false); err != nil {
			return err // a bucket that vanished would list as never written
		}
		if b, _ := storage.OptBucket(tx, name); b != nil {
			return fn(b)
		}
		return nil
	})
}

// readRecords decodes b's records (client id -> encodeRecord) of round in
// key order; name is b's path and what(k) names one record in errors.
func readRecords(b *storage.Bucket, round uint64, name string, what func(k []byte) string) ([]Record, error) {
	var out []Record
	err := storage.SForEach(b, name, func(k, v []byte) error {
		r, err := decodeRecord(round, k, v, what(k))
		if err == nil {
			out = append(out, r)
		}
		return err
	})
	return out, err
}

// PutStatistics stores a site's statistics message and appends its entry
// to the replay log (log.go), returning the entry's index. It is
// idempotent: when the site's statistics are already stored it writes
// nothing and returns 0 (the first copy stays). One transaction.
func (s *AggStore) PutStatistics(client string, at time.Time, msg []byte) (index uint64, err error) {
	if err := storage.CheckName("client id", client); err != nil {
		return 0, err
	}
	if len(msg) == 0 {
		return 0, fmt.Errorf("%w: empty statistics message", storage.ErrInvalid)
	}
	err = s.db.Update(func(tx *storage.Tx) error {
		b, err := storage.MakeBucket(tx, bucketStatistics)
		if err != nil {
			return err
		}
		if b.Get([]byte(client)) != nil {
			return nil
		}
		if err := storage.SPut(b, []byte(client), encodeRecord(at, msg)); err != nil {
			return err
		}
		index, err = appendLog(tx, LogStatistics, 0, client)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("storage: put statistics of %q: %w", client, err)
	}
	return index, nil
}

// Statistics returns every stored statistics message in client-id order. A
// read transaction.
func (s *AggStore) Statistics() ([]Record, error) {
	var out []Record
	err := s.viewWritten(bucketStatistics, func(b *storage.Bucket) (err error) {
		out, err = readRecords(b, 0, "statistics", func(k []byte) string { return fmt.Sprintf("statistics of %q", k) })
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("storage: statistics: %w", err)
	}
	return out, nil
}

// PutEval stores a site's evaluation report of eval round (the number of
// aggregations the evaluated model has had: 1 ..= the current round) and
// appends its entry to the replay log, returning its index. It is
// idempotent like PutStatistics. One transaction.
func (s *AggStore) PutEval(round uint64, client string, at time.Time, msg []byte) (index uint64, err error) {
	if round == 0 {
		return 0, fmt.Errorf("%w: eval round 0", storage.ErrInvalid)
	}
	if err := storage.CheckName("client id", client); err != nil {
		return 0, err
	}
	if len(msg) == 0 {
		return 0, fmt.Errorf("%w: empty evaluation message", storage.ErrInvalid)
	}
	err = s.db.Update(func(tx *storage.Tx) error {
		cur, err := currentRound(tx)
		if err != nil {
			return err
		}
		if round > cur {
			return fmt.Errorf("%w: eval round %d, the current round is %d", storage.ErrInvalid, round, cur)
		}
		evs, err := storage.MakeBucket(tx, bucketEvals)
		if err != nil {
			return err
		}
		rk := storage.EncodeU64(round)
		eb := evs.Bucket(rk)
		if eb != nil && eb.Get([]byte(client)) != nil {
			return nil
		}
		if eb == nil {
			if eb, err = evs.CreateBucket(rk); err != nil {
				return fmt.Errorf("evals of round %d: %w", round, err)
			}
		}
		if err := storage.SPut(eb, []byte(client), encodeRecord(at, msg)); err != nil {
			return err
		}
		index, err = appendLog(tx, LogEval, round, client)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("storage: put evaluation (%d, %q): %w", round, client, err)
	}
	return index, nil
}

// Evals returns the stored evaluation reports of eval round in client-id
// order (none: an empty list). A read transaction.
func (s *AggStore) Evals(round uint64) ([]Record, error) {
	var out []Record
	err := s.viewWritten(bucketEvals, func(evs *storage.Bucket) (err error) {
		eb := evs.Bucket(storage.EncodeU64(round))
		if eb == nil {
			return nil
		}
		out, err = readRecords(eb, round, fmt.Sprintf("evals/%d", round), func(k []byte) string {
			return fmt.Sprintf("evaluation (%d, %q)", round, k)
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("storage: evaluations of round %d: %w", round, err)
	}
	return out, nil
}

// EvalRounds lists the eval rounds with at least one stored report,
// ascending. A read transaction.
func (s *AggStore) EvalRounds() ([]uint64, error) {
	var out []uint64
	err := s.viewWritten(bucketEvals, func(evs *storage.Bucket) error {
		return evs.ForEach(func(k, v []byte) error {
			r, err := storage.DecodeU64(k, "evals key")
			if err != nil {
				return err
			}
			if v == nil {
				out = append(out, r)
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("storage: eval rounds: %w", err)
	}
	return out, nil
}

// PutFit stores the run's fitted preprocessing record (opaque to storage)
// and, in the same transaction, the global model of the current round (the
// initial model, whose dimension the fit decides). A record already stored
// is kept (the fit is done once per run): PutFit then fails with ErrExists
// and writes nothing. One transaction.
func (s *AggStore) PutFit(record []byte, global []float64) error {
	if len(record) == 0 {
		return fmt.Errorf("%w: empty fit record", storage.ErrInvalid)
	}
	if err := storage.CheckVec("checkpoint", global); err != nil {
		return err
	}
	err := s.db.Update(func(tx *storage.Tx) error {
		cur, err := currentRound(tx)
		if err != nil {
			return err
		}
		fb, err := storage.MakeBucket(tx, bucketFederation)
		if err != nil {
			return err
		}
		if fb.Get(keyFit) != nil {
			return fmt.Errorf("%w: the fit record", storage.ErrExists)
		}
		if err := storage.SPut(fb, keyFit, record); err != nil {
			return err
		}
		cp, err := storage.NeedBucket(tx, bucketCheckpoints)
		if err != nil {
			return err
		}
		return storage.SPut(cp, storage.EncodeU64(cur), storage.EncodeFloats(global))
	})
	if err != nil {
		return fmt.Errorf("storage: put fit: %w", err)
	}
	return nil
}

// Fit returns the fit record, or ErrNotFound. A read transaction.
func (s *AggStore) Fit() ([]byte, error) { return s.fedValue(keyFit, "the fit record") }

// PutFinalBundle stores the run's final model bundle (replacing any). One
// transaction.
func (s *AggStore) PutFinalBundle(b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("%w: empty bundle", storage.ErrInvalid)
	}
	err := s.db.Update(func(tx *storage.Tx) error {
		fb, err := storage.MakeBucket(tx, bucketFederation)
		if err != nil {
			return err
		}
		return storage.SPut(fb, keyFinalBundle, b)
	})
	if err != nil {
		return fmt.Errorf("storage: put final bundle: %w", err)
	}
	return nil
}

// FinalBundle returns the stored final bundle, or ErrNotFound. A read
// transaction.
func (s *AggStore) FinalBundle() ([]byte, error) {
	return s.fedValue(keyFinalBundle, "the final bundle")
}

func (s *AggStore) fedValue(k []byte, what string) ([]byte, error) {
	var out []byte
	err := s.db.View(func(tx *storage.Tx) error {
		fb, _ := storage.OptBucket(tx, bucketFederation)
		if fb == nil {
			return fmt.Errorf("%w: %s", storage.ErrNotFound, what)
		}
		v, err := storage.SGet(fb, k, "federation/"+string(k))
		if err != nil {
			return err
		}
		if v == nil {
			return fmt.Errorf("%w: %s", storage.ErrNotFound, what)
		}
		out = bytes.Clone(v)
		return nil
	})
	return out, err
}

package aggstore

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/edgefl/edgefl/node/storage"
)

// Rolling the aggregator's round log back to round N (broker-agg run
// --rollback N) is the way out of a file whose newest values are damaged, or
// hold a model the federation must not continue from. Round N is kept as it
// was last written while it was the current round: its record (reopened),
// its coordinator state, its checkpoint (the global model announced for it)
// and its stored updates. Everything later goes: the records, updates and
// checkpoints of rounds after N, the evaluation reports of eval rounds N and
// later (they judge the models after N or more aggregations, which are
// gone), the final bundle, every client's latest FedSplit z set by
// an update of a round after N, and the replay log's entries (log.go: all
// of them when N is before the current round, whose state they extend). Those z cannot be rebuilt (a z is the sum of
// every delta since the client's first update, and old updates may be
// pruned), so those clients have no copy at the aggregator: their next
// update refers to a copy the aggregator no longer holds, is refused as
// BASE_MISMATCH, and the site re-sends it against the round's global model
// (the agent's AckRejected rule), which sets a fresh copy. Only a file whose
// page tree is sound can be rolled back; a file whose pages are damaged must
// be restored from a copy or replaced by a new run.

// RoundIntact reports whether round n's values are all readable: its record,
// its checkpoint and its stored updates (nil), or what is wrong.
func (s *AggStore) RoundIntact(n uint64) error {
	if _, err := s.Round(n); err != nil {
		return err
	}
	if _, err := s.Checkpoint(n); err != nil {
		return err
	}
	_, err := s.Updates(n)
	return err
}

// LastIntactRound is the newest round n such that rounds 1..n are all
// intact (0 when round 1 is not), read from the file at path. The file's
// page tree must be sound.
func LastIntactRound(path string) (uint64, error) {
	s, err := OpenAgg(path, storage.Options{SkipValueCheck: true})
	if err != nil {
		return 0, err
	}
	defer s.Close()
	return s.lastIntact()
}

func (s *AggStore) lastIntact() (uint64, error) {
	var cur uint64
	err := s.db.View(func(tx *storage.Tx) error {
		rs, err := storage.NeedBucket(tx, bucketRounds)
		if err != nil {
			return err
		}
		k, _ := rs.Cursor().Last()
		if k != nil {
			cur, err = storage.DecodeU64(k, "rounds key")
		}
		return err
	})
	if err != nil {
		return 0, err
	}
	for n := uint64(1); n <= cur; n++ {
		if s.RoundIntact(n) != nil {
			return n - 1, nil
		}
	}
	return cur, nil
}

// RollbackResult says what Rollback did.
type RollbackResult struct {
	Round      uint64 // the round the log now ends at
	Backup     string // the copy of the file taken first
	Rounds     int    // later rounds removed
	ZsRemoved  []string
	Checkpoint []float64 // round Round's global model
}

// Rollback rolls the aggregator file at path back to round n (0: the last
// intact round), after copying the file to path + ".before-rollback-<unix
// seconds>". Rounds 1..n must be intact. rewrite, when not nil, replaces
// round 1's config bytes in the same transaction (the aggregator gives the
// rolled-back log a new run id there, so that the sites, which have moved
// past round n, start their round state over). One write transaction.
func Rollback(path string, n uint64, now time.Time, rewrite func(config []byte) ([]byte, error)) (RollbackResult, error) {
	var res RollbackResult
	s, err := OpenAgg(path, storage.Options{SkipValueCheck: true})
	if err != nil {
		return res, fmt.Errorf("storage: roll back %s: %w", path, err)
	}
	n, err = s.rollbackTarget(path, n)
	if err != nil {
		s.Close()
		return res, err
	}
	// The copy: the file as it is, before any change.
	res.Backup = fmt.Sprintf("%s.before-rollback-%d", path, now.Unix())
	if err := copyFile(path, res.Backup); err != nil {
		s.Close()
		return res, fmt.Errorf("storage: roll back %s: keep a copy: %w", path, err)
	}
	res.Round = n
	err = s.db.Update(func(tx *storage.Tx) error { return rollbackTx(tx, n, rewrite, &res) })
	if err == nil {
		res.Checkpoint, err = s.Checkpoint(n)
	}
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return res, fmt.Errorf("storage: roll back %s to round %d: %w", path, n, err)
	}
	return res, nil
}

// rollbackTarget checks that the log can be rolled back to round n (0: the
// last intact round) and returns the round it will end at.
func (s *AggStore) rollbackTarget(path string, n uint64) (uint64, error) {
	last, err := s.lastIntact()
	if err != nil {
		return 0, fmt.Errorf("storage: roll back %s: %w", path, err)
	}
	if n == 0 {
		n = last
	}
	if n == 0 {
		return 0, fmt.Errorf("%w: roll back %s: round 1 is not intact; nothing to roll back to (start a new run with another state file)", storage.ErrCorrupt, path)
	}
	if n > last {
		return 0, fmt.Errorf("%w: roll back %s to round %d: the newest intact round is %d", storage.ErrInvalid, path, n, last)
	}
	return n, nil
}

// rollbackTx is Rollback's one write transaction: it drops what came after
// round n, rewrites round 1's config (rewrite != nil) and reopens round n.
// It records in res what it removed.
func rollbackTx(tx *storage.Tx, n uint64, rewrite func(config []byte) ([]byte, error), res *RollbackResult) error {
	rs, err := storage.NeedBucket(tx, bucketRounds)
	if err != nil {
		return err
	}
	for _, name := range [][]byte{bucketRounds, bucketUpdates, bucketCheckpoints} {
		b, err := storage.NeedBucket(tx, name)
		if err != nil {
			return err
		}
		dropped, err := deleteRoundsFrom(b, n+1)
		if err != nil {
			return err
		}
		if string(name) == string(bucketRounds) {
			res.Rounds = dropped
		}
	}
	// Evaluation reports of eval round e judge the model after e
	// aggregations, the checkpoint of round e+1: those of rounds >= n
	// judge models that are gone. The final bundle goes too: the run
	// is not finished any more.
	if err := dropEvalsFrom(tx, n); err != nil {
		return err
	}
	if fb := tx.Bucket(bucketFederation); fb != nil {
		if err := fb.Delete(keyFinalBundle); err != nil {
			return err
		}
	}
	if res.ZsRemoved, err = dropLatestZAfter(tx, n); err != nil {
		return err
	}
	if err := dropDamagedClients(tx); err != nil {
		return err
	}
	if rewrite != nil {
		if err := rewriteRunConfig(rs, rewrite); err != nil {
			return err
		}
	}
	if err := reopenRound(rs, n); err != nil {
		return err
	}
	// The replay log extends the current round's state only: going back
	// past it drops every entry; staying at it drops those of the
	// messages removed above (log.go).
	cur, err := currentRound(tx)
	if err != nil {
		return err
	}
	if n < cur {
		err = clearLog(tx)
	} else {
		err = dropDanglingLog(tx)
	}
	if err != nil {
		return err
	}
	agg, err := storage.NeedBucket(tx, bucketAgg)
	if err != nil {
		return err
	}
	return storage.SPut(agg, keyCurrentRound, storage.EncodeU64(n))
}

// deleteRoundsFrom deletes b's keys (values or sub-buckets) of rounds >=
// from and returns how many it deleted.
func deleteRoundsFrom(b *storage.Bucket, from uint64) (int, error) {
	var doomed [][]byte
	c := b.Cursor()
	for k, _ := c.Seek(storage.EncodeU64(from)); k != nil; k, _ = c.Next() {
		doomed = append(doomed, append([]byte(nil), k...))
	}
	for _, k := range doomed {
		var err error
		if b.Bucket(k) != nil {
			err = b.DeleteBucket(k)
		} else {
			err = b.Delete(k)
		}
		if err != nil {
			return 0, err
		}
	}
	return len(doomed), nil
}

// dropLatestZAfter deletes every client's latest FedSplit z set by an
// update of a round after n (or unreadable) and returns those clients.
func dropLatestZAfter(tx *storage.Tx, n uint64) ([]string, error) {
	zb, err := storage.NeedBucket(tx, bucketLatestZ)
	if err != nil {
		return nil, err
	}
	var doomed [][]byte
	if err := zb.ForEach(func(k, raw []byte) error {
		v, err := storage.Unseal(k, raw, "latest_z/"+string(k))
		var r uint64
		if err == nil {
			r, err = storage.RoundOf(v, "latest_z/"+string(k))
		}
		if err != nil || r > n {
			doomed = append(doomed, append([]byte(nil), k...))
		}
		return nil
	}); err != nil {
		return nil, err
	}
	var removed []string
	for _, k := range doomed {
		if err := zb.Delete(k); err != nil {
			return removed, err
		}
		removed = append(removed, string(k))
	}
	return removed, nil
}

// dropDamagedClients deletes the registry entries that do not unseal. The
// registry is informational (last seen, participation): a damaged entry is
// dropped and rebuilt by the client's next status.
func dropDamagedClients(tx *storage.Tx) error {
	cb, err := storage.NeedBucket(tx, bucketClients)
	if err != nil {
		return err
	}
	var bad [][]byte
	if err := cb.ForEach(func(k, raw []byte) error {
		if _, err := storage.Unseal(k, raw, "clients/"+string(k)); err != nil {
			bad = append(bad, append([]byte(nil), k...))
		}
		return nil
	}); err != nil {
		return err
	}
	for _, k := range bad {
		if err := cb.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// rewriteRunConfig replaces round 1's config bytes by rewrite's answer.
func rewriteRunConfig(rs *storage.Bucket, rewrite func(config []byte) ([]byte, error)) error {
	fb := rs.Bucket(storage.EncodeU64(1))
	first, err := readRound(fb, 1)
	if err != nil {
		return err
	}
	conf, err := rewrite(first.Config)
	if err != nil {
		return err
	}
	return putBytes(fb, keyRoundConfig, conf)
}

// reopenRound marks round n open again, as it was while it was current.
func reopenRound(rs *storage.Bucket, n uint64) error {
	rb := rs.Bucket(storage.EncodeU64(n))
	r, err := readRound(rb, n)
	if err != nil {
		return err
	}
	r.Status, r.ClosedAt = RoundOpen, time.Time{}
	return writeRoundMeta(rb, r)
}

func copyFile(src, dst string) error {
	if _, err := os.Stat(dst); err == nil {
		return fmt.Errorf("%w: %s", storage.ErrExists, dst)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// dropEvalsFrom deletes the evaluation reports of eval rounds >= n.
func dropEvalsFrom(tx *storage.Tx, n uint64) error {
	b := tx.Bucket(bucketEvals)
	if b == nil {
		return nil
	}
	_, err := deleteRoundsFrom(b, n)
	return err
}

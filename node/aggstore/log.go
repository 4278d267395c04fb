package aggstore

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/edgefl/edgefl/node/storage"
)

// The replay log (aggregator schema version 4; ARCHITECTURE.md, "Durability
// and failure semantics"). The aggregator writes its coordinator's whole
// state only when a decision other than the acceptance of one site message
// changed it; a message it accepted is stored with one entry here, in the
// same transaction, and on restart the messages the log names are replayed,
// in log order, into the coordinator restored from the stored state. So an
// accepted update costs one write transaction, not two.
//
//	agg/log_index  the index of the last entry ever appended (sealed u64;
//	               absent: none yet). Indices only grow, also across
//	               truncations and rollbacks.
//	log            index u64 -> kind (1 byte) | round u64 | client id
//	               (LogSecAgg: attempt u32 | secagg kind u8 | client id)
//
// Rules:
//   - PutUpdate, PutStatistics, PutEval and PutSecAggMessage append an entry for the message
//     they store (nothing for a copy already stored) and return its index;
//   - every write of the coordinator's state (OpenRound with a State,
//     PutRoundState, CloseRound with a state) clears the log in the same
//     transaction: the caller writes a state that reflects every message
//     logged before it (the aggregator steps Stored for each before its
//     next state write), so the log holds exactly the messages accepted
//     since the stored state;
//   - every entry names a stored message (checked on open): rollback drops
//     the entries of the messages it removes (all of them when it goes back
//     past the current round: the log extends only the current round's
//     state), and PruneUpdates keeps the rounds the log names.
//
// A new kind of stored site message joins the log by appending its entry
// in the transaction that stores it (appendLog) and by a case in
// resolveLogged that reads it back.

var (
	bucketLog   = []byte("log")
	keyLogIndex = []byte("log_index")
)

// LogKind says which kind of stored message a log entry names.
type LogKind uint8

// Log kinds.
const (
	LogUpdate     LogKind = 1 // updates/<round>/<client>
	LogStatistics LogKind = 2 // statistics/<client> (round 0)
	LogEval       LogKind = 3 // evals/<eval round>/<client>
	LogSecAgg     LogKind = 4 // secagg_msgs/<round, attempt, kind, client> (secagg.go)
)

var logKindNames = [...]string{LogUpdate: "update", LogStatistics: "statistics", LogEval: "evaluation", LogSecAgg: "secagg"}

func (k LogKind) String() string {
	if int(k) < len(logKindNames) && logKindNames[k] != "" {
		return logKindNames[k]
	}
	return fmt.Sprintf("LogKind(%d)", uint8(k))
}

// Logged is one entry of the replay log with the message it names.
type Logged struct {
	Index    uint64
	Kind     LogKind
	Round    uint64 // the update's round, the eval round; 0 for statistics
	ClientID string
	// LogSecAgg only: the message's session (attempt) and secagg kind.
	Attempt    uint32
	SecAggKind uint8
	StoredAt   time.Time
	Msg        []byte // the message as stored (the encoded wire message)
}

func encodeLogEntry(kind LogKind, round uint64, client string) []byte {
	b := make([]byte, 0, 9+len(client))
	b = append(b, byte(kind))
	b = binary.BigEndian.AppendUint64(b, round)
	return append(b, client...)
}

func decodeLogEntry(k, v []byte) (Logged, error) {
	idx, err := storage.DecodeU64(k, "log key")
	if err != nil {
		return Logged{}, err
	}
	if len(v) < 10 {
		return Logged{}, fmt.Errorf("%w: log entry %d is %d bytes", storage.ErrCorrupt, idx, len(v))
	}
	e := Logged{Index: idx, Kind: LogKind(v[0]), Round: binary.BigEndian.Uint64(v[1:]), ClientID: string(v[9:])}
	switch {
	case idx == 0:
		return e, fmt.Errorf("%w: log entry 0", storage.ErrCorrupt)
	case e.Kind < LogUpdate || e.Kind > LogSecAgg:
		return e, fmt.Errorf("%w: log entry %d has kind %d", storage.ErrCorrupt, idx, v[0])
	case (e.Kind == LogStatistics) != (e.Round == 0):
		return e, fmt.Errorf("%w: log entry %d: %s of round %d", storage.ErrCorrupt, idx, e.Kind, e.Round)
	case e.Kind == LogSecAgg:
		return e, parseSecAggLog(&e)
	}
	return e, nil
}

// lastLogIndex reads agg/log_index (0: nothing logged yet).
func lastLogIndex(tx *storage.Tx) (uint64, error) {
	agg, err := storage.NeedBucket(tx, bucketAgg)
	if err != nil {
		return 0, err
	}
	v, err := storage.SGet(agg, keyLogIndex, "agg/log_index")
	if err != nil || v == nil {
		return 0, err
	}
	return storage.DecodeU64(v, "agg/log_index")
}

// appendLog appends the entry of a message stored in this transaction and
// returns its index.
func appendLog(tx *storage.Tx, kind LogKind, round uint64, client string) (uint64, error) {
	last, err := lastLogIndex(tx)
	if err != nil {
		return 0, err
	}
	lb, err := storage.NeedBucket(tx, bucketLog)
	if err != nil {
		return 0, err
	}
	idx := last + 1
	if err := storage.SPut(lb, storage.EncodeU64(idx), encodeLogEntry(kind, round, client)); err != nil {
		return 0, err
	}
	if err := storage.SPut(tx.Bucket(bucketAgg), keyLogIndex, storage.EncodeU64(idx)); err != nil {
		return 0, err
	}
	return idx, nil
}

// clearLog empties the log (a state write: the state reflects every entry).
func clearLog(tx *storage.Tx) error {
	lb, err := storage.NeedBucket(tx, bucketLog)
	if err != nil {
		return err
	}
	return deleteLogWhere(lb, func(Logged) bool { return true })
}

// deleteLogWhere deletes the entries doomed says go (an entry that does
// not decode goes too).
func deleteLogWhere(lb *storage.Bucket, doomed func(Logged) bool) error {
	var keys [][]byte
	if err := lb.ForEach(func(k, raw []byte) error {
		v, err := storage.Unseal(k, raw, "log entry")
		var e Logged
		if err == nil {
			e, err = decodeLogEntry(k, v)
		}
		if err != nil || doomed(e) {
			keys = append(keys, bytes.Clone(k))
		}
		return nil
	}); err != nil {
		return err
	}
	for _, k := range keys {
		if err := lb.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// resolveLogged reads the message entry e names into e (ErrCorrupt when it
// is not stored: a log entry always names a stored message).
func resolveLogged(tx *storage.Tx, e *Logged) error {
	var v []byte
	var err error
	what := fmt.Sprintf("%s (%d, %q) named by log entry %d", e.Kind, e.Round, e.ClientID, e.Index)
	switch e.Kind {
	case LogUpdate, LogEval:
		name := bucketUpdates
		if e.Kind == LogEval {
			name = bucketEvals
		}
		if top := tx.Bucket(name); top != nil {
			if b := top.Bucket(storage.EncodeU64(e.Round)); b != nil {
				v, err = storage.SGet(b, []byte(e.ClientID), what)
			}
		}
	case LogStatistics:
		if b := tx.Bucket(bucketStatistics); b != nil {
			v, err = storage.SGet(b, []byte(e.ClientID), what)
		}
	case LogSecAgg:
		what = fmt.Sprintf("secagg message %d of %q (round %d, attempt %d) named by log entry %d", e.SecAggKind, e.ClientID, e.Round, e.Attempt, e.Index)
		if b := tx.Bucket(bucketSecAggMsgs); b != nil {
			v, err = storage.SGet(b, secAggKey(e.Round, e.Attempt, e.SecAggKind, e.ClientID), what)
		}
	}
	if err != nil {
		return err
	}
	if v == nil {
		return fmt.Errorf("%w: %s is not stored", storage.ErrCorrupt, what)
	}
	if e.Kind == LogUpdate {
		u, err := decodeUpdate(e.Round, []byte(e.ClientID), v)
		e.StoredAt, e.Msg = u.StoredAt, u.Msg
		return err
	}
	r, err := decodeRecord(e.Round, []byte(e.ClientID), v, what)
	e.StoredAt, e.Msg = r.StoredAt, r.Msg
	return err
}

// readLog returns the log's entries in index order, each with its message
// when resolve, and the last index appended.
func readLog(tx *storage.Tx, resolve bool) (last uint64, out []Logged, err error) {
	if last, err = lastLogIndex(tx); err != nil {
		return 0, nil, err
	}
	lb := tx.Bucket(bucketLog)
	if lb == nil {
		return last, nil, nil // checked by the layout on open
	}
	err = storage.SForEach(lb, "log", func(k, v []byte) error {
		e, err := decodeLogEntry(k, v)
		if err != nil {
			return err
		}
		if e.Index > last {
			return fmt.Errorf("%w: log entry %d is past the last index appended, %d", storage.ErrCorrupt, e.Index, last)
		}
		if resolve {
			if err := resolveLogged(tx, &e); err != nil {
				return err
			}
		}
		out = append(out, e)
		return nil
	})
	return last, out, err
}

// Log returns the replay log: the messages stored since the coordinator's
// state was last written, in the order they were stored, and the index of
// the last entry ever appended (the stored state reflects no entry above
// it). A read transaction.
func (s *AggStore) Log() (last uint64, entries []Logged, err error) {
	err = s.db.View(func(tx *storage.Tx) error {
		last, entries, err = readLog(tx, true)
		return err
	})
	if err != nil {
		return 0, nil, fmt.Errorf("storage: replay log: %w", err)
	}
	return last, entries, nil
}

// logInvariants: every entry decodes, is not past the last index and names
// a stored message (read on open).
func logInvariants(tx *storage.Tx) error {
	_, _, err := readLog(tx, true)
	return err
}

// logRounds returns the update rounds the log names.
func logRounds(tx *storage.Tx) (map[uint64]bool, error) {
	_, es, err := readLog(tx, false)
	rounds := map[uint64]bool{}
	for _, e := range es {
		if e.Kind == LogUpdate {
			rounds[e.Round] = true
		}
	}
	return rounds, err
}

// dropDanglingLog deletes the entries whose message is no longer stored
// (rollback removed it).
func dropDanglingLog(tx *storage.Tx) error {
	lb, err := storage.NeedBucket(tx, bucketLog)
	if err != nil {
		return err
	}
	return deleteLogWhere(lb, func(e Logged) bool { return resolveLogged(tx, &e) != nil })
}

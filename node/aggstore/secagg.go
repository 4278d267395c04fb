package aggstore

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/edgefl/edgefl/node/storage"
)

// Secure aggregation's records (docs/privacy.md, "Persistence"). Like the
// federation schema's buckets (agg_fed.go), each bucket is created by its
// first write, so a run without --secagg writes exactly the file it wrote
// before (no migration; an older binary refuses a file holding them as
// having an unknown bucket).
//
// Aggregator:
//
//	secagg       server = round u64 | attempt u32 | the secagg.Server state
//	             (written at each phase advance, alone in its transaction
//	             with the deletion of the messages it has taken in; the
//	             coordinator's state, written before, cleared their replay
//	             log entries)
//	secagg_msgs  round u64 | attempt u32 | kind u8 | client id -> stored
//	             at (unix ns u64) | the encoded wire message as received (a
//	             site's message of the open phase, stored before it is
//	             counted, with a replay log entry of kind LogSecAgg in the
//	             same transaction: after a restart the coordinator replays
//	             it and the secagg.Server takes it again; kind
//	             SecAggViewKind: a site's signed view of the session,
//	             PutSecAggView, without a replay log entry)
//
// The site's record is the edge store's (node/edgestore, secagg_edge.go).
var (
	bucketSecAgg     = []byte("secagg")
	bucketSecAggMsgs = []byte("secagg_msgs")

	keySecAggServer = []byte("server")
)

func init() {
	aggSchema.Layout[string(bucketSecAgg)] = []string{string(keySecAggServer)}
	aggSchema.Layout[string(bucketSecAggMsgs)] = nil
}

// secAggAdvertiseKind is secagg.KindAdvertiseKeys (kept by PutSecAggServer).
const secAggAdvertiseKind = 1

// SecAggViewKind is the kind byte under which PutSecAggView keeps a site's
// signed view of a session in secagg_msgs: not a secagg message kind (no
// replay log entry; the coordinator counts nothing of it), and above every
// phase's keepFromKind, so it stays until another session's state replaces
// the session's (PutSecAggServer).
const SecAggViewKind = 0x80

// PutSecAggView keeps site client's signed view of session (round,
// attempt) (signed secure aggregation: its MaskedInput's view_signature),
// replacing any. One transaction.
func (s *AggStore) PutSecAggView(round uint64, attempt uint32, client string, sig []byte, at time.Time) error {
	if err := storage.CheckName("client id", client); err != nil {
		return err
	}
	if len(sig) == 0 || round == 0 {
		return fmt.Errorf("storage: put secagg view: %w: round %d, %d bytes", storage.ErrInvalid, round, len(sig))
	}
	err := s.db.Update(func(tx *storage.Tx) error {
		b, err := storage.MakeBucket(tx, bucketSecAggMsgs)
		if err != nil {
			return err
		}
		return storage.SPut(b, secAggKey(round, attempt, SecAggViewKind, client), encodeRecord(at, sig))
	})
	if err != nil {
		return fmt.Errorf("storage: put secagg view of %q (round %d, attempt %d): %w", client, round, attempt, err)
	}
	return nil
}

func secAggKey(round uint64, attempt uint32, kind uint8, client string) []byte {
	k := binary.BigEndian.AppendUint64(make([]byte, 0, 13+len(client)), round)
	k = binary.BigEndian.AppendUint32(k, attempt)
	return append(append(k, kind), client...)
}

// SecAggRecord is one stored secure-aggregation message.
type SecAggRecord struct {
	Round    uint64
	Attempt  uint32
	Kind     uint8
	ClientID string
	StoredAt time.Time // set by SecAggMessages
	Msg      []byte
}

// PutSecAggMessage stores a site's secure-aggregation message under
// (round, attempt, kind, client) with the time it was stored, and appends
// its replay log entry (log.go) in the same transaction, returning
// its index. The same bytes again store nothing (index 0); different bytes
// fail with ErrConflict. One transaction.
func (s *AggStore) PutSecAggMessage(r SecAggRecord, at time.Time) (index uint64, err error) {
	if err := storage.CheckName("client id", r.ClientID); err != nil {
		return 0, err
	}
	if len(r.Msg) == 0 || r.Round == 0 {
		return 0, fmt.Errorf("%w: secagg message of round %d with %d bytes", storage.ErrInvalid, r.Round, len(r.Msg))
	}
	k := secAggKey(r.Round, r.Attempt, r.Kind, r.ClientID)
	err = s.db.Update(func(tx *storage.Tx) error {
		b, err := storage.MakeBucket(tx, bucketSecAggMsgs)
		if err != nil {
			return err
		}
		old, err := storage.SGet(b, k, "secagg message")
		if err != nil {
			return err
		}
		if old != nil {
			rec, err := decodeRecord(r.Round, []byte(r.ClientID), old, "secagg message")
			if err != nil {
				return err
			}
			if !bytes.Equal(rec.Msg, r.Msg) {
				return storage.ErrConflict
			}
			return nil
		}
		if err := storage.SPut(b, k, encodeRecord(at, r.Msg)); err != nil {
			return err
		}
		index, err = appendLog(tx, LogSecAgg, r.Round, secAggLogClient(r.Attempt, r.Kind, r.ClientID))
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("storage: put secagg message %d of %q (round %d, attempt %d): %w", r.Kind, r.ClientID, r.Round, r.Attempt, err)
	}
	return index, nil
}

// secAggLogClient is the client part of a LogSecAgg entry: the rest of
// the message's key after the round (attempt u32 | kind u8 | client id).
func secAggLogClient(attempt uint32, kind uint8, client string) string {
	return string(secAggKey(0, attempt, kind, client)[8:])
}

// parseSecAggLog splits a LogSecAgg entry's client part (secAggLogClient).
func parseSecAggLog(e *Logged) error {
	if len(e.ClientID) < 6 {
		return fmt.Errorf("%w: secagg log entry %d of %d bytes", storage.ErrCorrupt, e.Index, len(e.ClientID))
	}
	b := []byte(e.ClientID)
	e.Attempt, e.SecAggKind, e.ClientID = binary.BigEndian.Uint32(b), b[4], string(b[5:])
	return nil
}

// SecAggMessages returns the stored messages of (round, attempt) in key
// order (kind, then client id). A read transaction.
func (s *AggStore) SecAggMessages(round uint64, attempt uint32) ([]SecAggRecord, error) {
	var out []SecAggRecord
	prefix := secAggKey(round, attempt, 0, "")[:12]
	err := s.viewWritten(bucketSecAggMsgs, func(b *storage.Bucket) error {
		return storage.SForEach(b, "secagg_msgs", func(k, v []byte) error {
			if len(k) < 14 {
				return fmt.Errorf("%w: secagg message key of %d bytes", storage.ErrCorrupt, len(k))
			}
			if !bytes.HasPrefix(k, prefix) {
				return nil
			}
			rec, err := decodeRecord(round, k[13:], v, "secagg message")
			if err != nil {
				return err
			}
			out = append(out, SecAggRecord{Round: round, Attempt: attempt, Kind: k[12], ClientID: rec.ClientID, StoredAt: rec.StoredAt, Msg: rec.Msg})
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("storage: secagg messages: %w", err)
	}
	return out, nil
}

// PutSecAggServer stores the server state of session (round, attempt) and,
// in the same transaction, deletes every stored message it has taken in:
// those of other sessions and those of this one with a kind below
// keepFromKind, but its AdvertiseKeys (kind 1), kept until the next
// session's state replaces this one. The replay log must name none of them (the coordinator's
// state that counts them is written first, which clears the log): a
// message it names is refused with ErrInvalid, and nothing is written. One
// transaction.
func (s *AggStore) PutSecAggServer(round uint64, attempt uint32, state []byte, keepFromKind uint8) error {
	if len(state) == 0 || round == 0 {
		return fmt.Errorf("storage: put secagg server: %w: round %d, %d bytes", storage.ErrInvalid, round, len(state))
	}
	v := binary.BigEndian.AppendUint64(make([]byte, 0, 12+len(state)), round)
	v = binary.BigEndian.AppendUint32(v, attempt)
	v = append(v, state...)
	prefix := secAggKey(round, attempt, 0, "")[:12]
	// The session's AdvertiseKeys (kind 1) stay until another session's
	// state replaces this one: they name each site's base round in FedSplit's
	// sum mode, which the round's close needs (the joiners).
	doomed := func(k []byte) bool {
		return !bytes.HasPrefix(k, prefix) || len(k) < 13 || (k[12] < keepFromKind && k[12] != secAggAdvertiseKind)
	}
	err := s.db.Update(func(tx *storage.Tx) error {
		b, err := storage.MakeBucket(tx, bucketSecAgg)
		if err != nil {
			return err
		}
		if err := storage.SPut(b, keySecAggServer, v); err != nil {
			return err
		}
		_, logged, err := readLog(tx, false)
		if err != nil {
			return err
		}
		for _, e := range logged {
			if e.Kind != LogSecAgg {
				continue
			}
			if doomed(secAggKey(e.Round, e.Attempt, e.SecAggKind, e.ClientID)) {
				return fmt.Errorf("%w: replay log entry %d names the secagg message %d of %q (round %d, attempt %d), which the advance would drop: the coordinator's state must be written first", storage.ErrInvalid, e.Index, e.SecAggKind, e.ClientID, e.Round, e.Attempt)
			}
		}
		mb, _ := storage.OptBucket(tx, bucketSecAggMsgs)
		if mb == nil {
			return nil
		}
		var del [][]byte
		if err := mb.ForEach(func(k, _ []byte) error {
			if doomed(k) {
				del = append(del, bytes.Clone(k))
			}
			return nil
		}); err != nil {
			return err
		}
		for _, k := range del {
			if err := mb.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("storage: put secagg server: %w", err)
	}
	return nil
}

// SecAggServer returns the stored server state and its session, or
// ErrNotFound. A read transaction.
func (s *AggStore) SecAggServer() (round uint64, attempt uint32, state []byte, err error) {
	found := false
	err = s.viewWritten(bucketSecAgg, func(b *storage.Bucket) error {
		v, err := storage.SGet(b, keySecAggServer, "secagg/server")
		if err != nil {
			return err
		}
		if v == nil {
			return fmt.Errorf("%w: secagg server state", storage.ErrNotFound)
		}
		if len(v) <= 12 {
			return fmt.Errorf("%w: secagg server state of %d bytes", storage.ErrCorrupt, len(v))
		}
		round, attempt = binary.BigEndian.Uint64(v), binary.BigEndian.Uint32(v[8:])
		state, found = bytes.Clone(v[12:]), true
		return nil
	})
	if err == nil && !found {
		err = fmt.Errorf("%w: secagg server state", storage.ErrNotFound)
	}
	return round, attempt, state, err
}

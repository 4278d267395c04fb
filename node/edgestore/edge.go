package edgestore

import (
	"bytes"
	crand "crypto/rand"
	"encoding/json"
	"fmt"
	"math"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgefl/edgefl/node/storage"
)

// Edge schema, version 6 (version 1 without the seals; every value
// outside meta is sealed with a CRC-32C, see node/storage/seal.go; version 2 without the
// final bundle keys; version 3 without instance_id; version 4 without
// meta/census, the sealed entry counts of node/storage/census.go; version 5 without
// FedSplit's sum mode, contrib and sum_pending):
//
//	meta      schema_version, kind = "edge", census
//	edge      client_id      string
//	          created_at     unix ns
//	          instance_id    string, this installation's random id, drawn
//	                         once by InitIdentity (a file moved aside by
//	                         --reset-state takes its id with it): two
//	                         gateways with one site id and their own state
//	                         files (a cloned SD card) tell the aggregator
//	                         apart by it
//	          seen_round     u64, the newest round announcement seen
//	          applied_round  u64, the newest round CommitRound applied
//	          global         round u64 + float64s, the last global model
//	          z              round u64 + float64s, FedSplit z_j and the round
//	                         it was last updated for
//	          server_z       round u64 + float64s, FedSplit: the aggregator's
//	                         copy of z_j as this site computes it (the base of
//	                         the next Z_DELTA) and the round of the update that
//	                         set it; absent = the aggregator holds no copy
//	                         (added without a migration: absent is meaningful)
//	          connection     u64, the number of the last MQTT connection
//	                         attempt (absent = none yet; added without a
//	                         migration)
//	          run_id         string, the aggregator run the round state
//	                         belongs to (absent = not known; added without a
//	                         migration)
//	          final_meta     JSON {"run_id", "round", "digest"}: the run whose
//	                         final model bundle is stored (absent = none)
//	          final_bundle   the final model bundle's bytes, exactly as
//	                         received (present iff final_meta is)
//	          contrib        round u64 + float64s, FedSplit in sum mode
//	                         (docs/privacy.md, "FedSplit"): the site's record
//	                         c_j of what it has contributed to the
//	                         aggregator's sum, and the round of the update
//	                         that last advanced it; absent = not counted yet
//	          control_undo   round u64 + float64s: SCAFFOLD's c_i before the
//	                         update of that round in the outbox, put back if
//	                         it is rejected; absent: none pending
//	residuals name -> float64s (error-feedback residuals; and under
//	          ResidualLocal the previous local model of the contrastive
//	          objectives, which a new run clears with the residuals)
//	outbox    round u64 -> the encoded wire update, until its receipt
//	sum_pending round u64 -> join u8 (0 or 1) + float64s: what a sum-mode
//	          update of the outbox adds to the aggregator's sum (and to
//	          contrib once its accepted receipt comes: AckSum); every key
//	          has its outbox entry
var (
	bucketEdge      = []byte("edge")
	bucketResiduals = []byte("residuals")
	bucketOutbox    = []byte("outbox")
	bucketPending   = []byte("sum_pending")

	keyClientID        = []byte("client_id")
	keyCreatedAt       = []byte("created_at")
	keyInstanceID      = []byte("instance_id")
	keySeenRound       = []byte("seen_round")
	keyAppliedRound    = []byte("applied_round")
	keyGlobal          = []byte("global")
	keyZ               = []byte("z")
	keyServerZ         = []byte("server_z")
	keyConnection      = []byte("connection")
	keyRunID           = []byte("run_id")
	keyRunSince        = []byte("run_since")
	keyEdgeFinalMeta   = []byte("final_meta")
	keyEdgeFinalBundle = []byte("final_bundle")
	keyContrib         = []byte("contrib")
	keyControlUndo     = []byte("control_undo")
)

const edgeKind = "edge"

func init() { edgeSchema.Invariants = edgeInvariants }

// edgeValue decodes the values that are float vectors (and the pending
// sum-mode records), so that a non-finite number (never written: CheckVec
// refuses it) is found on open, not when a round needs it.
func edgeValue(bucket string, k, v []byte) error {
	what := fmt.Sprintf("%s/%q", bucket, k)
	var err error
	switch {
	case bucket == string(bucketResiduals):
		_, err = storage.DecodeFloats(v, what)
	case bucket == string(bucketEdge) && (string(k) == string(keyGlobal) || string(k) == string(keyZ) || string(k) == string(keyServerZ) || string(k) == string(keyContrib) || string(k) == string(keyControlUndo)):
		_, _, err = storage.DecodeRoundVec(v, what)
	case bucket == string(bucketPending):
		_, err = decodePending(v, what)
	}
	return err
}

// edgeInvariants: the final bundle's two keys go together; every sum-mode
// pending contribution has its outbox entry.
func edgeInvariants(tx *storage.Tx) error {
	b, err := storage.NeedBucket(tx, bucketEdge)
	if err != nil {
		return err
	}
	if (b.Get(keyEdgeFinalMeta) == nil) != (b.Get(keyEdgeFinalBundle) == nil) {
		return fmt.Errorf("%w: edge/final_meta and edge/final_bundle are not both present or both absent", storage.ErrCorrupt)
	}
	// Looked up, not required: the layout requires both of the current
	// version, and a test's made-up schema may move them.
	out, pend := tx.Bucket(bucketOutbox), tx.Bucket(bucketPending)
	if out == nil || pend == nil {
		return nil
	}
	return pend.ForEach(func(k, _ []byte) error {
		if out.Get(k) == nil {
			return fmt.Errorf("%w: sum_pending has an entry %x without its outbox entry", storage.ErrCorrupt, k)
		}
		return nil
	})
}

var edgeSchema = storage.Schema{
	Kind: edgeKind,
	Migrations: []storage.Migration{
		{Name: "create buckets", Run: storage.CreateBuckets(bucketEdge, bucketResiduals, bucketOutbox)},
		{Name: "seal values", Run: storage.SealAll},
		// Version 3 adds the final_meta and final_bundle keys, written
		// when a run finishes. Nothing to convert: the step exists so that
		// an older agent refuses a file holding them as written by a newer
		// binary (ErrSchemaTooNew) instead of reporting unknown keys as
		// damage and suggesting --reset-state.
		{Name: "final bundle keys", Run: func(*storage.Tx) error { return nil }},
		// Version 4 adds instance_id, drawn by InitIdentity (also for a
		// file of an older version, on its first open by this version);
		// the step makes an older agent refuse the file as newer.
		{Name: "instance id key", Run: func(*storage.Tx) error { return nil }},
		// Version 5 adds meta/census, the sealed entry counts (node/storage/census.go).
		{Name: "count entries", Run: storage.WriteCensus},
		// Version 6 adds FedSplit's sum mode: edge/contrib and the
		// sum_pending bucket (an older agent refuses the file as newer).
		{Name: "sum mode", Run: storage.CreateBuckets(bucketPending)},
		// Version 7 adds edge/run_since, the creation time of the oldest
		// announcement seen of the current run (the agent's run order).
		{Name: "run order key", Run: func(*storage.Tx) error { return nil }},
		// Version 8 adds edge/control_undo, SCAFFOLD's c_i before the
		// update in the outbox (Commit.ControlUndo; an older agent
		// refuses the file as newer).
		{Name: "control undo key", Run: func(*storage.Tx) error { return nil }},
	},
	CountedFrom: 5,
	CheckValue:  edgeValue,
	Layout: map[string][]string{
		string(bucketEdge): {string(keyClientID), string(keyCreatedAt), string(keyInstanceID), string(keySeenRound), string(keyAppliedRound),
			string(keyGlobal), string(keyZ), string(keyServerZ), string(keyConnection), string(keyRunID), string(keyRunSince),
			string(keyEdgeFinalMeta), string(keyEdgeFinalBundle), string(keyContrib), string(keyControlUndo)},
		string(bucketResiduals): nil, string(bucketOutbox): nil, string(bucketPending): nil,
	},
}

// ResidualUplink is the residual name CommitRound writes: the error-feedback
// residual of the uplink codec.
const ResidualUplink = "uplink"

// ResidualControl is the name Commit stores SCAFFOLD's control variate
// c_i under (Commit.Control): the site's own state, committed with the
// update that changes it and cleared with the rest when a new run starts.
const ResidualControl = "scaffold_control"

// ResidualLocal is the name Commit stores Commit.Local under: the local
// model of the site's last solved round, which the contrastive objectives
// (MOON, FedSiam-DA: learn/model/contrast.go) compare the next solve with.
// It lives beside the residuals because it has their life: per site, per
// run, written with the update.
const ResidualLocal = "local"

// EdgeStore is the edge agent's state in one bbolt file. It is safe for
// concurrent use; bbolt serialises the writers.
type EdgeStore struct {
	db *storage.DB
}

// OpenEdge opens or creates the edge database at path.
func OpenEdge(path string, opts storage.Options) (*EdgeStore, error) {
	db, err := storage.Open(path, edgeSchema, opts)
	if err != nil {
		return nil, err
	}
	return &EdgeStore{db: db}, nil
}

// Close releases the file and its lock.
func (s *EdgeStore) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("storage: close %s: %w", s.db.Path(), err)
	}
	return nil
}

// Path is the database file.
func (s *EdgeStore) Path() string { return s.db.Path() }

// Check runs bbolt's page-level consistency check over the whole file (a
// read transaction; cheap for an edge database).
func (s *EdgeStore) Check() error { return storage.Check(s.db) }

// update runs fn on the edge bucket in a write transaction.
func (s *EdgeStore) update(fn func(b *storage.Bucket, tx *storage.Tx) error) error {
	return s.db.Update(inEdge(fn))
}

// view runs fn on the edge bucket in a read transaction.
func (s *EdgeStore) view(fn func(b *storage.Bucket, tx *storage.Tx) error) error {
	return s.db.View(inEdge(fn))
}

// inEdge is fn as a transaction function: it runs fn on tx's edge bucket.
func inEdge(fn func(b *storage.Bucket, tx *storage.Tx) error) func(*storage.Tx) error {
	return func(tx *storage.Tx) error {
		b, err := storage.NeedBucket(tx, bucketEdge)
		if err != nil {
			return err
		}
		return fn(b, tx)
	}
}

// Identity is who this agent is.
type Identity struct {
	ClientID  string
	CreatedAt time.Time
	// InstanceID is this installation's random id (26 characters of
	// [A-Z2-7]), drawn once and kept across restarts; a new state file
	// (--reset-state) draws a new one. "" before InitIdentity.
	InstanceID string
}

// InitIdentity records the client id on first use and returns the stored
// identity. Called again with the same id it changes nothing (but draws the
// instance id of a file written before there was one); with another id it
// fails with ErrMismatch, because the FedSplit z and the outbox in this file
// belong to the stored client. One transaction.
func (s *EdgeStore) InitIdentity(clientID string, now time.Time) (Identity, error) {
	if err := storage.CheckName("client id", clientID); err != nil {
		return Identity{}, err
	}
	var id Identity
	err := s.update(func(b *storage.Bucket, _ *storage.Tx) error {
		old, err := eget(b, keyClientID)
		if err != nil {
			return err
		}
		if old != nil {
			if id, err = readIdentity(b); err != nil {
				return err
			}
			if string(old) != clientID {
				return fmt.Errorf("%w: this database belongs to client %q, not %q", storage.ErrMismatch, old, clientID)
			}
			if id.InstanceID != "" {
				return nil
			}
			id.InstanceID = crand.Text()
			return storage.SPut(b, keyInstanceID, []byte(id.InstanceID))
		}
		id = Identity{ClientID: clientID, CreatedAt: now, InstanceID: crand.Text()}
		if err := storage.SPut(b, keyClientID, []byte(clientID)); err != nil {
			return err
		}
		if err := storage.SPut(b, keyInstanceID, []byte(id.InstanceID)); err != nil {
			return err
		}
		return storage.SPut(b, keyCreatedAt, storage.EncodeTime(now))
	})
	if err != nil {
		return Identity{}, wrapErr("storage: init identity", err)
	}
	return id, nil
}

func readIdentity(b *storage.Bucket) (Identity, error) {
	v, err := eget(b, keyClientID)
	if err != nil {
		return Identity{}, err
	}
	if v == nil {
		return Identity{}, fmt.Errorf("%w: identity", storage.ErrNotFound)
	}
	ct, err := eget(b, keyCreatedAt)
	if err != nil {
		return Identity{}, err
	}
	t, err := storage.DecodeTime(ct, "edge/created_at")
	if err != nil {
		return Identity{}, err
	}
	inst, err := eget(b, keyInstanceID)
	if err != nil {
		return Identity{}, err
	}
	return Identity{ClientID: string(v), CreatedAt: t, InstanceID: string(inst)}, nil
}

// Identity returns the stored identity, or ErrNotFound before InitIdentity.
// A read transaction.
func (s *EdgeStore) Identity() (Identity, error) {
	var id Identity
	err := s.view(func(b *storage.Bucket, _ *storage.Tx) (err error) {
		id, err = readIdentity(b)
		return err
	})
	return id, err
}

// getU64 reads an optional counter (0 when absent).
func getU64(b *storage.Bucket, key []byte) (uint64, error) {
	v, err := eget(b, key)
	if err != nil || v == nil {
		return 0, err
	}
	return storage.DecodeU64(v, "edge/"+string(key))
}

// raiseSeen moves seen_round up to round (never down).
func raiseSeen(b *storage.Bucket, round uint64) error {
	seen, err := getU64(b, keySeenRound)
	if err != nil {
		return err
	}
	if round > seen {
		return storage.SPut(b, keySeenRound, storage.EncodeU64(round))
	}
	return nil
}

// SetSeenRound records the newest round announcement seen. Rounds only move
// forward: a lower round fails with ErrStale (the same round is a no-op).
// One transaction.
func (s *EdgeStore) SetSeenRound(round uint64) error {
	if round == 0 {
		return fmt.Errorf("%w: round 0", storage.ErrInvalid)
	}
	err := s.update(func(b *storage.Bucket, _ *storage.Tx) error {
		seen, err := getU64(b, keySeenRound)
		if err != nil {
			return err
		}
		if round < seen {
			return fmt.Errorf("%w: round %d, already seen %d", storage.ErrStale, round, seen)
		}
		return raiseSeen(b, round)
	})
	if err != nil {
		return wrapErr("storage: set seen round", err)
	}
	return nil
}

// NextConnection takes the number of the site's next MQTT connection
// attempt (wire.ClientStatus.Connection) and records it: one more than the
// last, and never below floor. Callers pass the wall clock in milliseconds
// as the floor, so a site whose state file was replaced still numbers above
// the connections of its previous life (when the clock is sane). One
// transaction.
func (s *EdgeStore) NextConnection(floor uint64) (uint64, error) {
	var n uint64
	err := s.update(func(b *storage.Bucket, _ *storage.Tx) error {
		last, err := getU64(b, keyConnection)
		if err != nil {
			return err
		}
		if last == math.MaxUint64 {
			return fmt.Errorf("%w: connection numbers exhausted", storage.ErrInvalid)
		}
		n = max(last+1, floor)
		return storage.SPut(b, keyConnection, storage.EncodeU64(n))
	})
	if err != nil {
		return 0, wrapErr("storage: next connection", err)
	}
	return n, nil
}

// RunID is the aggregator run the round state belongs to ("" if not
// known). A read transaction.
func (s *EdgeStore) RunID() (string, error) {
	var id string
	err := s.view(func(b *storage.Bucket, _ *storage.Tx) error {
		v, err := eget(b, keyRunID)
		id = string(v)
		return err
	})
	return id, err
}

// RunOrder is the run the round state belongs to ("" if not known) and
// its since: the creation time (Unix ms) of the oldest announcement of it
// seen, 0 if not known. The agent orders runs by it (a run whose
// announcements are older than since is one it has left). A read
// transaction.
func (s *EdgeStore) RunOrder() (id string, since int64, err error) {
	err = s.view(func(b *storage.Bucket, _ *storage.Tx) error {
		v, err := eget(b, keyRunID)
		if err != nil {
			return err
		}
		id = string(v)
		u, err := getU64(b, keyRunSince)
		since = int64(min(u, math.MaxInt64))
		return err
	})
	return id, since, err
}

// RunStart is what StartRun did.
type RunStart struct {
	Previous string // the run id the state belonged to ("" if none)
	Reset    bool   // the round state was cleared
	Dropped  int    // unreceipted updates of the previous run removed
}

// StartRun makes runID the run the round state belongs to. The same run:
// nothing changes. A fresh state (no run id, no round seen) adopts it. Any
// other case is a new aggregator run, whose rounds start at 1 again: in one
// transaction the seen and applied rounds, the global model, FedSplit's z
// and the aggregator's copy of it (or the sum-mode record and its pending
// contributions), the residuals and the outbox are cleared (the identity
// and the connection counter stay).
func (s *EdgeStore) StartRun(runID string) (RunStart, error) {
	return s.StartRunAt(runID, 0)
}

// StartRunAt is StartRun of an announcement created at since (Unix ms, 0
// if not known), which becomes the run's since (RunOrder): a new run's,
// or the current run's when older than its since. The caller decides
// whether the run is one to start (the agent's run order); this records.
func (s *EdgeStore) StartRunAt(runID string, since int64) (RunStart, error) {
	if runID == "" {
		return RunStart{}, fmt.Errorf("storage: start run: %w: empty run id", storage.ErrInvalid)
	}
	since = max(since, 0)
	var rs RunStart
	if cur, old, err := s.RunOrder(); err != nil {
		return rs, wrapErr("storage: start run", err)
	} else if cur == runID {
		if since > 0 && (old == 0 || since < old) {
			if err := s.update(func(b *storage.Bucket, _ *storage.Tx) error {
				return storage.SPut(b, keyRunSince, storage.EncodeU64(uint64(since)))
			}); err != nil {
				return rs, wrapErr("storage: start run", err)
			}
		}
		return RunStart{Previous: cur}, nil
	}
	err := s.update(func(b *storage.Bucket, tx *storage.Tx) error {
		prev, err := eget(b, keyRunID)
		if err != nil {
			return err
		}
		rs = RunStart{Previous: string(prev)}
		seen, err := getU64(b, keySeenRound)
		if err != nil {
			return err
		}
		if rs.Previous == runID {
			return nil
		}
		if rs.Previous != "" || seen > 0 {
			rs.Reset = true
			for _, k := range [][]byte{keySeenRound, keyAppliedRound, keyGlobal, keyZ, keyServerZ, keyContrib, keyControlUndo} {
				if err := b.Delete(k); err != nil {
					return err
				}
			}
			out, err := storage.NeedBucket(tx, bucketOutbox)
			if err != nil {
				return err
			}
			rs.Dropped = out.Stats().KeyN
			for _, name := range [][]byte{bucketOutbox, bucketResiduals, bucketPending} {
				if err := tx.DeleteBucket(name); err != nil {
					return err
				}
				if _, err := tx.CreateBucket(name); err != nil {
					return err
				}
			}
			if tx.Bucket(bucketSecAgg) != nil {
				// The previous run's secure-aggregation session (and its
				// keys) is over.
				if err := tx.DeleteBucket(bucketSecAgg); err != nil {
					return err
				}
			}
		}
		if since > 0 {
			if err := storage.SPut(b, keyRunSince, storage.EncodeU64(uint64(since))); err != nil {
				return err
			}
		} else if err := b.Delete(keyRunSince); err != nil {
			return err
		}
		return storage.SPut(b, keyRunID, []byte(runID))
	})
	if err != nil {
		return RunStart{}, wrapErr("storage: start run", err)
	}
	return rs, nil
}

// SeenRound is the newest round seen (0 if none). A read transaction.
func (s *EdgeStore) SeenRound() (uint64, error) {
	return s.u64(keySeenRound)
}

// AppliedRound is the newest round CommitRound applied (0 if none). A read
// transaction.
func (s *EdgeStore) AppliedRound() (uint64, error) {
	return s.u64(keyAppliedRound)
}

// u64 reads the counter stored under k (0 if none). A read transaction.
func (s *EdgeStore) u64(k []byte) (uint64, error) {
	var r uint64
	err := s.view(func(b *storage.Bucket, _ *storage.Tx) (err error) {
		r, err = getU64(b, k)
		return err
	})
	return r, err
}

// SetGlobal stores the global model of a round announcement and raises the
// seen round to it. A global model older than the stored one fails with
// ErrStale (QoS 1 may redeliver an old announcement late); the same round
// overwrites. One transaction.
func (s *EdgeStore) SetGlobal(round uint64, vec []float64) error {
	if round == 0 {
		return fmt.Errorf("%w: round 0", storage.ErrInvalid)
	}
	if err := storage.CheckVec("global model", vec); err != nil {
		return err
	}
	err := s.update(func(b *storage.Bucket, _ *storage.Tx) error {
		old, err := eget(b, keyGlobal)
		if err != nil {
			return err
		}
		if old != nil {
			r, err := storage.RoundOf(old, "edge/global")
			if err != nil {
				return err
			}
			if round < r {
				return fmt.Errorf("%w: global model of round %d, have round %d", storage.ErrStale, round, r)
			}
		}
		if err := storage.SPut(b, keyGlobal, storage.EncodeRoundVec(round, vec)); err != nil {
			return err
		}
		return raiseSeen(b, round)
	})
	if err != nil {
		return wrapErr("storage: set global", err)
	}
	return nil
}

// Global returns the last global model and its round, or ErrNotFound. A
// read transaction.
func (s *EdgeStore) Global() (round uint64, vec []float64, err error) {
	return s.roundVec(keyGlobal, "global model")
}

// InitZ stores FedSplit's initial z (the first global model the client sees)
// if no z is stored yet, and reports whether it wrote. It never overwrites a
// z: that only happens through CommitRound. One transaction.
func (s *EdgeStore) InitZ(round uint64, z []float64) (bool, error) {
	if err := storage.CheckVec("z", z); err != nil {
		return false, err
	}
	wrote := false
	err := s.update(func(b *storage.Bucket, _ *storage.Tx) error {
		if b.Get(keyZ) != nil {
			return nil
		}
		wrote = true
		return storage.SPut(b, keyZ, storage.EncodeRoundVec(round, z))
	})
	if err != nil {
		return false, wrapErr("storage: init z", err)
	}
	return wrote, nil
}

// Z returns FedSplit's z and the round it was last updated for, or
// ErrNotFound. A read transaction.
func (s *EdgeStore) Z() (round uint64, z []float64, err error) {
	return s.roundVec(keyZ, "z")
}

// SetResidual stores an error-feedback residual under name. One
// transaction.
func (s *EdgeStore) SetResidual(name string, v []float64) error {
	if err := storage.CheckName("residual name", name); err != nil {
		return err
	}
	if err := storage.CheckVec("residual "+name, v); err != nil {
		return err
	}
	err := s.db.Update(storage.InBucket(bucketResiduals, func(b *storage.Bucket) error {
		return storage.SPut(b, []byte(name), storage.EncodeFloats(v))
	}))
	if err != nil {
		return fmt.Errorf("storage: set residual %q: %w", name, err)
	}
	return nil
}

// DeleteResidual removes a residual (no error if absent). One transaction.
func (s *EdgeStore) DeleteResidual(name string) error {
	err := s.db.Update(storage.InBucket(bucketResiduals, func(b *storage.Bucket) error {
		return b.Delete([]byte(name))
	}))
	if err != nil {
		return fmt.Errorf("storage: delete residual %q: %w", name, err)
	}
	return nil
}

// Residual returns the residual stored under name, or ErrNotFound. A read
// transaction.
func (s *EdgeStore) Residual(name string) ([]float64, error) {
	var v []float64
	err := s.db.View(storage.InBucket(bucketResiduals, func(b *storage.Bucket) error {
		raw, err := storage.SGet(b, []byte(name), "residual "+name)
		if err != nil {
			return err
		}
		if raw == nil {
			return fmt.Errorf("%w: residual %q", storage.ErrNotFound, name)
		}
		v, err = storage.DecodeFloats(raw, "residual "+name)
		return err
	}))
	return v, err
}

// Commit is what one local round makes durable (see EdgeStore.Commit).
type Commit struct {
	Round uint64
	// Z is FedSplit's new z_j (nil: unchanged; FedAvg/FedProx have none).
	Z []float64
	// ServerZ is the aggregator's copy of z_j once it applies this round's
	// Z_DELTA (nil: unchanged).
	ServerZ []float64
	// Residual is the uplink codec's error-feedback residual, stored under
	// ResidualUplink (nil: unchanged).
	Residual []float64
	// Control is SCAFFOLD's new control variate c_i, stored under
	// ResidualControl (nil: unchanged).
	Control []float64
	// ControlUndo is c_i before this round's delta c (zeros: none), kept
	// with the round (edge/control_undo) until the update's receipt: a
	// rejection puts it back (AckRejected), since the aggregator never
	// counted the delta; an accepted receipt drops it. nil: none.
	ControlUndo []float64
	// Msg is the encoded update for the outbox; required.
	Msg []byte
	// SecAgg is the agent's secure-aggregation record of the round (nil:
	// unchanged; secagg.go): Msg is then its first message.
	SecAgg []byte
	// Pending is what a sum-mode update adds to the aggregator's sum,
	// kept with the outbox entry until its receipt (nil: not sum mode).
	Pending *SumPending
	// Local is the round's local model, stored under ResidualLocal for the
	// contrastive objectives' next solve (nil: unchanged).
	Local []float64
}

// SumPending is what a sum-mode update adds to the aggregator's sum
// (uplink.Pending): V, which for a join (Join) includes the round's global
// model.
type SumPending struct {
	Join bool
	V    []float64
}

func encodePending(p SumPending) []byte {
	b := []byte{0}
	if p.Join {
		b[0] = 1
	}
	return storage.AppendFloats(b, p.V)
}

func decodePending(b []byte, what string) (SumPending, error) {
	if len(b) < 1 || b[0] > 1 {
		return SumPending{}, fmt.Errorf("%w: %s has no join flag", storage.ErrCorrupt, what)
	}
	v, err := storage.DecodeFloats(b[1:], what)
	return SumPending{Join: b[0] == 1, V: v}, err
}

// CommitRound is Commit without a server copy of z.
func (s *EdgeStore) CommitRound(round uint64, z, residual []float64, outboxMsg []byte) error {
	return s.Commit(Commit{Round: round, Z: z, Residual: residual, Msg: outboxMsg})
}

// Commit is the durable end of a local round: in one transaction it writes
// the new FedSplit z and the aggregator's copy of it (both tagged with the
// round), the uplink residual (under ResidualUplink), the local model (under
// ResidualLocal), the applied round and
// the outbox entry holding the encoded update, and raises the seen round. A
// nil or empty vector leaves the stored one unchanged; Msg is required.
//
// Applied rounds only move forward: if the round is not greater than the
// last applied round, nothing is written and the error wraps
// ErrAlreadyApplied. That is what keeps a FedSplit step from being applied
// twice after a crash and redelivery of the same round announcement.
func (s *EdgeStore) Commit(c Commit) error {
	round := c.Round
	if round == 0 {
		return fmt.Errorf("%w: round 0", storage.ErrInvalid)
	}
	if len(c.Msg) == 0 {
		return fmt.Errorf("%w: empty outbox message for round %d", storage.ErrInvalid, round)
	}
	if c.Pending != nil && len(c.Pending.V) == 0 {
		return fmt.Errorf("%w: empty pending contribution for round %d", storage.ErrInvalid, round)
	}
	for _, v := range []struct {
		name string
		vec  []float64
	}{{"z", c.Z}, {"server z", c.ServerZ}, {"residual", c.Residual}, {"control", c.Control}, {"control undo", c.ControlUndo}, {"pending contribution", c.Pending.vec()}, {"local model", c.Local}} {
		if len(v.vec) > 0 {
			if err := storage.CheckVec(v.name, v.vec); err != nil {
				return err
			}
		}
	}
	err := s.update(func(b *storage.Bucket, tx *storage.Tx) error {
		applied, err := getU64(b, keyAppliedRound)
		if err != nil {
			return err
		}
		if round <= applied {
			return fmt.Errorf("%w: round %d (last applied %d)", storage.ErrAlreadyApplied, round, applied)
		}
		out, err := storage.NeedBucket(tx, bucketOutbox)
		if err != nil {
			return err
		}
		res, err := storage.NeedBucket(tx, bucketResiduals)
		if err != nil {
			return err
		}
		if len(c.Z) > 0 {
			if err := storage.SPut(b, keyZ, storage.EncodeRoundVec(round, c.Z)); err != nil {
				return err
			}
		}
		if len(c.ServerZ) > 0 {
			if err := storage.SPut(b, keyServerZ, storage.EncodeRoundVec(round, c.ServerZ)); err != nil {
				return err
			}
		}
		if err := c.putResiduals(res); err != nil {
			return err
		}
		if len(c.ControlUndo) > 0 {
			if err := storage.SPut(b, keyControlUndo, storage.EncodeRoundVec(round, c.ControlUndo)); err != nil {
				return err
			}
		}
		if err := storage.SPut(out, storage.EncodeU64(round), c.Msg); err != nil {
			return err
		}
		if c.SecAgg != nil {
			sb, err := storage.MakeBucket(tx, bucketSecAgg)
			if err != nil {
				return err
			}
			if err := storage.SPut(sb, keySecAggEdge, c.SecAgg); err != nil {
				return err
			}
		}
		if c.Pending != nil {
			pend, err := storage.NeedBucket(tx, bucketPending)
			if err != nil {
				return err
			}
			if err := storage.SPut(pend, storage.EncodeU64(round), encodePending(*c.Pending)); err != nil {
				return err
			}
		}
		if err := storage.SPut(b, keyAppliedRound, storage.EncodeU64(round)); err != nil {
			return err
		}
		return raiseSeen(b, round)
	})
	if err != nil {
		return fmt.Errorf("storage: commit round %d: %w", round, err)
	}
	return nil
}

// putResiduals writes the site's own vectors that c changes into the
// residuals bucket: the uplink's error-feedback residual, SCAFFOLD's c_i
// and the contrastive objectives' local model.
func (c Commit) putResiduals(res *storage.Bucket) error {
	for _, r := range []struct {
		name string
		vec  []float64
	}{{ResidualUplink, c.Residual}, {ResidualControl, c.Control}, {ResidualLocal, c.Local}} {
		if len(r.vec) > 0 {
			if err := storage.SPut(res, []byte(r.name), storage.EncodeFloats(r.vec)); err != nil {
				return err
			}
		}
	}
	return nil
}

// ServerZ returns the aggregator's copy of z_j as this site computed it and
// the round of the update that set it, or ErrNotFound when the aggregator
// holds no copy this site knows of. A read transaction.
func (s *EdgeStore) ServerZ() (round uint64, z []float64, err error) {
	return s.roundVec(keyServerZ, "server z")
}

// roundVec reads the round and vector stored under k (what names it in
// ErrNotFound). A read transaction.
func (s *EdgeStore) roundVec(k []byte, what string) (round uint64, vec []float64, err error) {
	err = s.view(func(b *storage.Bucket, _ *storage.Tx) error {
		v, err := eget(b, k)
		if err != nil {
			return err
		}
		if v == nil {
			return fmt.Errorf("%w: %s", storage.ErrNotFound, what)
		}
		round, vec, err = storage.DecodeRoundVec(v, "edge/"+string(k))
		return err
	})
	return round, vec, err
}

// OutboxEntry is an update written but not yet receipted.
type OutboxEntry struct {
	Round uint64
	Msg   []byte // the encoded wire update, as handed to CommitRound
}

// Outbox returns the unreceipted updates in round order. A read
// transaction; the returned bytes are copies.
func (s *EdgeStore) Outbox() ([]OutboxEntry, error) {
	var entries []OutboxEntry
	err := s.db.View(storage.InBucket(bucketOutbox, func(b *storage.Bucket) error {
		return storage.SForEach(b, "outbox", func(k, v []byte) error {
			r, err := storage.DecodeU64(k, "outbox key")
			if err != nil {
				return err
			}
			if len(v) == 0 {
				return fmt.Errorf("%w: outbox entry of round %d is empty", storage.ErrCorrupt, r)
			}
			entries = append(entries, OutboxEntry{Round: r, Msg: bytes.Clone(v)})
			return nil
		})
	}))
	if err != nil {
		return nil, wrapErr("storage: outbox", err)
	}
	return entries, nil
}

// Ack removes the outbox entry of round after its receipt and reports
// whether there was one (a duplicate receipt finds none: not an error). A
// sum-mode update's entry is acknowledged by AckSum instead (ErrInvalid
// here). One transaction.
func (s *EdgeStore) Ack(round uint64) (bool, error) {
	return s.ack(round, false)
}

// AckRejected removes the outbox entry of a rejected round (and its
// sum-mode pending contribution: the update is not in the aggregator's
// sum) and, if there was one, forgets the aggregator's copy of z in the
// same transaction: the copy
// this site computed assumed the update would be applied, so the next
// FedSplit update must be a delta against the round's global model (base
// round 0), which resets the aggregator's copy; and puts back SCAFFOLD's
// c_i as it was before the round (settleControl). A rejection of a round with
// no outbox entry (already receipted, or an update this site never sent,
// published by someone else under its id) changes nothing.
func (s *EdgeStore) AckRejected(round uint64) (bool, error) {
	return s.ack(round, true)
}

func (s *EdgeStore) ack(round uint64, rejected bool) (bool, error) {
	found := false
	err := s.db.Update(func(tx *storage.Tx) error {
		b, err := storage.NeedBucket(tx, bucketOutbox)
		if err != nil {
			return err
		}
		k := storage.EncodeU64(round)
		if b.Get(k) == nil {
			return nil
		}
		found = true
		pend, err := storage.NeedBucket(tx, bucketPending)
		if err != nil {
			return err
		}
		if pend.Get(k) != nil {
			if !rejected {
				return fmt.Errorf("%w: round %d is a sum-mode update: its receipt advances the record (AckSum)", storage.ErrInvalid, round)
			}
			// Rejected: not in the aggregator's sum, so not in the
			// record either; what it carried goes out again next round.
			if err := pend.Delete(k); err != nil {
				return err
			}
		}
		eb, err := storage.NeedBucket(tx, bucketEdge)
		if err != nil {
			return err
		}
		if err := settleControl(eb, tx, round, rejected); err != nil {
			return err
		}
		if rejected {
			// The copy assumed this round's z would be applied. A copy of a
			// later round's z stays: the rejection is of an older re-sent
			// update (a broker that redelivers, such as a NATS cluster after
			// a node's loss, brings a late round_closed for it), and the
			// later update's own receipt decides that copy.
			keep := false
			if raw, err := storage.SGet(eb, keyServerZ, "server z"); err == nil && raw != nil {
				if cr, _, err := storage.DecodeRoundVec(raw, "server z"); err == nil && cr > round {
					keep = true
				}
			}
			if !keep {
				if err := eb.Delete(keyServerZ); err != nil {
					return err
				}
			}
		}
		return b.Delete(k)
	})
	if err != nil {
		return false, fmt.Errorf("storage: ack round %d: %w", round, err)
	}
	return found, nil
}

// settleControl is the receipt's effect on SCAFFOLD's c_i, in the ack's
// transaction: the undo of round's update (Commit.ControlUndo) goes, and
// on a rejection becomes c_i again, as the aggregator never counted that
// update's delta c. An undo of another round stays (none arises: a
// SCAFFOLD site commits its next update only after this one's receipt).
func settleControl(eb *storage.Bucket, tx *storage.Tx, round uint64, rejected bool) error {
	raw, err := eget(eb, keyControlUndo)
	if err != nil || raw == nil {
		return err
	}
	ur, undo, err := storage.DecodeRoundVec(raw, "edge/control_undo")
	if err != nil || ur != round {
		return err
	}
	if rejected {
		res, err := storage.NeedBucket(tx, bucketResiduals)
		if err != nil {
			return err
		}
		if err := storage.SPut(res, []byte(ResidualControl), storage.EncodeFloats(undo)); err != nil {
			return err
		}
	}
	return eb.Delete(keyControlUndo)
}

// Contribution returns FedSplit's sum-mode record c_j and the round of the
// update that last advanced it, or ErrNotFound while the site is not
// counted. A read transaction.
func (s *EdgeStore) Contribution() (round uint64, c []float64, err error) {
	return s.roundVec(keyContrib, "contribution record")
}

// Pending returns the sum-mode pending contribution of round's outbox
// entry; ok is false when there is none. A read transaction.
func (s *EdgeStore) Pending(round uint64) (p SumPending, ok bool, err error) {
	err = s.db.View(storage.InBucket(bucketPending, func(b *storage.Bucket) error {
		raw, err := storage.SGet(b, storage.EncodeU64(round), fmt.Sprintf("sum_pending %d", round))
		if err != nil || raw == nil {
			return err
		}
		ok = true
		p, err = decodePending(raw, fmt.Sprintf("sum_pending %d", round))
		return err
	}))
	if err != nil {
		return SumPending{}, false, fmt.Errorf("storage: pending contribution of round %d: %w", round, err)
	}
	return p, ok, nil
}

// AckSum is Ack for a sum-mode update: in one transaction it removes
// round's outbox entry and pending contribution and stores the advanced
// record c (uplink.Advance of the record of round prev, 0: none, and the
// pending contribution), and reports whether the entry was there. The
// record must still be prev's (ErrStale otherwise: it advanced
// meanwhile); an entry already gone (a duplicate receipt) changes nothing,
// so a record advances exactly once per update.
func (s *EdgeStore) AckSum(round, prev uint64, c []float64) (bool, error) {
	if err := storage.CheckVec("contribution record", c); err != nil {
		return false, err
	}
	found := false
	err := s.update(func(eb *storage.Bucket, tx *storage.Tx) error {
		out, err := storage.NeedBucket(tx, bucketOutbox)
		if err != nil {
			return err
		}
		pend, err := storage.NeedBucket(tx, bucketPending)
		if err != nil {
			return err
		}
		k := storage.EncodeU64(round)
		if out.Get(k) == nil {
			return nil
		}
		if pend.Get(k) == nil {
			return fmt.Errorf("%w: round %d has no pending contribution", storage.ErrInvalid, round)
		}
		found = true
		cur := uint64(0)
		if v, err := eget(eb, keyContrib); err != nil {
			return err
		} else if v != nil {
			if cur, err = storage.RoundOf(v, "edge/contrib"); err != nil {
				return err
			}
		}
		if cur != prev {
			return fmt.Errorf("%w: the record is of round %d, the advance is of the record of round %d", storage.ErrStale, cur, prev)
		}
		if err := storage.SPut(eb, keyContrib, storage.EncodeRoundVec(round, c)); err != nil {
			return err
		}
		if err := pend.Delete(k); err != nil {
			return err
		}
		return out.Delete(k)
	})
	if err != nil {
		return false, fmt.Errorf("storage: ack round %d: %w", round, err)
	}
	return found, nil
}

// eget is SGet for a key of the edge bucket.
func eget(b *storage.Bucket, k []byte) ([]byte, error) { return storage.SGet(b, k, "edge/"+string(k)) }

// Final is the final model bundle of a finished aggregator run.
type Final struct {
	RunID  string `json:"run_id"` // the run it ends ("" for a run without a run id)
	Round  uint64 `json:"round"`  // rounds the run completed
	Digest string `json:"digest"` // the bundle's SHA-256 digest (hex), as the bundle states it
	// Bundle is the bundle's bytes as received; the storage layer does not
	// parse it (the agent verifies it before SetFinal and after Final).
	Bundle []byte `json:"-"`
}

// MaxFinalBundle bounds a stored bundle (one bbolt value).
const MaxFinalBundle = bolt.MaxValueSize - storage.SealLen

// SetFinal stores the final bundle of a finished run, replacing any earlier
// one, and in the same transaction empties the outbox: the run is over, its
// unreceipted updates can no longer be applied and are not re-sent. The
// round state stays as it is until StartRun of another run (the bundle
// stays then too, until the next run's replaces it). The sum-mode pending
// contributions go with their outbox entries. One transaction.
func (s *EdgeStore) SetFinal(f Final) error {
	if len(f.Bundle) == 0 || len(f.Bundle) > MaxFinalBundle {
		return fmt.Errorf("storage: set final: %w: bundle of %d bytes", storage.ErrInvalid, len(f.Bundle))
	}
	if f.Digest == "" {
		return fmt.Errorf("storage: set final: %w: no digest", storage.ErrInvalid)
	}
	meta, err := json.Marshal(f)
	if err != nil {
		return wrapErr("storage: set final", err)
	}
	err = s.update(func(b *storage.Bucket, tx *storage.Tx) error {
		if err := storage.SPut(b, keyEdgeFinalMeta, meta); err != nil {
			return err
		}
		if err := storage.SPut(b, keyEdgeFinalBundle, f.Bundle); err != nil {
			return err
		}
		for _, name := range [][]byte{bucketOutbox, bucketPending} {
			if err := tx.DeleteBucket(name); err != nil {
				return err
			}
			if _, err := tx.CreateBucket(name); err != nil {
				return err
			}
		}
		return b.Delete(keyControlUndo) // its outbox entry is gone
	})
	if err != nil {
		return wrapErr("storage: set final", err)
	}
	return nil
}

// Final returns the stored final bundle, or ErrNotFound. A read
// transaction; the bytes are a copy.
func (s *EdgeStore) Final() (Final, error) {
	var f Final
	err := s.view(func(b *storage.Bucket, _ *storage.Tx) error {
		meta, err := eget(b, keyEdgeFinalMeta)
		if err != nil {
			return err
		}
		raw, err := eget(b, keyEdgeFinalBundle)
		if err != nil {
			return err
		}
		if meta == nil && raw == nil {
			return fmt.Errorf("%w: final bundle", storage.ErrNotFound)
		}
		if meta == nil || len(raw) == 0 {
			return fmt.Errorf("%w: edge/final_meta and edge/final_bundle are not both present", storage.ErrCorrupt)
		}
		if err := json.Unmarshal(meta, &f); err != nil || f.Digest == "" {
			return fmt.Errorf("%w: edge/final_meta: %q", storage.ErrCorrupt, meta)
		}
		f.Bundle = bytes.Clone(raw)
		return nil
	})
	if err != nil {
		return Final{}, wrapErr("storage: final", err)
	}
	return f, nil
}

// vec is p's vector (nil for no pending contribution).
func (p *SumPending) vec() []float64 {
	if p == nil {
		return nil
	}
	return p.V
}

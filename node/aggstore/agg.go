package aggstore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/edgefl/edgefl/node/storage"
)

// Aggregator schema, version 4 (version 1 without the seals; every value
// outside meta is sealed with a CRC-32C, see node/storage/seal.go; version 2 without
// meta/census, the sealed entry counts of node/storage/census.go; version 3 without the
// replay log, log.go):
//
//	meta        schema_version, kind = "agg", census
//	agg         current_round  u64, log_index u64 (log.go)
//	log         index u64 -> kind | round u64 | client id (log.go)
//	clients     client id -> JSON clientJSON
//	rounds      round u64 -> bucket { meta: JSON roundJSON, config: bytes, state: bytes,
//	                                  sum: bytes (FedSplit sum mode's S and m at the
//	                                  round's opening, uplink.SumState; absent
//	                                  otherwise: added without a migration, as
//	                                  the schema run's buckets), split: bytes
//	                                  (the robust FedSplit step's state), opt:
//	                                  bytes (the server optimiser's state),
//	                                  control: float64s (SCAFFOLD's c; absent
//	                                  otherwise, added the same way) }
//	updates     round u64 -> bucket { client id -> stored_at unix ns u64 |
//	                                  sample_count u64 | loss float64 LE | message }
//	latest_z    client id -> round u64 + float64s
//	checkpoints round u64 -> float64s (the global model announced for the round)
//
// A run with a federation schema (agg_fed.go) adds these buckets,
// each created by its first write, so that a run without a schema writes
// exactly the file it wrote before (no migration: the schema version stays
// 3; an older binary refuses a file holding them as having an unknown
// bucket):
//
//	statistics  client id -> stored_at unix ns u64 | message (a site's statistics)
//	evals       eval round u64 -> bucket { client id -> stored_at unix ns u64 | message }
//	federation  fit = the fitted preprocessing record (opaque bytes), final_bundle = bytes
var (
	bucketAgg         = []byte("agg")
	bucketClients     = []byte("clients")
	bucketRounds      = []byte("rounds")
	bucketUpdates     = []byte("updates")
	bucketLatestZ     = []byte("latest_z")
	bucketCheckpoints = []byte("checkpoints")

	keyCurrentRound = []byte("current_round")
	keyRoundMeta    = []byte("meta")
	keyRoundConfig  = []byte("config")
	keyRoundState   = []byte("state")
	keyRoundSum     = []byte("sum")
	keyRoundSplit   = []byte("split")
	keyRoundOpt     = []byte("opt")
	keyRoundControl = []byte("control")
)

const aggKind = "agg"

var aggSchema = storage.Schema{
	Kind: aggKind,
	Migrations: []storage.Migration{
		{Name: "create buckets", Run: storage.CreateBuckets(bucketAgg, bucketClients, bucketRounds,
			bucketUpdates, bucketLatestZ, bucketCheckpoints)},
		{Name: "seal values", Run: storage.SealAll},
		{Name: "count entries", Run: storage.WriteCensus},
		{Name: "replay log", Run: storage.CreateBuckets(bucketLog)},
	},
	CountedFrom: 3,
	CheckValue:  aggValue,
	Layout: map[string][]string{
		string(bucketAgg): {string(keyCurrentRound), string(keyLogIndex)}, string(bucketLog): nil,
		string(bucketClients): nil, string(bucketRounds): nil,
		string(bucketUpdates): nil, string(bucketLatestZ): nil, string(bucketCheckpoints): nil,
		string(bucketStatistics): nil, string(bucketEvals): nil, string(bucketFederation): {string(keyFit), string(keyFinalBundle)},
	},
}

func init() {
	aggSchema.Invariants = aggInvariants
	aggSchema.Nested = map[string][]string{string(bucketRounds): roundKeys}
}

// aggValue decodes the values that are float vectors, so that a
// non-finite number (never written: CheckVec refuses it) is found on open,
// not when a round needs it.
func aggValue(bucket string, k, v []byte) error {
	what := fmt.Sprintf("%s/%q", bucket, k)
	var err error
	switch bucket {
	case string(bucketCheckpoints):
		_, err = storage.DecodeFloats(v, what)
	case string(bucketLatestZ):
		_, _, err = storage.DecodeRoundVec(v, what)
	}
	return err
}

// aggInvariants: the round log has every round from its first to the current one
// (a damaged key would otherwise leave a hole that reads as "not found"),
// no update or checkpoint belongs to a later round, and every replay log
// entry names a stored message.
func aggInvariants(tx *storage.Tx) error {
	if err := roundInvariants(tx); err != nil {
		return err
	}
	return logInvariants(tx)
}

func roundInvariants(tx *storage.Tx) error {
	cur, _, err := readCurrentRound(tx) // 0 before the first round
	if err != nil {
		return err
	}
	rs, err := storage.NeedBucket(tx, bucketRounds)
	if err != nil {
		return err
	}
	next := uint64(0) // the log may start past round 1 (OpenRound allows it), but has no holes
	if err := rs.ForEach(func(k, _ []byte) error {
		r, err := storage.DecodeU64(k, "rounds key")
		if err != nil {
			return err
		}
		if next == 0 {
			next = r
		}
		if r != next {
			return fmt.Errorf("%w: the round log has round %d where round %d belongs", storage.ErrCorrupt, r, next)
		}
		next++
		return nil
	}); err != nil {
		return err
	}
	if next > 0 && next-1 != cur || next == 0 && cur != 0 {
		return fmt.Errorf("%w: the round log ends at round %d, its current round is %d", storage.ErrCorrupt, max(next, 1)-1, cur)
	}
	// The aggregator checkpoints the next round's model before it opens
	// that round (and the final aggregate as round Rounds+1): a checkpoint
	// may be one round ahead.
	for _, c := range []struct {
		name  []byte
		ahead uint64
	}{{bucketUpdates, 0}, {bucketCheckpoints, 1}, {bucketEvals, 0}} {
		name := c.name
		b, err := storage.NeedBucket(tx, name)
		if string(name) == string(bucketEvals) {
			if b, err = storage.OptBucket(tx, name); b == nil {
				continue
			}
		}
		if err != nil {
			return err
		}
		if err := b.ForEach(func(k, _ []byte) error {
			r, err := storage.DecodeU64(k, string(name)+" key")
			if err == nil && (r == 0 || r > cur+c.ahead) {
				err = fmt.Errorf("%w: %s of round %d, the current round is %d", storage.ErrCorrupt, name, r, cur)
			}
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}

// roundKeys are the keys of a round's bucket.
var roundKeys = []string{string(keyRoundMeta), string(keyRoundConfig), string(keyRoundState), string(keyRoundSum), string(keyRoundSplit), string(keyRoundOpt), string(keyRoundControl)}

// updateHeader is the fixed part of a stored update: stored_at, sample
// count, loss.
const updateHeader = 24

// AggStore is the aggregator's state in one bbolt file. It is safe for
// concurrent use; bbolt serialises the writers.
type AggStore struct {
	db   *storage.DB
	opts storage.Options
}

// OpenAgg opens or creates the aggregator database at path.
func OpenAgg(path string, opts storage.Options) (*AggStore, error) {
	db, err := storage.Open(path, aggSchema, opts)
	if err != nil {
		return nil, err
	}
	// Open's checks read every value through the map: give the pages back
	// (a restarted aggregator would otherwise carry its whole file in its
	// RSS).
	if err := storage.ReleaseMapped(db); err != nil {
		_ = db.Close()
		return nil, err
	}
	return &AggStore{db: db, opts: opts}, nil
}

// Close releases the file and its lock.
func (s *AggStore) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("storage: close %s: %w", s.db.Path(), err)
	}
	return nil
}

// Path is the database file.
func (s *AggStore) Path() string { return s.db.Path() }

// Check runs bbolt's page-level consistency check over the whole file (a
// read transaction over every page: slow on a large database).
func (s *AggStore) Check() error { return storage.Check(s.db) }

// Commits is the id of the file's last committed write transaction
// (bbolt's transaction id): every write transaction, so every durable
// event, advances it by one. A read transaction.
func (s *AggStore) Commits() (uint64, error) {
	var id int
	err := s.db.View(func(tx *storage.Tx) error {
		id = tx.ID()
		return nil
	})
	return uint64(id), err
}

// Compact writes a compacted copy of the database to dst, which must not
// exist, using bbolt.Compact in a read transaction of this store (writers
// are not blocked). The copy is written under dst+".tmp" and renamed when
// complete. To shrink the live file: Close, Compact from a fresh handle,
// swap the files, reopen.
func (s *AggStore) Compact(dst string) error { return storage.Compact(s.db, dst, s.opts) }

// ---- clients ----

// ClientRecord is the registry entry of one client.
type ClientRecord struct {
	ID          string
	Online      bool
	LastSeen    time.Time
	SampleCount uint64
	// FirstSampleCount is the first non-zero sample count the client
	// reported (status or update): the bound on the counts it reports later.
	FirstSampleCount uint64
	RecentLoss       float64 // loss at the anchor of its latest update; NaN = unknown
	Participation    uint64  // accepted updates
	Capabilities     []string
	SoftwareVersion  string
	// ErrorReason and ErrorMessage are the site error of its latest online
	// status (wire ClientStatus error_reason/error_message; empty: none).
	ErrorReason, ErrorMessage string
}

type clientJSON struct {
	ID              string   `json:"id"`
	Online          bool     `json:"online"`
	LastSeenUnixNs  int64    `json:"last_seen_unix_ns,omitempty"`
	SampleCount     uint64   `json:"sample_count"`
	FirstSamples    uint64   `json:"first_sample_count,omitempty"`
	RecentLoss      *float64 `json:"recent_loss,omitempty"`
	Participation   uint64   `json:"participation"`
	Capabilities    []string `json:"capabilities,omitempty"`
	SoftwareVersion string   `json:"software_version,omitempty"`
	ErrorReason     string   `json:"error_reason,omitempty"`
	ErrorMessage    string   `json:"error_message,omitempty"`
}

func encodeClient(c ClientRecord) ([]byte, error) {
	j := clientJSON{
		ID: c.ID, Online: c.Online, SampleCount: c.SampleCount, Participation: c.Participation,
		Capabilities: c.Capabilities, SoftwareVersion: c.SoftwareVersion, FirstSamples: c.FirstSampleCount,
		ErrorReason: c.ErrorReason, ErrorMessage: c.ErrorMessage,
	}
	if !c.LastSeen.IsZero() {
		j.LastSeenUnixNs = c.LastSeen.UnixNano()
	}
	if !math.IsNaN(c.RecentLoss) && !math.IsInf(c.RecentLoss, 0) {
		l := c.RecentLoss
		j.RecentLoss = &l
	}
	return json.Marshal(j)
}

func decodeClient(id, v []byte) (ClientRecord, error) {
	var j clientJSON
	if err := json.Unmarshal(v, &j); err != nil {
		return ClientRecord{}, fmt.Errorf("%w: client %q: %w", storage.ErrCorrupt, id, err)
	}
	if j.ID != string(id) {
		return ClientRecord{}, fmt.Errorf("%w: client record under %q names %q", storage.ErrCorrupt, id, j.ID)
	}
	c := ClientRecord{
		ID: j.ID, Online: j.Online, SampleCount: j.SampleCount, Participation: j.Participation,
		Capabilities: j.Capabilities, SoftwareVersion: j.SoftwareVersion, RecentLoss: math.NaN(), FirstSampleCount: j.FirstSamples,
		ErrorReason: j.ErrorReason, ErrorMessage: j.ErrorMessage,
	}
	if j.LastSeenUnixNs != 0 {
		c.LastSeen = time.Unix(0, j.LastSeenUnixNs)
	}
	if j.RecentLoss != nil {
		c.RecentLoss = *j.RecentLoss
	}
	return c, nil
}

func getClient(b *storage.Bucket, id string) (ClientRecord, bool, error) {
	v, err := storage.SGet(b, []byte(id), "clients/"+id)
	if err != nil {
		return ClientRecord{}, false, err
	}
	if v == nil {
		return ClientRecord{ID: id, RecentLoss: math.NaN()}, false, nil
	}
	c, err := decodeClient([]byte(id), v)
	return c, true, err
}

func putClient(b *storage.Bucket, c ClientRecord) error {
	v, err := encodeClient(c)
	if err != nil {
		return fmt.Errorf("storage: encode client %q: %w", c.ID, err)
	}
	return storage.SPut(b, []byte(c.ID), v)
}

// PutClient writes a whole registry entry (replacing any). A non-finite
// RecentLoss is stored as unknown. One transaction.
func (s *AggStore) PutClient(c ClientRecord) error {
	if err := storage.CheckName("client id", c.ID); err != nil {
		return err
	}
	err := s.db.Update(storage.InBucket(bucketClients, func(b *storage.Bucket) error {
		return putClient(b, c)
	}))
	if err != nil {
		return fmt.Errorf("storage: put client %q: %w", c.ID, err)
	}
	return nil
}

// ClientStatus is what a client's status message tells the registry.
type ClientStatus struct {
	ID              string
	Online          bool
	SampleCount     uint64
	Capabilities    []string
	SoftwareVersion string
	// ErrorReason and ErrorMessage: the site's error (empty: none). An
	// online status sets or clears the stored error; an offline status (a
	// last will carries none) keeps it.
	ErrorReason, ErrorMessage string
	At                        time.Time // when the aggregator received it
}

// PutClientStatus upserts a client's status (online flag, sample count,
// capabilities, version, last seen = max(stored, At)) and keeps its
// participation count and recent loss. One transaction.
func (s *AggStore) PutClientStatus(st ClientStatus) error {
	return s.PutClientStatuses([]ClientStatus{st})
}

// PutClientStatuses is PutClientStatus for each of sts in order, in one
// transaction (one fsync for a burst of statuses); an invalid id writes
// none of them.
func (s *AggStore) PutClientStatuses(sts []ClientStatus) error {
	for _, st := range sts {
		if err := storage.CheckName("client id", st.ID); err != nil {
			return err
		}
	}
	if len(sts) == 0 {
		return nil
	}
	err := s.db.Update(storage.InBucket(bucketClients, func(b *storage.Bucket) error {
		for _, st := range sts {
			if err := putStatus(b, st); err != nil {
				return fmt.Errorf("storage: put status of %q: %w", st.ID, err)
			}
		}
		return nil
	}))
	if err != nil {
		return fmt.Errorf("storage: put %d statuses: %w", len(sts), err)
	}
	return nil
}

// putStatus upserts one status in the clients bucket b.
func putStatus(b *storage.Bucket, st ClientStatus) error {
	c, _, err := getClient(b, st.ID)
	if err != nil {
		return err
	}
	c.Online = st.Online
	if st.SampleCount > 0 {
		c.SampleCount = st.SampleCount
		if c.FirstSampleCount == 0 {
			c.FirstSampleCount = st.SampleCount
		}
	}
	if st.Capabilities != nil {
		c.Capabilities = slices.Clone(st.Capabilities)
	}
	if st.SoftwareVersion != "" {
		c.SoftwareVersion = st.SoftwareVersion
	}
	if st.Online {
		c.ErrorReason, c.ErrorMessage = st.ErrorReason, st.ErrorMessage
	}
	if st.At.After(c.LastSeen) {
		c.LastSeen = st.At
	}
	return putClient(b, c)
}

// Client returns one registry entry, or ErrNotFound. A read transaction.
func (s *AggStore) Client(id string) (ClientRecord, error) {
	var c ClientRecord
	err := s.db.View(storage.InBucket(bucketClients, func(b *storage.Bucket) (err error) {
		var ok bool
		c, ok, err = getClient(b, id)
		if err == nil && !ok {
			err = fmt.Errorf("%w: client %q", storage.ErrNotFound, id)
		}
		return err
	}))
	return c, err
}

// Clients returns the whole registry ordered by id. A read transaction.
func (s *AggStore) Clients() ([]ClientRecord, error) {
	var cs []ClientRecord
	err := s.db.View(storage.InBucket(bucketClients, func(b *storage.Bucket) error {
		return storage.SForEach(b, "clients", func(k, v []byte) error {
			c, err := decodeClient(k, v)
			if err != nil {
				return err
			}
			cs = append(cs, c)
			return nil
		})
	}))
	if err != nil {
		return nil, fmt.Errorf("storage: clients: %w", err)
	}
	return cs, nil
}

// ---- rounds ----

// RoundStatus is where a round is in its life.
type RoundStatus uint8

// Round statuses.
const (
	RoundOpen   RoundStatus = 1
	RoundClosed RoundStatus = 2
)

func (s RoundStatus) String() string {
	switch s {
	case RoundOpen:
		return "open"
	case RoundClosed:
		return "closed"
	}
	return fmt.Sprintf("RoundStatus(%d)", uint8(s))
}

// Round is one round of the aggregator's log.
type Round struct {
	Number   uint64
	Status   RoundStatus
	OpenedAt time.Time
	ClosedAt time.Time // zero while open
	Config   []byte    // the round's configuration, e.g. the encoded announcement
	State    []byte    // the aggregator's own round state (opaque)
	// Sum is the aggregator's FedSplit sum-mode state as the round opens
	// (opaque; nil: none), written by OpenRound with the round's
	// checkpoint in one transaction and never changed.
	Sum []byte
	// Split is the robust FedSplit server step's state as the round opens
	// (opaque: each site's lag and record; nil: none), written and kept
	// like Sum.
	Split []byte
	// Opt is the server optimiser's state as the round opens (opaque:
	// its step count and moments; nil: none), written and kept like Sum.
	Opt []byte
	// Control is SCAFFOLD's server control variate c as the round opens
	// (float64s; nil: none, c = 0), written and kept like Sum.
	Control []byte
}

type roundJSON struct {
	Status         RoundStatus `json:"status"`
	OpenedAtUnixNs int64       `json:"opened_at_unix_ns,omitempty"`
	ClosedAtUnixNs int64       `json:"closed_at_unix_ns,omitempty"`
}

func unixNs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNs(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

func readRound(rb *storage.Bucket, n uint64) (Round, error) {
	var j roundJSON
	meta, err := storage.SGet(rb, keyRoundMeta, fmt.Sprintf("round %d meta", n))
	if err != nil {
		return Round{}, err
	}
	config, err := storage.SGet(rb, keyRoundConfig, fmt.Sprintf("round %d config", n))
	if err != nil {
		return Round{}, err
	}
	state, err := storage.SGet(rb, keyRoundState, fmt.Sprintf("round %d state", n))
	if err != nil {
		return Round{}, err
	}
	sum, err := storage.SGet(rb, keyRoundSum, fmt.Sprintf("round %d sum", n))
	if err != nil {
		return Round{}, err
	}
	split, err := storage.SGet(rb, keyRoundSplit, fmt.Sprintf("round %d split", n))
	if err != nil {
		return Round{}, err
	}
	opt, err := storage.SGet(rb, keyRoundOpt, fmt.Sprintf("round %d opt", n))
	if err != nil {
		return Round{}, err
	}
	control, err := storage.SGet(rb, keyRoundControl, fmt.Sprintf("round %d control", n))
	if err != nil {
		return Round{}, err
	}
	if err := json.Unmarshal(meta, &j); err != nil {
		return Round{}, fmt.Errorf("%w: round %d meta: %w", storage.ErrCorrupt, n, err)
	}
	if j.Status != RoundOpen && j.Status != RoundClosed {
		return Round{}, fmt.Errorf("%w: round %d has status %d", storage.ErrCorrupt, n, j.Status)
	}
	return Round{
		Number:   n,
		Status:   j.Status,
		OpenedAt: fromUnixNs(j.OpenedAtUnixNs),
		ClosedAt: fromUnixNs(j.ClosedAtUnixNs),
		Config:   bytes.Clone(config),
		State:    bytes.Clone(state),
		Sum:      bytes.Clone(sum),
		Split:    bytes.Clone(split),
		Opt:      bytes.Clone(opt),
		Control:  bytes.Clone(control),
	}, nil
}

func writeRoundMeta(rb *storage.Bucket, r Round) error {
	v, err := json.Marshal(roundJSON{Status: r.Status, OpenedAtUnixNs: unixNs(r.OpenedAt), ClosedAtUnixNs: unixNs(r.ClosedAt)})
	if err != nil {
		return err
	}
	return storage.SPut(rb, keyRoundMeta, v)
}

func putBytes(b *storage.Bucket, k, v []byte) error {
	if len(v) == 0 {
		return b.Delete(k)
	}
	return storage.SPut(b, k, v)
}

// roundBucket returns the nested bucket of round n, or ErrNotFound.
func roundBucket(tx *storage.Tx, n uint64) (*storage.Bucket, error) {
	rs, err := storage.NeedBucket(tx, bucketRounds)
	if err != nil {
		return nil, err
	}
	rb := rs.Bucket(storage.EncodeU64(n))
	if rb == nil {
		if rs.Get(storage.EncodeU64(n)) != nil {
			return nil, fmt.Errorf("%w: round %d is a value, not a bucket", storage.ErrCorrupt, n)
		}
		return nil, fmt.Errorf("%w: round %d", storage.ErrNotFound, n)
	}
	return rb, nil
}

// inRound is InBucket for the bucket of round n, which must exist.
func inRound(n uint64, fn func(rb *storage.Bucket) error) func(tx *storage.Tx) error {
	return func(tx *storage.Tx) error {
		rb, err := roundBucket(tx, n)
		if err != nil {
			return err
		}
		return fn(rb)
	}
}

// readCurrentRound reads the current-round pointer; ok is false before the
// first round.
func readCurrentRound(tx *storage.Tx) (cur uint64, ok bool, err error) {
	agg, err := storage.NeedBucket(tx, bucketAgg)
	if err != nil {
		return 0, false, err
	}
	v, err := storage.SGet(agg, keyCurrentRound, "agg/current_round")
	if err != nil || v == nil {
		return 0, false, err
	}
	cur, err = storage.DecodeU64(v, "agg/current_round")
	return cur, err == nil, err
}

// currentRound is readCurrentRound with ErrNotFound before the first round.
func currentRound(tx *storage.Tx) (uint64, error) {
	cur, ok, err := readCurrentRound(tx)
	if err == nil && !ok {
		err = fmt.Errorf("%w: no round yet", storage.ErrNotFound)
	}
	return cur, err
}

// currentRoundBucket is roundBucket for the current-round pointer, which
// must never dangle.
func currentRoundBucket(tx *storage.Tx, n uint64) (*storage.Bucket, error) {
	rb, err := roundBucket(tx, n)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, fmt.Errorf("%w: current round %d has no record", storage.ErrCorrupt, n)
	}
	return rb, err
}

// OpenRound starts round r.Number with its config (and optional state: a
// state clears the replay log, log.go; and optional sum), makes
// it the current round and stores global as the round's checkpoint (nil: no
// checkpoint). If the current round is still open it is closed in the same
// transaction, with ClosedAt = r.OpenedAt: "close t, open t+1" is one durable
// event. Round numbers only grow: a number not above the current round fails
// with ErrStale. One transaction.
func (s *AggStore) OpenRound(r Round, global []float64) error {
	if r.Number == 0 {
		return fmt.Errorf("%w: round 0", storage.ErrInvalid)
	}
	if global != nil {
		if err := storage.CheckVec("checkpoint", global); err != nil {
			return err
		}
	}
	err := s.db.Update(func(tx *storage.Tx) error {
		cur, ok, err := readCurrentRound(tx)
		if err != nil {
			return err
		}
		rs, err := storage.NeedBucket(tx, bucketRounds)
		if err != nil {
			return err
		}
		if ok {
			if r.Number <= cur {
				return fmt.Errorf("%w: round %d, current round is %d", storage.ErrStale, r.Number, cur)
			}
			cb, err := currentRoundBucket(tx, cur)
			if err != nil {
				return err
			}
			prev, err := readRound(cb, cur)
			if err != nil {
				return err
			}
			if prev.Status == RoundOpen {
				prev.Status, prev.ClosedAt = RoundClosed, r.OpenedAt
				if err := writeRoundMeta(cb, prev); err != nil {
					return err
				}
			}
		}
		rb, err := rs.CreateBucket(storage.EncodeU64(r.Number))
		if err != nil {
			return fmt.Errorf("%w: round %d: %w", storage.ErrExists, r.Number, err)
		}
		r.Status, r.ClosedAt = RoundOpen, time.Time{}
		if err := writeRoundMeta(rb, r); err != nil {
			return err
		}
		if err := putBytes(rb, keyRoundConfig, r.Config); err != nil {
			return err
		}
		if err := putBytes(rb, keyRoundState, r.State); err != nil {
			return err
		}
		if err := putBytes(rb, keyRoundSum, r.Sum); err != nil {
			return err
		}
		if err := putBytes(rb, keyRoundSplit, r.Split); err != nil {
			return err
		}
		if err := putBytes(rb, keyRoundOpt, r.Opt); err != nil {
			return err
		}
		if err := putBytes(rb, keyRoundControl, r.Control); err != nil {
			return err
		}
		if len(r.State) > 0 {
			if err := clearLog(tx); err != nil {
				return err
			}
		}
		agg := tx.Bucket(bucketAgg) // present: readCurrentRound checked
		if err := storage.SPut(agg, keyCurrentRound, storage.EncodeU64(r.Number)); err != nil {
			return err
		}
		if global != nil {
			cp, err := storage.NeedBucket(tx, bucketCheckpoints)
			if err != nil {
				return err
			}
			return storage.SPut(cp, storage.EncodeU64(r.Number), storage.EncodeFloats(global))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("storage: open round %d: %w", r.Number, err)
	}
	return nil
}

// PutRoundState replaces the aggregator's state bytes of an existing round
// and clears the replay log (log.go): the state reflects every message
// logged before it. One transaction.
func (s *AggStore) PutRoundState(n uint64, state []byte) error {
	err := s.db.Update(func(tx *storage.Tx) error {
		rb, err := roundBucket(tx, n)
		if err != nil {
			return err
		}
		if err := putBytes(rb, keyRoundState, state); err != nil {
			return err
		}
		return clearLog(tx)
	})
	if err != nil {
		return fmt.Errorf("storage: put state of round %d: %w", n, err)
	}
	return nil
}

// CloseRound marks round n closed at closedAt with its final state (nil
// keeps the stored state; a state clears the replay log, log.go). Closing a
// closed round is a no-op that keeps the first ClosedAt. One transaction.
func (s *AggStore) CloseRound(n uint64, closedAt time.Time, state []byte) error {
	err := s.db.Update(func(tx *storage.Tx) error {
		rb, err := roundBucket(tx, n)
		if err != nil {
			return err
		}
		r, err := readRound(rb, n)
		if err != nil {
			return err
		}
		if r.Status == RoundClosed {
			return nil
		}
		r.Status, r.ClosedAt = RoundClosed, closedAt
		if err := writeRoundMeta(rb, r); err != nil {
			return err
		}
		if state != nil {
			if err := putBytes(rb, keyRoundState, state); err != nil {
				return err
			}
			return clearLog(tx)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("storage: close round %d: %w", n, err)
	}
	return nil
}

// Round returns round n, or ErrNotFound. A read transaction.
func (s *AggStore) Round(n uint64) (Round, error) {
	var r Round
	err := s.db.View(inRound(n, func(rb *storage.Bucket) (err error) {
		r, err = readRound(rb, n)
		return err
	}))
	return r, err
}

// CurrentRound returns the round OpenRound last started (open, or closed by
// CloseRound), or ErrNotFound before the first. After a restart this is the
// round to resume. A read transaction.
func (s *AggStore) CurrentRound() (Round, error) {
	var r Round
	err := s.db.View(func(tx *storage.Tx) error {
		n, err := currentRound(tx)
		if err != nil {
			return err
		}
		rb, err := currentRoundBucket(tx, n)
		if err != nil {
			return err
		}
		r, err = readRound(rb, n)
		return err
	})
	return r, err
}

// ---- updates ----

// Update is one accepted client update.
type Update struct {
	Round       uint64
	ClientID    string
	StoredAt    time.Time
	SampleCount uint64  // n_k reported with the update (0 = unknown)
	Loss        float64 // the client's loss at the anchor; set NaN when unknown (0 is a loss)
	Msg         []byte  // the encoded wire update as received
}

func encodeUpdate(u Update) []byte {
	b := make([]byte, 0, updateHeader+len(u.Msg))
	b = binary.BigEndian.AppendUint64(b, uint64(unixNs(u.StoredAt)))
	b = binary.BigEndian.AppendUint64(b, u.SampleCount)
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(u.Loss))
	return append(b, u.Msg...)
}

func decodeUpdate(round uint64, client, v []byte) (Update, error) {
	if len(v) <= updateHeader {
		return Update{}, fmt.Errorf("%w: update (%d, %q) is %d bytes, want more than %d",
			storage.ErrCorrupt, round, client, len(v), updateHeader)
	}
	return Update{
		Round:       round,
		ClientID:    string(client),
		StoredAt:    fromUnixNs(int64(binary.BigEndian.Uint64(v))),
		SampleCount: binary.BigEndian.Uint64(v[8:]),
		Loss:        math.Float64frombits(binary.LittleEndian.Uint64(v[16:])),
		Msg:         bytes.Clone(v[updateHeader:]),
	}, nil
}

// PutUpdate stores an accepted update under its key (round, client) and, in
// the same transaction, the client's latest z (when z is non-nil, tagged
// with the update's round) and its registry entry (participation + 1, last
// seen, sample count, recent loss; created if absent). The round must exist.
//
// It is idempotent: if (round, client) is already stored it writes nothing
// and returns index 0 with a nil error; otherwise index is the update's
// entry in the replay log (log.go), appended in the same transaction. A z
// older than the client's stored z fails with ErrStale and writes nothing.
// One transaction, so when PutUpdate returns the update is durable and a
// receipt may be sent.
func (s *AggStore) PutUpdate(u Update, z []float64) (index uint64, err error) {
	if err := checkUpdate(u, z); err != nil {
		return 0, err
	}
	err = s.db.Update(func(tx *storage.Tx) error {
		index, err = putUpdate(tx, u, z)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("storage: put update (%d, %q): %w", u.Round, u.ClientID, err)
	}
	return index, nil
}

// PutUpdates is group commit: it stores updates (without z) in one
// transaction, each as PutUpdate stores one, so one fsync makes them all
// durable. The caller has already applied them in this order with the
// replay log indexes first, first+1, ... (first from NextLogIndex): the
// transaction checks that each gets exactly its index and that none is
// stored already, and otherwise writes nothing and fails (the caller's
// state then holds what the file does not: it must not go on). Nothing
// of the group is durable before PutUpdates returns nil.
func (s *AggStore) PutUpdates(first uint64, us []Update) error {
	return s.PutUpdatesZ(first, us, nil)
}

// PutUpdatesZ is PutUpdates for updates that carry a FedSplit z: zs[i]
// (zs nil, or zs[i] nil: none) is stored as us[i]'s client's latest z in
// the same transaction, as PutUpdate stores it (a z older than the
// client's stored one fails the whole group with ErrStale).
func (s *AggStore) PutUpdatesZ(first uint64, us []Update, zs [][]float64) error {
	if zs != nil && len(zs) != len(us) {
		return fmt.Errorf("storage: put %d updates: %w: %d z", len(us), storage.ErrInvalid, len(zs))
	}
	zOf := func(i int) []float64 {
		if zs == nil {
			return nil
		}
		return zs[i]
	}
	for i, u := range us {
		if err := checkUpdate(u, zOf(i)); err != nil {
			return fmt.Errorf("storage: put update (%d, %q): %w", u.Round, u.ClientID, err)
		}
	}
	err := s.db.Update(func(tx *storage.Tx) error {
		for i, u := range us {
			index, err := putUpdate(tx, u, zOf(i))
			if err != nil {
				return fmt.Errorf("update (%d, %q): %w", u.Round, u.ClientID, err)
			}
			if want := first + uint64(i); index != want {
				return fmt.Errorf("%w: update (%d, %q) got replay log index %d, want %d (0: stored already)",
					ErrGroupMoved, u.Round, u.ClientID, index, want)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("storage: put %d updates: %w", len(us), err)
	}
	return nil
}

// ErrGroupMoved: a group commit (PutUpdates) found the file not as its
// caller expected it (an update stored already, or the replay log moved).
var ErrGroupMoved = errors.New("the replay log is not where the group expected it")

// NextLogIndex is the replay log index the next stored message will get.
func (s *AggStore) NextLogIndex() (next uint64, err error) {
	err = s.db.View(func(tx *storage.Tx) error {
		last, err := lastLogIndex(tx)
		next = last + 1
		return err
	})
	return next, err
}

// checkUpdate is PutUpdate's check of its arguments, before any write.
func checkUpdate(u Update, z []float64) error {
	if u.Round == 0 {
		return fmt.Errorf("%w: round 0", storage.ErrInvalid)
	}
	if err := storage.CheckName("client id", u.ClientID); err != nil {
		return err
	}
	if len(u.Msg) == 0 {
		return fmt.Errorf("%w: empty update message", storage.ErrInvalid)
	}
	if z != nil {
		if err := storage.CheckVec("z", z); err != nil {
			return err
		}
	}
	return nil
}

// putUpdate is PutUpdate's transaction: index 0 when (round, client) is
// stored already (nothing written).
func putUpdate(tx *storage.Tx, u Update, z []float64) (index uint64, err error) {
	if _, err := roundBucket(tx, u.Round); err != nil {
		return 0, err
	}
	ups, err := storage.NeedBucket(tx, bucketUpdates)
	if err != nil {
		return 0, err
	}
	rk := storage.EncodeU64(u.Round)
	ub := ups.Bucket(rk)
	if ub != nil && ub.Get([]byte(u.ClientID)) != nil {
		return 0, nil // duplicate: index stays 0
	}
	if z != nil {
		if err := putLatestZ(tx, u.ClientID, u.Round, z); err != nil {
			return 0, err
		}
	}
	if ub == nil {
		if ub, err = ups.CreateBucket(rk); err != nil {
			return 0, fmt.Errorf("updates of round %d: %w", u.Round, err)
		}
	}
	if err := storage.SPut(ub, []byte(u.ClientID), encodeUpdate(u)); err != nil {
		return 0, err
	}
	cb, err := storage.NeedBucket(tx, bucketClients)
	if err != nil {
		return 0, err
	}
	c, _, err := getClient(cb, u.ClientID)
	if err != nil {
		return 0, err
	}
	c.Participation++
	if u.StoredAt.After(c.LastSeen) {
		c.LastSeen = u.StoredAt
	}
	if u.SampleCount > 0 {
		c.SampleCount = u.SampleCount
		if c.FirstSampleCount == 0 {
			c.FirstSampleCount = u.SampleCount
		}
	}
	if !math.IsNaN(u.Loss) && !math.IsInf(u.Loss, 0) {
		c.RecentLoss = u.Loss
	}
	if err := putClient(cb, c); err != nil {
		return 0, err
	}
	return appendLog(tx, LogUpdate, u.Round, u.ClientID)
}

// GetUpdate returns the stored update (round, client), or ErrNotFound. A
// read transaction.
func (s *AggStore) GetUpdate(round uint64, client string) (Update, error) {
	var u Update
	err := s.db.View(storage.InBucket(bucketUpdates, func(ups *storage.Bucket) (err error) {
		var v []byte
		if ub := ups.Bucket(storage.EncodeU64(round)); ub != nil {
			if v, err = storage.SGet(ub, []byte(client), fmt.Sprintf("update (%d, %q)", round, client)); err != nil {
				return err
			}
		}
		if v == nil {
			return fmt.Errorf("%w: update (%d, %q)", storage.ErrNotFound, round, client)
		}
		u, err = decodeUpdate(round, []byte(client), v)
		return err
	}))
	return u, err
}

// ForEachUpdate calls fn for every stored update of round, in client-id
// order, inside one read transaction; an error from fn stops the iteration
// and is returned as is. fn gets copies it may keep, and must not call the
// store's write methods (a write waiting on this read transaction can
// deadlock when the file has to grow).
func (s *AggStore) ForEachUpdate(round uint64, fn func(Update) error) error {
	return s.forEachUpdate(round, true, fn)
}

// ForEachUpdateMeta is ForEachUpdate without the messages (Msg is nil):
// the sample counts and losses of a round's updates, read without copying
// K encoded vectors (a streamed close takes its weights from them before
// it decodes the updates one at a time).
func (s *AggStore) ForEachUpdateMeta(round uint64, fn func(Update) error) error {
	return s.forEachUpdate(round, false, fn)
}

func (s *AggStore) forEachUpdate(round uint64, msg bool, fn func(Update) error) error {
	return s.db.View(storage.InBucket(bucketUpdates, func(ups *storage.Bucket) error {
		ub := ups.Bucket(storage.EncodeU64(round))
		if ub == nil {
			return nil
		}
		return storage.SForEachReleasing(ub, fmt.Sprintf("updates/%d", round), func(k, v []byte) error {
			if !msg && len(v) > updateHeader {
				v = v[:updateHeader+1] // the header, and one byte so that it decodes
			}
			u, err := decodeUpdate(round, k, v)
			if err != nil {
				return err
			}
			if !msg {
				u.Msg = nil
			}
			return fn(u)
		})
	}))
}

// Updates returns every stored update of round in client-id order.
func (s *AggStore) Updates(round uint64) ([]Update, error) {
	var us []Update
	err := s.ForEachUpdate(round, func(u Update) error {
		us = append(us, u)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("storage: updates of round %d: %w", round, err)
	}
	return us, nil
}

// PruneUpdates deletes the stored updates of every round below before and
// returns how many rounds it pruned. Round records, checkpoints and latest
// z are kept, and so are the updates of a round the replay log names (the
// coordinator's state is rebuilt from them: log.go). One transaction;
// Compact afterwards to return the space to the file system.
func (s *AggStore) PruneUpdates(before uint64) (int, error) {
	n := 0
	err := s.db.Update(func(tx *storage.Tx) error {
		ups, err := storage.NeedBucket(tx, bucketUpdates)
		if err != nil {
			return err
		}
		logged, err := logRounds(tx)
		if err != nil {
			return err
		}
		var doomed [][]byte
		c := ups.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			r, err := storage.DecodeU64(k, "updates key")
			if err != nil {
				return err
			}
			if r >= before {
				break
			}
			if !logged[r] {
				doomed = append(doomed, bytes.Clone(k))
			}
		}
		for _, k := range doomed {
			if err := ups.DeleteBucket(k); err != nil {
				return err
			}
		}
		n = len(doomed)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("storage: prune updates before %d: %w", before, err)
	}
	return n, nil
}

// ---- latest z ----

func putLatestZ(tx *storage.Tx, client string, round uint64, z []float64) error {
	b, err := storage.NeedBucket(tx, bucketLatestZ)
	if err != nil {
		return err
	}
	old, err := storage.SGet(b, []byte(client), "latest_z/"+client)
	if err != nil {
		return err
	}
	if old != nil {
		r, err := storage.RoundOf(old, "latest_z/"+client)
		if err != nil {
			return err
		}
		if round < r {
			return fmt.Errorf("%w: z of %q for round %d, have round %d", storage.ErrStale, client, round, r)
		}
	}
	return storage.SPut(b, []byte(client), storage.EncodeRoundVec(round, z))
}

// PutLatestZ stores client's latest FedSplit z for round; a z older than the
// stored one fails with ErrStale. One transaction.
func (s *AggStore) PutLatestZ(client string, round uint64, z []float64) error {
	if err := storage.CheckName("client id", client); err != nil {
		return err
	}
	if err := storage.CheckVec("z", z); err != nil {
		return err
	}
	if err := s.db.Update(func(tx *storage.Tx) error { return putLatestZ(tx, client, round, z) }); err != nil {
		return fmt.Errorf("storage: put latest z of %q: %w", client, err)
	}
	return nil
}

// ClientZ returns client's latest z and its round, or ErrNotFound. A read
// transaction.
func (s *AggStore) ClientZ(client string) (round uint64, z []float64, err error) {
	err = s.db.View(storage.InBucket(bucketLatestZ, func(b *storage.Bucket) error {
		v, err := storage.SGet(b, []byte(client), "latest_z/"+client)
		if err != nil {
			return err
		}
		if v == nil {
			return fmt.Errorf("%w: z of %q", storage.ErrNotFound, client)
		}
		round, z, err = storage.DecodeRoundVec(v, "latest_z/"+client)
		return err
	}))
	return round, z, err
}

// ClientZRound returns the round of client's latest z without reading the
// vector, or ErrNotFound. A read transaction.
func (s *AggStore) ClientZRound(client string) (round uint64, err error) {
	err = s.db.View(storage.InBucket(bucketLatestZ, func(b *storage.Bucket) error {
		v, err := storage.SGet(b, []byte(client), "latest_z/"+client)
		if err != nil {
			return err
		}
		if v == nil {
			return fmt.Errorf("%w: z of %q", storage.ErrNotFound, client)
		}
		round, err = storage.RoundOf(v, "latest_z/"+client)
		return err
	}))
	return round, err
}

// LatestZ returns every client's latest z. A read transaction.
func (s *AggStore) LatestZ() (map[string][]float64, error) {
	zs := make(map[string][]float64)
	err := s.db.View(storage.InBucket(bucketLatestZ, func(b *storage.Bucket) error {
		return storage.SForEach(b, "latest_z", func(k, v []byte) error {
			_, z, err := storage.DecodeRoundVec(v, "latest_z/"+string(k))
			if err != nil {
				return err
			}
			zs[string(k)] = z
			return nil
		})
	}))
	if err != nil {
		return nil, fmt.Errorf("storage: latest z: %w", err)
	}
	return zs, nil
}

// ZRound is a client's latest z as LatestZRounds lists it: its round and
// its number of values, not the values.
type ZRound struct {
	Client string
	Round  uint64
	Len    int
}

// LatestZRounds lists every client's latest z in client-id order without
// decoding the vectors (ClientZ reads one): a server step that reads each
// z_j as it needs it holds one at a time. A read transaction.
func (s *AggStore) LatestZRounds() ([]ZRound, error) {
	var zs []ZRound
	err := s.db.View(storage.InBucket(bucketLatestZ, func(b *storage.Bucket) error {
		return storage.SForEach(b, "latest_z", func(k, v []byte) error {
			r, err := storage.RoundOf(v, "latest_z/"+string(k))
			if err != nil {
				return err
			}
			zs = append(zs, ZRound{Client: string(k), Round: r, Len: (len(v) - 8) / 8})
			return nil
		})
	}))
	if err != nil {
		return nil, fmt.Errorf("storage: latest z: %w", err)
	}
	return zs, nil
}

// ---- checkpoints ----

// PutCheckpoint stores the global model of round (overwriting). One
// transaction.
func (s *AggStore) PutCheckpoint(round uint64, vec []float64) error {
	if round == 0 {
		return fmt.Errorf("%w: round 0", storage.ErrInvalid)
	}
	if err := storage.CheckVec("checkpoint", vec); err != nil {
		return err
	}
	err := s.db.Update(storage.InBucket(bucketCheckpoints, func(b *storage.Bucket) error {
		return storage.SPut(b, storage.EncodeU64(round), storage.EncodeFloats(vec))
	}))
	if err != nil {
		return fmt.Errorf("storage: put checkpoint %d: %w", round, err)
	}
	return nil
}

// Checkpoint returns the global model of round, or ErrNotFound. A read
// transaction.
func (s *AggStore) Checkpoint(round uint64) ([]float64, error) {
	var v []float64
	err := s.db.View(storage.InBucket(bucketCheckpoints, func(b *storage.Bucket) error {
		raw, err := storage.SGet(b, storage.EncodeU64(round), fmt.Sprintf("checkpoint %d", round))
		if err != nil {
			return err
		}
		if raw == nil {
			return fmt.Errorf("%w: checkpoint of round %d", storage.ErrNotFound, round)
		}
		v, err = storage.DecodeFloats(raw, fmt.Sprintf("checkpoint %d", round))
		return err
	}))
	return v, err
}

// LatestCheckpoint returns the checkpoint with the highest round, or
// ErrNotFound. A read transaction.
func (s *AggStore) LatestCheckpoint() (round uint64, vec []float64, err error) {
	err = s.db.View(func(tx *storage.Tx) error {
		if err := storage.CheckCensus(tx, string(bucketCheckpoints), false); err != nil {
			return err // a lost last entry would make an older checkpoint the latest
		}
		return storage.InBucket(bucketCheckpoints, func(b *storage.Bucket) error {
			k, sealed := b.Cursor().Last()
			if k == nil {
				return fmt.Errorf("%w: no checkpoint", storage.ErrNotFound)
			}
			if round, err = storage.DecodeU64(k, "checkpoint key"); err != nil {
				return err
			}
			raw, err := storage.Unseal(k, sealed, fmt.Sprintf("checkpoint %d", round))
			if err != nil {
				return err
			}
			vec, err = storage.DecodeFloats(raw, fmt.Sprintf("checkpoint %d", round))
			return err
		})(tx)
	})
	return round, vec, err
}

// ReleaseMapped gives back the pages of the file's map this process has
// read (storage.DB.ReleaseMapped): the aggregator reads a whole round's
// updates back at every close.
func (s *AggStore) ReleaseMapped() error { return storage.ReleaseMapped(s.db) }

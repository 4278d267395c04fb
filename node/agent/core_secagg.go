package agent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/secagg"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// The site's side of secure aggregation (docs/privacy.md, "Round flow") as
// steps of the site core: pure, over the read-only StoreView, each
// returning a plan whose records the shell commits before it publishes the
// plan's message. A round whose announcement carries a SecAggSpec is solved
// as any other, but the update is never sent: its quantised input
// (uplink.SecAggInput) and a new secagg.Client are committed with the
// AdvertiseKeys message as the round's outbox entry (recCommit: one
// transaction with the applied round). Each later phase's message is
// computed from the stored record and committed, record and outbox entry
// together (recSecAgg), before it is published. After a restart or a
// reconnection the outbox entry is re-sent as an update's is; a phase asked
// again gets the stored answer byte for byte (the secagg.Client replays
// it), so a site never sends two different masked inputs. A newer attempt
// of the round (the aggregator aborted the session) starts a new client
// over the same stored input; a newer round or run replaces the record.
// The randomness (keys, shares, stochastic rounding, signatures, the
// distributed-DP noise key) and the signing identity are the shell's
// (secAggConfig), handed in as the time is.

// secAggRecord is what the edge file holds of the site's session: a secret
// (its private keys and self-mask seed), kept in the state file (mode
// 0600).
type secAggRecord struct {
	run     string
	round   uint64
	attempt uint32
	input   []uint32 // the quantised update, the secure sum's input
	client  []byte   // secagg.Client.MarshalBinary
	// signed: the site committed to survivors (uplink.SecAggSurvivorsDigest)
	// in the session's consistency round, the first set it was shown: it
	// signed it (or, below the threshold, refused it), and accepts no other
	// set in the session.
	signed    bool
	survivors [32]byte
}

// secAggRecordVersion is the record's encoding; version 2 (a signed
// survivor set's digest after the input) is written only once a site has
// signed one, so every other record is the version 1 it was.
const (
	secAggRecordVersion       = 1
	secAggRecordVersionSigned = 2
)

func (r *secAggRecord) marshal() []byte {
	b := []byte{secAggRecordVersion}
	if r.signed {
		b[0] = secAggRecordVersionSigned
	}
	b = binary.AppendUvarint(b, uint64(len(r.run)))
	b = append(b, r.run...)
	b = binary.BigEndian.AppendUint64(b, r.round)
	b = binary.BigEndian.AppendUint32(b, r.attempt)
	b = binary.AppendUvarint(b, uint64(len(r.input)))
	for _, v := range r.input {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	if r.signed {
		b = append(b, r.survivors[:]...)
	}
	return append(b, r.client...)
}

// errBadRecord: the stored record does not decode (the file's seals make
// this a bug or a version mismatch, not a flipped bit).
var errBadRecord = fmt.Errorf("%w: the secure-aggregation record does not decode", storage.ErrCorrupt)

func unmarshalSecAggRecord(b []byte) (*secAggRecord, error) {
	if len(b) < 1 || (b[0] != secAggRecordVersion && b[0] != secAggRecordVersionSigned) {
		return nil, errBadRecord
	}
	signed := b[0] == secAggRecordVersionSigned
	b = b[1:]
	n, k := canonUvarint(b)
	if k <= 0 || n > uint64(len(b)-k) || n > 256 {
		return nil, errBadRecord
	}
	r := &secAggRecord{run: string(b[k : k+int(n)])}
	b = b[k+int(n):]
	if len(b) < 12 {
		return nil, errBadRecord
	}
	r.round, r.attempt = binary.BigEndian.Uint64(b), binary.BigEndian.Uint32(b[8:])
	b = b[12:]
	n, k = canonUvarint(b)
	if k <= 0 || n > secagg.MaxDim || n*4 > uint64(len(b)-k) {
		return nil, errBadRecord
	}
	b = b[k:]
	r.input = make([]uint32, n)
	for i := range r.input {
		r.input[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	b = b[4*n:]
	if signed {
		if len(b) < 32 {
			return nil, errBadRecord
		}
		r.signed = true
		copy(r.survivors[:], b)
		b = b[32:]
	}
	r.client = bytes.Clone(b)
	if len(r.client) == 0 {
		return nil, errBadRecord
	}
	return r, nil
}

// canonUvarint is binary.Uvarint refusing (k = 0) an overlong encoding,
// so a record has one encoding: what decodes encodes back to its bytes.
func canonUvarint(b []byte) (uint64, int) {
	v, k := binary.Uvarint(b)
	if k > 0 && k != len(binary.AppendUvarint(nil, v)) {
		return 0, 0
	}
	return v, k
}

// recordRound is the round of the site's sum-mode record c_j (0: none,
// the site joins).
func recordRound(v StoreView) (uint64, error) {
	r, _, err := v.Contribution()
	if errors.Is(err, storage.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, diskErrAt(v, err)
	}
	return r, nil
}

// secAggMessage is the wire envelope of a site's secagg message m, sent at
// now. In sum mode an AdvertiseKeys names the round of the site's record
// its input is a delta against (0: a join) and the installation (the
// aggregator's uplink.SumState.Check).
func (sr *siteRules) secAggMessage(v StoreView, ann *wire.RoundAnnouncement, c *secagg.Client, m secagg.Message, now time.Time) ([]byte, error) {
	w := &wire.SecAggMessage{ClientId: sr.ClientID, RunId: ann.RunId, Round: ann.Round,
		Attempt: ann.Secagg.Attempt, Kind: uint32(m.Kind()), Payload: secagg.Encode(m), SentAtUnixMs: now.UnixMilli()}
	if m.Kind() == secagg.KindAdvertiseKeys && sumMode(ann) {
		// The round's first AdvertiseKeys (no pending contribution yet: it
		// is committed with it) or a delta's names its record's round.
		p, ok, err := v.Pending(ann.Round)
		switch {
		case err != nil:
			return nil, diskErrAt(v, err)
		case !ok || !p.Join:
			if w.BaseRound, err = recordRound(v); err != nil {
				return nil, err
			}
		}
		w.InstanceId = sr.InstanceID
	}
	id := sr.SecAgg.Identity
	if a, ok := m.(*secagg.AdvertiseKeys); ok && id != nil {
		sig, err := id.Sign(uplink.SecAggAdvertDigest(a.Session, a.Keys), sr.SecAgg.Entropy)
		if err != nil {
			return nil, wrap("secagg: signing the advertisement", err)
		}
		w.Certificate, w.Signature = id.Cert, sig
	}
	if _, ok := m.(*secagg.MaskedInput); ok && id != nil {
		// The consistency check: this site's view of the session, signed
		// with its masked input (uplink.SecAggViewDigest).
		view, ok := secAggView(ann, c)
		if !ok {
			return nil, errors.New("secagg: a masked input without a view of the session")
		}
		sig, err := id.Sign(view, sr.SecAgg.Entropy)
		if err != nil {
			return nil, wrap("secagg: signing the view", err)
		}
		w.ViewSignature = sig
	}
	return wire.Encode(w)
}

// newSecAggClient makes the site's client of the announcement's session.
func (sr *siteRules) newSecAggClient(ann *wire.RoundAnnouncement, dim int) (*secagg.Client, error) {
	cfg, _, err := uplink.SecAggSetup(ann.Secagg, dim)
	if err != nil {
		return nil, bad(ann.Round, "secagg: %v", err)
	}
	return secagg.NewClient(cfg, uplink.SecAggSession(ann.RunId, ann.Round, ann.Secagg.Attempt), sr.ClientID, sr.SecAgg.Rand(ann.Round))
}

// secAggSolved is the step of a solved round under secure aggregation: the
// quantised update and the new session's client committed with its
// AdvertiseKeys, the round applied (recCommit), before it is sent. Under
// distributed DP the site's noise key is read, or drawn and committed
// first (recNoiseKey).
func (sr *siteRules) secAggSolved(v StoreView, ann *wire.RoundAnnouncement, p *prepared, o solveOutcome, now time.Time, res Result) *plan {
	r := ann.Round
	res.Report = o.rep
	fail := func(err error) *plan { return &plan{res: res, err: err} }
	_, q, err := uplink.SecAggSetup(ann.Secagg, len(p.x))
	if err != nil {
		return fail(bad(r, "secagg: %v", err))
	}
	var recs []change
	var key [32]byte
	if ann.GetDp() != nil {
		var rec *change
		if key, rec, err = sr.noiseKey(v, r); err != nil {
			return fail(err)
		}
		if rec != nil {
			recs = append(recs, *rec)
		}
	}
	var input []uint32
	var pending *edgestore.SumPending
	if p.sum {
		input, pending, err = sr.secAggSumInput(v, ann, q, o.sent, p.x, key)
	} else {
		input, err = sr.secAggInput(ann, q, o.sent, p.x, key)
	}
	if err != nil {
		return fail(err)
	}
	c, err := sr.newSecAggClient(ann, len(p.x))
	if err != nil {
		return fail(err)
	}
	rec, msg, err := sr.secAggState(v, ann, input, c, c.Advertise(), now)
	if err != nil {
		return fail(err)
	}
	commit := edgestore.Commit{Round: r, Msg: msg, SecAgg: rec}
	if p.sum {
		commit.Z, commit.Pending = o.sent, pending
	}
	pl := &plan{records: append(recs, change{kind: recCommit, round: r, commit: commit}), res: res, base: res}
	pl.res.Action, pl.res.Msg, pl.res.SecAggKind, pl.res.Healthy = ActionSecAgg, msg, secagg.KindAdvertiseKeys, true
	return pl
}

// noiseKey is the site's distributed-DP noise key: the stored one, or one
// drawn from the shell's randomness with the record that stores it (the
// override of a test that compares a live run with simulate replaces
// either, as the stored key is still drawn).
func (sr *siteRules) noiseKey(v StoreView, r uint64) ([32]byte, *change, error) {
	key, err := v.NoiseKey()
	var rec *change
	switch {
	case errors.Is(err, storage.ErrNotFound):
		if n, err := sr.SecAgg.Entropy.Read(key[:]); err != nil || n != len(key) {
			return key, nil, roundErr(r, fmt.Errorf("secagg: drawing the noise key: %d bytes, %w", n, err))
		}
		rec = &change{kind: recNoiseKey, round: r, key: key}
	case err != nil:
		return key, nil, diskErrAt(v, roundErr(r, err))
	}
	if sr.SecAgg.NoiseKey != nil {
		key = *sr.SecAgg.NoiseKey
	}
	return key, rec, nil
}

// secAggState encodes the record of (ann's session, input, c) and the
// envelope of c's message m.
func (sr *siteRules) secAggState(v StoreView, ann *wire.RoundAnnouncement, input []uint32, c *secagg.Client, m secagg.Message, now time.Time) (rec, msg []byte, err error) {
	cs, err := c.MarshalBinary()
	if err != nil {
		return nil, nil, fmt.Errorf("agent: round %d: secagg state: %w", ann.Round, err)
	}
	rec = (&secAggRecord{run: ann.RunId, round: ann.Round, attempt: ann.Secagg.Attempt, input: input, client: cs}).marshal()
	if msg, err = sr.secAggMessage(v, ann, c, m, now); err != nil {
		return nil, nil, fmt.Errorf("agent: round %d: encode the secagg message: %w", ann.Round, err)
	}
	return rec, msg, nil
}

// readSecAggRecord reads the stored record (nil when there is none).
func readSecAggRecord(v StoreView) (*secAggRecord, error) {
	b, err := v.SecAgg()
	if errors.Is(err, storage.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, diskErrAt(v, err)
	}
	return unmarshalSecAggRecord(b)
}

// secAggPhase is the step of an announcement of a round this site has
// applied under secure aggregation: the phase's message from the stored
// session, a new session over the stored input for a newer attempt, or
// the stored message again.
func (sr *siteRules) secAggPhase(v StoreView, ann *wire.RoundAnnouncement, now time.Time, res Result) *plan {
	r := ann.Round
	rec, err := readSecAggRecord(v)
	if err != nil {
		return &plan{res: res, err: err}
	}
	if rec == nil || rec.round != r || rec.run != ann.RunId {
		// Applied without secure aggregation, or the record is another
		// round's: nothing of this session here.
		return sr.resendPlan(v, res)
	}
	att := ann.Secagg.Attempt
	switch {
	case att < rec.attempt:
		res.Action = ActionStale
		return &plan{res: res}
	case att > rec.attempt:
		if ann.SecaggPhase != wire.SecAggPhase_SECAGG_PHASE_ADVERTISE {
			// Not selected for the new session's advertise phase (or
			// it went on without this site): nothing to send.
			res.Action = ActionDone
			return &plan{res: res}
		}
		c, err := sr.newSecAggClient(ann, len(rec.input))
		if err != nil {
			return &plan{res: res, err: err}
		}
		sr.log().Info("secure aggregation: a new session of the round (the previous one aborted); advertising new keys over the same update", "round", r, "attempt", att)
		return sr.secAggSend(v, ann, rec.input, c, c.Advertise(), now, res)
	}
	c, err := secagg.UnmarshalClient(rec.client)
	if err != nil {
		return &plan{res: res, err: diskErrAt(v, fmt.Errorf("%w: agent: round %d: the secagg client state: %w", storage.ErrCorrupt, r, err))}
	}
	switch ann.SecaggPhase {
	case wire.SecAggPhase_SECAGG_PHASE_SHARE_KEYS:
		if c.Phase() == secagg.ClientAdvertised {
			return sr.shareKeys(v, ann, rec, c, now, res)
		} // answered: its ShareKeys is re-sent while unreceipted
	case wire.SecAggPhase_SECAGG_PHASE_MASKED:
		// The ShareList comes on the receipts topic. A site that missed it
		// asks again by re-sending its ShareKeys, which stays in the
		// outbox until the ShareList arrives (node/agent/session.go
		// secAggReceipt): on its next connection, not on every copy of
		// this announcement.
		res.Action = ActionDone
		return &plan{res: res}
	case wire.SecAggPhase_SECAGG_PHASE_CONSISTENCY:
		if c.Phase() == secagg.ClientMasked && sr.SecAgg.Identity != nil {
			return sr.secAggConsistency(v, ann, rec, c, now, res)
		}
		res.Action = ActionDone // password-only: nothing to sign
		return &plan{res: res}
	case wire.SecAggPhase_SECAGG_PHASE_UNMASK:
		if c.Phase() == secagg.ClientMasked {
			return sr.unmask(v, ann, rec, c, now, res)
		}
	}
	return sr.resendPlan(v, res)
}

// resendPlan is the plan of the re-send of an applied round's outbox entry.
func (sr *siteRules) resendPlan(v StoreView, res Result) *plan {
	res, err := sr.resend(v, res)
	return &plan{res: res, err: err}
}

// shareKeys answers the session's KeyList (the share-keys phase), checked
// first (signed secure aggregation: checkSignedKeys).
func (sr *siteRules) shareKeys(v StoreView, ann *wire.RoundAnnouncement, rec *secAggRecord, c *secagg.Client, now time.Time, res Result) *plan {
	kl, err := decodeBroadcast[*secagg.KeyList](ann)
	if err != nil {
		return &plan{res: res, err: err}
	}
	if !inKeyList(kl, sr.ClientID) {
		res.Action = ActionDone // not in U1: the session goes on without this site
		return &plan{res: res}
	}
	if err := sr.checkSignedKeys(ann, kl, now); err != nil {
		return &plan{res: res, err: err}
	}
	m, err := c.ShareKeys(kl, sr.SecAgg.Rand(ann.Round))
	if err != nil {
		return &plan{res: res, err: fmt.Errorf("agent: round %d: secagg share keys: %w", ann.Round, err)}
	}
	return sr.secAggSend(v, ann, rec.input, c, m, now, res)
}

// unmask answers the UnmaskRequest (the unmask phase) of a site in the
// sum, the views and the survivor set checked first (signed secure
// aggregation: checkViews, checkSurvivors).
func (sr *siteRules) unmask(v StoreView, ann *wire.RoundAnnouncement, rec *secAggRecord, c *secagg.Client, now time.Time, res Result) *plan {
	req, err := decodeBroadcast[*secagg.UnmaskRequest](ann)
	if err != nil {
		return &plan{res: res, err: err}
	}
	if !slicesContains(req.Survivors, sr.ClientID) {
		res.Action = ActionDone // its masked input is not in the sum
		return &plan{res: res}
	}
	if err := sr.checkViews(ann, c, req, now); err != nil {
		return &plan{res: res, err: err}
	}
	if err := sr.checkSurvivors(ann, rec, c, req, now); err != nil {
		return &plan{res: res, err: err}
	}
	m, err := c.Unmask(req)
	if err != nil {
		return &plan{res: res, err: fmt.Errorf("agent: round %d: secagg unmask: %w", ann.Round, err)}
	}
	return sr.secAggSend(v, ann, rec.input, c, m, now, res)
}

// shareList is the step of the aggregator's ShareList (the masked phase):
// the masked input, committed before it is returned for publishing. A
// ShareList of another session, or one the site has answered, changes
// nothing (the stored answer is re-sent).
func (sr *siteRules) shareList(v StoreView, m *wire.SecAggMessage, now time.Time) *plan {
	res := Result{Round: m.Round}
	fail := func(err error) *plan { return &plan{res: res, err: err} }
	rec, err := readSecAggRecord(v)
	if err != nil {
		return fail(err)
	}
	if rec == nil || rec.round != m.Round || rec.attempt != m.Attempt || rec.run != m.RunId {
		res.Action = ActionStale
		return &plan{res: res}
	}
	c, err := secagg.UnmarshalClient(rec.client)
	if err != nil {
		return fail(diskErrAt(v, fmt.Errorf("%w: agent: round %d: the secagg client state: %w", storage.ErrCorrupt, m.Round, err)))
	}
	if c.Phase() != secagg.ClientShared {
		// Answered already (a second copy of the ShareList: the answer to
		// a re-sent ShareKeys): the masked input in the outbox is re-sent
		// as any unreceipted message is, never computed again.
		res.Action = ActionDone
		return &plan{res: res}
	}
	p, err := secagg.Decode(m.Payload)
	if err != nil {
		return fail(fmt.Errorf("%w: round %d: share list: %w", ErrBadAnnouncement, m.Round, err))
	}
	sl, ok := p.(*secagg.ShareList)
	if !ok || !bytes.Equal(sl.Session, uplink.SecAggSession(m.RunId, m.Round, m.Attempt)) {
		return fail(fmt.Errorf("%w: round %d: a share list of another session or kind", ErrBadAnnouncement, m.Round))
	}
	masked, err := c.MaskInput(sl, rec.input)
	if err != nil {
		return fail(fmt.Errorf("agent: round %d: secagg masked input: %w", m.Round, err))
	}
	ann := &wire.RoundAnnouncement{RunId: m.RunId, Round: m.Round, Secagg: &wire.SecAggSpec{Attempt: m.Attempt}}
	return sr.secAggSend(v, ann, rec.input, c, masked, now, res)
}

// secAggSend is the plan of the session's new state with its message m as
// the round's outbox entry (recSecAgg), m published once it is committed.
func (sr *siteRules) secAggSend(v StoreView, ann *wire.RoundAnnouncement, input []uint32, c *secagg.Client, m secagg.Message, now time.Time, res Result) *plan {
	rec, msg, err := sr.secAggState(v, ann, input, c, m, now)
	if err != nil {
		return &plan{res: res, err: err}
	}
	pl := &plan{records: []change{{kind: recSecAgg, round: ann.Round, commit: edgestore.Commit{SecAgg: rec, Msg: msg}}}, res: res, base: res}
	pl.res.Action, pl.res.Msg, pl.res.SecAggKind, pl.res.Healthy = ActionSecAgg, msg, m.Kind(), true
	return pl
}

func decodeBroadcast[T secagg.Message](ann *wire.RoundAnnouncement) (T, error) {
	var zero T
	m, err := secagg.Decode(ann.SecaggBroadcast)
	if err != nil {
		return zero, bad(ann.Round, "secagg broadcast: %v", err)
	}
	t, ok := m.(T)
	if !ok || !bytes.Equal(m.SessionID(), uplink.SecAggSession(ann.RunId, ann.Round, ann.Secagg.Attempt)) {
		return zero, bad(ann.Round, "secagg broadcast: a %v of another session or phase", m.Kind())
	}
	return t, nil
}

// checkSignedKeys is signed secure aggregation's check of a KeyList,
// before any share leaves this site: with a signing identity, every key
// must carry a valid signature by its site's certificate of the
// federation CA (uplink.CheckKeyList), valid at now. A key list that fails
// is refused as a site error (reason secagg_refused, carried by the site's
// status to the aggregator's operator): this site shares nothing in the
// session.
func (sr *siteRules) checkSignedKeys(ann *wire.RoundAnnouncement, kl *secagg.KeyList, now time.Time) error {
	id := sr.SecAgg.Identity
	if id == nil {
		return nil
	}
	refuse := func(err error) error {
		return &sitedata.SiteError{Reason: sitedata.ReasonSecAgg, Problem: fmt.Sprintf("round %d session %d: key list refused: %v", ann.Round, ann.Secagg.Attempt, err), Err: err}
	}
	var signed []uplink.SignedKey
	if len(ann.SecaggSignedKeys) > 0 {
		var err error
		if signed, err = uplink.DecodeSignedKeys(ann.SecaggSignedKeys); err != nil {
			return refuse(fmt.Errorf("%w: %w", uplink.ErrSecAggSignature, err))
		}
	}
	if err := uplink.CheckKeyList(id.Roots, now, kl, signed); err != nil {
		return refuse(err)
	}
	return nil
}

// secAggView is the digest of what this site saw of the session (c past
// its masked input): the KeyList and, with the complete graph, U2
// (secagg.Client.View, uplink.SecAggViewDigest).
func secAggView(ann *wire.RoundAnnouncement, c *secagg.Client) ([32]byte, bool) {
	kl, holders, ok := c.View()
	if !ok {
		return [32]byte{}, false
	}
	return uplink.SecAggViewDigest(uplink.SecAggSession(ann.RunId, ann.Round, ann.Secagg.Attempt), kl, holders), true
}

// checkViews is the consistency check before any share is revealed: with
// a signing identity, every survivor of req must have signed this site's
// own view of the session (uplink.CheckViews). A failure is a site error
// (secagg_refused): nothing is revealed.
func (sr *siteRules) checkViews(ann *wire.RoundAnnouncement, c *secagg.Client, req *secagg.UnmaskRequest, now time.Time) error {
	id := sr.SecAgg.Identity
	if id == nil {
		return nil
	}
	view, ok := secAggView(ann, c)
	if !ok {
		return refuseUnmask(ann, errors.New("no masked input sent in this session"))
	}
	var signed []uplink.SignedKey
	if len(ann.SecaggViewSignatures) > 0 {
		var err error
		if signed, err = uplink.DecodeSignedKeys(ann.SecaggViewSignatures); err != nil {
			return refuseUnmask(ann, fmt.Errorf("%w: %w", uplink.ErrSecAggView, err))
		}
	}
	if err := uplink.CheckViews(id.Roots, now, req.Survivors, view, signed); err != nil {
		return refuseUnmask(ann, err)
	}
	return nil
}

// secAggConsistency is the site's turn in the consistency round (signed
// secure aggregation, uplink.CheckSurvivors): it signs the survivor set U3
// with its view (the views themselves are checked at the unmask) and sends
// the signature (kind 9), recording in the same transaction that it
// signed this set: shown another set later in the session, it refuses (a
// site error secagg_refused) and reveals nothing.
func (sr *siteRules) secAggConsistency(v StoreView, ann *wire.RoundAnnouncement, rec *secAggRecord, c *secagg.Client, now time.Time, res Result) *plan {
	fail := func(err error) *plan { return &plan{res: res, err: err} }
	req, err := decodeBroadcast[*secagg.UnmaskRequest](ann)
	if err != nil {
		return fail(err)
	}
	if !slicesContains(req.Survivors, sr.ClientID) {
		res.Action = ActionDone // its masked input is not in the sum
		return &plan{res: res}
	}
	digest, err := survivorsDigest(ann, c, req)
	if err != nil {
		return fail(err)
	}
	if err := uplink.CheckSurvivorSet(rec.survivors, rec.signed, digest); err != nil {
		return fail(refuseUnmask(ann, err))
	}
	next := *rec
	next.signed, next.survivors = true, digest
	if len(req.Survivors) < c.Threshold() {
		tooFew := refuseUnmask(ann, fmt.Errorf("%w: %d survivors, threshold %d", uplink.ErrSecAggSurvivors, len(req.Survivors), c.Threshold()))
		if rec.signed {
			return fail(tooFew)
		}
		// A set no honest aggregator announces: the site commits to it
		// unsigned (a record without a message), so that it refuses every
		// other set of the session too, and reveals nothing in it.
		return &plan{records: []change{{kind: recSecAgg, round: ann.Round, commit: edgestore.Commit{SecAgg: next.marshal()}}}, res: res, base: res, err: tooFew}
	}
	if rec.signed {
		return sr.resendPlan(v, res) // signed already: the stored message is re-sent until receipted
	}
	sig, err := sr.SecAgg.Identity.Sign(digest, sr.SecAgg.Entropy)
	if err != nil {
		return fail(wrap("secagg: signing the survivor set", err))
	}
	msg, err := wire.Encode(&wire.SecAggMessage{ClientId: sr.ClientID, RunId: ann.RunId, Round: ann.Round, Attempt: ann.Secagg.Attempt,
		Kind: uplink.SecAggKindSurvivors, Payload: secagg.Encode(req), SentAtUnixMs: now.UnixMilli(), SurvivorsSignature: sig})
	if err != nil {
		return fail(fmt.Errorf("agent: round %d: encode the signed survivor set: %w", ann.Round, err))
	}
	pl := &plan{records: []change{{kind: recSecAgg, round: ann.Round, commit: edgestore.Commit{SecAgg: next.marshal(), Msg: msg}}}, res: res, base: res}
	pl.res.Action, pl.res.Msg, pl.res.SecAggKind, pl.res.Healthy = ActionSecAgg, msg, secagg.Kind(uplink.SecAggKindSurvivors), true
	return pl
}

// survivorsDigest is what this site signs of req's survivor set
// (uplink.SecAggSurvivorsDigest over its view).
func survivorsDigest(ann *wire.RoundAnnouncement, c *secagg.Client, req *secagg.UnmaskRequest) ([32]byte, error) {
	view, ok := secAggView(ann, c)
	if !ok {
		return view, refuseUnmask(ann, errors.New("no masked input sent in this session"))
	}
	return uplink.SecAggSurvivorsDigest(uplink.SecAggSession(ann.RunId, ann.Round, ann.Secagg.Attempt), view, req.Survivors), nil
}

// checkSurvivors is the consistency round's check before any share is
// revealed: with a signing identity, the survivor set must be the one this
// site signed (if it signed one), and at least the session's threshold of
// survivors must have signed it with this site's view, every relayed
// signature valid (uplink.CheckSurvivors). A failure is a site error
// (secagg_refused): nothing is revealed.
func (sr *siteRules) checkSurvivors(ann *wire.RoundAnnouncement, rec *secAggRecord, c *secagg.Client, req *secagg.UnmaskRequest, now time.Time) error {
	id := sr.SecAgg.Identity
	if id == nil {
		return nil
	}
	digest, err := survivorsDigest(ann, c, req)
	if err != nil {
		return err
	}
	if err := uplink.CheckSurvivorSet(rec.survivors, rec.signed, digest); err != nil {
		return refuseUnmask(ann, err)
	}
	var signed []uplink.SignedKey
	if len(ann.SecaggSurvivorSignatures) > 0 {
		if signed, err = uplink.DecodeSignedKeys(ann.SecaggSurvivorSignatures); err != nil {
			return refuseUnmask(ann, fmt.Errorf("%w: %w", uplink.ErrSecAggSurvivors, err))
		}
	}
	if err := uplink.CheckSurvivors(id.Roots, now, c.Threshold(), req.Survivors, digest, signed); err != nil {
		return refuseUnmask(ann, err)
	}
	return nil
}

// refuseUnmask is the site error of a session refused before the unmask.
func refuseUnmask(ann *wire.RoundAnnouncement, err error) error {
	return &sitedata.SiteError{Reason: sitedata.ReasonSecAgg, Problem: fmt.Sprintf("round %d session %d: unmask refused: %v", ann.Round, ann.Secagg.Attempt, err), Err: err}
}

func inKeyList(kl *secagg.KeyList, id string) bool {
	for _, k := range kl.Sites {
		if k.ID == id {
			return true
		}
	}
	return false
}

func slicesContains(v []string, s string) bool {
	for _, x := range v {
		if x == s {
			return true
		}
	}
	return false
}

// secAggKindOf is the secagg kind of an encoded SecAggMessage envelope (0
// for anything else): what a SECAGG receipt is matched against.
func secAggKindOf(msg []byte) uint32 {
	m, err := wire.DecodeSecAgg(msg, wire.Limits{})
	if err != nil {
		return 0
	}
	return m.Kind
}

// secAggRefusals is what a site refuses under secure aggregation, as the
// aggregator does (node/aggregator/server_secagg.go): the FedSplit family
// outside sum mode (the aggregator would need each z_j), anchor gradients
// (per site), and central DP.
func secAggRefusals(ann *wire.RoundAnnouncement, split bool) error {
	switch {
	case ann.Secagg == nil:
		return nil
	case split && !sumMode(ann):
		return uplink.ErrSecAggSplit
	case ann.AnchorSketch != nil:
		return errors.New("secure aggregation with an anchor gradient: refused (it is per site)")
	case ann.Dp != nil && ann.Dp.Mode != wire.DPMode_DP_MODE_DISTRIBUTED:
		return errors.New("secure aggregation with central differential privacy: refused (the aggregator cannot re-clip what it cannot see; the distributed mode is the one that composes)")
	}
	return nil
}

// secAggSumInput is a sum-mode site's input (uplink.SecAggSumInput): the
// quantised delta of its z_j against its record c_j (a join: against x on
// the grid), under distributed DP clipped and with its noise share drawn
// from key, and what it adds to the record once the round's UPDATE
// receipt confirms it is in the sum.
func (sr *siteRules) secAggSumInput(v StoreView, ann *wire.RoundAnnouncement, q secagg.Quantizer, z, global []float64, key [32]byte) ([]uint32, *edgestore.SumPending, error) {
	r := ann.Round
	u := uplink.SumUpdate{Round: r, Z: z, Global: global, Tamper: poison}
	cr, c, err := v.Contribution()
	switch {
	case err == nil:
		u.Record = &uplink.Record{Round: cr, C: c}
	case !errors.Is(err, storage.ErrNotFound):
		return nil, nil, diskErrAt(v, roundErr(r, err))
	}
	var sd *uplink.SecAggDP
	if d := ann.GetDp(); d != nil {
		sd = &uplink.SecAggDP{Clip: d.ClipNorm, Std: dp.SiteStd(d.NoiseMultiplier, d.ClipNorm, int(d.NoiseShares)), Noise: dp.NoiseRand(key, r)}
	}
	in, p, err := uplink.SecAggSumInput(q, u, sd, sr.SecAgg.Rand(r))
	if err != nil {
		return nil, nil, roundErr(r, err)
	}
	return in, &edgestore.SumPending{Join: p.Join, V: p.V}, nil
}

// secAggInput is the site's input: its quantised update, and under
// distributed DP (docs/privacy.md "Threat models") its clipped update,
// quantised, plus its discrete-Gaussian noise share on the ring, drawn from
// the round's stream of the site's secret noise key (uplink.SecAggNoisyInput).
func (sr *siteRules) secAggInput(ann *wire.RoundAnnouncement, q secagg.Quantizer, sent, global []float64, key [32]byte) ([]uint32, error) {
	r := ann.Round
	d := ann.GetDp()
	var in []uint32
	var err error
	if d == nil {
		in, err = uplink.SecAggInput(q, sent, global, sr.SecAgg.Rand(r))
	} else {
		std := dp.SiteStd(d.NoiseMultiplier, d.ClipNorm, int(d.NoiseShares))
		in, err = uplink.SecAggNoisyInput(q, sent, global, d.ClipNorm, std, dp.NoiseRand(key, r), sr.SecAgg.Rand(r))
	}
	if err != nil {
		return nil, roundErr(r, err)
	}
	return in, nil
}

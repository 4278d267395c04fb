package agent

import (
	"bytes"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/secagg"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// The site's side of secure aggregation (docs/privacy.md, "Round flow"): a
// round whose announcement carries a SecAggSpec is solved as any other, but
// the update is never sent. Its quantised input (uplink.SecAggInput) and a
// new secagg.Client (keys and self-mask seed from crypto/rand) are
// committed with the AdvertiseKeys message as the round's outbox entry (one
// transaction with the applied round: edgestore.Commit). Each later phase's
// message is computed from the stored record and committed, record and
// outbox entry together (edgestore.EdgeStore.SetSecAgg), before it is
// published. After a restart or a reconnection the outbox entry is re-sent
// as an update's is; a phase asked again gets the stored answer byte for
// byte (the secagg.Client replays it), so a site never sends two different
// masked inputs. A newer attempt of the round (the aggregator aborted the
// session) starts a new client over the same stored input; a newer round
// or run replaces the record.

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

// secAggRand is the randomness of the site's secure aggregation: its keys,
// shares and stochastic rounding. crypto/rand unless a test that compares a
// live run with simulate gives a seeded stream (RoundHandler.SecAggRand).
func (h *RoundHandler) secAggRand(round uint64) io.Reader {
	if h.SecAggRand != nil {
		return h.SecAggRand(round)
	}
	return crand.Reader
}

// secAggMessage is the wire envelope of a site's secagg message m. In sum
// mode an AdvertiseKeys names the round of the site's record its input is
// a delta against (0: a join) and the installation (the aggregator's
// uplink.SumState.Check).
func (h *RoundHandler) secAggMessage(ann *wire.RoundAnnouncement, c *secagg.Client, m secagg.Message) ([]byte, error) {
	w := &wire.SecAggMessage{ClientId: h.ClientID, RunId: ann.RunId, Round: ann.Round,
		Attempt: ann.Secagg.Attempt, Kind: uint32(m.Kind()), Payload: secagg.Encode(m), SentAtUnixMs: h.clock().Now().UnixMilli()}
	if m.Kind() == secagg.KindAdvertiseKeys && sumMode(ann) {
		p, ok, err := h.Store.Pending(ann.Round)
		switch {
		case err != nil:
			return nil, h.diskErr(err)
		case !ok:
			// The round's first AdvertiseKeys: committed with its pending
			// contribution in the same transaction (secAggCommit).
			if w.BaseRound, err = h.recordRound(); err != nil {
				return nil, err
			}
		case !p.Join:
			if w.BaseRound, err = h.recordRound(); err != nil {
				return nil, err
			}
		}
		w.InstanceId = h.InstanceID
	}
	if a, ok := m.(*secagg.AdvertiseKeys); ok && h.SecAggIdentity != nil {
		sig, err := h.SecAggIdentity.Sign(uplink.SecAggAdvertDigest(a.Session, a.Keys), crand.Reader)
		if err != nil {
			return nil, wrap("secagg: signing the advertisement", err)
		}
		w.Certificate, w.Signature = h.SecAggIdentity.Cert, sig
	}
	if _, ok := m.(*secagg.MaskedInput); ok && h.SecAggIdentity != nil {
		// The consistency check: this site's view of the session, signed
		// with its masked input (uplink.SecAggViewDigest).
		view, ok := h.secAggView(ann, c)
		if !ok {
			return nil, errors.New("secagg: a masked input without a view of the session")
		}
		sig, err := h.SecAggIdentity.Sign(view, crand.Reader)
		if err != nil {
			return nil, wrap("secagg: signing the view", err)
		}
		w.ViewSignature = sig
	}
	return wire.Encode(w)
}

// recordRound is the round of the site's sum-mode record c_j (0: none,
// the site joins).
func (h *RoundHandler) recordRound() (uint64, error) {
	r, _, err := h.Store.Contribution()
	if errors.Is(err, storage.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, h.diskErr(err)
	}
	return r, nil
}

// newSecAggClient makes the site's client of the announcement's session.
func (h *RoundHandler) newSecAggClient(ann *wire.RoundAnnouncement, dim int) (*secagg.Client, error) {
	cfg, _, err := uplink.SecAggSetup(ann.Secagg, dim)
	if err != nil {
		return nil, bad(ann.Round, "secagg: %v", err)
	}
	return secagg.NewClient(cfg, uplink.SecAggSession(ann.RunId, ann.Round, ann.Secagg.Attempt), h.ClientID, h.secAggRand(ann.Round))
}

// secAggCommit is the end of a solved round under secure aggregation: the
// quantised update and the new session's client committed with its
// AdvertiseKeys, the round applied (edgestore.Commit), before it is sent.
func (h *RoundHandler) secAggCommit(ann *wire.RoundAnnouncement, p *prepared, sent []float64, res Result) (Result, error) {
	r := ann.Round
	_, q, err := uplink.SecAggSetup(ann.Secagg, len(p.x))
	if err != nil {
		return res, bad(r, "secagg: %v", err)
	}
	var input []uint32
	var pending *edgestore.SumPending
	if p.sum {
		input, pending, err = h.secAggSumInput(ann, q, sent, p.x)
	} else {
		input, err = h.secAggInput(ann, q, sent, p.x)
	}
	if err != nil {
		return res, err
	}
	c, err := h.newSecAggClient(ann, len(p.x))
	if err != nil {
		return res, err
	}
	rec, msg, err := h.secAggState(ann, input, c, c.Advertise())
	if err != nil {
		return res, err
	}
	commit := edgestore.Commit{Round: r, Msg: msg, SecAgg: rec}
	if p.sum {
		commit.Z, commit.Pending = sent, pending
	}
	if err := h.Store.Commit(commit); err != nil {
		if errors.Is(err, storage.ErrAlreadyApplied) {
			return h.resend(res)
		}
		return res, h.diskErr(roundErr(r, err))
	}
	res.Action, res.Msg, res.SecAggKind = ActionSecAgg, msg, secagg.KindAdvertiseKeys
	res.Healthy = true
	return res, nil
}

// secAggState encodes the record of (ann's session, input, c) and the
// envelope of c's message m.
func (h *RoundHandler) secAggState(ann *wire.RoundAnnouncement, input []uint32, c *secagg.Client, m secagg.Message) (rec, msg []byte, err error) {
	cs, err := c.MarshalBinary()
	if err != nil {
		return nil, nil, fmt.Errorf("agent: round %d: secagg state: %w", ann.Round, err)
	}
	rec = (&secAggRecord{run: ann.RunId, round: ann.Round, attempt: ann.Secagg.Attempt, input: input, client: cs}).marshal()
	if msg, err = h.secAggMessage(ann, c, m); err != nil {
		return nil, nil, fmt.Errorf("agent: round %d: encode the secagg message: %w", ann.Round, err)
	}
	return rec, msg, nil
}

// secAggRecord reads the stored record (nil when there is none).
func (h *RoundHandler) secAggRecord() (*secAggRecord, error) {
	b, err := h.Store.SecAgg()
	if errors.Is(err, storage.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, h.diskErr(err)
	}
	return unmarshalSecAggRecord(b)
}

// secAggPhase answers an announcement of a round this site has applied
// under secure aggregation: the phase's message from the stored session, a
// new session over the stored input for a newer attempt, or the stored
// message again.
func (h *RoundHandler) secAggPhase(ann *wire.RoundAnnouncement, res Result) (Result, error) {
	r := ann.Round
	rec, err := h.secAggRecord()
	if err != nil {
		return res, err
	}
	if rec == nil || rec.round != r || rec.run != ann.RunId {
		// Applied without secure aggregation, or the record is another
		// round's: nothing of this session here.
		return h.resend(res)
	}
	att := ann.Secagg.Attempt
	switch {
	case att < rec.attempt:
		res.Action = ActionStale
		return res, nil
	case att > rec.attempt:
		if ann.SecaggPhase != wire.SecAggPhase_SECAGG_PHASE_ADVERTISE {
			// Not selected for the new session's advertise phase (or
			// it went on without this site): nothing to send.
			res.Action = ActionDone
			return res, nil
		}
		c, err := h.newSecAggClient(ann, len(rec.input))
		if err != nil {
			return res, err
		}
		h.log().Info("secure aggregation: a new session of the round (the previous one aborted); advertising new keys over the same update", "round", r, "attempt", att)
		return h.secAggSend(ann, rec.input, c, c.Advertise(), res)
	}
	c, err := secagg.UnmarshalClient(rec.client)
	if err != nil {
		return res, h.diskErr(fmt.Errorf("%w: agent: round %d: the secagg client state: %w", storage.ErrCorrupt, r, err))
	}
	switch ann.SecaggPhase {
	case wire.SecAggPhase_SECAGG_PHASE_SHARE_KEYS:
		if c.Phase() != secagg.ClientAdvertised {
			break // answered: its ShareKeys is re-sent while unreceipted
		}
		kl, err := decodeBroadcast[*secagg.KeyList](ann)
		if err != nil {
			return res, err
		}
		if !inKeyList(kl, h.ClientID) {
			res.Action = ActionDone // not in U1: the session goes on without this site
			return res, nil
		}
		if err := h.checkSignedKeys(ann, kl); err != nil {
			return res, err
		}
		m, err := c.ShareKeys(kl, h.secAggRand(r))
		if err != nil {
			return res, fmt.Errorf("agent: round %d: secagg share keys: %w", r, err)
		}
		return h.secAggSend(ann, rec.input, c, m, res)
	case wire.SecAggPhase_SECAGG_PHASE_MASKED:
		// The ShareList comes on the receipts topic. A site that missed it
		// asks again by re-sending its ShareKeys, which stays in the
		// outbox until the ShareList arrives (node/agent/session.go
		// secAggReceipt): on its next connection, not on every copy of
		// this announcement.
		res.Action = ActionDone
		return res, nil
	case wire.SecAggPhase_SECAGG_PHASE_CONSISTENCY:
		if c.Phase() == secagg.ClientMasked && h.SecAggIdentity != nil {
			return h.secAggConsistency(ann, rec, c, res)
		}
		res.Action = ActionDone // password-only: nothing to sign
		return res, nil
	case wire.SecAggPhase_SECAGG_PHASE_UNMASK:
		if c.Phase() == secagg.ClientMasked {
			req, err := decodeBroadcast[*secagg.UnmaskRequest](ann)
			if err != nil {
				return res, err
			}
			if !slicesContains(req.Survivors, h.ClientID) {
				res.Action = ActionDone // its masked input is not in the sum
				return res, nil
			}
			if err := h.checkViews(ann, c, req); err != nil {
				return res, err
			}
			if err := h.checkSurvivors(ann, rec, c, req); err != nil {
				return res, err
			}
			m, err := c.Unmask(req)
			if err != nil {
				return res, fmt.Errorf("agent: round %d: secagg unmask: %w", r, err)
			}
			return h.secAggSend(ann, rec.input, c, m, res)
		}
	}
	return h.resend(res)
}

// HandleShareList answers the aggregator's ShareList (the masked phase):
// the masked input, committed before it is returned for publishing. A
// ShareList of another session, or one the site has answered, changes
// nothing (the stored answer is re-sent).
func (h *RoundHandler) HandleShareList(m *wire.SecAggMessage) (Result, error) {
	res := Result{Round: m.Round}
	rec, err := h.secAggRecord()
	if err != nil {
		return res, err
	}
	if rec == nil || rec.round != m.Round || rec.attempt != m.Attempt || rec.run != m.RunId {
		res.Action = ActionStale
		return res, nil
	}
	c, err := secagg.UnmarshalClient(rec.client)
	if err != nil {
		return res, h.diskErr(fmt.Errorf("%w: agent: round %d: the secagg client state: %w", storage.ErrCorrupt, m.Round, err))
	}
	if c.Phase() != secagg.ClientShared {
		// Answered already (a second copy of the ShareList: the answer to
		// a re-sent ShareKeys): the masked input in the outbox is re-sent
		// as any unreceipted message is, never computed again.
		res.Action = ActionDone
		return res, nil
	}
	p, err := secagg.Decode(m.Payload)
	if err != nil {
		return res, fmt.Errorf("%w: round %d: share list: %w", ErrBadAnnouncement, m.Round, err)
	}
	sl, ok := p.(*secagg.ShareList)
	if !ok || !bytes.Equal(sl.Session, uplink.SecAggSession(m.RunId, m.Round, m.Attempt)) {
		return res, fmt.Errorf("%w: round %d: a share list of another session or kind", ErrBadAnnouncement, m.Round)
	}
	masked, err := c.MaskInput(sl, rec.input)
	if err != nil {
		return res, fmt.Errorf("agent: round %d: secagg masked input: %w", m.Round, err)
	}
	ann := &wire.RoundAnnouncement{RunId: m.RunId, Round: m.Round, Secagg: &wire.SecAggSpec{Attempt: m.Attempt}}
	return h.secAggSend(ann, rec.input, c, masked, res)
}

// secAggSend commits the session's new state with its message m as the
// round's outbox entry, then returns m for publishing.
func (h *RoundHandler) secAggSend(ann *wire.RoundAnnouncement, input []uint32, c *secagg.Client, m secagg.Message, res Result) (Result, error) {
	rec, msg, err := h.secAggState(ann, input, c, m)
	if err != nil {
		return res, err
	}
	if err := h.Store.SetSecAgg(ann.Round, rec, msg); err != nil {
		return res, h.diskErr(roundErr(ann.Round, err))
	}
	res.Action, res.Msg, res.SecAggKind = ActionSecAgg, msg, m.Kind()
	res.Healthy = true
	return res, nil
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
// federation CA (uplink.CheckKeyList). A key list that fails is refused as
// a site error (reason secagg_refused, carried by the site's status to
// the aggregator's operator): this site shares nothing in the session.
func (h *RoundHandler) checkSignedKeys(ann *wire.RoundAnnouncement, kl *secagg.KeyList) error {
	id := h.SecAggIdentity
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
	if err := uplink.CheckKeyList(id.Roots, h.clock().Now(), kl, signed); err != nil {
		return refuse(err)
	}
	return nil
}

// secAggView is the digest of what this site saw of the session (c past
// its masked input): the KeyList and, with the complete graph, U2
// (secagg.Client.View, uplink.SecAggViewDigest).
func (h *RoundHandler) secAggView(ann *wire.RoundAnnouncement, c *secagg.Client) ([32]byte, bool) {
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
func (h *RoundHandler) checkViews(ann *wire.RoundAnnouncement, c *secagg.Client, req *secagg.UnmaskRequest) error {
	if h.SecAggIdentity == nil {
		return nil
	}
	refuse := func(err error) error {
		return &sitedata.SiteError{Reason: sitedata.ReasonSecAgg, Problem: fmt.Sprintf("round %d session %d: unmask refused: %v", ann.Round, ann.Secagg.Attempt, err), Err: err}
	}
	view, ok := h.secAggView(ann, c)
	if !ok {
		return refuse(errors.New("no masked input sent in this session"))
	}
	var signed []uplink.SignedKey
	if len(ann.SecaggViewSignatures) > 0 {
		var err error
		if signed, err = uplink.DecodeSignedKeys(ann.SecaggViewSignatures); err != nil {
			return refuse(fmt.Errorf("%w: %w", uplink.ErrSecAggView, err))
		}
	}
	if err := uplink.CheckViews(h.SecAggIdentity.Roots, h.clock().Now(), req.Survivors, view, signed); err != nil {
		return refuse(err)
	}
	return nil
}

// secAggConsistency is the site's turn in the consistency round (signed
// secure aggregation, uplink.CheckSurvivors): it signs the survivor set U3
// with its view (the views themselves are checked at the unmask) and sends
// the signature (kind 9), recording in the same transaction that
// it signed this set: shown another set later in the session, it refuses
// (a site error secagg_refused) and reveals nothing.
func (h *RoundHandler) secAggConsistency(ann *wire.RoundAnnouncement, rec *secAggRecord, c *secagg.Client, res Result) (Result, error) {
	req, err := decodeBroadcast[*secagg.UnmaskRequest](ann)
	if err != nil {
		return res, err
	}
	if !slicesContains(req.Survivors, h.ClientID) {
		res.Action = ActionDone // its masked input is not in the sum
		return res, nil
	}
	digest, err := h.survivorsDigest(ann, c, req)
	if err != nil {
		return res, err
	}
	if err := uplink.CheckSurvivorSet(rec.survivors, rec.signed, digest); err != nil {
		return res, h.refuseUnmask(ann, err)
	}
	if !rec.signed && len(req.Survivors) < c.Threshold() {
		// A set no honest aggregator announces: the site commits to it
		// unsigned, so that it refuses every other set of the session
		// too, and reveals nothing in it.
		next := *rec
		next.signed, next.survivors = true, digest
		if err := h.Store.SetSecAgg(ann.Round, next.marshal(), nil); err != nil {
			return res, h.diskErr(roundErr(ann.Round, err))
		}
		return res, h.refuseUnmask(ann, fmt.Errorf("%w: %d survivors, threshold %d", uplink.ErrSecAggSurvivors, len(req.Survivors), c.Threshold()))
	}
	if len(req.Survivors) < c.Threshold() {
		return res, h.refuseUnmask(ann, fmt.Errorf("%w: %d survivors, threshold %d", uplink.ErrSecAggSurvivors, len(req.Survivors), c.Threshold()))
	}
	if rec.signed {
		return h.resend(res) // signed already: the stored message is re-sent until receipted
	}
	sig, err := h.SecAggIdentity.Sign(digest, crand.Reader)
	if err != nil {
		return res, wrap("secagg: signing the survivor set", err)
	}
	msg, err := wire.Encode(&wire.SecAggMessage{ClientId: h.ClientID, RunId: ann.RunId, Round: ann.Round, Attempt: ann.Secagg.Attempt,
		Kind: uplink.SecAggKindSurvivors, Payload: secagg.Encode(req), SentAtUnixMs: h.clock().Now().UnixMilli(), SurvivorsSignature: sig})
	if err != nil {
		return res, fmt.Errorf("agent: round %d: encode the signed survivor set: %w", ann.Round, err)
	}
	next := *rec
	next.signed, next.survivors = true, digest
	if err := h.Store.SetSecAgg(ann.Round, next.marshal(), msg); err != nil {
		return res, h.diskErr(roundErr(ann.Round, err))
	}
	res.Action, res.Msg, res.SecAggKind = ActionSecAgg, msg, secagg.Kind(uplink.SecAggKindSurvivors)
	res.Healthy = true
	return res, nil
}

// survivorsDigest is what this site signs of req's survivor set
// (uplink.SecAggSurvivorsDigest over its view).
func (h *RoundHandler) survivorsDigest(ann *wire.RoundAnnouncement, c *secagg.Client, req *secagg.UnmaskRequest) ([32]byte, error) {
	view, ok := h.secAggView(ann, c)
	if !ok {
		return view, h.refuseUnmask(ann, errors.New("no masked input sent in this session"))
	}
	return uplink.SecAggSurvivorsDigest(uplink.SecAggSession(ann.RunId, ann.Round, ann.Secagg.Attempt), view, req.Survivors), nil
}

// checkSurvivors is the consistency round's check before any share is
// revealed: with a signing identity, the survivor set must be the one this
// site signed (if it signed one), and at least the session's threshold of
// survivors must have signed it with this site's view, every relayed
// signature valid (uplink.CheckSurvivors). A failure is a site error
// (secagg_refused): nothing is revealed.
func (h *RoundHandler) checkSurvivors(ann *wire.RoundAnnouncement, rec *secAggRecord, c *secagg.Client, req *secagg.UnmaskRequest) error {
	if h.SecAggIdentity == nil {
		return nil
	}
	digest, err := h.survivorsDigest(ann, c, req)
	if err != nil {
		return err
	}
	if err := uplink.CheckSurvivorSet(rec.survivors, rec.signed, digest); err != nil {
		return h.refuseUnmask(ann, err)
	}
	var signed []uplink.SignedKey
	if len(ann.SecaggSurvivorSignatures) > 0 {
		if signed, err = uplink.DecodeSignedKeys(ann.SecaggSurvivorSignatures); err != nil {
			return h.refuseUnmask(ann, fmt.Errorf("%w: %w", uplink.ErrSecAggSurvivors, err))
		}
	}
	if err := uplink.CheckSurvivors(h.SecAggIdentity.Roots, h.clock().Now(), c.Threshold(), req.Survivors, digest, signed); err != nil {
		return h.refuseUnmask(ann, err)
	}
	return nil
}

// refuseUnmask is the site error of a session refused before the unmask.
func (h *RoundHandler) refuseUnmask(ann *wire.RoundAnnouncement, err error) error {
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

// SecAggSession reads the secure-aggregation session stored in a site's
// state file: its round, attempt and quantised input (for tests and
// inspection; the client state with the site's keys is not returned).
// ErrNotFound (storage's) when the site has none.
func SecAggSession(s *edgestore.EdgeStore) (round uint64, attempt uint32, input []uint32, err error) {
	b, err := s.SecAgg()
	if err != nil {
		return 0, 0, nil, err
	}
	rec, err := unmarshalSecAggRecord(b)
	if err != nil {
		return 0, 0, nil, err
	}
	return rec.round, rec.attempt, rec.input, nil
}

// secAggSumInput is a sum-mode site's input (uplink.SecAggSumInput): the
// quantised delta of its z_j against its record c_j (a join: against x on
// the grid), under distributed DP clipped and with its noise share, and
// what it adds to the record once the round's UPDATE receipt confirms it
// is in the sum.
func (h *RoundHandler) secAggSumInput(ann *wire.RoundAnnouncement, q secagg.Quantizer, z, global []float64) ([]uint32, *edgestore.SumPending, error) {
	r := ann.Round
	u := uplink.SumUpdate{Round: r, Z: z, Global: global, Tamper: poison}
	cr, c, err := h.Store.Contribution()
	switch {
	case err == nil:
		u.Record = &uplink.Record{Round: cr, C: c}
	case !errors.Is(err, storage.ErrNotFound):
		return nil, nil, h.diskErr(roundErr(r, err))
	}
	var sd *uplink.SecAggDP
	if d := ann.GetDp(); d != nil {
		key, err := h.noiseKey(r)
		if err != nil {
			return nil, nil, err
		}
		sd = &uplink.SecAggDP{Clip: d.ClipNorm, Std: dp.SiteStd(d.NoiseMultiplier, d.ClipNorm, int(d.NoiseShares)), Noise: dp.NoiseRand(key, r)}
	}
	in, p, err := uplink.SecAggSumInput(q, u, sd, h.secAggRand(r))
	if err != nil {
		return nil, nil, roundErr(r, err)
	}
	return in, &edgestore.SumPending{Join: p.Join, V: p.V}, nil
}

// noiseKey is the site's distributed-DP noise key (kept in its edge store;
// a test's fixed key when RoundHandler.SecAggNoiseKey is set).
func (h *RoundHandler) noiseKey(r uint64) ([32]byte, error) {
	key, err := h.Store.SecAggNoiseKey()
	if err != nil {
		return key, h.diskErr(roundErr(r, err))
	}
	if h.SecAggNoiseKey != nil {
		key = *h.SecAggNoiseKey
	}
	return key, nil
}

// secAggInput is the site's input: its quantised update, and under
// distributed DP (docs/privacy.md "Threat models") its clipped update,
// quantised, plus its discrete-Gaussian noise share on the ring, drawn from
// the round's stream of the site's secret noise key (kept in the edge
// store) (uplink.SecAggNoisyInput).
func (h *RoundHandler) secAggInput(ann *wire.RoundAnnouncement, q secagg.Quantizer, sent, global []float64) ([]uint32, error) {
	r := ann.Round
	d := ann.GetDp()
	if d == nil {
		in, err := uplink.SecAggInput(q, sent, global, h.secAggRand(r))
		if err != nil {
			return nil, roundErr(r, err)
		}
		return in, nil
	}
	key, err := h.noiseKey(r)
	if err != nil {
		return nil, err
	}
	std := dp.SiteStd(d.NoiseMultiplier, d.ClipNorm, int(d.NoiseShares))
	in, err := uplink.SecAggNoisyInput(q, sent, global, d.ClipNorm, std, dp.NoiseRand(key, r), h.secAggRand(r))
	if err != nil {
		return nil, roundErr(r, err)
	}
	return in, nil
}

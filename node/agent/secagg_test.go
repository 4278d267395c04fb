package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/edgefl/edgefl/node/edgestore"
	"path/filepath"
	"slices"
	"testing"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/secagg"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
	"github.com/edgefl/edgefl/testkit"
)

// secAggSite is one site's handler over its own store (reopened to
// simulate a restart).
type secAggSite struct {
	h    *RoundHandler
	path string
}

func newSecAggSites(t *testing.T, n int) []*secAggSite {
	var out []*secAggSite
	for i := range n {
		id := fmt.Sprintf("site-%d", i)
		path := filepath.Join(t.TempDir(), id+".db")
		s := openStore(t, path)
		if _, err := s.InitIdentity(id, t0); err != nil {
			t.Fatal(err)
		}
		h := &RoundHandler{ClientID: id, Federation: testFed, Store: s, Data: testData(uint64(i+1), 60),
			Clock: clock.NewFake(t0), Seed: 3, Log: testkit.Logger(t)}
		out = append(out, &secAggSite{h: h, path: path})
		t.Cleanup(func() { h.Store.Close() })
	}
	return out
}

// restart closes and reopens the site's store: its handler keeps nothing
// else between announcements.
func (s *secAggSite) restart(t *testing.T) {
	if err := s.h.Store.Close(); err != nil {
		t.Fatal(err)
	}
	s.h.Store = openStore(t, s.path)
}

func secAggAnnouncement(t *testing.T, round uint64, attempt uint32, phase wire.SecAggPhase, bcast secagg.Message, sites []*secAggSite) *wire.RoundAnnouncement {
	a := announce(t, round, AlgoFedProx, testGlobal(round))
	a.RunId = "RUN1"
	a.Secagg = &wire.SecAggSpec{Threshold: 2, Clip: 0.5, ScaleBits: 24, MaxSites: uint32(len(sites)), Attempt: attempt}
	a.SecaggPhase = phase
	if bcast != nil {
		a.SecaggBroadcast = secagg.Encode(bcast)
	}
	for _, s := range sites {
		a.Selected = append(a.Selected, s.h.ClientID)
	}
	return a
}

// payloadOf decodes the secagg message a site published.
func payloadOf(t *testing.T, msg []byte) (*wire.SecAggMessage, secagg.Message) {
	t.Helper()
	m, err := wire.DecodeSecAgg(msg, wire.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := secagg.Decode(m.Payload)
	if err != nil {
		t.Fatal(err)
	}
	return m, p
}

// TestSecAggHandler drives three sites' round handlers through a session
// against an in-process secagg.Server, as the aggregator runs it: each
// phase's message is committed (record and outbox entry) before Handle
// returns it, asked again (also after a restart of the store) the site
// returns the same bytes, the unmasked sum is exactly the sum of the
// inputs the sites stored, and a newer attempt advertises new keys over the
// same input.
func TestSecAggHandler(t *testing.T) {
	ctx := context.Background()
	sites := newSecAggSites(t, 3)
	const round = 1
	ann := secAggAnnouncement(t, round, 0, wire.SecAggPhase_SECAGG_PHASE_ADVERTISE, nil, sites)
	cfg, _, err := uplink.SecAggSetup(ann.Secagg, testDim)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := secagg.NewServer(cfg, uplink.SecAggSession("RUN1", round, 0))
	if err != nil {
		t.Fatal(err)
	}
	run := &secAggRun{t: t, srv: srv, round: round, sent: map[string][]byte{}}
	step, again := run.step, run.again
	firstAdv := map[string][]byte{}
	for _, s := range sites {
		res, err := s.h.Handle(ctx, ann)
		step("advertise", s, res, err, secagg.KindAdvertiseKeys)
		firstAdv[s.h.ClientID] = res.Msg
	}
	sites[0].restart(t)
	again("advertise", sites[0], ann)

	out, err := srv.Advance()
	if err != nil {
		t.Fatal(err)
	}
	shareAnn := secAggAnnouncement(t, round, 0, wire.SecAggPhase_SECAGG_PHASE_SHARE_KEYS, out[0].Msg, sites)
	for _, s := range sites {
		res, err := s.h.Handle(ctx, shareAnn)
		step("share keys", s, res, err, secagg.KindShareKeys)
	}
	sites[1].restart(t)
	again("share keys", sites[1], shareAnn)
	// In the masked phase the site waits for its ShareList (its ShareKeys
	// stays in the outbox, re-sent on a new connection, until it comes).
	maskedAnn := secAggAnnouncement(t, round, 0, wire.SecAggPhase_SECAGG_PHASE_MASKED, nil, sites)
	if res, err := sites[2].h.Handle(ctx, maskedAnn); err != nil || res.Action != ActionDone {
		t.Fatalf("masked phase before the share list: %v %v", res.Action, err)
	}

	out, err = srv.Advance()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range out {
		s := sites[slices.IndexFunc(sites, func(s *secAggSite) bool { return s.h.ClientID == o.To })]
		sl := &wire.SecAggMessage{ClientId: o.To, RunId: "RUN1", Round: round, Kind: wire.SecAggKindShareList, Payload: secagg.Encode(o.Msg)}
		res, err := s.h.HandleShareList(sl)
		step("masked input", s, res, err, secagg.KindMaskedInput)
		s.restart(t)
		if res2, err := s.h.HandleShareList(sl); err != nil || res2.Action != ActionDone {
			t.Fatalf("the share list again after a restart, %s: %v %v", o.To, res2.Action, err)
		}
		if out, err := s.h.Store.Outbox(); err != nil || len(out) != 1 || !bytes.Equal(out[0].Msg, res.Msg) {
			t.Fatalf("%s: the outbox no longer holds the one masked input it sent (%v): a site must never send two", o.To, err)
		}
		stale := *sl
		stale.Attempt = 1
		if res, err := s.h.HandleShareList(&stale); err != nil || res.Action != ActionStale {
			t.Fatalf("a share list of another session: %v %v", res.Action, err)
		}
	}

	out, err = srv.Advance()
	if err != nil {
		t.Fatal(err)
	}
	unmaskAnn := secAggAnnouncement(t, round, 0, wire.SecAggPhase_SECAGG_PHASE_UNMASK, out[0].Msg, sites)
	for _, s := range sites {
		res, err := s.h.Handle(ctx, unmaskAnn)
		step("unmask", s, res, err, secagg.KindUnmaskResponse)
	}
	if _, err := srv.Advance(); err != nil {
		t.Fatal(err)
	}
	sum, err := srv.Sum()
	if err != nil {
		t.Fatal(err)
	}
	var inputs [][]uint32
	for _, s := range sites {
		r, a, in, err := SecAggSession(s.h.Store)
		if err != nil || r != round || a != 0 {
			t.Fatalf("%s: session of round %d attempt %d: %v", s.h.ClientID, r, a, err)
		}
		inputs = append(inputs, in)
	}
	if !slices.Equal(sum, uplink.SecAggPlainSum(inputs, testDim)) {
		t.Fatal("the unmasked sum is not the sum of the inputs the sites stored")
	}

	checkNewAttempt(t, sites, firstAdv, unmaskAnn)
}

// checkNewAttempt: a newer attempt (the aggregator aborted) advertises new
// keys over the same input, and an older attempt's announcement is stale.
func checkNewAttempt(t *testing.T, sites []*secAggSite, firstAdv map[string][]byte, unmaskAnn *wire.RoundAnnouncement) {
	t.Helper()
	ctx := context.Background()
	const round = 1
	s := sites[0]
	_, _, before, _ := SecAggSession(s.h.Store)
	newAnn := secAggAnnouncement(t, round, 1, wire.SecAggPhase_SECAGG_PHASE_ADVERTISE, nil, sites)
	res, err := s.h.Handle(ctx, newAnn)
	if err != nil || res.Action != ActionSecAgg || res.SecAggKind != secagg.KindAdvertiseKeys {
		t.Fatalf("a new attempt: %v %v", res.Action, err)
	}
	_, adv := payloadOf(t, res.Msg)
	_, old := payloadOf(t, firstAdv[s.h.ClientID])
	if !bytes.Equal(adv.SessionID(), uplink.SecAggSession("RUN1", round, 1)) {
		t.Fatal("the new advertisement is not of the new session")
	}
	if adv.(*secagg.AdvertiseKeys).Keys.MaskKey == old.(*secagg.AdvertiseKeys).Keys.MaskKey {
		t.Fatal("the new session reuses the aborted one's keys")
	}
	_, a, after, _ := SecAggSession(s.h.Store)
	if a != 1 || !slices.Equal(before, after) {
		t.Fatalf("attempt %d; the input changed: %v", a, !slices.Equal(before, after))
	}
	// An older attempt's announcement is stale.
	if res, err := s.h.Handle(ctx, unmaskAnn); err != nil || res.Action != ActionStale {
		t.Fatalf("an announcement of the aborted session: %v %v", res.Action, err)
	}
}

// secAggRun checks the messages of one secure-aggregation session as the
// sites send them, and hands them to the aggregator's side (srv).
type secAggRun struct {
	t     *testing.T
	srv   *secagg.Server
	round uint64
	sent  map[string][]byte // the last message of each site
}

// step checks that s answered with a message of kind, stored as its outbox
// entry, that the server takes.
func (r *secAggRun) step(what string, s *secAggSite, res Result, err error, kind secagg.Kind) {
	t := r.t
	t.Helper()
	if err != nil || res.Action != ActionSecAgg || res.SecAggKind != kind {
		t.Fatalf("%s, %s: %v %v (kind %v), want a %v", what, s.h.ClientID, res.Action, err, res.SecAggKind, kind)
	}
	out, err := s.h.Store.Outbox()
	if err != nil || len(out) != 1 || !bytes.Equal(out[0].Msg, res.Msg) {
		t.Fatalf("%s, %s: the outbox does not hold the message (%v)", what, s.h.ClientID, err)
	}
	m, p := payloadOf(t, res.Msg)
	if m.ClientId != s.h.ClientID || m.Round != r.round || m.Kind != uint32(kind) || m.RunId != "RUN1" {
		t.Fatalf("%s: envelope %v", what, m)
	}
	if err := r.srv.Receive(p); err != nil {
		t.Fatalf("%s, %s: the server refuses it: %v", what, s.h.ClientID, err)
	}
	r.sent[s.h.ClientID] = res.Msg
}

// again checks that s answers a the same as before.
func (r *secAggRun) again(what string, s *secAggSite, a *wire.RoundAnnouncement) {
	t := r.t
	t.Helper()
	res, err := s.h.Handle(context.Background(), a)
	if err != nil || res.Action != ActionResend || !bytes.Equal(res.Msg, r.sent[s.h.ClientID]) {
		t.Fatalf("%s again, %s: %v %v, want the stored message again", what, s.h.ClientID, res.Action, err)
	}
}

// TestSecAggLateSite: a selected site that did not advertise (offline in
// the advertise phase) does not solve in a later phase, and the site's
// refusals (FedSplit, anchor gradients, DP) leave nothing in its store.
func TestSecAggLateSite(t *testing.T) {
	ctx := context.Background()
	sites := newSecAggSites(t, 2)
	s := sites[0]
	ann := secAggAnnouncement(t, 1, 0, wire.SecAggPhase_SECAGG_PHASE_MASKED, nil, sites)
	if res, err := s.h.Handle(ctx, ann); err != nil || res.Action != ActionDone {
		t.Fatalf("a late site: %v %v", res.Action, err)
	}
	for name, mutate := range map[string]func(a *wire.RoundAnnouncement){
		"fedsplit": func(a *wire.RoundAnnouncement) { a.Algorithm = AlgoFedSplit },
		"anchor":   func(a *wire.RoundAnnouncement) { a.AnchorSketch = &wire.SketchSpec{} },
		"dp": func(a *wire.RoundAnnouncement) {
			a.Dp = &wire.DPParams{Mode: wire.DPMode_DP_MODE_CENTRAL, ClipNorm: 1, NoiseMultiplier: 1, Delta: 1e-5}
		},
	} {
		a := secAggAnnouncement(t, 2, 0, wire.SecAggPhase_SECAGG_PHASE_ADVERTISE, nil, sites)
		mutate(a)
		before := snapshot(t, s.h.Store)
		if _, err := s.h.Handle(ctx, a); !errors.Is(err, ErrBadAnnouncement) {
			t.Fatalf("%s under secagg: %v, want ErrBadAnnouncement", name, err)
		}
		if !snapshot(t, s.h.Store).equal(before) {
			t.Fatalf("%s: the refusal wrote to the store", name)
		}
		if _, err := s.h.Store.SecAgg(); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("%s: a session record: %v", name, err)
		}
	}
}

// FuzzSecAggRecord: the record's decoder never panics, and what it accepts
// encodes back to the same bytes.
func FuzzSecAggRecord(f *testing.F) {
	f.Add((&secAggRecord{run: "R", round: 3, attempt: 1, input: []uint32{1, 2, 3}, client: []byte{9}}).marshal())
	f.Add((&secAggRecord{run: "R", round: 3, attempt: 1, input: []uint32{1, 2, 3}, client: []byte{9}, signed: true, survivors: [32]byte{7}}).marshal())
	f.Add([]byte{1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := unmarshalSecAggRecord(b)
		if err != nil {
			return
		}
		if !bytes.Equal(r.marshal(), b) {
			t.Fatalf("%x decodes to a record that encodes to %x", b, r.marshal())
		}
	})
}

// TestSecAggSumMode walks a site of FedProx:FedSplit under secure
// aggregation (sum mode, docs/privacy.md "FedSplit under secure
// aggregation") through two rounds: the first input joins (base round 0,
// the installation named, the pending contribution x on the grid plus the
// dequantised input, z_j committed), a new session of the round advertises
// the same join; the next round waits for the first one's UPDATE receipt
// and re-sends its entry; the receipt advances the record by exactly the
// pending contribution; the second input is a delta against it (base round
// 1) whose pending contribution is its dequantised input.
func TestSecAggSumMode(t *testing.T) {
	ctx := context.Background()
	sites := newSecAggSites(t, 3)
	s := sites[0]
	s.h.InstanceID = "INSTANCE0"
	ann := func(round uint64, attempt uint32) *wire.RoundAnnouncement {
		a := secAggAnnouncement(t, round, attempt, wire.SecAggPhase_SECAGG_PHASE_ADVERTISE, nil, sites)
		a.Algorithm, a.SplitSum = AlgoFedProxSplit, true
		return a
	}
	a1 := ann(1, 0)
	_, q, err := uplink.SecAggSetup(a1.Secagg, testDim)
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.h.Handle(ctx, a1)
	if err != nil || res.Action != ActionSecAgg || res.SecAggKind != secagg.KindAdvertiseKeys {
		t.Fatalf("round 1: %v %v", res.Action, err)
	}
	p := checkSumJoin(t, s, q, res)
	checkSumNewSession(t, s, ann(1, 1), p)
	// Round 2 waits for round 1's UPDATE receipt and re-sends its entry.
	res, err = s.h.Handle(ctx, ann(2, 0))
	if err != nil || res.Action != ActionWaiting || res.Waiting != 1 || secAggKindOf(res.Msg) != uint32(secagg.KindAdvertiseKeys) {
		t.Fatalf("round 2 before round 1's receipt: %v waiting %d (%v)", res.Action, res.Waiting, err)
	}
	// Secagg receipts leave the entry; the round's UPDATE receipt advances
	// the record.
	acks := sumStore{s.h.Store}
	if ok, err := acks.HasPending(1); !ok || err != nil {
		t.Fatalf("HasPending(1) = %v, %v", ok, err)
	}
	if had, err := acks.Ack(1); !had || err != nil {
		t.Fatalf("round 1's receipt: %v %v", had, err)
	}
	cr, c, err := s.h.Store.Contribution()
	if err != nil || cr != 1 || !slices.Equal(c, p.V) {
		t.Fatalf("the record after round 1's receipt: round %d (%v), want the pending contribution", cr, err)
	}
	res, err = s.h.Handle(ctx, ann(2, 0))
	if err != nil || res.Action != ActionSecAgg {
		t.Fatalf("round 2: %v %v", res.Action, err)
	}
	if m, _ := payloadOf(t, res.Msg); m.BaseRound != 1 {
		t.Fatalf("round 2's AdvertiseKeys: base round %d, want 1 (the record's)", m.BaseRound)
	}
	p, ok, err := s.h.Store.Pending(2)
	_, _, input, _ := SecAggSession(s.h.Store)
	if err != nil || !ok || p.Join || !slices.Equal(p.V, q.Dequantize(input)) {
		t.Fatalf("round 2's pending contribution: join %v (%v %v), want the dequantised input", p.Join, ok, err)
	}
}

// checkSumJoin checks round 1's answer res of a sum-mode site under
// secure aggregation: an AdvertiseKeys that joins (base round 0, the
// installation named), with x on the grid plus the dequantised input as
// the pending contribution and z_j committed; it returns that pending
// contribution.
func checkSumJoin(t *testing.T, s *secAggSite, q secagg.Quantizer, res Result) edgestore.SumPending {
	t.Helper()
	m, _ := payloadOf(t, res.Msg)
	if m.BaseRound != 0 || m.InstanceId != "INSTANCE0" {
		t.Fatalf("round 1's AdvertiseKeys: base round %d, instance %q; want a join from INSTANCE0", m.BaseRound, m.InstanceId)
	}
	p, ok, err := s.h.Store.Pending(1)
	if err != nil || !ok || !p.Join {
		t.Fatalf("round 1's pending contribution: %+v %v %v", p, ok, err)
	}
	_, _, input, err := SecAggSession(s.h.Store)
	if err != nil {
		t.Fatal(err)
	}
	xg, d := uplink.SecAggGrid(q, testGlobal(1)), q.Dequantize(input)
	for i := range p.V {
		if p.V[i] != xg[i]+d[i] {
			t.Fatalf("pending[%d] = %v, want x on the grid + the dequantised input = %v", i, p.V[i], xg[i]+d[i])
		}
	}
	if zr, _, err := s.h.Store.Z(); err != nil || zr != 1 {
		t.Fatalf("z_j of round %d (%v), want round 1's", zr, err)
	}
	return p
}

// checkSumNewSession: the session aborted, the next one (a) advertises new
// keys over the same join p.
func checkSumNewSession(t *testing.T, s *secAggSite, a *wire.RoundAnnouncement, p edgestore.SumPending) {
	t.Helper()
	// The session aborted: the next one advertises new keys over the same
	// join.
	res, err := s.h.Handle(context.Background(), a)
	if err != nil || res.Action != ActionSecAgg {
		t.Fatalf("round 1, attempt 1: %v %v", res.Action, err)
	}
	if m, _ := payloadOf(t, res.Msg); m.BaseRound != 0 || m.Attempt != 1 {
		t.Fatalf("attempt 1's AdvertiseKeys: base round %d attempt %d", m.BaseRound, m.Attempt)
	}
	if p2, ok, _ := s.h.Store.Pending(1); !ok || !slices.Equal(p2.V, p.V) {
		t.Fatal("the new session changed the pending contribution")
	}
}

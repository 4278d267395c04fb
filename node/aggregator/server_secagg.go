package aggregator

import (
	"context"
	"errors"
	"fmt"
	"github.com/edgefl/edgefl/node/aggstore"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/edgefl/edgefl/internal/metrics"
	"github.com/edgefl/edgefl/learn/aggregate"
	splitpkg "github.com/edgefl/edgefl/learn/split"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/secagg"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// The shell's part of secure aggregation (ServerConfig.SecAgg;
// docs/privacy.md, "Round flow" and "Persistence"): the refusals, the
// secagg.Server of the open session and its records in the state file, the
// inbound messages (stored, then handed to the server, then counted), the
// phase advances and what they publish, and the aggregation of the sum.
//
// What is written when (store, then send):
//
//   - a site's message: its bytes under (round, attempt, kind, client) with
//     a replay log entry, in one transaction (aggstore.PutSecAggMessage),
//     after the secagg.Server took it and before the coordinator counts
//     it; then the receipt. The coordinator's state is not written for it
//     (a lone accept: coordinator_replay.go); the next state write, at the
//     latest the one that closes the phase, reflects it and clears the log;
//   - a phase advance: the coordinator's state that closes the phase (with
//     every message of it counted), then the server's whole state
//     (aggstore.PutSecAggServer, which also drops the stored messages it
//     took in), then the coordinator's state with the next phase, then the
//     announcement (and the ShareLists). After a restart the coordinator
//     is its stored state with the logged messages replayed (replayEvent),
//     and the server is its stored state plus the stored messages of the
//     open phase that the coordinator counts, taken again.

// SecAggConfig is secure aggregation's configuration (ServerConfig.SecAgg;
// docs/privacy.md; server_secagg.go): the aggregator learns only the sum
// of the sites' quantised updates over the sites that finish the protocol.
// The FedProx family with fedavg or mean (the uniform mean of the sum) and
// the FedSplit family in sum mode (the sum added to S), uniform selection
// (published: the KeyList names the participants), the fp32 codec setting
// (the ring quantiser replaces it), no anchor gradients, no schema, no
// central DP.
type SecAggConfig struct {
	// Clip bounds each coordinate of a site's update w - x (> 0); the
	// sites clip to it before quantising.
	Clip float64
	// ScaleBits is the fixed-point scale 2^ScaleBits of the ring quantiser
	// (0: the finest that cannot wrap with K sites, uplink.SecAggScaleBits).
	ScaleBits int
	// Threshold is t (0: secagg.DefaultThreshold(K), at least K/2 + 1).
	Threshold int
	// Timeout is the deadline of each phase after the advertise phase
	// (default DefaultSecAggTimeout).
	Timeout time.Duration
}

// DefaultSecAggTimeout is the default deadline of the share-keys, masked
// input and unmask phases: each is one message per site, no local work.
const DefaultSecAggTimeout = time.Minute

// Validate checks the settings on their own; checkSecAgg checks them
// against the rest of the configuration.
func (c *SecAggConfig) Validate() error {
	refuse := func(format string, a ...any) error {
		return fmt.Errorf("%w: secure aggregation (--secagg): %s", coordinator.ErrConfig, fmt.Sprintf(format, a...))
	}
	switch {
	case !(c.Clip > 0) || c.Clip > 1e6:
		return refuse("clip %v: want > 0 (and at most 1e6)", c.Clip)
	case c.Timeout < 0:
		return refuse("phase timeout %v: want > 0", c.Timeout)
	}
	return nil
}

// checkSecAgg refuses what secure aggregation cannot cover and sets the
// coordinator's secure-aggregation phases; d is the derived configuration.
func (cfg *ServerConfig) checkSecAgg(d *derived) error {
	if cfg.SecAgg == nil {
		return nil
	}
	copied := *cfg.SecAgg // the defaults below are this configuration's, not the caller's
	sc := &copied
	cfg.SecAgg = sc
	refuse := func(format string, a ...any) error {
		return fmt.Errorf("%w: secure aggregation (--secagg): %s", coordinator.ErrConfig, fmt.Sprintf(format, a...))
	}
	split := isSplit(d.fam)
	switch {
	case split && cfg.Aggregator != "" && cfg.Aggregator != splitpkg.StepMean:
		return refuse("--aggregator %s: %v", cfg.Aggregator, uplink.ErrSplitRobustDP)
	case !split && d.aggSpec != "fedavg" && d.aggSpec != "mean":
		return refuse("aggregator %q needs the individual updates; the aggregator sees only their sum (hint: use fedavg or mean; bound norms with --secagg-clip)", d.aggSpec)
	case cfg.Selector != "uniform" && cfg.Selector != "":
		return refuse("selector %q: %v", cfg.Selector, uplink.ErrSecAggSelector)
	case cfg.Codec != "fp32":
		return refuse("uplink codec %q: a masked update does not compress, and top-k or dct would reveal its support (hint: leave --codec at fp32)", cfg.Codec)
	case cfg.AnchorSketch != nil:
		return refuse("anchor gradients are per-site (they describe a site's data): not sent under --secagg")
	case cfg.Schema != nil:
		return refuse("a federation schema's statistics and evaluation reports are per site: not supported under --secagg yet")
	case cfg.DP != nil && !cfg.DP.Distributed:
		return refuse("central differential privacy re-clips each update, which it hides: the distributed mode is the one that composes with it (hint: --dp distributed)")
	case cfg.K < 2:
		return refuse("K = %d: a sum of one site is that site's update; want K >= 2", cfg.K)
	}
	if err := sc.Validate(); err != nil {
		return err
	}
	if sc.Timeout == 0 {
		sc.Timeout = DefaultSecAggTimeout
	}
	sc.Threshold = uplink.SecAggThreshold(cfg.K, sc.Threshold)
	shares := 0
	if cfg.DP != nil {
		// The noise shares: the threshold less the colluding sites the
		// guarantee holds against (uplink.SecAggNoiseShares).
		k, err := uplink.SecAggNoiseShares(sc.Threshold, cfg.DP.Colluders)
		if err != nil {
			return refuse("%v", err)
		}
		shares = k
		// The quantiser's range holds the clipped update and the noise's
		// tail (uplink.SecAggDPRange); --secagg-clip does not apply.
		sc.Clip = uplink.SecAggDPRange(cfg.DP.Clip, cfg.DP.Noise, shares)
	}
	if sc.ScaleBits == 0 {
		sb, err := uplink.SecAggScaleBits(sc.Clip, cfg.K)
		if err != nil {
			return refuse("%v", err)
		}
		sc.ScaleBits = sb
	}
	q, err := secagg.NewQuantizer(sc.Clip, sc.ScaleBits, cfg.K)
	if err != nil {
		return refuse("%v", err)
	}
	if cfg.DP != nil {
		if err := uplink.CheckSecAggDP(q, cfg.DP.Clip, cfg.DP.Noise, shares); err != nil {
			return refuse("%v", err)
		}
	}
	d.coord.Quorum = max(d.coord.Quorum, sc.Threshold)
	d.coord.SecAgg = &coordinator.SecAggConfig{Threshold: sc.Threshold, Timeout: sc.Timeout}
	if split {
		// Sum mode (server_secagg_sum.go): S and m, no late updates.
		d.aggSpec, d.sum, d.coord.StoreLate = "", true, false
	}
	return nil
}

// secAggRun is the shell's secure aggregation component: its
// configuration (ServerConfig.SecAgg with checkSecAgg's defaults, and K),
// the open session's secagg.Server (for round, attempt), the message being
// proposed and whether it was stored now, the session's advance the batch
// decided, its restore from the round log (restore) and its status section
// (status). nil when the run has no secure aggregation: its methods are
// then no-ops (off, no status).
type secAggRun struct {
	cfg            SecAggConfig
	k              int
	lim            wire.Limits
	log            *slog.Logger
	srv            *secagg.Server
	round, attempt int
	pend           *inSecAgg
	stored         bool
	advance        *coordinator.SecAggAdvance // set by carryOut, carried out after the batch
}

// newSecAggRun is the component of cfg (nil: none) with K sites per round;
// lim bounds the stored messages it reads back.
func newSecAggRun(cfg *SecAggConfig, k int, lim wire.Limits, log *slog.Logger) *secAggRun {
	if cfg == nil {
		return nil
	}
	return &secAggRun{cfg: *cfg, k: k, lim: lim, log: log}
}

// on reports whether the run has secure aggregation.
func (a *secAggRun) on() bool { return a != nil }

// threshold is t, the sites a session needs.
func (a *secAggRun) threshold() int { return a.cfg.Threshold }

// spec is the announcement's spec for session attempt.
func (a *secAggRun) spec(attempt int) *wire.SecAggSpec {
	return &wire.SecAggSpec{Threshold: uint32(a.cfg.Threshold), Clip: a.cfg.Clip, ScaleBits: uint32(a.cfg.ScaleBits),
		MaxSites: uint32(a.k), Attempt: uint32(attempt)}
}

// session returns the secagg.Server of (round, attempt) of run runID over
// dim values, making a new one when the open one is of another session.
func (a *secAggRun) session(round, attempt, dim int, runID string) (*secagg.Server, error) {
	if a.srv != nil && a.round == round && a.attempt == attempt {
		return a.srv, nil
	}
	cfg, _, err := uplink.SecAggSetup(a.spec(attempt), dim)
	if err != nil {
		return nil, err
	}
	srv, err := secagg.NewServer(cfg, uplink.SecAggSession(runID, uint64(round), uint32(attempt)))
	if err != nil {
		return nil, err
	}
	a.srv, a.round, a.attempt = srv, round, attempt
	return srv, nil
}

// openSession is the open session's server and its round and attempt
// (nil when none).
func (a *secAggRun) openSession() (srv *secagg.Server, round, attempt int) {
	if a == nil {
		return nil, 0, 0
	}
	return a.srv, a.round, a.attempt
}

// propose makes in the message being proposed, not stored yet; done
// forgets it.
func (a *secAggRun) propose(in *inSecAgg) (done func()) {
	a.pend, a.stored = in, false
	return func() { a.pend = nil }
}

// proposed is the message being proposed (nil when none).
func (a *secAggRun) proposed() *inSecAgg { return a.pend }

// setStored records whether the proposed message was stored now (false: a
// copy stored earlier).
func (a *secAggRun) setStored(stored bool) { a.stored = stored }

// storedNow reports whether the proposed message was stored now.
func (a *secAggRun) storedNow() bool { return a.stored }

// deferAdvance keeps the batch's SecAggAdvance, carried out after the
// batch.
func (a *secAggRun) deferAdvance(d coordinator.SecAggAdvance) { a.advance = &d }

// takeAdvance returns the batch's SecAggAdvance (nil when none) and
// forgets it.
func (a *secAggRun) takeAdvance() *coordinator.SecAggAdvance {
	if a == nil {
		return nil
	}
	d := a.advance
	a.advance = nil
	return d
}

// secAggSession is the open session's server of (round, attempt) of this
// run's model (secAggRun.session).
func (s *Server) secAggSession(round, attempt int) (*secagg.Server, error) {
	return s.secAgg.session(round, attempt, s.dim, s.stored.RunID)
}

// inSecAgg is a decoded, validated secagg message of a site.
type inSecAgg struct {
	msg    *wire.SecAggMessage
	raw    []byte
	parsed secagg.Message
}

// handleSecAgg checks a site's secagg message in the callback's goroutine:
// run, kind, the payload's encoding, that it is the site's own and of the
// session it names. What fails gets a counter, a log line and a BAD_UPDATE
// receipt; the rest goes to the loop.
func (s *Server) handleSecAgg(m *wire.SecAggMessage, raw []byte) bool {
	bad := func(reason, detail string) bool {
		s.reject(m.ClientId, reason)
		s.log.Warn("secagg message rejected", "client", m.ClientId, "round", m.Round, "kind", m.Kind, "reason", reason, "detail", detail)
		s.receiptSecAgg(m.ClientId, m.Round, m.Kind, false, wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE, reason+": "+detail, time.Time{})
		return true
	}
	switch {
	case !s.secAgg.on():
		return bad("no_secagg", "this federation runs without --secagg")
	case m.RunId != s.stored.RunID:
		return bad("run_mismatch", fmt.Sprintf("a message for run %q, this run is %q", m.RunId, s.stored.RunID))
	}
	p, err := secagg.Decode(m.Payload)
	if err != nil {
		return bad("malformed", err.Error())
	}
	kind := uint32(p.Kind())
	if m.Kind == uplink.SecAggKindSurvivors && p.Kind() == secagg.KindUnmaskRequest {
		// A signed survivor set: its payload is the UnmaskRequest it
		// answers, relayed as the site signed it (the aggregator does not
		// check the signature; the sites do).
		kind = m.Kind
	}
	if kind != m.Kind || string(p.SessionID()) != string(uplink.SecAggSession(m.RunId, m.Round, m.Attempt)) {
		return bad("invalid", fmt.Sprintf("a %v payload of another session or kind than the message's (kind %d, attempt %d)", p.Kind(), m.Kind, m.Attempt))
	}
	if m.Kind == uplink.SecAggKindSurvivors && len(m.SurvivorsSignature) == 0 {
		return bad("invalid", "a survivor set without its signature")
	}
	if id := secAggSender(p); id != m.ClientId && m.Kind != uplink.SecAggKindSurvivors {
		return bad("topic_mismatch", fmt.Sprintf("the payload is site %q's", id))
	}
	return s.submit(&request{secagg: &inSecAgg{msg: m, raw: raw, parsed: p}})
}

// secAggSender is the site a site's message names as its sender.
func secAggSender(m secagg.Message) string {
	switch m := m.(type) {
	case *secagg.AdvertiseKeys:
		return m.Keys.ID
	case *secagg.ShareKeys:
		return m.ID
	case *secagg.MaskedInput:
		return m.ID
	case *secagg.UnmaskResponse:
		return m.ID
	}
	return ""
}

func (s *Server) onSecAgg(ctx context.Context, in *inSecAgg) error {
	defer s.secAgg.propose(in)()
	return s.propose(ctx, secAggEvent(in.msg, s.clock.Now()), nil, s.storeSecAgg, s.refuseSecAgg)
}

// secAggEvent is the coordinator's event for a site's secagg message
// received (or stored, for the replay: replayEvent) at at.
func secAggEvent(m *wire.SecAggMessage, at time.Time) coordinator.SecAggArrived {
	return coordinator.SecAggArrived{Client: m.ClientId, Round: clampRound(m.Round), Attempt: int(min(m.Attempt, 1<<30)), Kind: int(m.Kind), At: at}
}

func clampRound(r uint64) int { return int(min(r, 1<<31-1)) }

// errSecAggRefused: the secagg.Server refused an accepted message (a
// conflicting second copy, a malformed set of boxes, ...): the site's fault.
var errSecAggRefused = errors.New("refused by the secure aggregation")

// storeSecAgg hands an accepted message to the session's secagg.Server and
// stores it with its replay log entry (the proposal, before the receipt;
// one write transaction: the coordinator's state is not written after a
// lone accept, coordinator_replay.go) and returns the entry's index (0: a
// copy stored earlier).
func (s *Server) storeSecAgg(d coordinator.Decision, now time.Time) (uint64, error) {
	a, ok := d.(coordinator.AcceptSecAgg)
	in := s.secAgg.proposed()
	if !ok || in == nil || in.msg.ClientId != a.Client || clampRound(in.msg.Round) != a.Round || int(in.msg.Kind) != a.Kind {
		return 0, fmt.Errorf("%w: %#v", errNotGiven, d)
	}
	if err := s.checkSumSecAgg(in.msg); err != nil {
		return 0, err
	}
	srv, err := s.secAggSession(a.Round, a.Attempt)
	if err != nil {
		return 0, err
	}
	if a.Kind != uplink.SecAggKindSurvivors {
		if err := srv.Receive(in.parsed); err != nil {
			return 0, fmt.Errorf("%w: %w", errSecAggRefused, err)
		}
	}
	index, err := s.store.PutSecAggMessage(aggstore.SecAggRecord{Round: uint64(a.Round), Attempt: uint32(a.Attempt), Kind: uint8(a.Kind),
		ClientID: a.Client, Msg: in.raw}, now)
	if errors.Is(err, storage.ErrConflict) {
		return 0, fmt.Errorf("%w: %w", errSecAggRefused, err)
	}
	s.secAgg.setStored(index > 0)
	if err == nil && len(in.msg.ViewSignature) > 0 {
		// Signed secure aggregation: the site's view signature, relayed to
		// the survivors with the UnmaskRequest (announceSecAgg). Lost in a
		// crash between the two transactions, it is missing at the unmask,
		// and the signing sites refuse the session (an abort, never a
		// wrong reveal).
		if verr := s.store.PutSecAggView(uint64(a.Round), uint32(a.Attempt), a.Client, in.msg.ViewSignature, now); verr != nil {
			s.storageErrors.Add(1)
			s.log.Error("storing a secagg view signature", "client", a.Client, "round", a.Round, "err", verr)
		}
	}
	return index, err
}

// refuseSecAgg answers an accepted message that was not stored.
func (s *Server) refuseSecAgg(err error) error {
	if errors.Is(err, errNotGiven) {
		return err
	}
	m := s.secAgg.proposed().msg
	if errors.Is(err, uplink.ErrBaseMismatch) {
		// Sum mode: a join of a counted site, or a delta of one that is
		// not counted; its input never enters a sum, and the UPDATE
		// receipt ends the site's pending contribution.
		s.reject(m.ClientId, "base_mismatch")
		s.log.Warn("secagg message rejected", "client", m.ClientId, "round", m.Round, "reason", "base_mismatch", "detail", err)
		s.receiptSecAgg(m.ClientId, m.Round, m.Kind, false, wire.ReceiptCode_RECEIPT_CODE_BASE_MISMATCH, err.Error(), time.Time{})
		s.receipt(&wire.ClientUpdate{ClientId: m.ClientId, Round: m.Round}, false, wire.ReceiptCode_RECEIPT_CODE_BASE_MISMATCH, err.Error(), time.Time{})
		return nil
	}
	if errors.Is(err, errSecAggRefused) {
		s.reject(m.ClientId, "secagg_refused")
		s.log.Warn("secagg message refused", "client", m.ClientId, "round", m.Round, "kind", m.Kind, "err", err)
		s.receiptSecAgg(m.ClientId, m.Round, m.Kind, false, wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE, err.Error(), time.Time{})
		return nil
	}
	s.storageErrors.Add(1)
	s.log.Error("storing an accepted secagg message; rejecting it for a retry", "client", m.ClientId, "round", m.Round, "err", err)
	s.reject(m.ClientId, "internal")
	s.receiptSecAgg(m.ClientId, m.Round, m.Kind, false, wire.ReceiptCode_RECEIPT_CODE_INTERNAL, "server could not store the message; retry", time.Time{})
	return nil
}

// answerSecAgg carries out coordinator.AcceptSecAgg and RejectSecAgg.
func (s *Server) answerSecAgg(d coordinator.Decision, storedAt time.Time) {
	switch d := d.(type) {
	case coordinator.AcceptSecAgg:
		code := wire.ReceiptCode_RECEIPT_CODE_STORED
		if !s.secAgg.storedNow() {
			code = wire.ReceiptCode_RECEIPT_CODE_DUPLICATE
		}
		s.log.Info("secagg message stored", "client", d.Client, "round", d.Round, "attempt", d.Attempt, "kind", secagg.Kind(d.Kind).String())
		s.receiptSecAgg(d.Client, uint64(d.Round), uint32(d.Kind), true, code, "", storedAt)
	case coordinator.RejectSecAgg:
		if d.Closed && s.sum != nil {
			s.answerClosedSum(d)
		}
		if d.Reason == coordinator.Duplicate {
			s.log.Info("duplicate secagg message ignored", "client", d.Client, "round", d.Round, "kind", secagg.Kind(d.Kind).String())
			s.receiptSecAgg(d.Client, uint64(d.Round), uint32(d.Kind), true, wire.ReceiptCode_RECEIPT_CODE_DUPLICATE, "duplicate: stored earlier", s.clock.Now())
			if d.Kind == int(secagg.KindShareKeys) {
				// A site re-sends its ShareKeys until it has its ShareList:
				// the answer is the ShareList again.
				s.publishShareLists(d.Client)
			}
			return
		}
		s.hist.reject(d.Client, "secagg/"+d.Reason.String())
		s.log.Warn("secagg message rejected", "client", d.Client, "round", d.Round, "kind", secagg.Kind(d.Kind).String(), "reason", d.Reason.String())
		s.receiptSecAgg(d.Client, uint64(d.Round), uint32(d.Kind), false, receiptCodes[d.Reason], d.Reason.String(), time.Time{})
	}
}

// receiptSecAgg publishes a receipt of subject SECAGG.
func (s *Server) receiptSecAgg(client string, round uint64, kind uint32, accepted bool, code wire.ReceiptCode, reason string, storedAt time.Time) {
	if round == 0 {
		return
	}
	s.sendReceipt(&wire.Receipt{ClientId: client, Round: round, Accepted: accepted, Reason: reason, Code: code,
		Subject: wire.ReceiptSubject_RECEIPT_SUBJECT_SECAGG, SecaggKind: kind}, storedAt, "secagg receipt")
}

// advanceSecAgg carries out coordinator.SecAggAdvance: the server's Advance (unless its
// stored state is past that phase already: a restart after storing it),
// its state stored, then coordinator.SecAggAdvanced stepped with the sites the next
// phase expects or why the session aborted.
func (s *Server) advanceSecAgg(ctx context.Context, d coordinator.SecAggAdvance) error {
	srv, err := s.secAggSession(d.Round, d.Attempt)
	if err != nil {
		return err
	}
	start := s.clock.Now()
	var advErr error
	if d.Phase == coordinator.SecAggConsistency {
		// The consistency round advances nothing in the server: the
		// survivors stay U3; the round needs t of them to have signed.
		return s.step(ctx, s.consistencyAdvanced(d, srv))
	}
	if srv.Phase() == secagg.Phase(d.Phase) {
		_, advErr = srv.Advance()
		st, err := srv.MarshalBinary()
		if err != nil {
			return fmt.Errorf("aggregator: secagg server state: %w", err)
		}
		if err := s.store.PutSecAggServer(uint64(d.Round), uint32(d.Attempt), st, uint8(coordinator.SecAggKind(min(d.Phase+1, coordinator.SecAggUnmask+1)))); err != nil {
			s.storageErrors.Add(1)
			return fmt.Errorf("aggregator: %w", err)
		}
	}
	ev := coordinator.SecAggAdvanced{Round: d.Round, Attempt: d.Attempt, Phase: d.Phase, At: s.clock.Now()}
	switch srv.Phase() {
	case secagg.PhaseAborted:
		ev.Err = errText(advErr, srv) + s.secAggRefusals()
	case secagg.PhaseShareKeys:
		kl := srv.Pending()[0].Msg.(*secagg.KeyList)
		for _, k := range kl.Sites {
			ev.Next = append(ev.Next, k.ID)
		}
		signed, err := s.signedKeys(d.Round, d.Attempt, kl)
		if err != nil {
			return err
		}
		ev.Signed, ev.Listed = len(signed), len(kl.Sites)
	case secagg.PhaseMasked:
		for _, o := range srv.Pending() {
			ev.Next = append(ev.Next, o.To)
		}
	case secagg.PhaseUnmask, secagg.PhaseDone:
		ev.Next = srv.Survivors()
	}
	s.log.Info("secagg phase closed", "round", d.Round, "attempt", d.Attempt, "phase", secAggPhaseName(d.Phase),
		"next", srv.Phase().String(), "sites", len(ev.Next), "took", s.clock.Since(start).Round(time.Microsecond))
	return s.step(ctx, ev)
}

// secAggRefusals names the sites whose status says they refused the
// session (site error secagg_refused: a key list they could not verify),
// for the abort's reason: "" when none did.
func (s *Server) secAggRefusals() string {
	var out []string
	for id, e := range s.siteErrs {
		if e[0] == wire.SiteErrSecAgg {
			out = append(out, id+": "+e[1])
		}
	}
	if len(out) == 0 {
		return ""
	}
	slices.Sort(out)
	return "; refused by " + strings.Join(out, "; ")
}

// errText is why srv aborted.
func errText(err error, srv *secagg.Server) string {
	if err != nil {
		return err.Error()
	}
	if _, err := srv.Sum(); err != nil {
		return err.Error()
	}
	return "aborted"
}

// announceSecAgg carries out AnnounceSecAgg: the announcement with the
// phase and its broadcast, and in the masked phase every ShareList.
func (s *Server) announceSecAgg(d coordinator.AnnounceSecAgg) error {
	srv, err := s.secAggSession(d.Round, d.Attempt)
	if err != nil {
		return err
	}
	a, err := s.announcement(d.Round, d.Selected, d.Deadline)
	if err != nil {
		return err
	}
	a.SecaggPhase = wire.SecAggPhase(d.Phase)
	a.Global = nil // the sites taking part have it: no need to send it four times
	for _, o := range srv.Pending() {
		if o.To == "" {
			a.SecaggBroadcast = secagg.Encode(o.Msg)
			if kl, ok := o.Msg.(*secagg.KeyList); ok {
				signed, err := s.signedKeys(d.Round, d.Attempt, kl)
				if err != nil {
					return err
				}
				if len(signed) > 0 {
					a.SecaggSignedKeys = uplink.EncodeSignedKeys(signed)
				}
			}
			if req, ok := o.Msg.(*secagg.UnmaskRequest); ok && d.Phase == coordinator.SecAggUnmask {
				// The views and the survivor signatures go with the unmask
				// only: a survivor's signature of U3 binds its view, so the
				// consistency round needs neither.
				views, err := s.viewSignatures(d.Round, d.Attempt, req.Survivors)
				if err != nil {
					return err
				}
				if len(views) > 0 {
					a.SecaggViewSignatures = uplink.EncodeSignedKeys(views)
				}
				sigs, err := s.survivorSignatures(d.Round, d.Attempt, req.Survivors)
				if err != nil {
					return err
				}
				if len(sigs) > 0 {
					a.SecaggSurvivorSignatures = uplink.EncodeSignedKeys(sigs)
				}
			}
		}
	}
	b, err := wire.Encode(a)
	if err != nil {
		return fmt.Errorf("aggregator: encode the secagg announcement of round %d: %w", d.Round, err)
	}
	s.mu.Lock()
	online := s.view.online
	s.mu.Unlock()
	s.hist.sent(uint64(len(b)) * uint64(max(online, 1)))
	s.log.Info("secagg phase announced", "round", d.Round, "attempt", d.Attempt, "phase", secAggPhaseName(d.Phase),
		"deadline", d.Deadline.UTC().Format(time.RFC3339), "bytes", len(b))
	s.publish(s.topics.Round(), true, b, "secagg announcement")
	if d.Phase == coordinator.SecAggMasked {
		s.publishShareLists("")
	}
	return nil
}

// signedKeys is the KeyList's signed advertisements, as the sites sent them
// (their stored AdvertiseKeys envelopes), to relay with it: each site with
// a client certificate checks every key against them (uplink.CheckKeyList;
// docs/privacy.md, "Threat model per mode"). The aggregator relays; it
// neither needs nor checks the signatures.
func (s *Server) signedKeys(round, attempt int, kl *secagg.KeyList) ([]uplink.SignedKey, error) {
	recs, err := s.store.SecAggMessages(uint64(round), uint32(attempt))
	if err != nil {
		s.storageErrors.Add(1)
		return nil, fmt.Errorf("aggregator: round %d: the stored advertisements: %w", round, err)
	}
	listed := make(map[string]bool, len(kl.Sites))
	for _, k := range kl.Sites {
		listed[k.ID] = true
	}
	var signed []uplink.SignedKey
	for _, rec := range recs {
		if rec.Kind != uint8(secagg.KindAdvertiseKeys) || !listed[rec.ClientID] {
			continue
		}
		m, err := wire.DecodeSecAgg(rec.Msg, s.lim)
		if err != nil {
			return nil, fmt.Errorf("aggregator: round %d: the stored AdvertiseKeys of %q: %w", round, rec.ClientID, err)
		}
		if len(m.Certificate) > 0 {
			signed = append(signed, uplink.SignedKey{ID: rec.ClientID, Cert: m.Certificate, Sig: m.Signature})
		}
	}
	slices.SortFunc(signed, func(a, b uplink.SignedKey) int { return strings.Compare(a.ID, b.ID) })
	return signed, nil
}

// viewSignatures is the survivors' signed views of the session (their
// masked inputs' view signatures, with the certificates of their
// advertisements), to relay with the UnmaskRequest: each site with a client
// certificate reveals nothing unless every survivor signed its own view
// (uplink.CheckViews). Survivors without one are left out (the signing
// sites then refuse).
func (s *Server) viewSignatures(round, attempt int, survivors []string) ([]uplink.SignedKey, error) {
	recs, err := s.store.SecAggMessages(uint64(round), uint32(attempt))
	if err != nil {
		s.storageErrors.Add(1)
		return nil, fmt.Errorf("aggregator: round %d: the stored view signatures: %w", round, err)
	}
	certs, sigs := map[string][]byte{}, map[string][]byte{}
	for _, rec := range recs {
		switch {
		case rec.Kind == aggstore.SecAggViewKind:
			sigs[rec.ClientID] = rec.Msg
		case rec.Kind == uint8(secagg.KindAdvertiseKeys):
			m, err := wire.DecodeSecAgg(rec.Msg, s.lim)
			if err != nil {
				return nil, fmt.Errorf("aggregator: round %d: the stored AdvertiseKeys of %q: %w", round, rec.ClientID, err)
			}
			certs[rec.ClientID] = m.Certificate
		}
	}
	var out []uplink.SignedKey
	for _, id := range survivors {
		if len(sigs[id]) > 0 && len(certs[id]) > 0 {
			out = append(out, uplink.SignedKey{ID: id, Cert: certs[id], Sig: sigs[id]})
		}
	}
	return out, nil
}

// publishShareLists sends the open session's ShareLists in the masked
// phase: to every site of U2 (to ""), or to one.
func (s *Server) publishShareLists(to string) {
	srv, round, attempt := s.secAgg.openSession()
	if srv == nil || srv.Phase() != secagg.PhaseMasked {
		return
	}
	for _, o := range srv.Pending() {
		if o.To == "" || (to != "" && o.To != to) {
			continue
		}
		topic, err := s.topics.Receipt(o.To)
		if err != nil {
			continue
		}
		b, err := wire.Encode(&wire.SecAggMessage{ClientId: o.To, RunId: s.stored.RunID, Round: uint64(round), Attempt: uint32(attempt),
			Kind: uint32(secagg.KindShareList), Payload: secagg.Encode(o.Msg), SentAtUnixMs: s.clock.Now().UnixMilli()})
		if err != nil {
			s.log.Error("encoding a share list", "client", o.To, "err", err)
			continue
		}
		s.hist.sent(uint64(len(b)))
		s.publish(topic, false, b, "secagg share list")
	}
}

// secAggAggregate is the closed round's next global model: the uniform mean
// of the sum over U3 (its contributors).
func (s *Server) secAggAggregate(cr coordinator.CloseRound) ([]float64, aggregate.Report, error) {
	attempt, _, _ := s.coord.SecAggSession()
	srv, err := s.secAggSession(cr.Round, attempt)
	if err != nil {
		return nil, aggregate.Report{}, err
	}
	sum, err := srv.Sum()
	if err != nil {
		return nil, aggregate.Report{}, fmt.Errorf("aggregator: round %d: %w", cr.Round, err)
	}
	if !slices.Equal(srv.Survivors(), cr.Contributors) {
		return nil, aggregate.Report{}, fmt.Errorf("aggregator: round %d: the sum is over %v, the round's contributors are %v", cr.Round, srv.Survivors(), cr.Contributors)
	}
	_, q, err := uplink.SecAggSetup(s.secAgg.spec(attempt), s.dim)
	if err != nil {
		return nil, aggregate.Report{}, err
	}
	if s.sum != nil {
		return s.secAggSumAggregate(cr, attempt, q, sum)
	}
	out, err := uplink.SecAggMean(q, s.global, sum, len(cr.Contributors))
	if err != nil {
		return nil, aggregate.Report{}, fmt.Errorf("aggregator: round %d: %w", cr.Round, err)
	}
	return out, aggregate.Report{Metrics: map[string]float64{"secagg_sites": float64(len(cr.Contributors))}}, nil
}

// restoreSecAgg rebuilds the open session's server after a restart
// (secAggRun.restore).
func (s *Server) restoreSecAgg() error {
	return s.secAgg.restore(s.coord, s.store, s.cfg.StatePath, s.dim, s.stored.RunID)
}

// restore rebuilds the open session's server after a restart from the
// round log at path: its stored state (if it is the coordinator's
// session) plus the stored messages of the open phase that the
// coordinator counted, taken again.
func (a *secAggRun) restore(coord *coordinator.Coordinator, store *aggstore.AggStore, path string, dim int, runID string) error {
	if a == nil {
		return nil
	}
	attempt, _, ok := coord.SecAggSession()
	if !ok {
		return nil
	}
	round := coord.Round()
	r, at, st, err := store.SecAggServer()
	switch {
	case errors.Is(err, storage.ErrNotFound):
	case err != nil:
		return err
	case r == uint64(round) && at == uint32(attempt):
		srv, err := secagg.UnmarshalServer(st)
		if err != nil {
			return fmt.Errorf("aggregator: %s: the secure aggregation's server state: %w", path, err)
		}
		a.srv, a.round, a.attempt = srv, round, attempt
	}
	recs, err := store.SecAggMessages(uint64(round), uint32(attempt))
	if err != nil {
		return err
	}
	if len(recs) == 0 {
		return nil
	}
	srv, err := a.session(round, attempt, dim, runID)
	if err != nil {
		return err
	}
	taken := 0
	for _, rec := range recs {
		if rec.Kind == uplink.SecAggKindSurvivors {
			continue // not the server's: relayed from the store (survivorSignatures)
		}
		if !coord.SecAggCounted(rec.ClientID, int(rec.Kind)) {
			// Not counted by the restored coordinator (its replay did not
			// accept it: the configuration changed), or of a phase the
			// stored server state is past: not taken again.
			continue
		}
		m, err := wire.DecodeSecAgg(rec.Msg, a.lim)
		if err != nil {
			return fmt.Errorf("aggregator: %s: a stored secagg message of %q: %w", path, rec.ClientID, err)
		}
		p, err := secagg.Decode(m.Payload)
		if err != nil {
			return fmt.Errorf("aggregator: %s: a stored secagg message of %q: %w", path, rec.ClientID, err)
		}
		if err := srv.Receive(p); err != nil {
			// Of a phase the stored state is past (the advance was stored,
			// the messages' deletion with it): nothing to take again.
			a.log.Debug("stored secagg message not taken again", "client", rec.ClientID, "kind", rec.Kind, "err", err)
			continue
		}
		taken++
	}
	a.log.Info("secure aggregation resumed", "round", round, "attempt", attempt, "phase", srv.Phase().String(), "messages_replayed", taken)
	return nil
}

// text is the run's setting as resumeDiffs compares and names it.
func (a *secAggRun) text() string {
	if a == nil {
		return secAggText(nil)
	}
	return secAggText(&a.cfg)
}

// secAggText is a secure-aggregation setting as resumeDiffs compares and
// names it.
func secAggText(c *SecAggConfig) string {
	if c == nil {
		return "off"
	}
	return fmt.Sprintf("clip %g, scale 2^%d, threshold %d, timeout %v", c.Clip, c.ScaleBits, c.Threshold, c.Timeout)
}

// SecAggStatus is a --secagg run's secure aggregation, as `status`,
// /status and /metrics report it: the open round's session (attempt) and
// phase, the sessions aborted so far and why the last one did, and the
// settings.
type SecAggStatus struct {
	Phase     string  `json:"phase"` // advertise | share-keys | masked-input | consistency | unmask
	Attempt   int     `json:"attempt"`
	Deadline  string  `json:"deadline,omitempty"` // of the phase after the advertise phase (RFC 3339)
	Messages  uint64  `json:"messages"`
	Aborts    uint64  `json:"aborts"`
	LastAbort string  `json:"last_abort,omitempty"`
	Threshold int     `json:"threshold"`
	Clip      float64 `json:"clip"`
	ScaleBits int     `json:"scale_bits"`
	// Model is the security model of the last key list announced
	// (docs/privacy.md, "Threat model per mode"): "signed" when every site
	// of it signed its keys with its client certificate (the sites then
	// verify every key against the federation CA), "honest-but-curious"
	// otherwise; empty before the first key list. SignedKeys of
	// ListedKeys sites signed; kept with the coordinator's state
	// (SecAggState), so `status` reads it from a stopped aggregator's file.
	Model      string `json:"model,omitempty"`
	SignedKeys int    `json:"signed_keys,omitempty"`
	ListedKeys int    `json:"listed_keys,omitempty"`
}

// The security models SecAggStatus.Model names.
const (
	SecAggModelSigned = "signed"
	SecAggModelHBC    = "honest-but-curious"
)

func newSecAggStatus(c *SecAggConfig, st *coordinator.SecAggState, phase coordinator.Phase, ctr coordinator.Counters) *SecAggStatus {
	out := &SecAggStatus{Phase: secagg.PhaseAdvertise.String(), Messages: ctr.SecAggMessages, Aborts: ctr.SecAggAborts,
		Threshold: c.Threshold, Clip: c.Clip, ScaleBits: c.ScaleBits}
	if st != nil {
		out.Attempt, out.LastAbort = st.Attempt, st.LastAbort
		out.SignedKeys, out.ListedKeys = st.SignedKeys, st.ListedKeys
		switch {
		case st.ListedKeys == 0:
		case st.SignedKeys == st.ListedKeys:
			out.Model = SecAggModelSigned
		default:
			out.Model = SecAggModelHBC
		}
		if phase == coordinator.PhaseSecAgg {
			out.Phase = secAggPhaseName(st.Phase)
			if st.Advancing {
				out.Phase = secAggPhaseName(min(st.Phase+1, coordinator.SecAggUnmask+1))
			}
			if !st.Deadline.IsZero() && !st.Advancing {
				out.Deadline = st.Deadline.UTC().Format(time.RFC3339)
			}
		}
	}
	return out
}

// secAggStatus is the running coordinator's (nil without --secagg).
func (s *Server) secAggStatus() *SecAggStatus { return s.secAgg.status(s.coord) }

// status is the status section of the running coordinator's secure
// aggregation (nil without it).
func (a *secAggRun) status(coord *coordinator.Coordinator) *SecAggStatus {
	if a == nil {
		return nil
	}
	return newSecAggStatus(&a.cfg, coord.SnapshotSecAgg(), coord.Phase(), coord.Counters())
}

// secAggFamilies are the /metrics families of p (none when nil).
func secAggFamilies(p *SecAggStatus) []metrics.Family {
	if p == nil {
		return nil
	}
	var phases []metrics.Sample
	for _, ph := range []string{secagg.PhaseAdvertise.String(), secagg.PhaseShareKeys.String(), secagg.PhaseMasked.String(), secAggPhaseName(coordinator.SecAggConsistency), secagg.PhaseUnmask.String()} {
		phases = append(phases, metrics.Sample{Labels: []metrics.Label{{Name: "phase", Value: ph}}, Value: b2f(p.Phase == ph)})
	}
	return []metrics.Family{
		{Name: ns + "secagg_phase", Help: "Secure aggregation: 1 for the open round's phase.", Type: metrics.Gauge, Samples: phases},
		metrics.One(ns+"secagg_attempt", "Secure aggregation: the open round's session (sessions aborted in this round).", metrics.Gauge, float64(p.Attempt)),
		metrics.One(ns+"secagg_messages_total", "Secure aggregation: sites' messages accepted and stored.", metrics.Counter, float64(p.Messages)),
		metrics.One(ns+"secagg_aborts_total", "Secure aggregation: sessions aborted without a sum (too few sites left, a tampered share); the round drew a new session.", metrics.Counter, float64(p.Aborts)),
	}
}

// secAggPhaseName is the status's name of a coordinator phase: the
// secagg.Server's names, and "consistency" for the signed round in
// between, which the server does not have.
func secAggPhaseName(p int) string {
	if p == coordinator.SecAggConsistency {
		return "consistency"
	}
	if p == coordinator.SecAggUnmask+1 {
		return secagg.PhaseDone.String()
	}
	return secagg.Phase(p).String()
}

// consistencyAdvanced closes the consistency round: the survivors stay
// U3, and fewer than t signatures of it abort the session, naming the
// sites that refused (their site errors).
func (s *Server) consistencyAdvanced(d coordinator.SecAggAdvance, srv *secagg.Server) coordinator.SecAggAdvanced {
	ev := coordinator.SecAggAdvanced{Round: d.Round, Attempt: d.Attempt, Phase: d.Phase, At: s.clock.Now(), Next: srv.Survivors()}
	sigs, err := s.survivorSignatures(d.Round, d.Attempt, ev.Next)
	t := s.secAgg.threshold()
	switch {
	case err != nil:
		ev.Err = "secagg: " + err.Error()
	case len(sigs) < t:
		ev.Err = fmt.Sprintf("secagg: %d of %d survivors signed the survivor set, threshold %d", len(sigs), len(ev.Next), t) + s.secAggRefusals()
	}
	s.log.Info("secagg phase closed", "round", d.Round, "attempt", d.Attempt, "phase", secAggPhaseName(d.Phase), "signed", len(sigs), "sites", len(ev.Next))
	return ev
}

// survivorSignatures is the consistency round's signatures of the
// survivors (their kind 9 messages, with the certificates of their
// advertisements), to relay with the UnmaskRequest: each signing site
// reveals nothing unless at least t of them sign its own survivor set and
// view and every one verifies (uplink.CheckSurvivors).
func (s *Server) survivorSignatures(round, attempt int, survivors []string) ([]uplink.SignedKey, error) {
	recs, err := s.store.SecAggMessages(uint64(round), uint32(attempt))
	if err != nil {
		s.storageErrors.Add(1)
		return nil, fmt.Errorf("aggregator: round %d: the stored survivor signatures: %w", round, err)
	}
	certs, sigs := map[string][]byte{}, map[string][]byte{}
	for _, rec := range recs {
		if rec.Kind != uplink.SecAggKindSurvivors && rec.Kind != uint8(secagg.KindAdvertiseKeys) {
			continue
		}
		m, err := wire.DecodeSecAgg(rec.Msg, s.lim)
		if err != nil {
			return nil, fmt.Errorf("aggregator: round %d: a stored secagg message of %q: %w", round, rec.ClientID, err)
		}
		if rec.Kind == uplink.SecAggKindSurvivors {
			sigs[rec.ClientID] = m.SurvivorsSignature
		} else {
			certs[rec.ClientID] = m.Certificate
		}
	}
	var out []uplink.SignedKey
	for _, id := range survivors {
		if len(sigs[id]) > 0 && len(certs[id]) > 0 {
			out = append(out, uplink.SignedKey{ID: id, Cert: certs[id], Sig: sigs[id]})
		}
	}
	return out, nil
}

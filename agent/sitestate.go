package agent

import (
	"context"
	"errors"
	"time"

	"github.com/edgefl/edgefl/sitedata"
	"github.com/edgefl/edgefl/storage"
	"github.com/edgefl/edgefl/wire"
)

// This file is the agent's side of a federation with a schema (issue 11):
// statistics and evaluation reports re-sent until receipted, the site error
// its statuses carry, and the end of a run.

// sendUplink publishes a statistics or evaluation message and keeps it
// until the aggregator receipts it: re-sent after a backoff doubling from
// ReconnectMin to ReconnectMax, and on every reconnection. (The
// announcement asking for it is retained: after a restart it is made
// again.) It is RoundHandler.Emit.
func (a *Agent) sendUplink(o Outgoing) {
	k := uplinkKey{subject: o.Subject, round: o.Round}
	a.mu.Lock()
	if a.closing {
		a.mu.Unlock()
		return
	}
	if a.uplinks == nil {
		a.uplinks = map[uplinkKey]*pendingUplink{}
	}
	p := a.uplinks[k]
	if p == nil {
		p = &pendingUplink{}
		a.uplinks[k] = p
	} else if p.timer != nil && p.timer.Stop() {
		a.inflight.Done()
	}
	p.run, p.msg, p.attempts, p.timer = o.RunID, o.Msg, 0, nil
	a.scheduleUplinkLocked(k, p)
	a.mu.Unlock()
	a.publishUplink(k, o.Msg)
}

// scheduleUplinkLocked arms p's re-send timer (a.mu held).
func (a *Agent) scheduleUplinkLocked(k uplinkKey, p *pendingUplink) {
	d := a.cfg.ReconnectMin
	for i := 0; i < p.attempts && d < a.cfg.ReconnectMax; i++ {
		d *= 2
	}
	d = min(d, a.cfg.ReconnectMax)
	p.attempts++
	a.inflight.Add(1)
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		defer a.inflight.Done()
		a.mu.Lock()
		cur := a.uplinks[k]
		if a.closing || cur != p || p.timer != t {
			a.mu.Unlock()
			return // receipted, replaced or shutting down meanwhile
		}
		msg := p.msg
		a.scheduleUplinkLocked(k, p)
		a.mu.Unlock()
		a.log.Info("re-sending an unreceipted "+subjectName(k.subject), "round", k.round, "attempt", p.attempts)
		a.publishUplink(k, msg)
	})
	p.timer = t
}

// publishUplink publishes on the site's update topic (QoS 1, not retained).
func (a *Agent) publishUplink(k uplinkKey, msg []byte) {
	if !a.enter() {
		return
	}
	if k.subject == wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS {
		a.stats.statisticsSent.Add(1)
	} else {
		a.stats.evaluationsSent.Add(1)
	}
	tok := a.client.Publish(a.tUpdate, 1, false, msg)
	go func() {
		defer a.leave()
		ctx, cancel := context.WithTimeout(a.runCtx, a.cfg.PublishTimeout)
		defer cancel()
		if err := a.await(ctx, tok); err != nil {
			if a.runCtx.Err() == nil {
				a.log.Warn(subjectName(k.subject)+" not acknowledged by the broker; re-sent later", "round", k.round, "err", err)
			}
			return
		}
		a.observe(Event{Kind: EventUplink, Subject: k.subject, Round: k.round})
	}()
}

func subjectName(s wire.ReceiptSubject) string {
	if s == wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS {
		return "statistics"
	}
	return "evaluation report"
}

// isReceipted is RoundHandler.Receipted.
func (a *Agent) isReceipted(subject wire.ReceiptSubject, run string, round uint64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.receipted[uplinkKey{subject: subject, round: round}]
	return ok && r == run
}

// resendUplinks publishes every unreceipted statistics and evaluation
// message again (on a reconnection).
func (a *Agent) resendUplinks() {
	type out struct {
		k   uplinkKey
		msg []byte
	}
	var all []out
	a.mu.Lock()
	for k, p := range a.uplinks {
		all = append(all, out{k, p.msg})
	}
	a.mu.Unlock()
	for _, o := range all {
		a.log.Info("re-sending an unreceipted "+subjectName(o.k.subject), "round", o.k.round)
		a.publishUplink(o.k, o.msg)
	}
}

// dropUplinksLocked forgets the pending and receipted messages of the runs
// drop says (a.mu held).
func (a *Agent) dropUplinksLocked(drop func(run string) bool) {
	for k, p := range a.uplinks {
		if drop(p.run) {
			if p.timer != nil && p.timer.Stop() {
				a.inflight.Done()
			}
			delete(a.uplinks, k)
		}
	}
	for k, run := range a.receipted {
		if drop(run) {
			delete(a.receipted, k)
		}
	}
}

// onUplinkReceipt handles the receipt of a statistics or evaluation
// message: accepted (stored or duplicate) ends its re-sending; INTERNAL
// keeps it (the backoff goes on); another rejection drops it, logged.
func (a *Agent) onUplinkReceipt(r *wire.Receipt) {
	k := uplinkKey{subject: r.GetSubject(), round: r.Round}
	lg := a.log.With("round", r.Round, "code", r.Code.String())
	a.mu.Lock()
	p := a.uplinks[k]
	switch {
	case r.Accepted || r.Code != wire.ReceiptCode_RECEIPT_CODE_INTERNAL:
		if p != nil {
			if p.timer != nil && p.timer.Stop() {
				a.inflight.Done()
			}
			delete(a.uplinks, k)
			if r.Accepted {
				if a.receipted == nil {
					a.receipted = map[uplinkKey]string{}
				}
				a.receipted[k] = p.run
			}
		}
	}
	a.mu.Unlock()
	switch {
	case r.Accepted:
		a.stats.receiptsAccepted.Add(1)
		lg.Info(subjectName(k.subject)+" receipted", "had_pending", p != nil)
	case r.Code == wire.ReceiptCode_RECEIPT_CODE_INTERNAL:
		a.stats.receiptsRetry.Add(1)
		lg.Warn("aggregator failed to store the "+subjectName(k.subject)+"; re-sent later", "reason", r.Reason)
	default:
		a.stats.receiptsRejected.Add(1)
		lg.Warn(subjectName(k.subject)+" rejected by the aggregator; dropped", "reason", r.Reason)
	}
	a.observe(Event{Kind: EventReceipt, Subject: k.subject, Round: r.Round, Accepted: r.Accepted})
}

// setSiteError records why this site cannot take part, logs it at ERROR
// when it is new (the full text, which may name a cell's value: the local
// log only) and publishes the retained status carrying its reason and
// public message (no data values).
func (a *Agent) setSiteError(se *sitedata.SiteError, ann *wire.RoundAnnouncement) {
	a.mu.Lock()
	old := a.siteErr
	same := old != nil && old.Reason == se.Reason && old.Public() == se.Public()
	a.siteErr = se
	a.mu.Unlock()
	if same {
		a.log.Debug("site error persists", "reason", se.Reason, "round", ann.Round)
		return
	}
	a.log.Error("this site cannot take part; the aggregator is told", "reason", se.Reason, "err", se.Error(),
		"round", ann.Round, "phase", ann.GetPhase().String())
	a.publishStatus()
	a.observe(Event{Kind: EventSiteError, Err: se})
}

// clearSiteError ends a site error after a successful announcement;
// keepData keeps an error about the site's data (the announcement did not
// read it).
func (a *Agent) clearSiteError(keepData bool) {
	a.mu.Lock()
	old := a.siteErr
	if old == nil || keepData && dataError(old.Reason) {
		a.mu.Unlock()
		return
	}
	a.siteErr = nil
	a.mu.Unlock()
	a.log.Info("site error over; this site takes part again", "was", old.Reason)
	a.publishStatus()
	a.observe(Event{Kind: EventSiteError})
}

// publishStatus publishes the retained online status now (sample count,
// site error) when connected.
func (a *Agent) publishStatus() {
	if !a.enter() {
		return
	}
	if !a.client.IsConnectionOpen() {
		a.leave() // the next connection publishes it
		return
	}
	b, err := a.statusMsg(true, false, a.conn.Load())
	if err != nil {
		a.leave()
		a.log.Error("status message", "err", err)
		return
	}
	tok := a.client.Publish(a.tStatus, 1, true, b)
	go func() {
		defer a.leave()
		ctx, cancel := context.WithTimeout(a.runCtx, a.cfg.PublishTimeout)
		defer cancel()
		if err := a.await(ctx, tok); err != nil && a.runCtx.Err() == nil {
			a.log.Warn("status not published", "err", err)
		}
	}()
}

// runFinished is the end of a run: log it once, stop re-sending, and stay
// quiet until another run is announced.
func (a *Agent) runFinished(ann *wire.RoundAnnouncement, res Result) {
	a.mu.Lock()
	a.finished, a.finishedRun = true, ann.RunId
	a.dropUplinksLocked(func(string) bool { return true })
	a.mu.Unlock()
	if f := res.Final; f != nil {
		a.log.Info("federation finished; final model written", "path", a.cfg.ModelOut, "digest", f.Digest,
			"round", f.Round, "run_id", f.RunID, "bytes", len(f.Bundle))
	} else {
		a.log.Info("federation finished", "round", ann.Round, "run_id", ann.RunId)
	}
	a.observe(Event{Kind: EventFinished, Round: ann.Round})
}

// restoreFinal, at start: a stored final bundle means its run has ended
// for this site; model_out is rewritten if it does not hold the bundle. A
// model_out that cannot be written is a site error (disk), not a reason
// not to run.
func (a *Agent) restoreFinal(store *storage.EdgeStore) error {
	f, err := store.Final()
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return nil
	case err != nil:
		return err
	}
	a.mu.Lock()
	a.finished, a.finishedRun = true, f.RunID
	a.mu.Unlock()
	wrote, err := a.handler.RestoreModelOut(f)
	var se *sitedata.SiteError
	switch {
	case errors.As(err, &se):
		a.mu.Lock()
		a.siteErr = se
		a.mu.Unlock()
		a.log.Error("this site cannot take part; the aggregator is told", "reason", se.Reason, "err", se.Error())
	case err != nil:
		return err
	case wrote:
		a.log.Info("final model of the finished run restored to model_out", "path", a.cfg.ModelOut, "digest", f.Digest, "run_id", f.RunID)
	}
	return nil
}

// dataError reports a site error about the site's data file, which only
// reading the data again can clear.
func dataError(reason string) bool {
	switch reason {
	case sitedata.ReasonSchema, sitedata.ReasonBadValue, sitedata.ReasonUnknownLabel, sitedata.ReasonTooFewRows, sitedata.ReasonData:
		return true
	}
	return false
}

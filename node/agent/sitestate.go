package agent

import (
	"encoding/json"
	"errors"
	"slices"

	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/wire"
)

// This file is the agent's side of a federation with a schema:
// statistics and evaluation reports re-sent until receipted, the site error
// its statuses carry, and the end of a run.

// sendUplink hands a statistics or evaluation message to the session,
// which publishes it and keeps it until the aggregator receipts it
// (session.emitted). It is RoundHandler.Emit.
func (a *Agent) sendUplink(o Outgoing) { a.step(emitted{out: o}) }

// sendUplinkMsg publishes a statistics or evaluation message the session
// decided to send.
func (a *Agent) sendUplinkMsg(act action) {
	k := act.key
	switch act.why {
	case sendRetry:
		a.log.Info("re-sending an unreceipted "+subjectName(k.subject), "round", k.round, "attempt", act.attempt)
	case sendReconnect:
		a.log.Info("re-sending an unreceipted "+subjectName(k.subject), "round", k.round)
	}
	a.publishUplink(k, act.msg)
}

// publishUplink publishes on the site's update topic (QoS 1, not retained).
func (a *Agent) publishUplink(k pendingKey, msg []byte) {
	if !a.enter() {
		return
	}
	if k.subject == wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS {
		a.stats.statisticsSent.Add(1)
	} else {
		a.stats.evaluationsSent.Add(1)
	}
	a.publishAsync(a.tUpdate, false, msg, func(err error) {
		if err != nil {
			a.log.Warn(subjectName(k.subject)+" not acknowledged by the broker; re-sent later", "round", k.round, "err", err)
			return
		}
		a.observe(Event{Kind: EventUplink, Subject: k.subject, Round: k.round})
	})
}

func subjectName(s wire.ReceiptSubject) string {
	switch s {
	case wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS:
		return "statistics"
	case wire.ReceiptSubject_RECEIPT_SUBJECT_SECAGG:
		return "secagg message"
	}
	return "evaluation report"
}

// siteErrorSet logs a site error (at ERROR when it is new: the full text,
// which may name a cell's value, goes to the local log only) and publishes
// the retained status carrying its reason and public message (no data
// values).
func (a *Agent) siteErrorSet(se *sitedata.SiteError, ann *wire.RoundAnnouncement, same bool) {
	if same {
		a.log.Debug("site error persists", "reason", se.Reason, "round", ann.Round)
		return
	}
	if se.Reason == sitedata.ReasonSecAgg {
		a.stats.secAggRefusals.Add(1)
	}
	a.log.Error("this site cannot take part; the aggregator is told", "reason", se.Reason, "err", se.Error(),
		"round", ann.Round, "phase", ann.GetPhase().String())
	a.publishStatus()
	a.observe(Event{Kind: EventSiteError, Err: se})
}

// siteErrorCleared tells that the site error "was" is over.
func (a *Agent) siteErrorCleared(was *sitedata.SiteError) {
	a.log.Info("site error over; this site takes part again", "was", was.Reason)
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
	a.publishAsync(a.tStatus, true, b, func(err error) {
		if err != nil {
			a.log.Warn("status not published", "err", err)
		}
	})
}

// notInPreprocessing is what a site is told when its statistics are not
// among those the federation's preprocessing was fitted from.
const notInPreprocessing = "this site's statistics are not in the federation's preprocessing: it joined after the statistics phase, so the preprocessing (means, levels, scales) was fitted from the other sites' rows and this site trained and evaluated with it"

// notInPreprocessingNow is the same, told when the site reads the run's
// fitted preprocessing (wire.RunSpec.statistics_sites), before it trains.
const notInPreprocessingNow = "this site's statistics are not in the federation's preprocessing: it joined after the statistics phase, so the preprocessing (means, levels, scales) was fitted from the other sites' rows; this site trains and evaluates with it"

// statisticsSites reads a bundle's provenance.statistics_sites (nil when
// there are none or the bundle does not parse: it was verified before).
func statisticsSites(raw []byte) []string {
	var b struct {
		Provenance struct {
			StatisticsSites []string `json:"statistics_sites"`
		} `json:"provenance"`
	}
	if json.Unmarshal(raw, &b) != nil {
		return nil
	}
	return b.Provenance.StatisticsSites
}

// runFinished logs the end of a run (the session stops re-sending and
// stays quiet until another run is announced).
func (a *Agent) runFinished(ann *wire.RoundAnnouncement, res Result) {
	if f := res.Final; f != nil {
		args := []any{"path", a.cfg.ModelOut, "digest", f.Digest, "round", f.Round, "run_id", f.RunID, "bytes", len(f.Bundle)}
		if d := ann.GetDp(); d != nil {
			// The guarantee the bundle records (docs/privacy.md).
			args = append(args, "dp_epsilon", d.GetEpsilonSpent(), "dp_delta", d.GetDelta())
		}
		a.log.Info("federation finished; final model written", args...)
		if sites := statisticsSites(f.Bundle); len(sites) > 0 && !slices.Contains(sites, a.cfg.SiteID) {
			a.log.Warn(notInPreprocessing+" (the final bundle's provenance names the sites that shaped it)", "statistics_sites", sites)
		}
	} else {
		a.log.Info("federation finished", "round", ann.Round, "run_id", ann.RunId)
	}
	a.observe(Event{Kind: EventFinished, Round: ann.Round})
}

// restoreFinal, at start: a stored final bundle means its run has ended
// for this site; model_out is rewritten if it does not hold the bundle. A
// model_out that cannot be written is a site error (disk), not a reason
// not to run.
func (a *Agent) restoreFinal(store *edgestore.EdgeStore) error {
	f, err := store.Final()
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return nil
	case err != nil:
		return err
	}
	wrote, err := a.handler.RestoreModelOut(f)
	var se *sitedata.SiteError
	if err == nil || errors.As(err, &se) {
		a.step(finalRestored{run: f.RunID, siteErr: se})
	}
	switch {
	case se != nil:
		a.log.Error("this site cannot take part; the aggregator is told", "reason", se.Reason, "err", se.Error())
	case err != nil:
		return err
	case wrote:
		a.log.Info("final model of the finished run restored to model_out", "path", a.cfg.ModelOut, "digest", f.Digest, "run_id", f.RunID)
	}
	return nil
}

// writeModelOut writes the stored final bundle to model_out again after a
// failed write (the session's actWriteModelOut, on its backoff timer):
// freeing space on a full disk is enough for the model to arrive.
func (a *Agent) writeModelOut(attempt int) {
	f, err := a.store.Final()
	if err == nil {
		_, err = a.handler.RestoreModelOut(f)
	}
	if err != nil {
		a.log.Warn("model_out still cannot be written; trying again later", "path", a.cfg.ModelOut, "attempt", attempt, "err", err)
	} else {
		a.log.Info("final model written to model_out", "path", a.cfg.ModelOut, "digest", f.Digest, "run_id", f.RunID, "attempt", attempt)
	}
	a.step(modelOutDone{run: f.RunID, err: err})
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

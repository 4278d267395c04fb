package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/edgefl/edgefl/node/edgestore"
	"os"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/prep"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/proto/wire"
)

// Outgoing is a statistics or evaluation message for the site's update
// topic, re-sent until the aggregator receipts (Subject, Round).
type Outgoing struct {
	Subject wire.ReceiptSubject // STATISTICS or EVALUATION
	RunID   string
	Round   uint64 // 0 for statistics; the eval round for an evaluation
	Msg     []byte // the encoded envelope
}

// ErrFinished is the cancellation cause of a local solve when the
// aggregator announces the end of the run: nothing is committed.
var ErrFinished = errors.New("agent: the aggregator finished the run")

// diskErr is a site error "disk" for a failure of the state file.
func (h *RoundHandler) diskErr(err error) error { return diskErrAt(h.Store, err) }

// solveErr is a site error "solve_failed", unless the solve was canceled
// (then the cancellation cause is wrapped, as Handle's callers expect).
func solveErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", err, context.Cause(ctx))
	}
	return sitedata.NewError(sitedata.ReasonSolveFailed, "", err)
}

// badTransform is a site error about the schema, transform or bundle the
// aggregator sent.
func badTransform(what string, err error) error {
	return &sitedata.SiteError{Reason: sitedata.ReasonBadTransform, Problem: what + " refused: " + err.Error(), Err: err}
}

// handleFederated handles what a federation with a schema announces, and
// the end of any run (PHASE_FINISHED):
//
//   - PHASE_STATISTICS: read the CSV by the schema (sitedata.Load) and
//     emit the SiteStatistics of the training rows;
//   - PHASE_TRAIN: the training data are sitedata's Data(transform), cached
//     per run, schema and transform; with evaluate, the EvalReport of the
//     global model on the held-out rows is emitted first (selected or
//     not); then the round is trained as without a schema;
//   - PHASE_FINISHED: the final evaluation when asked and no bundle yet;
//     with the bundle: verify it (bundle.Unmarshal checks the digest),
//     store it and write it atomically to ModelOut. Nothing is solved.
//
// A problem with the site's data is a *sitedata.SiteError (the agent
// publishes it in its status), as are a schema, transform or bundle
// refused (bad_transform), a solve that fails and a disk error.
func (h *RoundHandler) handleFederated(ctx context.Context, ann *wire.RoundAnnouncement, res Result, invited bool) (Result, error) {
	switch ann.GetPhase() {
	case wire.Phase_PHASE_STATISTICS:
		return h.statistics(ann, res)
	case wire.Phase_PHASE_FINISHED:
		return h.finish(ann, res)
	}
	s, err := h.schemaOf(ann)
	if err != nil {
		return res, err
	}
	if len(ann.GetTransform()) == 0 {
		return res, badTransform("announcement", errors.New("a training round with a schema but no transform"))
	}
	train, holdout, err := h.site.data(h, ann.RunId, s, ann.GetTransform())
	if err != nil {
		return res, err
	}
	if s.Declared() {
		// No statistics phase refused the site: the rule applies here.
		if err := h.site.site.site.EnoughRows(); err != nil {
			return res, err
		}
	}
	res.SampleCount = train.N
	if ann.GetEvaluate() {
		if err := h.evaluate(ann, holdout, &res); err != nil {
			return res, err
		}
	}
	if train.N == 0 {
		return res, &sitedata.SiteError{Reason: sitedata.ReasonTooFewRows, File: h.DataFile, Problem: "no training rows", Expected: "at least one training row"}
	}
	return h.train(ctx, ann, train, res, invited)
}

// schemaOf parses the announced schema.
func (h *RoundHandler) schemaOf(ann *wire.RoundAnnouncement) (*schema.Schema, error) {
	if h.DataFile == "" {
		return nil, &sitedata.SiteError{Reason: sitedata.ReasonData, Problem: "the federation reads the sites' data by a schema",
			Expected: "data = csv:PATH (this site's data is not a csv file)"}
	}
	s, err := schema.Parse(ann.GetSchema())
	if err != nil {
		return nil, badTransform("schema", err)
	}
	return s, nil
}

// statistics carries out the statistics phase: the site's data are read
// by the schema (the shell's I/O), then the core makes the SiteStatistics
// (siteRules.statistics).
func (h *RoundHandler) statistics(ann *wire.RoundAnnouncement, res Result) (Result, error) {
	s, err := h.schemaOf(ann)
	if err != nil {
		return res, err
	}
	if err := statisticsRefused(s); err != nil {
		return res, err
	}
	st, err := h.site.load(h, ann.RunId, s)
	if err != nil {
		return res, err
	}
	done := h.receipted(wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, ann.RunId, 0)
	return h.rules().statistics(ann, s, st.site, done, h.clock().Now(), res)
}

// evaluate adds the EvalReport of the announced global model on the
// held-out rows to res (siteRules.evaluation).
func (h *RoundHandler) evaluate(ann *wire.RoundAnnouncement, holdout model.Data, res *Result) error {
	done := h.receipted(wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION, ann.RunId, uint64(ann.GetEvalRound()))
	return h.rules().evaluation(ann, holdout, done, h.clock().Now(), res)
}

// finish carries out PHASE_FINISHED (see handleFederated): the core's
// plan (siteRules.finish) either has the stored bundle made sure of on
// disk, asks for the final evaluation, or stores the verified bundle
// (recFinal) and only then writes it to ModelOut.
func (h *RoundHandler) finish(ann *wire.RoundAnnouncement, res Result) (Result, error) {
	pl := h.rules().finish(h.Store, ann, res)
	switch {
	case pl.err != nil:
		return pl.res, pl.err
	case pl.restore != nil:
		if _, err := h.RestoreModelOut(*pl.restore); err != nil {
			return pl.base, err
		}
		return pl.res, nil
	case pl.finalEval:
		res = pl.res
		s, err := h.schemaOf(ann)
		if err != nil {
			return res, err
		}
		train, holdout, err := h.site.data(h, ann.RunId, s, ann.GetTransform())
		if err != nil {
			return res, err
		}
		res.SampleCount = train.N
		return res, h.evaluate(ann, holdout, &res)
	}
	if res, stop, err := h.commit(pl.records, pl.base); stop {
		return res, err
	}
	if pl.bundle != nil {
		if err := h.writeModelOut(pl.bundle); err != nil {
			return pl.base, err
		}
	}
	return pl.res, nil
}

// ErrModelOut is wrapped by the site error (disk) of a final bundle that
// is stored but could not be written to model_out (disk full, read-only):
// the agent writes it again later (session: modelOutKey) until it can.
var ErrModelOut = errors.New("model_out not written")

// writeModelOut writes the final bundle raw to model_out. When that fails,
// a model_out holding something else (the previous run's final model,
// which looks valid) is moved aside to model_out + ".stale", or removed
// when it cannot be moved, so that nothing takes it for this run's model;
// the error is a site error (disk) wrapping ErrModelOut.
func (h *RoundHandler) writeModelOut(raw []byte) error {
	write := h.WriteFile
	if write == nil {
		write = bundle.WriteFileAtomic
	}
	err := write(h.ModelOut, raw)
	if err == nil {
		return nil
	}
	if old, rerr := os.ReadFile(h.ModelOut); rerr == nil && !bytes.Equal(old, raw) {
		aside := h.ModelOut + ".stale"
		if merr := os.Rename(h.ModelOut, aside); merr != nil {
			aside = "(removed)"
			if merr := os.Remove(h.ModelOut); merr != nil {
				aside = "(could not be moved or removed: " + merr.Error() + ")"
			}
		}
		h.log().Warn("model_out held an older model (a previous run's): set aside so that it is not taken for this run's final model",
			"path", h.ModelOut, "moved_to", aside)
	}
	return sitedata.NewError(sitedata.ReasonDisk, h.ModelOut, fmt.Errorf("%w: %w", ErrModelOut, err))
}

// RestoreModelOut writes a stored final bundle to ModelOut unless the file
// already holds exactly its bytes (a crash between storing and writing, a
// deleted file or a new model_out path), verifying it first. It reports
// whether it wrote.
func (h *RoundHandler) RestoreModelOut(f edgestore.Final) (bool, error) {
	if old, err := os.ReadFile(h.ModelOut); err == nil && bytes.Equal(old, f.Bundle) {
		return false, nil
	}
	if _, err := bundle.Unmarshal(f.Bundle); err != nil {
		return false, sitedata.NewError(sitedata.ReasonDisk, h.Store.Path(), wrap("the stored final bundle", err))
	}
	if err := h.writeModelOut(f.Bundle); err != nil {
		return false, err
	}
	return true, nil
}

func (h *RoundHandler) receipted(subject wire.ReceiptSubject, run string, round uint64) bool {
	return h.Receipted != nil && h.Receipted(subject, run, round)
}

// flush hands the messages of res not handed yet to Emit: before a solve
// starts (an evaluation goes out before the round's solve) and when the
// announcement is handled.
func (h *RoundHandler) flush(res Result) {
	for ; h.emitted < len(res.Out); h.emitted++ {
		if h.Emit != nil {
			h.Emit(res.Out[h.emitted])
		}
	}
}

// siteCache holds the site's data as the federation's schema reads it:
// loaded once per run and schema, transformed once per transform.
type siteCache struct {
	key  string // run id, schema digest
	site *loadedSite

	trKey          [sha256.Size]byte // the transform's bytes
	train, holdout model.Data
}

// loadedSite is the site's CSV (and eval CSV) read by a schema.
type loadedSite struct {
	site *sitedata.Site
	eval *schema.Table // Config.EvalData's rows, nil without it
}

// load reads the site's data by s (cached per run and schema). With an
// eval file, every row of the data file is a training row and the eval
// file's rows are the held-out rows.
func (c *siteCache) load(h *RoundHandler, run string, s *schema.Schema) (*loadedSite, error) {
	key := run + "\x00" + s.Digest()
	if c.site != nil && c.key == key {
		return c.site, nil
	}
	c.key, c.site, c.trKey = "", nil, [sha256.Size]byte{}
	st, err := sitedata.Load(s, h.DataFile)
	if err != nil {
		return nil, err
	}
	ls := &loadedSite{site: st}
	if h.EvalFile != "" {
		st.TrainOnEvery()
		ev, err := sitedata.Load(s, h.EvalFile)
		if err != nil {
			return nil, err
		}
		ls.eval = ev.Table
	}
	lg := h.log()
	lg.Info("site data read by the federation schema", "file", h.DataFile, "eval_file", h.EvalFile,
		"schema", s.Digest()[:12], "rows", st.Table.Rows, "training_rows", len(st.Train), "held_out_rows", ls.heldOut())
	if len(st.Table.Extra) > 0 {
		lg.Info("columns the schema does not use are ignored", "file", h.DataFile, "columns", st.Table.Extra)
	}
	if h.DataLabel != "" && h.DataLabel != s.Label.Column {
		lg.Warn("data's label= is ignored: the federation schema names the label column", "label", h.DataLabel, "schema_label", s.Label.Column)
	}
	if st.Table.SingleClass() {
		lg.Warn("all of this site's rows are of one class (allowed; it trains and reports as usual)", "file", h.DataFile)
	}
	if ls.heldOut() == 0 {
		lg.Warn("no held-out rows: evaluation reports will say n = 0", "holdout", s.Holdout, "eval_file", h.EvalFile)
	}
	c.key, c.site = key, ls
	return ls, nil
}

func (ls *loadedSite) heldOut() int {
	if ls.eval != nil {
		return ls.eval.Rows
	}
	return len(ls.site.Holdout)
}

// data is the site's training and held-out data under the announced
// transform (JSON of prep.Transform), cached per run, schema and
// transform.
func (c *siteCache) data(h *RoundHandler, run string, s *schema.Schema, rawTr []byte) (train, holdout model.Data, err error) {
	ls, err := c.load(h, run, s)
	if err != nil {
		return train, holdout, err
	}
	key := sha256.Sum256(rawTr)
	if key == c.trKey {
		return c.train, c.holdout, nil
	}
	var tr prep.Transform
	dec := json.NewDecoder(bytes.NewReader(rawTr))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&tr); err != nil {
		return train, holdout, badTransform("transform", err)
	}
	if train, holdout, err = ls.site.Data(&tr); err != nil {
		return train, holdout, err
	}
	if ls.eval != nil {
		if holdout, err = ls.site.EvalData(&tr, ls.eval); err != nil {
			return train, holdout, err
		}
	}
	c.trKey, c.train, c.holdout = key, train, holdout
	return train, holdout, nil
}

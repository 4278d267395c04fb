package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/proto/wire"
	"github.com/edgefl/edgefl/testkit"
)

// startFedAgent runs an agent whose data is the CSV at csv, read by the
// federation's schema (data = csv:PATH, nothing loaded at start).
func startFedAgent(t *testing.T, url, state, csv string, mod func(*Config)) *runningAgent {
	t.Helper()
	return startFedAgentID(t, testSite, url, state, csv, mod)
}

func startFedAgentID(t *testing.T, id, url, state, csv string, mod func(*Config)) *runningAgent {
	t.Helper()
	cfg := DefaultConfig()
	cfg.SiteID, cfg.Federation, cfg.Brokers, cfg.StateFile = id, testFed, []string{url}, state
	cfg.Data = "csv:" + csv
	cfg.ReconnectMin, cfg.ReconnectMax = 100*time.Millisecond, time.Second
	if mod != nil {
		mod(&cfg)
	}
	return runAgent(t, cfg, nil)
}

// sameMsg reports whether two messages encode to the same bytes.
func sameMsg(t *testing.T, a, b wire.Message) bool {
	t.Helper()
	x, err := wire.Encode(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := wire.Encode(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(x, y)
}

func subjectReceipt(subject wire.ReceiptSubject, round uint64) *wire.Receipt {
	return &wire.Receipt{ClientId: testSite, Round: round, Accepted: true, StoredAtUnixMs: 1, Code: wire.ReceiptCode_RECEIPT_CODE_STORED, Subject: subject}
}

func (f *fakeAgg) nextStatistics() *wire.SiteStatistics {
	f.t.Helper()
	select {
	case s := <-f.statistics:
		return s
	case <-time.After(guard):
		f.t.Fatal("no statistics from the agent")
	}
	return nil
}

func (f *fakeAgg) nextEval() *wire.EvalReport {
	f.t.Helper()
	select {
	case e := <-f.evals:
		return e
	case <-time.After(guard):
		f.t.Fatal("no evaluation report from the agent")
	}
	return nil
}

// statusWhere returns the next status ok accepts, skipping the others.
func (f *fakeAgg) statusWhere(what string, ok func(*wire.ClientStatus) bool) *wire.ClientStatus {
	f.t.Helper()
	timeout := time.After(guard)
	for {
		select {
		case s := <-f.status:
			if ok(s) {
				return s
			}
		case <-timeout:
			f.t.Fatalf("no status %s", what)
		}
	}
}

// pendingUplinks is the number of statistics and evaluation messages the
// agent is still re-sending.
func (ra *runningAgent) pendingUplinks() int {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	return len(ra.sess.uplinks)
}

func (f *fakeAgg) quiet(t *testing.T) {
	t.Helper()
	select {
	case b := <-f.updates:
		t.Fatalf("an update was published: %d bytes", len(b))
	case s := <-f.statistics:
		t.Fatalf("statistics were published: %v", s)
	case e := <-f.evals:
		t.Fatalf("an evaluation report was published: %v", e)
	default:
	}
}

// The statistics phase over MQTT: the agent sends its statistics and
// re-sends them, byte for byte, until the aggregator's STATISTICS receipt;
// its status then reports its training rows.
func TestAgentStatisticsResentUntilReceipted(t *testing.T) {
	_, url := testkit.StartBroker(t)
	agg := newFakeAgg(t, url)
	f := newFedFixture(t, 80)
	ra := startFedAgent(t, url, filepath.Join(t.TempDir(), "edge.db"), f.csv, nil)
	if st := agg.nextStatus(); !st.Online || st.SampleCount != 0 || st.ErrorReason != "" {
		t.Fatalf("online status before any schema: %v", st)
	}
	ra.wait(t, "connected", isKind(EventConnected))

	agg.announce(f.statsAnn(fedRun))
	first := agg.nextStatistics()
	if first.RunId != fedRun || first.SchemaDigest != f.s.Digest() || string(first.Stats) != mustJSON(t, f.stats) {
		t.Fatalf("statistics %v", first)
	}
	if st := agg.statusWhere("with the training rows", func(s *wire.ClientStatus) bool { return s.SampleCount > 0 }); st.SampleCount != uint64(f.train.N) || !st.Online {
		t.Fatalf("status %v, want %d training rows", st, f.train.N)
	}
	// No receipt: re-sent after the backoff (100 ms, then 200 ms).
	for i := range 2 {
		if d, want := ra.nextTimer(t), 100*time.Millisecond<<i; d != want {
			t.Fatalf("re-send %d after %v, want %v", i+1, d, want)
		}
		if again := agg.nextStatistics(); !sameMsg(t, again, first) {
			t.Fatalf("re-sent statistics differ: %v", again)
		}
	}
	agg.receipt(subjectReceipt(wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, 0))
	ra.wait(t, "statistics receipt", func(e Event) bool {
		return e.Kind == EventReceipt && e.Subject == wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS && e.Accepted
	})
	if n := ra.pendingUplinks(); n != 0 {
		t.Fatalf("%d messages still re-sent after the receipt", n)
	}
	// The retained announcement delivered again (a reconnection): the
	// receipted statistics are not sent again.
	agg.announce(f.statsAnn(fedRun))
	ra.wait(t, "statistics phase handled", func(e Event) bool { return e.Kind == EventRound && e.Action == ActionDone })
	s := ra.Stats()
	if s.StatisticsSent < 3 || s.ReceiptsAccepted != 1 || s.RoundErrors != 0 {
		t.Fatalf("stats %+v", s)
	}
	for len(agg.statistics) > 0 { // a re-send may have crossed the receipt
		<-agg.statistics
	}
	agg.quiet(t)
}

// A CSV missing a schema column: the retained status says schema_mismatch
// with a message naming file and column and no data value, no statistics
// go out; once the file is fixed the next announcement clears it.
func TestAgentSiteErrorStatus(t *testing.T) {
	_, url := testkit.StartBroker(t)
	agg := newFakeAgg(t, url)
	f := newFedFixture(t, 60)
	broken := filepath.Join(t.TempDir(), "site.csv")
	good, err := os.ReadFile(f.csv)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(broken, bytes.Replace(good, []byte("id,age,"), []byte("id,years,"), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	ra := startFedAgent(t, url, filepath.Join(t.TempDir(), "edge.db"), broken, nil)
	ra.wait(t, "connected", isKind(EventConnected))
	agg.announce(f.statsAnn(fedRun))
	st := agg.statusWhere("with an error", func(s *wire.ClientStatus) bool { return s.ErrorReason != "" })
	if st.ErrorReason != wire.SiteErrSchema || !st.Online || !strings.Contains(st.ErrorMessage, broken) || !strings.Contains(st.ErrorMessage, `"age"`) {
		t.Fatalf("error status %v", st)
	}
	// The file's path is in the message and t.TempDir's random digits may
	// spell a data value: only the rest of the message is searched.
	rest := strings.ReplaceAll(st.ErrorMessage, broken, "")
	for _, cell := range strings.FieldsFunc(string(good), func(r rune) bool { return r == ',' || r == '\n' }) {
		if len(cell) > 3 && strings.Contains(rest, cell) && cell != "colour" && cell != "size" {
			t.Fatalf("the error message %q carries the data value %q", st.ErrorMessage, cell)
		}
	}
	e := ra.wait(t, "site error", isKind(EventSiteError))
	var se *sitedata.SiteError
	if !errors.As(e.Err, &se) || se.Reason != wire.SiteErrSchema {
		t.Fatalf("site error event %v", e.Err)
	}
	failed := func(e Event) bool { return e.Kind == EventRound && e.Err != nil }
	ra.wait(t, "the failed announcement", failed)
	agg.quiet(t)

	// The same error again: no new status (nor a new ERROR line).
	agg.announce(f.statsAnn(fedRun))
	ra.wait(t, "the same error", failed)
	select {
	case e := <-ra.events:
		t.Fatalf("event after the repeated error: %+v", e)
	default:
	}

	if err := os.WriteFile(broken, good, 0o600); err != nil {
		t.Fatal(err)
	}
	agg.announce(f.statsAnn(fedRun))
	if s := agg.nextStatistics(); string(s.Stats) != mustJSON(t, f.stats) {
		t.Fatalf("statistics after the fix %v", s)
	}
	cleared := agg.statusWhere("without the error", func(s *wire.ClientStatus) bool { return s.ErrorReason == "" && s.Online })
	if cleared.ErrorMessage != "" {
		t.Fatalf("status after the fix %v", cleared)
	}
	ra.wait(t, "site error cleared", func(e Event) bool { return e.Kind == EventSiteError && e.Err == nil })
	if s := ra.Stats(); s.RoundErrors != 2 {
		t.Fatalf("stats %+v", s)
	}
}

// evaluate: a site the round does not select still evaluates the global
// model on its held-out rows and sends the EvalReport of eval_round,
// figures equal to sitedata.Evaluate, re-sent until its EVALUATION receipt.
func TestAgentEvaluatesWhenNotSelected(t *testing.T) {
	_, url := testkit.StartBroker(t)
	agg := newFakeAgg(t, url)
	f := newFedFixture(t, 100)
	ra := startFedAgent(t, url, filepath.Join(t.TempDir(), "edge.db"), f.csv, nil)
	ra.wait(t, "connected", isKind(EventConnected))
	x := f.global(t, 3)
	ann := f.trainAnn(t, fedRun, 3, x)
	ann.Selected, ann.Evaluate, ann.EvalRound = []string{"site-b"}, true, 2
	agg.announce(ann)
	ev := agg.nextEval()
	want, err := sitedata.Evaluate(f.spec, x, f.holdout)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Round != 2 || ev.RunId != fedRun || string(ev.Report) != mustJSON(t, want) {
		t.Fatalf("evaluation %v, want round 2 with %s", ev, mustJSON(t, want))
	}
	if d := ra.nextTimer(t); d != 100*time.Millisecond {
		t.Fatalf("evaluation re-sent after %v, want 100ms", d)
	}
	if again := agg.nextEval(); !sameMsg(t, again, ev) {
		t.Fatalf("re-sent evaluation differs: %v", again)
	}
	agg.receipt(subjectReceipt(wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION, 2))
	ra.wait(t, "evaluation receipt", func(e Event) bool {
		return e.Kind == EventReceipt && e.Subject == wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION && e.Round == 2
	})
	if n := ra.pendingUplinks(); n != 0 {
		t.Fatalf("%d messages still re-sent after the receipt", n)
	}
	select {
	case b := <-agg.updates:
		t.Fatalf("a site not selected sent an update (%d bytes)", len(b))
	default:
	}
}

// The end of a run over MQTT: the final evaluation, then the bundle
// written to model_out and kept in the state file; announcements of the
// finished run are ignored and nothing more is published, also after a
// restart; another run's announcement wakes the site up.
func TestAgentFinishedRun(t *testing.T) {
	srv, url := testkit.StartBroker(t)
	agg := newFakeAgg(t, url)
	f := newFedFixture(t, 80)
	dir := t.TempDir()
	state, out := filepath.Join(dir, "edge.db"), filepath.Join(dir, "out", "model.json")
	if err := os.Mkdir(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	withOut := func(c *Config) { c.ModelOut = out }
	ra := startFedAgent(t, url, state, f.csv, withOut)
	ra.wait(t, "connected", isKind(EventConnected))

	agg.announce(f.statsAnn(fedRun))
	agg.nextStatistics()
	agg.receipt(subjectReceipt(wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, 0))
	x1 := f.global(t, 1)
	agg.announce(f.trainAnn(t, fedRun, 1, x1))
	_, u := agg.nextUpdate()
	if u.Round != 1 || u.SampleCount != uint64(f.train.N) {
		t.Fatalf("update %v", u)
	}
	agg.receipt(accepted(1))
	ra.wait(t, "receipt", receiptOf(1))

	x := f.global(t, 2)
	agg.announce(f.finishedAnn(t, fedRun, 1, x, nil))
	ev := agg.nextEval()
	if want, _ := sitedata.Evaluate(f.spec, x, f.holdout); ev.Round != 1 || string(ev.Report) != mustJSON(t, want) {
		t.Fatalf("final evaluation %v", ev)
	}
	agg.receipt(subjectReceipt(wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION, 1))
	b := f.bundleOf(t, fedRun, 1, x)
	agg.announce(f.finishedAnn(t, fedRun, 1, x, b))
	ra.wait(t, "finished", isKind(EventFinished))
	if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, b) {
		t.Fatalf("model_out: %v", err)
	}

	// Quiet: the finished run's announcements are ignored, a reconnection
	// publishes nothing but the status.
	agg.announce(f.finishedAnn(t, fedRun, 1, x, b))
	ra.wait(t, "ignored", func(e Event) bool { return e.Kind == EventRound && e.Action == ActionIgnored })
	agg.announce(f.trainAnn(t, fedRun, 2, x))
	ra.wait(t, "ignored", func(e Event) bool { return e.Kind == EventRound && e.Action == ActionIgnored && e.Round == 2 })
	cl, ok := srv.Clients.Get(testSite)
	if !ok {
		t.Fatal("agent not connected")
	}
	if err := cl.Net.Conn.Close(); err != nil { // a network failure
		t.Fatal(err)
	}
	ra.wait(t, "reconnected", isKind(EventConnected))
	ra.stop()
	for len(agg.evals) > 0 { // re-sends that crossed the receipt
		<-agg.evals
	}
	agg.quiet(t)
	if s := ra.Stats(); s.RoundsSolved != 1 || s.RoundErrors != 0 {
		t.Fatalf("stats %+v", s)
	}

	store := openStore(t, state)
	fin, err := store.Final()
	store.Close()
	if err != nil || fin.RunID != fedRun || !bytes.Equal(fin.Bundle, b) {
		t.Fatalf("stored final %+v, %v", fin, err)
	}

	// A restart: still finished (the retained announcement is ignored),
	// and a lost model_out is written again from the state file.
	if err := os.Remove(out); err != nil {
		t.Fatal(err)
	}
	rb := startFedAgent(t, url, state, f.csv, withOut)
	// (The retained announcement may be delivered before the connection's
	// own event: wait for the ignoring only.)
	rb.wait(t, "ignored after restart", func(e Event) bool { return e.Kind == EventRound && e.Action == ActionIgnored })
	if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, b) {
		t.Fatalf("model_out not restored at start: %v", err)
	}
	agg.quiet(t)

	// Another run wakes it up.
	agg.announce(f.statsAnn("run-0002"))
	if s := agg.nextStatistics(); s.RunId != "run-0002" {
		t.Fatalf("statistics of the new run: %v", s)
	}
}

// A bundle whose digest does not match is refused: an error status
// (bad_transform), nothing written, and the site is not finished: the
// aggregator's next, correct bundle is taken.
func TestAgentRefusesTamperedBundle(t *testing.T) {
	_, url := testkit.StartBroker(t)
	agg := newFakeAgg(t, url)
	f := newFedFixture(t, 60)
	state := filepath.Join(t.TempDir(), "edge.db")
	ra := startFedAgent(t, url, state, f.csv, nil)
	ra.wait(t, "connected", isKind(EventConnected))
	x := f.global(t, 2)
	good := f.bundleOf(t, fedRun, 2, x)
	tampered := bytes.Replace(good, []byte(`"round":2`), []byte(`"round":3`), 1)
	ann := f.finishedAnn(t, fedRun, 2, x, tampered)
	ann.Evaluate = false
	agg.announce(ann)
	st := agg.statusWhere("with an error", func(s *wire.ClientStatus) bool { return s.ErrorReason != "" })
	if st.ErrorReason != wire.SiteErrBadTransform || !strings.Contains(st.ErrorMessage, "digest mismatch") {
		t.Fatalf("status %v", st)
	}
	modelOut := filepath.Join(filepath.Dir(state), DefaultModelOutName)
	if _, err := os.Stat(modelOut); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused bundle was written: %v", err)
	}
	ann.Bundle = good
	agg.announce(ann)
	ra.wait(t, "finished", isKind(EventFinished))
	if got, err := os.ReadFile(modelOut); err != nil || !bytes.Equal(got, good) {
		t.Fatalf("model_out: %v", err)
	}
	agg.statusWhere("without the error", func(s *wire.ClientStatus) bool { return s.ErrorReason == "" })
	ra.stop()
	store := openStore(t, state)
	defer store.Close()
	if fin, err := store.Final(); err != nil || !bytes.Equal(fin.Bundle, good) {
		t.Fatalf("stored final: %v", err)
	}
}

// A final bundle that cannot be written to model_out (the disk is full):
// model_out, which held the previous run's model, is set aside (it would
// pass for this run's), the aggregator sees the site error (disk), the
// write is tried again on a backoff, and once space is freed the model
// arrives and the error clears, without a restart or a re-announcement.
func TestAgentModelOutRetried(t *testing.T) {
	_, url := testkit.StartBroker(t)
	agg := newFakeAgg(t, url)
	f := newFedFixture(t, 80)
	dir := t.TempDir()
	state, out := filepath.Join(dir, "edge.db"), filepath.Join(dir, "final.bundle.json")
	previous := f.bundleOf(t, "run-0000", 3, f.global(t, 9))
	if err := os.WriteFile(out, previous, 0o644); err != nil {
		t.Fatal(err)
	}
	openStore(t, state).Close() // the site's state (it ran run-0000)
	var full atomic.Bool
	var writes atomic.Int32
	full.Store(true)
	write := func(path string, data []byte) error {
		writes.Add(1)
		if full.Load() {
			return &os.PathError{Op: "write", Path: path + ".tmp", Err: syscall.ENOSPC}
		}
		return bundle.WriteFileAtomic(path, data)
	}
	cfg := DefaultConfig()
	cfg.SiteID, cfg.Federation, cfg.Brokers, cfg.StateFile, cfg.ModelOut = testSite, testFed, []string{url}, state, out
	cfg.Data = "csv:" + f.csv
	cfg.ReconnectMin, cfg.ReconnectMax = 100*time.Millisecond, time.Second
	ra := runAgentDeps(t, cfg, nil, func(d *Deps) { d.WriteModelOut = write })
	ra.wait(t, "connected", isKind(EventConnected))

	x := f.global(t, 2)
	b := f.bundleOf(t, fedRun, 1, x)
	agg.announce(f.finishedAnn(t, fedRun, 1, x, b))
	e := ra.wait(t, "the disk error", isKind(EventSiteError))
	if !errors.Is(e.Err, ErrModelOut) || !strings.Contains(e.Err.Error(), "no space left on device") {
		t.Fatalf("site error %v, want model_out not written", e.Err)
	}
	agg.statusWhere("with the disk error", func(s *wire.ClientStatus) bool { return s.GetErrorReason() == wire.SiteErrDisk })
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("model_out still holds the previous run's model: %v", err)
	}
	if got, err := os.ReadFile(out + ".stale"); err != nil || !bytes.Equal(got, previous) {
		t.Fatalf("the previous model was not kept as %s.stale: %v", out, err)
	}
	// Still full: tried again after 100 ms, again after 200 ms more (the
	// fake clock runs the timer's callback, the write, synchronously).
	for _, c := range []struct {
		writes int32
		after  time.Duration
	}{{2, 100 * time.Millisecond}, {3, 200 * time.Millisecond}} {
		if d := ra.nextTimer(t); d != c.after || writes.Load() != c.writes {
			t.Fatalf("write #%d after %v (%d writes), want after %v", c.writes, d, writes.Load(), c.after)
		}
	}
	full.Store(false) // space freed
	if d := ra.nextTimer(t); d != 400*time.Millisecond || writes.Load() != 4 {
		t.Fatalf("write #4 after %v (%d writes)", d, writes.Load())
	}
	if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, b) {
		t.Fatalf("model_out after space was freed: %v", err)
	}
	if e := ra.wait(t, "the error cleared", isKind(EventSiteError)); e.Err != nil {
		t.Fatalf("site error %v, want cleared", e.Err)
	}
	agg.statusWhere("without an error", func(s *wire.ClientStatus) bool { return s.Online && s.GetErrorReason() == "" })
	// The run's end is handled: its announcement is now ignored.
	agg.announce(f.finishedAnn(t, fedRun, 1, x, b))
	ra.wait(t, "ignored", func(e Event) bool { return e.Kind == EventRound && e.Action == ActionIgnored })
}

// A site whose statistics come after the statistics phase closed (a
// STALE_ROUND receipt) is told at once that its rows are not in the
// federation's preprocessing.
func TestAgentToldStatisticsTooLate(t *testing.T) {
	_, url := testkit.StartBroker(t)
	agg := newFakeAgg(t, url)
	f := newFedFixture(t, 80)
	ra := startFedAgent(t, url, filepath.Join(t.TempDir(), "edge.db"), f.csv, nil)
	ra.wait(t, "connected", isKind(EventConnected))
	agg.announce(f.statsAnn(fedRun))
	agg.nextStatistics()
	stale := subjectReceipt(wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, 0)
	stale.Accepted, stale.Code = false, wire.ReceiptCode_RECEIPT_CODE_STALE_ROUND
	agg.receipt(stale)
	ra.wait(t, "the stale receipt", func(e Event) bool {
		return e.Kind == EventReceipt && e.Subject == wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS && !e.Accepted
	})
	if l := ra.logs.Lines("this site's statistics are not in the federation's preprocessing"); len(l) != 1 || !strings.Contains(l[0], "level=WARN") ||
		!strings.Contains(l[0], "after the statistics phase closed") {
		t.Fatalf("the site was not told: %q", l)
	}
}

// The schema and transform by digest (wire RunSpec): an announcement that
// names them only by digest waits for the run topic; a run spec whose
// transform is not the announced one (altered) is refused and nothing is
// trained; the run's own spec lets the site train; a site that joins late
// (a new state file, as after a restart on a fresh disk) gets both retained
// messages and trains too.
func TestAgentRunSpecByDigest(t *testing.T) {
	_, url := testkit.StartBroker(t)
	agg := newFakeAgg(t, url)
	f := newFedFixture(t, 100)
	ra := startFedAgent(t, url, filepath.Join(t.TempDir(), "edge.db"), f.csv, nil)
	ra.wait(t, "connected", isKind(EventConnected))
	x := f.global(t, 3)
	ann := f.trainAnn(t, fedRun, 3, x)
	spec := ann.ByDigest()
	if len(ann.Schema) != 0 || len(ann.Transform) != 0 || ann.SchemaDigest == "" || ann.TransformDigest == "" {
		t.Fatalf("announcement still carries bodies: %v", ann)
	}
	agg.announce(ann)
	tampered := &wire.RunSpec{Federation: spec.Federation, RunId: spec.RunId, Schema: spec.Schema,
		Transform: bytes.Replace(spec.Transform, []byte("1"), []byte("2"), 1)}
	publishSpec := func(s *wire.RunSpec) {
		b, err := wire.Encode(s)
		if err != nil {
			t.Fatal(err)
		}
		agg.publishRaw(agg.topics.Run(), b, true)
	}
	publishSpec(tampered)
	ra.wait(t, "the altered run spec refused", func(e Event) bool {
		return e.Kind == EventBadMessage && errors.Is(e.Err, wire.ErrBodyMissing)
	})
	agg.quiet(t)
	publishSpec(spec)
	if _, u := agg.nextUpdate(); u.Round != 3 {
		t.Fatalf("update of round %d, want 3", u.Round)
	}
	ra.stop()

	late := startFedAgent(t, url, filepath.Join(t.TempDir(), "edge.db"), f.csv, nil)
	late.wait(t, "connected", isKind(EventConnected))
	if _, u := agg.nextUpdate(); u.Round != 3 {
		t.Fatalf("late site: update of round %d, want 3", u.Round)
	}
}

// A site that joined after the statistics phase (it is not among the run
// spec's statistics_sites) is told at once, when it reads the fitted
// preprocessing, and once per run; a site among them is told nothing.
func TestAgentToldNotInPreprocessingByRunSpec(t *testing.T) {
	_, url := testkit.StartBroker(t)
	agg := newFakeAgg(t, url)
	f := newFedFixture(t, 100)
	ra := startFedAgent(t, url, filepath.Join(t.TempDir(), "edge.db"), f.csv, nil)
	ra.wait(t, "connected", isKind(EventConnected))
	x := f.global(t, 3)
	ann := f.trainAnn(t, fedRun, 3, x)
	spec := ann.ByDigest()
	publishSpec := func(sites ...string) {
		s := &wire.RunSpec{Federation: spec.Federation, RunId: spec.RunId, Schema: spec.Schema, Transform: spec.Transform, StatisticsSites: sites}
		b, err := wire.Encode(s)
		if err != nil {
			t.Fatal(err)
		}
		agg.publishRaw(agg.topics.Run(), b, true)
	}
	const told = "this site's statistics are not in the federation's preprocessing"
	publishSpec(testSite, "site-z")
	agg.announce(ann)
	if _, u := agg.nextUpdate(); u.Round != 3 {
		t.Fatalf("update of round %d, want 3", u.Round)
	}
	if l := ra.logs.Lines(told); len(l) != 0 {
		t.Fatalf("a site among the statistics sites was told it is not: %q", l)
	}
	// The same run's spec again, twice (a re-publication after a restart):
	// told once. The run topic is not ordered with the others: wait for
	// the line, then for the second copy to be handled (a bad-message-free
	// round trip: the next update).
	publishSpec("site-y", "site-z")
	for deadline := time.Now().Add(10 * time.Second); len(ra.logs.Lines(told)) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the late site was not told")
		}
	}
	publishSpec("site-y", "site-z")
	ann4 := f.trainAnn(t, fedRun, 4, x)
	ann4.ByDigest()
	agg.announce(ann4)
	if _, u := agg.nextUpdate(); u.Round != 4 {
		t.Fatalf("update of round %d, want 4", u.Round)
	}
	if l := ra.logs.Lines(told); len(l) != 1 || !strings.Contains(l[0], "level=WARN") || !strings.Contains(l[0], "site-y") {
		t.Fatalf("the late site was told %d times: %q", len(l), l)
	}
}

// eval_data is written as data is (csv:PATH) or as a bare PATH: either way
// the site reads that file's rows as its held-out rows, and every row of
// data trains (its statistics count all 80).
func TestAgentEvalDataForms(t *testing.T) {
	for _, form := range []string{"PATH", "csv:PATH"} {
		t.Run(form, func(t *testing.T) {
			_, url := testkit.StartBroker(t)
			agg := newFakeAgg(t, url)
			f := newFedFixture(t, 80)
			eval := filepath.Join(t.TempDir(), "heldout.csv")
			if err := os.WriteFile(eval, []byte(siteCSV(25, 77)), 0o600); err != nil {
				t.Fatal(err)
			}
			ra := startFedAgent(t, url, filepath.Join(t.TempDir(), "edge.db"), f.csv, func(c *Config) {
				c.EvalData = strings.Replace(form, "PATH", eval, 1)
			})
			ra.wait(t, "connected", isKind(EventConnected))
			agg.announce(f.statsAnn(fedRun))
			var st struct {
				Rows int `json:"rows"`
			}
			if err := json.Unmarshal(agg.nextStatistics().Stats, &st); err != nil || st.Rows != 80 {
				t.Fatalf("statistics of %d training rows (%v), want every row of data", st.Rows, err)
			}
		})
	}
}

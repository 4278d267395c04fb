package agent

import (
	"context"
	"errors"
	"fmt"
	"github.com/edgefl/edgefl/node/edgestore"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/secagg"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// memState is the edge state in memory: what the site core reads
// (StoreView) and what its records change, with the store's refusals (a
// stale seen round or global model, a round already applied, a vector that
// is not finite, an empty outbox message). The core's tests and fuzzer run
// on it, without a database.
type memState struct {
	run                        string
	since                      int64
	seen, applied              uint64
	globalRound, zRound, szRnd uint64
	global, z, serverZ         []float64
	residual, control          []float64
	undoRound                  uint64
	controlUndo                []float64
	contribRound               uint64
	contrib                    []float64
	outbox                     []edgestore.OutboxEntry
	final                      *edgestore.Final
	secAgg                     []byte
	pending                    map[uint64]edgestore.SumPending
	noiseKey                   *[32]byte
}

func (m *memState) SecAgg() ([]byte, error) {
	if m.secAgg == nil {
		return nil, storage.ErrNotFound
	}
	return slices.Clone(m.secAgg), nil
}

func (m *memState) Pending(round uint64) (edgestore.SumPending, bool, error) {
	p, ok := m.pending[round]
	return p, ok, nil
}

func (m *memState) NoiseKey() ([32]byte, error) {
	if m.noiseKey == nil {
		return [32]byte{}, storage.ErrNotFound
	}
	return *m.noiseKey, nil
}

func (m *memState) RunOrder() (string, int64, error)         { return m.run, m.since, nil }
func (m *memState) AppliedRound() (uint64, error)            { return m.applied, nil }
func (m *memState) Outbox() ([]edgestore.OutboxEntry, error) { return slices.Clone(m.outbox), nil }
func (m *memState) Path() string                             { return "memory" }

func (m *memState) Final() (edgestore.Final, error) {
	if m.final == nil {
		return edgestore.Final{}, storage.ErrNotFound
	}
	return *m.final, nil
}

func (m *memState) vec(r uint64, v []float64) (uint64, []float64, error) {
	if v == nil {
		return 0, nil, storage.ErrNotFound
	}
	return r, slices.Clone(v), nil
}

func (m *memState) Z() (uint64, []float64, error)       { return m.vec(m.zRound, m.z) }
func (m *memState) ServerZ() (uint64, []float64, error) { return m.vec(m.szRnd, m.serverZ) }
func (m *memState) Contribution() (uint64, []float64, error) {
	return m.vec(m.contribRound, m.contrib)
}

func (m *memState) Residual(name string) ([]float64, error) {
	if name == edgestore.ResidualControl && m.control != nil {
		return slices.Clone(m.control), nil
	}
	if name != edgestore.ResidualUplink || m.residual == nil {
		return nil, storage.ErrNotFound
	}
	return slices.Clone(m.residual), nil
}

func finite(name string, v []float64) error {
	for i, x := range v {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Errorf("%w: %s[%d] = %v", storage.ErrInvalid, name, i, x)
		}
	}
	return nil
}

// apply commits c as edgestore.EdgeStore would.
func (m *memState) apply(c change) error {
	switch c.kind {
	case recStartRun:
		if c.run == m.run {
			if c.since > 0 && (m.since == 0 || c.since < m.since) {
				m.since = c.since
			}
			return nil
		}
		*m = memState{run: c.run, since: max(c.since, 0)}
	case recSeen:
		if c.round < m.seen {
			return storage.ErrStale
		}
		m.seen = c.round
	case recGlobal:
		if c.round < m.globalRound {
			return storage.ErrStale
		}
		if err := finite("global", c.vec); err != nil {
			return err
		}
		m.globalRound, m.global, m.seen = c.round, slices.Clone(c.vec), max(m.seen, c.round)
	case recInitZ:
		if err := finite("z", c.vec); err != nil {
			return err
		}
		if m.z == nil {
			m.zRound, m.z = c.round, slices.Clone(c.vec)
		}
	case recCommit:
		cm := c.commit
		if cm.Round <= m.applied {
			return storage.ErrAlreadyApplied
		}
		if len(cm.Msg) == 0 {
			return fmt.Errorf("%w: empty outbox message", storage.ErrInvalid)
		}
		for _, v := range [][]float64{cm.Z, cm.ServerZ, cm.Residual, cm.Control} {
			if err := finite("commit", v); err != nil {
				return err
			}
		}
		if cm.Z != nil {
			m.zRound, m.z = cm.Round, slices.Clone(cm.Z)
		}
		if cm.ServerZ != nil {
			m.szRnd, m.serverZ = cm.Round, slices.Clone(cm.ServerZ)
		}
		if cm.Residual != nil {
			m.residual = slices.Clone(cm.Residual)
		}
		if cm.Control != nil {
			m.control = slices.Clone(cm.Control)
		}
		if cm.ControlUndo != nil {
			m.undoRound, m.controlUndo = cm.Round, slices.Clone(cm.ControlUndo)
		}
		if cm.SecAgg != nil {
			m.secAgg = slices.Clone(cm.SecAgg)
		}
		if cm.Pending != nil {
			if m.pending == nil {
				m.pending = map[uint64]edgestore.SumPending{}
			}
			m.pending[cm.Round] = *cm.Pending
		}
		m.applied = cm.Round
		m.outbox = append(m.outbox, edgestore.OutboxEntry{Round: cm.Round, Msg: slices.Clone(cm.Msg)})
	case recSecAgg:
		if c.round != m.applied {
			return storage.ErrStale
		}
		if len(c.commit.SecAgg) == 0 {
			return fmt.Errorf("%w: empty secagg record", storage.ErrInvalid)
		}
		m.secAgg = slices.Clone(c.commit.SecAgg)
		if c.commit.Msg != nil {
			m.outbox = slices.DeleteFunc(m.outbox, func(e edgestore.OutboxEntry) bool { return e.Round == c.round })
			m.outbox = append(m.outbox, edgestore.OutboxEntry{Round: c.round, Msg: slices.Clone(c.commit.Msg)})
		}
	case recNoiseKey:
		if m.noiseKey == nil {
			k := c.key
			m.noiseKey = &k
		}
	case recFinal:
		f := c.final
		m.final, m.outbox = &f, nil
	default:
		return fmt.Errorf("unknown change %d", c.kind)
	}
	return nil
}

// carryOut is the shell's commit of a plan's records on m (RoundHandler.commit).
func (m *memState) carryOut(sr siteRules, recs []change, base Result) (Result, bool, error) {
	for _, c := range recs {
		if err := m.apply(c); err != nil {
			if res, stop, err := sr.commitFailed(m, c, err, base); stop {
				return res, true, err
			}
		}
	}
	return base, false, nil
}

func testRules() siteRules {
	return siteRules{ClientID: testSite, Federation: testFed, Local: Local{MaxEpochs: 3}, Seed: 3,
		Limits: wire.Limits{MaxMessageBytes: 1 << 20, MaxDimension: 1 << 12}, Clock: clock.NewFake(t0),
		Log: slog.New(slog.DiscardHandler), SecAgg: secAggConfig{
			Rand:    func(round uint64) io.Reader { return rand.NewChaCha8([32]byte{byte(round)}) },
			Entropy: rand.NewChaCha8([32]byte{'k'})}}
}

// stepRound runs one announcement through the core on m as the shell does
// (begin, commit, round, commit, solve, solved, commit) and returns the
// outcome and every plan's records.
func stepRound(t testing.TB, sr siteRules, m *memState, ann *wire.RoundAnnouncement) (Result, []change, error) {
	t.Helper()
	res, recs, err := sr.begin(m, ann)
	if err != nil {
		if len(recs) > 0 {
			t.Fatalf("begin refused the announcement (%v) and still asks for records %v", err, recs)
		}
		return res, nil, err
	}
	all := slices.Clone(recs)
	if res, stop, err := m.carryOut(sr, recs, res); stop {
		return res, all, err
	}
	if ann.GetPhase() != wire.Phase_PHASE_TRAIN || len(ann.GetSchema()) > 0 {
		return res, all, errShellSide // the federated phases read the site's data by its schema in the shell
	}
	pl := sr.round(m, ann, testData(1, 90), false, t0, res)
	for {
		if pl.err != nil && len(pl.records) > 0 && !commitsToRefuse(pl.records) {
			t.Fatalf("a plan that refuses (%v) still asks for records %v", pl.err, pl.records)
		}
		all = append(all, pl.records...)
		if res, stop, err := m.carryOut(sr, pl.records, pl.base); stop {
			return res, all, err
		}
		if pl.err != nil || pl.solve == nil {
			return pl.res, all, pl.err
		}
		p := pl.solve
		sent, rep, stop, err := solve(context.Background(), p, sr.rng(p.round, streams.SiteSolve), sr.log())
		if err != nil {
			return res, all, err
		}
		pl = sr.solved(m, ann, p, solveOutcome{sent: sent, rep: rep, stop: stop}, t0, res)
	}
}

var errShellSide = errors.New("handled by the shell")

// commitsToRefuse reports whether recs are the one record a refusing plan
// may ask for: a secagg session's commitment to a survivor set below the
// threshold, without a message (siteRules.secAggConsistency), so that the
// site refuses every other set of the session too.
func commitsToRefuse(recs []change) bool {
	return len(recs) == 1 && recs[0].kind == recSecAgg && recs[0].commit.Msg == nil
}

// The core decides a round from the view alone and its plans commit in
// order: a new run's record comes first, a solved round's commit carries
// the update it returns, and the same announcement stepped again re-sends
// that update without solving (the state moved forward).
func TestCoreRoundPlans(t *testing.T) {
	for _, algo := range []string{AlgoFedProx, AlgoFedSplit, AlgoFedAvg} {
		t.Run(algo, func(t *testing.T) {
			sr, m := testRules(), &memState{}
			ann := announce(t, 1, algo, f32(testGlobal(1)))
			ann.RunId = "run-A"
			res, recs, err := stepRound(t, sr, m, ann)
			if err != nil || res.Action != ActionSolved {
				t.Fatalf("%v %v", res.Action, err)
			}
			var kinds []recordKind
			for _, c := range recs {
				kinds = append(kinds, c.kind)
			}
			want := []recordKind{recStartRun, recGlobal, recCommit}
			if algo == AlgoFedSplit {
				want = []recordKind{recStartRun, recGlobal, recInitZ, recCommit}
			}
			if !slices.Equal(kinds, want) {
				t.Fatalf("records %v, want %v", kinds, want)
			}
			if last := recs[len(recs)-1]; !slices.Equal(last.commit.Msg, res.Msg) || m.applied != 1 {
				t.Fatalf("the commit does not carry the update returned (applied %d)", m.applied)
			}
			again, recs, err := stepRound(t, sr, m, ann)
			if err != nil || again.Action != ActionResend || !slices.Equal(again.Msg, res.Msg) {
				t.Fatalf("again: %v %v", again.Action, err)
			}
			if len(recs) != 1 || recs[0].kind != recStartRun {
				t.Fatalf("again: records %v, want only the run's (a no-op)", recs)
			}
			other := announce(t, 2, algo, f32(testGlobal(2)))
			other.RunId, other.Selected = "run-A", []string{"site-z"}
			if res, recs, err := stepRound(t, sr, m, other); err != nil || res.Action != ActionNotSelected || recs[len(recs)-1].kind != recSeen || m.seen != 2 {
				t.Fatalf("not selected: %v %v %v seen %d", res.Action, recs, err, m.seen)
			}
		})
	}
}

// FuzzCore feeds arbitrary bytes through the path of an inbound round
// announcement on the site core, without a database: wire decoding with
// limits, then the core's steps carried out on the in-memory state.
// Nothing may panic; a refused announcement asks for no record; whatever
// is solved is committed as the store would accept it, publishable, and
// never solved again.
func FuzzCore(f *testing.F) {
	for _, algo := range []string{AlgoFedProx, AlgoFedSplit} {
		b, err := wire.Encode(announce(f, 1, algo, f32(testGlobal(1))))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	sum := announce(f, 1, AlgoFedProxSplit, f32(testGlobal(1)))
	sum.SplitSum = true
	if b, err := wire.Encode(sum); err == nil {
		f.Add(b)
	}
	nan := announce(f, 2, AlgoFedProx, f32(testGlobal(2)))
	nan.Global.Payload = nanFrame(f, testDim)
	if b, err := wire.Encode(nan); err == nil {
		f.Add(b)
	}
	for _, sa := range secAggSeeds(f) {
		if b, err := wire.Encode(sa); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte{})
	f.Add([]byte("\x08\x02garbage"))
	sr := testRules()
	f.Fuzz(func(t *testing.T, b []byte) {
		ann, err := wire.DecodeRound(b, sr.Limits)
		if err != nil {
			return
		}
		ann.Federation = testFed
		m := &memState{}
		res, _, err := stepRound(t, sr, m, ann)
		if err != nil || res.Msg == nil {
			return
		}
		if res.Action == ActionSecAgg {
			fuzzSecAggPhases(t, sr, m, ann, res.Msg)
			return
		}
		u, err := wire.DecodeUpdate(res.Msg, wire.Limits{})
		if err != nil {
			t.Fatalf("the core produced an undecodable update: %v", err)
		}
		if u.Round != ann.Round || u.ClientId != testSite {
			t.Fatalf("update of round %d from %q, announced %d", u.Round, u.ClientId, ann.Round)
		}
		if res.Action == ActionSolved {
			again, _, err := stepRound(t, sr, m, ann)
			if err != nil || again.Action != ActionResend || !slices.Equal(again.Msg, res.Msg) {
				t.Fatalf("the announcement stepped again: %v %v, want the committed update re-sent", again.Action, err)
			}
		}
	})
}

// secAggSeeds are FuzzCore's secure-aggregation announcements: a
// session's advertise phase (plain, under distributed DP, in sum mode).
func secAggSeeds(f *testing.F) []*wire.RoundAnnouncement {
	var out []*wire.RoundAnnouncement
	for i := range 3 {
		a := announce(f, 1, AlgoFedProx, f32(testGlobal(1)))
		a.RunId = "RUN1"
		a.Secagg = &wire.SecAggSpec{Threshold: 2, Clip: 0.5, ScaleBits: 24, MaxSites: 3}
		switch i {
		case 1:
			a.Dp = &wire.DPParams{Mode: wire.DPMode_DP_MODE_DISTRIBUTED, ClipNorm: 0.5, NoiseMultiplier: 1, NoiseShares: 2}
		case 2:
			a.Algorithm, a.SplitSum = AlgoFedProxSplit, true
		}
		out = append(out, a)
	}
	return out
}

// fuzzSecAggPhases steps the secure-aggregation events that follow an
// advertised session on m: each later phase's announcement and a
// ShareList, both carrying the fuzzed broadcast. Nothing may panic, a
// refusal asks for no record (but a commitment to a survivor set), and
// every message the core commits is this site's secagg message of the
// round, also in the outbox.
func fuzzSecAggPhases(t *testing.T, sr siteRules, m *memState, ann *wire.RoundAnnouncement, adv []byte) {
	check := func(what string, res Result) {
		if res.Action != ActionSecAgg {
			return
		}
		w, err := wire.DecodeSecAgg(res.Msg, wire.Limits{})
		if err != nil || w.ClientId != testSite || w.Round != ann.Round {
			t.Fatalf("%s: the core committed %+v (%v)", what, w, err)
		}
		if i := slices.IndexFunc(m.outbox, func(e edgestore.OutboxEntry) bool { return e.Round == ann.Round }); i < 0 || !slices.Equal(m.outbox[i].Msg, res.Msg) {
			t.Fatalf("%s: the message published is not the round's outbox entry", what)
		}
	}
	check("advertise", Result{Action: ActionSecAgg, Msg: adv})
	for _, ph := range []wire.SecAggPhase{wire.SecAggPhase_SECAGG_PHASE_SHARE_KEYS, wire.SecAggPhase_SECAGG_PHASE_MASKED,
		wire.SecAggPhase_SECAGG_PHASE_CONSISTENCY, wire.SecAggPhase_SECAGG_PHASE_UNMASK} {
		next := *ann
		next.SecaggPhase = ph
		res, _, err := stepRound(t, sr, m, &next)
		if err == nil {
			check(ph.String(), res)
		}
	}
	sl := &wire.SecAggMessage{RunId: ann.RunId, Round: ann.Round, Attempt: ann.Secagg.Attempt, Payload: ann.SecaggBroadcast}
	pl := sr.shareList(m, sl, t0)
	if pl.err != nil && len(pl.records) > 0 {
		t.Fatalf("a refused share list (%v) asks for records %v", pl.err, pl.records)
	}
	if res, stop, err := m.carryOut(sr, pl.records, pl.base); stop || err != nil {
		t.Fatalf("share list: the store refused its records: %v %v", res.Action, err)
	}
	if pl.err == nil {
		check("share list", pl.res)
	}
}

// The run's end as the core plans it, on the in-memory state: a verified
// bundle is stored (recFinal) before it is written; a bundle of another
// run or schema is refused with no record; a stored bundle of the run is
// only restored; without a bundle the site waits (and evaluates if asked).
func TestCoreFinishPlans(t *testing.T) {
	f := newFedFixture(t, 80)
	x := f.global(t, 5)
	good := f.bundleOf(t, fedRun, 5, x)
	otherRun := f.bundleOf(t, "another-run", 5, x)
	sr := testRules()
	m := &memState{}

	pl := sr.finish(m, f.finishedAnn(t, fedRun, 5, x, nil), Result{Round: 5})
	if pl.err != nil || pl.res.Action != ActionFinishing || !pl.finalEval || len(pl.records) != 0 || pl.bundle != nil {
		t.Fatalf("no bundle yet: %+v", pl)
	}
	pl = sr.finish(m, f.finishedAnn(t, fedRun, 5, x, otherRun), Result{Round: 5})
	if pl.err == nil || len(pl.records) != 0 || pl.bundle != nil {
		t.Fatalf("another run's bundle: %+v", pl)
	}
	pl = sr.finish(m, f.finishedAnn(t, fedRun, 5, x, good), Result{Round: 5})
	if pl.err != nil || pl.res.Action != ActionFinished || len(pl.records) != 1 || pl.records[0].kind != recFinal ||
		!slices.Equal(pl.bundle, good) || !slices.Equal(pl.records[0].final.Bundle, good) || pl.base.Action != 0 {
		t.Fatalf("the bundle: %+v", pl)
	}
	if _, stop, err := m.carryOut(sr, pl.records, pl.base); stop || err != nil {
		t.Fatal(stop, err)
	}
	pl = sr.finish(m, f.finishedAnn(t, fedRun, 5, x, good), Result{Round: 5})
	if pl.err != nil || pl.res.Action != ActionDone || pl.restore == nil || len(pl.records) != 0 || pl.bundle != nil {
		t.Fatalf("re-delivered: %+v", pl)
	}
}

// The site core is pure by construction: core.go and core_secagg.go import
// nothing that does I/O (crypto/rand included: randomness is handed in),
// name no concrete store (only StoreView) and read no clock. A planted `os`
// import, a `time.Now()` or a `*edgestore.EdgeStore` fails this.
func TestCoreImportsNoIO(t *testing.T) {
	for _, file := range []string{"core.go", "core_secagg.go"} {
		t.Run(file, func(t *testing.T) { checkPure(t, file) })
	}
}

func checkPure(t *testing.T, file string) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	forbidden := []string{"os", "io", "net", "net/http", "os/exec", "syscall", "go.etcd.io/bbolt",
		"github.com/eclipse/paho.mqtt.golang", "crypto/rand"}
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		if slices.Contains(forbidden, p) || strings.HasPrefix(p, "io/") || strings.HasPrefix(p, "net/") {
			t.Errorf("%s imports %s", file, p)
		}
	}
	banned := map[string]bool{"time.Now": true, "time.Since": true, "time.Sleep": true, "time.After": true,
		"edgestore.EdgeStore": true, "edgestore.OpenEdge": true, "clock.Real": true}
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if x, ok := sel.X.(*ast.Ident); ok && banned[x.Name+"."+sel.Sel.Name] {
				t.Errorf("%s: %s uses %s.%s", fset.Position(sel.Pos()), file, x.Name, sel.Sel.Name)
			}
		}
		return true
	})
}

// The federated phases' rules over data the shell read: the statistics
// and the evaluation are returned in Result.Out (the executor emits them),
// timestamped with the time passed in, and not made again once receipted.
func TestCoreFederatedSteps(t *testing.T) {
	f := newFedFixture(t, 80)
	sr := testRules()
	now := t0.Add(time.Minute)

	stats := f.statsAnn(fedRun)
	res, err := sr.statistics(stats, f.s, f.site, false, now, Result{Round: stats.Round})
	if err != nil || res.Action != ActionStatistics || len(res.Out) != 1 || res.Out[0].Subject != wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS {
		t.Fatalf("statistics: %+v %v", res, err)
	}
	if st, err := wire.DecodeStatistics(res.Out[0].Msg, wire.Limits{}); err != nil || st.SentAtUnixMs != now.UnixMilli() || st.ClientId != testSite {
		t.Fatalf("statistics message: %+v %v", st, err)
	}
	if res, err := sr.statistics(stats, f.s, f.site, true, now, Result{}); err != nil || res.Action != ActionDone || len(res.Out) != 0 {
		t.Fatalf("statistics receipted: %+v %v", res, err)
	}

	ann := f.trainAnn(t, fedRun, 3, f.global(t, 3))
	ann.Evaluate, ann.EvalRound = true, 3
	var got Result
	if err := sr.evaluation(ann, f.holdout, false, now, &got); err != nil || len(got.Out) != 1 || got.Out[0].Round != 3 || !got.Healthy {
		t.Fatalf("evaluation: %+v %v", got, err)
	}
	got = Result{}
	if err := sr.evaluation(ann, f.holdout, true, now, &got); err != nil || len(got.Out) != 0 || !got.Healthy {
		t.Fatalf("evaluation receipted: %+v %v", got, err)
	}
}

// The route of a training announcement through the core enters proto/round
// for the math and nothing past it (ARCHITECTURE.md, "The route of a round
// announcement"): the core's steps on that route call no function of
// learn/ or of proto/uplink themselves, and no hook is handed down for
// uplink to call back up into the agent in a shipped build. A planted
// `model.New(...)` in prepare, or a non-nil poison, fails this.
func TestCoreRouteThroughRound(t *testing.T) {
	route := map[string]bool{"begin": true, "round": true, "prepare": true, "budget": true, "rng": true,
		"solved": true, "uplink": true, "resend": true, "anchorGrad": true, "commitFailed": true, "solve": true}
	allowed := map[string]bool{"wire": true, "round": true, "errors": true, "fmt": true, "math": true,
		"slices": true, "time": true, "context": true, "strings": true}
	for _, file := range []string{"core.go", "round.go"} {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		imported := map[string]bool{}
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			name := p[strings.LastIndex(p, "/")+1:]
			if im.Name != nil {
				name = im.Name.Name
			}
			imported[name] = true
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || !route[fd.Name.Name] {
				continue
			}
			ast.Inspect(fd, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
					if x, ok := sel.X.(*ast.Ident); ok && imported[x.Name] && !allowed[x.Name] {
						t.Errorf("%s: %s calls %s.%s, past proto/round", fset.Position(call.Pos()), fd.Name.Name, x.Name, sel.Sel.Name)
					}
				}
				return true
			})
		}
	}
	if poison != nil {
		t.Error("a shipped build hands uplink a poisoning hook: a call back up into the agent on every update")
	}
}

// A whole secure-aggregation session decided by the site core alone, three
// sites on in-memory states against an in-process secagg.Server, without a
// database: each phase's plan commits the session's record with its
// message (recCommit for the advertisement, recSecAgg after it) before the
// message is published, and the unmasked sum is exactly the sum of the
// inputs the records hold.
func TestCoreSecAggSession(t *testing.T) {
	const round, n = 1, 3
	mkAnn := func(phase wire.SecAggPhase, bcast secagg.Message) *wire.RoundAnnouncement {
		a := announce(t, round, AlgoFedProx, f32(testGlobal(round)))
		a.RunId = "RUN1"
		a.Secagg = &wire.SecAggSpec{Threshold: 2, Clip: 0.5, ScaleBits: 24, MaxSites: n}
		a.SecaggPhase = phase
		if bcast != nil {
			a.SecaggBroadcast = secagg.Encode(bcast)
		}
		for i := range n {
			a.Selected = append(a.Selected, fmt.Sprintf("site-%d", i))
		}
		return a
	}
	adv := mkAnn(wire.SecAggPhase_SECAGG_PHASE_ADVERTISE, nil)
	cfg, _, err := uplink.SecAggSetup(adv.Secagg, testDim)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := secagg.NewServer(cfg, uplink.SecAggSession("RUN1", round, 0))
	if err != nil {
		t.Fatal(err)
	}
	rules, states := make([]siteRules, n), make([]*memState, n)
	for i := range n {
		rules[i], states[i] = testRules(), &memState{}
		rules[i].ClientID = fmt.Sprintf("site-%d", i)
		rules[i].SecAgg.Rand = func(r uint64) io.Reader { return rand.NewChaCha8([32]byte{byte(r), byte(i + 1)}) }
	}
	take := func(what string, i int, res Result, err error, kind secagg.Kind, last recordKind, recs []change) {
		t.Helper()
		if err != nil || res.Action != ActionSecAgg || res.SecAggKind != kind {
			t.Fatalf("%s, site %d: %v %v (kind %v), want a %v", what, i, res.Action, err, res.SecAggKind, kind)
		}
		if len(recs) == 0 || recs[len(recs)-1].kind != last || !slices.Equal(recs[len(recs)-1].commit.Msg, res.Msg) {
			t.Fatalf("%s, site %d: records %v do not end with the %v of the message published", what, i, recs, last)
		}
		m, err := wire.DecodeSecAgg(res.Msg, wire.Limits{})
		if err != nil || m.ClientId != rules[i].ClientID {
			t.Fatalf("%s, site %d: %v %v", what, i, m, err)
		}
		p, err := secagg.Decode(m.Payload)
		if err == nil {
			err = srv.Receive(p)
		}
		if err != nil {
			t.Fatalf("%s, site %d: the server refuses it: %v", what, i, err)
		}
	}
	phase := func(what string, a *wire.RoundAnnouncement, kind secagg.Kind, last recordKind) {
		for i := range n {
			res, recs, err := stepRound(t, rules[i], states[i], a)
			take(what, i, res, err, kind, last, recs)
		}
	}
	phase("advertise", adv, secagg.KindAdvertiseKeys, recCommit)
	out, err := srv.Advance()
	if err != nil {
		t.Fatal(err)
	}
	phase("share keys", mkAnn(wire.SecAggPhase_SECAGG_PHASE_SHARE_KEYS, out[0].Msg), secagg.KindShareKeys, recSecAgg)
	if out, err = srv.Advance(); err != nil {
		t.Fatal(err)
	}
	for _, o := range out {
		i := slices.IndexFunc(rules, func(sr siteRules) bool { return sr.ClientID == o.To })
		pl := rules[i].shareList(states[i], &wire.SecAggMessage{ClientId: o.To, RunId: "RUN1", Round: round,
			Kind: wire.SecAggKindShareList, Payload: secagg.Encode(o.Msg)}, t0)
		if _, stop, err := states[i].carryOut(rules[i], pl.records, pl.base); stop || err != nil {
			t.Fatal(stop, err)
		}
		take("masked input", i, pl.res, pl.err, secagg.KindMaskedInput, recSecAgg, pl.records)
	}
	if out, err = srv.Advance(); err != nil {
		t.Fatal(err)
	}
	phase("unmask", mkAnn(wire.SecAggPhase_SECAGG_PHASE_UNMASK, out[0].Msg), secagg.KindUnmaskResponse, recSecAgg)
	if _, err := srv.Advance(); err != nil {
		t.Fatal(err)
	}
	sum, err := srv.Sum()
	if err != nil {
		t.Fatal(err)
	}
	var inputs [][]uint32
	for i := range n {
		rec, err := unmarshalSecAggRecord(states[i].secAgg)
		if err != nil {
			t.Fatal(err)
		}
		inputs = append(inputs, rec.input)
	}
	if !slices.Equal(sum, uplink.SecAggPlainSum(inputs, testDim)) {
		t.Fatal("the unmasked sum is not the sum of the inputs the sites' records hold")
	}
}

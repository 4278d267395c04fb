package aggregator

import (
	"encoding/json"
	"errors"
	"github.com/edgefl/edgefl/node/aggstore"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/learn/evaluate"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/wire"
)

// The round history is what the console charts and `broker-agg status`
// summarises: one record per aggregated round (participants, stragglers,
// partial work, bytes, the change of the global model) and one point per
// evaluated round (the federation's figures and each site's). It lives in
// the shell, not in the coordinator (which stays a pure state machine), is
// bounded to the last HistoryRounds rounds, and is rebuilt from the round
// log on restart as far as the log allows (bytes are counted by the running
// process only).

// HistoryRounds bounds the rounds (and evaluated rounds) kept in memory.
const HistoryRounds = 1000

// historySites bounds the sites whose last message and rejections are
// kept (ids come from topics, which the broker's ACL ties to identities;
// an external broker without the ACL could invent them).
const historySites = 10000

// historyRebuildValues bounds the checkpoint values read on restart to
// compute the change of the global model of rebuilt rounds (one checkpoint
// a round): a large model gets it for fewer rounds.
const historyRebuildValues = 20_000_000

// RoundRecord is one aggregated round.
type RoundRecord struct {
	Round        int       `json:"round"`
	OpenedAt     time.Time `json:"opened_at,omitzero"`
	AggregatedAt time.Time `json:"aggregated_at,omitzero"`
	// Participants is how many updates the aggregation took; Partial and
	// Stragglers name the sites that sent partial work and the invited
	// sites that did not report.
	Participants int      `json:"participants"`
	Partial      []string `json:"partial,omitempty"`
	Stragglers   []string `json:"stragglers,omitempty"`
	Late         int      `json:"late,omitempty"` // late FedSplit updates stored since the previous aggregation
	// BytesUp is the payload received from the sites while the round was
	// open (updates, statuses, reports; also what was rejected); BytesDown
	// what the aggregator sent for it: each announcement once per site
	// online when it was published, plus the receipts. Both are nil for a
	// round rebuilt from the round log, and cover only the part of a round
	// after a restart.
	BytesUp   *uint64 `json:"bytes_up,omitempty"`
	BytesDown *uint64 `json:"bytes_down,omitempty"`
	// DeltaNorm is ||x^{t+1} - x^t||, the change of the global model by
	// this aggregation; RelChange that over ||x^t|| (what --stop-delta
	// compares). nil when unknown.
	DeltaNorm *float64 `json:"delta_norm,omitempty"`
	RelChange *float64 `json:"rel_change,omitempty"`
	// Seconds is the aggregation and checkpoint time (this process only).
	Seconds float64 `json:"seconds,omitempty"`
}

// EvalFigures are one evaluation's headline figures: held-out rows, loss,
// and Score: accuracy for classification, R^2 for regression (nil when
// undefined).
type EvalFigures struct {
	N     int64    `json:"n"`
	Loss  float64  `json:"loss"`
	Score *float64 `json:"score,omitempty"`
	// Classification: the balanced accuracy and the majority-class
	// baseline's accuracy on the same rows (evaluate.Baseline);
	// BelowBaseline marks a model that does not beat its baseline (for
	// regression: R^2 not above 0, the rows' mean).
	BalancedAccuracy *float64 `json:"balanced_accuracy,omitempty"`
	Baseline         *float64 `json:"baseline,omitempty"`
	BelowBaseline    bool     `json:"below_baseline,omitempty"`
}

// EvalPoint is the evaluation of the global model after Round
// aggregations: the federation's figures and, with a schema, each site's
// (on its held-out rows). Without a schema it is --eval-data's.
type EvalPoint struct {
	Round      int                    `json:"round"`
	Federation EvalFigures            `json:"federation"`
	Sites      map[string]EvalFigures `json:"sites,omitempty"`
}

func figuresOf(r evaluate.Report) EvalFigures {
	f := EvalFigures{N: r.N, Loss: r.Loss}
	if r.Confusion != nil {
		a, ba := r.Accuracy, r.BalancedAccuracy
		f.Score, f.BalancedAccuracy = &a, &ba
	} else if r.R2 != nil {
		v := *r.R2
		f.Score = &v
	}
	if b := r.WithBaseline().Baseline; b != nil {
		if b.Rule == evaluate.BaselineMajority {
			acc := b.Accuracy
			f.Baseline = &acc
		}
		f.BelowBaseline = !b.Beaten
	}
	return f
}

func evalPointOf(fig *EvalStatus) EvalPoint {
	p := EvalPoint{Round: fig.Round, Federation: figuresOf(fig.Federation), Sites: map[string]EvalFigures{}}
	for id, r := range fig.Sites {
		p.Sites[id] = figuresOf(r)
	}
	return p
}

// siteWork is what a site's latest accepted update said of its local solve.
type siteWork struct {
	Round   int
	Gamma   float64
	Epochs  uint64
	Partial bool
}

// history is the shell's per-round memory (its own lock: the loop writes,
// HTTP handlers read).
type history struct {
	mu     sync.Mutex
	rounds []RoundRecord // ascending, at most HistoryRounds
	evals  []EvalPoint   // ascending by Round, at most HistoryRounds
	work   map[string]siteWork
	// Bytes of the round being counted: up is the received-bytes total at
	// its start, down what was sent for it so far.
	upStart   uint64
	down      uint64
	counting  bool // the bytes of the open round are being counted
	openRound int
	openedAt  time.Time
	// lastMsg is when each site's last message arrived (any topic).
	lastMsg map[string]time.Time
	// rejected counts each site's rejected messages by reason.
	rejected map[string]map[string]uint64
	// Kept as rounds come and go: each site's partial and straggled rounds
	// in rounds, and its latest evaluation.
	partialN, straggledN map[string]int
	lastEval             map[string]SiteEval
}

// count adds sign times r's partial and straggled sites to the per-site
// counts.
func (h *history) count(r RoundRecord, sign int) {
	if h.partialN == nil {
		h.partialN, h.straggledN = map[string]int{}, map[string]int{}
	}
	for _, id := range r.Partial {
		h.partialN[id] += sign
	}
	for _, id := range r.Stragglers {
		h.straggledN[id] += sign
	}
}

func (h *history) addRound(r RoundRecord) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.count(r, 1)
	if n := len(h.rounds); n > 0 && h.rounds[n-1].Round >= r.Round {
		// A round aggregated again (a restart redoing it): replace.
		i, found := slices.BinarySearchFunc(h.rounds, r.Round, func(x RoundRecord, t int) int { return x.Round - t })
		if found {
			h.count(h.rounds[i], -1)
			h.rounds[i] = r
			return
		}
		h.rounds = slices.Insert(h.rounds, i, r)
	} else {
		h.rounds = append(h.rounds, r)
	}
	if n := len(h.rounds) - HistoryRounds; n > 0 {
		for _, old := range h.rounds[:n] {
			h.count(old, -1)
		}
		h.rounds = slices.Delete(h.rounds, 0, n)
	}
}

func (h *history) addEval(p EvalPoint) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lastEval == nil {
		h.lastEval = map[string]SiteEval{}
	}
	for id, f := range p.Sites {
		if old, ok := h.lastEval[id]; !ok || p.Round >= old.Round {
			h.lastEval[id] = SiteEval{Round: p.Round, EvalFigures: f}
		}
	}
	i, found := slices.BinarySearchFunc(h.evals, p.Round, func(x EvalPoint, t int) int { return x.Round - t })
	if found {
		h.evals[i] = p
		return
	}
	h.evals = slices.Insert(h.evals, i, p)
	if len(h.evals) > HistoryRounds {
		h.evals = slices.Delete(h.evals, 0, len(h.evals)-HistoryRounds)
	}
}

func (h *history) setWork(id string, w siteWork) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.work == nil {
		h.work = map[string]siteWork{}
	}
	if old, ok := h.work[id]; !ok || w.Round >= old.Round {
		h.work[id] = w
	}
}

func (h *history) seen(id string, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lastMsg == nil {
		h.lastMsg = map[string]time.Time{}
	}
	if old, ok := h.lastMsg[id]; !ok && len(h.lastMsg) >= historySites {
		return
	} else if at.After(old) {
		h.lastMsg[id] = at
	}
}

func (h *history) reject(id, reason string) {
	if id == "" || wire.ValidID(id) != nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rejected == nil {
		h.rejected = map[string]map[string]uint64{}
	}
	m := h.rejected[id]
	if m == nil {
		if len(h.rejected) >= historySites {
			return
		}
		m = map[string]uint64{}
		h.rejected[id] = m
	}
	m[reason]++
}

func (h *history) sent(n uint64) {
	h.mu.Lock()
	h.down += n
	h.mu.Unlock()
}

// startRound starts counting the bytes of round r (opened at at), unless
// they are being counted already.
func (h *history) startRound(r int, at time.Time, upTotal uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.counting && h.openRound == r {
		return
	}
	h.counting, h.openRound, h.openedAt, h.upStart, h.down = true, r, at, upTotal, 0
}

// endRound returns the bytes counted for round r (nil when they were not
// counted) and stops counting.
func (h *history) endRound(r int, upTotal uint64) (up, down *uint64, openedAt time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.counting || h.openRound != r {
		return nil, nil, time.Time{}
	}
	u, d := upTotal-h.upStart, h.down
	h.counting = false
	return &u, &d, h.openedAt
}

// snapshot copies what the status shows. roundsAfter and evalsAfter keep
// only the records of later rounds (the console asks for what it lacks).
func (h *history) snapshot(roundsAfter, evalsAfter int) (rounds []RoundRecord, evals []EvalPoint, work map[string]siteWork,
	lastMsg map[string]time.Time, rejected map[string]map[string]uint64, partial, stragglers map[string]int, lastEval map[string]SiteEval) {
	h.mu.Lock()
	defer h.mu.Unlock()
	i, _ := slices.BinarySearchFunc(h.rounds, roundsAfter+1, func(x RoundRecord, t int) int { return x.Round - t })
	rounds = slices.Clone(h.rounds[i:])
	i, _ = slices.BinarySearchFunc(h.evals, evalsAfter+1, func(x EvalPoint, t int) int { return x.Round - t })
	evals = slices.Clone(h.evals[i:])
	partial, stragglers, lastEval = maps.Clone(h.partialN), maps.Clone(h.straggledN), maps.Clone(h.lastEval)
	work, lastMsg = maps.Clone(h.work), maps.Clone(h.lastMsg)
	rejected = make(map[string]map[string]uint64, len(h.rejected))
	for k, m := range h.rejected {
		c := make(map[string]uint64, len(m))
		for r, n := range m {
			c[r] = n
		}
		rejected[k] = c
	}
	return
}

// rebuildHistory fills the history from the round log after a restart
// (history.rebuild), the coordinator restored and the log replayed.
func (s *Server) rebuildHistory() error {
	src := historySource{store: s.store, dim: s.dim, lim: s.lim, clients: s.coord.Snapshot().Clients}
	if fit := s.fed.fitted(); fit != nil {
		src.schema = fit.schema
	}
	return s.hist.rebuild(src)
}

// historySource is what the history is rebuilt from after a restart.
type historySource struct {
	store  *aggstore.AggStore
	dim    int            // the model's values (0: not known yet)
	schema *schema.Schema // a schema run's, once fitted (nil: no evaluated rounds)
	lim    wire.Limits
	// clients are the restored coordinator's (the round log replayed):
	// each site's latest round.
	clients []coordinator.ClientState
}

// rebuild fills the history from the round log: the last HistoryRounds
// closed rounds (participants, partial work, stragglers, the change of the
// global model while the checkpoint budget lasts), the evaluated rounds
// and each site's latest work report.
func (h *history) rebuild(src historySource) error {
	cur, err := src.store.CurrentRound()
	if errors.Is(err, storage.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	last := int(cur.Number) - 1 // the newest closed round (the current one may be closed too: the end)
	if cur.Status == aggstore.RoundClosed {
		last = int(cur.Number)
	}
	if err := h.rebuildRounds(src, max(1, last-HistoryRounds+1), last); err != nil {
		return err
	}
	if src.schema != nil {
		if err := h.rebuildEvals(src); err != nil {
			return err
		}
	}
	h.rebuildWork(src)
	return nil
}

// rebuildRounds adds the records of the closed rounds first to last; the
// change of the global model is read for the newest rounds only, as far as
// the checkpoint budget (historyRebuildValues) lasts.
func (h *history) rebuildRounds(src historySource, first, last int) error {
	deltaFrom := last + 1 // rounds from here get the change of the global model
	if src.dim > 0 {
		deltaFrom = last - historyRebuildValues/src.dim + 1
	}
	var prev []float64
	for r := first; r <= last; r++ {
		rd, err := src.store.Round(uint64(r))
		if err != nil {
			return err
		}
		var st coordinator.State
		if err := json.Unmarshal(rd.State, &st); err != nil {
			return err
		}
		if st.Phase == coordinator.PhaseStatistics || st.Phase == coordinator.PhaseFitting {
			continue
		}
		rec := roundRecordOf(src.store, r, rd, st)
		if r >= deltaFrom {
			if prev == nil {
				prev, _ = src.store.Checkpoint(uint64(r))
			}
			next, err := src.store.Checkpoint(uint64(r + 1))
			if err == nil && len(prev) == src.dim && len(next) == src.dim {
				rec.DeltaNorm, rec.RelChange = deltaOf(prev, next)
			}
			prev = next
		}
		h.addRound(rec)
	}
	return nil
}

// roundRecordOf is the history's record of closed round r from its stored
// round and coordinator state: when it opened and was aggregated, its
// participants, partial contributors and stragglers (store: the round
// log, for when the next round opened).
func roundRecordOf(store *aggstore.AggStore, r int, rd aggstore.Round, st coordinator.State) RoundRecord {
	rec := RoundRecord{Round: r, OpenedAt: rd.OpenedAt, Participants: len(st.Received)}
	if next, err := store.Round(uint64(r + 1)); err == nil {
		rec.AggregatedAt = next.OpenedAt
	} else if !rd.ClosedAt.IsZero() {
		rec.AggregatedAt = rd.ClosedAt
	}
	got := map[string]bool{}
	for _, x := range st.Received {
		got[x.Client] = true
		if x.Partial {
			rec.Partial = append(rec.Partial, x.Client)
		}
	}
	for _, id := range st.Invited {
		if !got[id] {
			rec.Stragglers = append(rec.Stragglers, id)
		}
	}
	return rec
}

// rebuildEvals adds the figures of the last HistoryRounds evaluated rounds
// (a run with a federation schema).
func (h *history) rebuildEvals(src historySource) error {
	rounds, err := src.store.EvalRounds()
	if err != nil {
		return err
	}
	if len(rounds) > HistoryRounds {
		rounds = rounds[len(rounds)-HistoryRounds:]
	}
	for _, e := range rounds {
		fig, err := evalFigures(src.store, src.schema, int(e), src.lim)
		if err != nil {
			return err
		}
		if fig != nil {
			h.addEval(evalPointOf(fig))
		}
	}
	return nil
}

// rebuildWork sets each site's latest work report, from its latest stored
// update.
func (h *history) rebuildWork(src historySource) {
	for _, c := range src.clients {
		if c.LastRound < 1 {
			continue
		}
		u, err := src.store.GetUpdate(uint64(c.LastRound), c.ID)
		if err != nil {
			continue // pruned
		}
		if m, err := wire.DecodeUpdate(u.Msg, src.lim); err == nil && m.Report != nil {
			h.setWork(c.ID, siteWork{Round: c.LastRound, Gamma: m.Report.AchievedGamma, Epochs: m.Report.Epochs, Partial: m.Report.Partial})
		}
	}
}

// deltaOf is ||next - prev|| and that over ||prev|| (nil when ||prev|| is 0).
func deltaOf(prev, next []float64) (abs, rel *float64) {
	d := 0.0
	for i, v := range next {
		d += (v - prev[i]) * (v - prev[i])
	}
	d = math.Sqrt(d)
	abs = &d
	if n := norm2(prev); n > 0 {
		c := d / n
		rel = &c
	}
	return abs, rel
}

// noteWork keeps what an accepted update said of its site's local solve.
func (s *Server) noteWork(m *wire.ClientUpdate) {
	if m == nil || m.Report == nil {
		return
	}
	s.hist.setWork(m.ClientId, siteWork{Round: int(min(m.Round, math.MaxInt32)), Gamma: m.Report.AchievedGamma,
		Epochs: m.Report.Epochs, Partial: m.Report.Partial})
}

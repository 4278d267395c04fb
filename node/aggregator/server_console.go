package aggregator

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
)

// The data behind the console (/) and `broker-agg status --addr`: one JSON
// document, GET /status, read from the state file (ReadStatus) with the
// running daemon's live part added (LiveStatus).

// statusCache keeps the last status read from the state file, so that
// browsers polling /status cost one read of the file per change of the
// view and at most a few a second, however many are open.
type statusCache struct {
	mu  sync.Mutex
	gen uint64
	at  time.Time
	st  Status
	ok  bool
}

// statusMinAge is how long a cached read of the state file serves while the
// view changes.
const statusMinAge = 500 * time.Millisecond

func (s *Server) fileStatus() (Status, error) {
	s.mu.Lock()
	gen, finished := s.gen, s.view.finished
	s.mu.Unlock()
	c := &s.stCache
	c.mu.Lock()
	defer c.mu.Unlock()
	// A finished run's view no longer changes: its status is read afresh
	// once, so a reader never sees the run's end with the clients of a
	// read taken before they registered (a short run ends within
	// statusMinAge of its first read).
	if c.ok && (c.gen == gen || (!finished && s.clock.Since(c.at) < statusMinAge)) {
		return c.st, nil
	}
	st, err := ReadStatus(s.store)
	if err != nil {
		return st, err
	}
	c.gen, c.at, c.st, c.ok = gen, s.clock.Now(), st, true
	return st, nil
}

// LiveStatus is the federation's status as the running daemon's /status
// serves it: ReadStatus of its state file plus its configuration, the
// round history (the aggregated rounds after roundsAfter and the evaluated
// rounds after evalsAfter; -1: all kept) and each site's live figures.
func (s *Server) LiveStatus(roundsAfter, evalsAfter int) (Status, error) {
	st, err := s.fileStatus()
	if err != nil {
		return st, err
	}
	st.Clients = slices.Clone(st.Clients) // the cached copy is shared
	v, _ := s.Watch()
	rounds, evals, work, lastMsg, rejected, partial, straggled, lastEval := s.hist.snapshot(roundsAfter, evalsAfter)
	rejected = s.addBrokerRejections(rejected)
	if rounds == nil {
		rounds = []RoundRecord{}
	}
	if evals == nil {
		evals = []EvalPoint{}
	}
	live := &LiveStatus{
		Now: s.clock.Now().UTC(), Family: s.fam, Rounds: s.cfg.Rounds, PerRound: s.cfg.K,
		Quorum: coordinator.QuorumOf(s.cfg.K, s.cfg.QuorumFraction), QuorumFraction: s.cfg.QuorumFraction,
		RoundTimeout: s.cfg.RoundTimeout.Seconds(), Params: s.bundleParams(), Rejected: v.Rejected,
		History: rounds, Evaluations: evals, ScoreName: s.scoreName(),
	}
	if s.fed.on() {
		live.EvalEvery = s.fed.evalEvery()
	}
	if isSplit(s.fam) {
		live.Params["family"] = s.fam
	}
	st.Live = live
	if r := st.StatisticsReview; r != nil && s.reviewStop.Load() {
		c := *r
		c.Stopped = true
		st.StatisticsReview = &c
	}
	st.DuplicateInstances = s.inst.report()
	if st.Model == nil && !s.fed.on() {
		spec := s.spec // set once, before Run, without a schema
		st.Model = &spec
	}
	seen := map[string]bool{}
	for i := range st.Clients {
		c := &st.Clients[i]
		seen[c.ID] = true
		s.liveClient(c, work, lastMsg, rejected, partial, straggled, lastEval)
	}
	// Sites known only from their rejected messages (never a valid status).
	for id := range rejected {
		if !seen[id] {
			c := ClientInfo{ID: id}
			s.liveClient(&c, work, lastMsg, rejected, partial, straggled, lastEval)
			st.Clients = append(st.Clients, c)
		}
	}
	s.addRoster(&st)
	st.StatisticsOverdue = s.statisticsOverdue(st)
	slices.SortFunc(st.Clients, func(a, b ClientInfo) int {
		if a.ID < b.ID {
			return -1
		}
		if a.ID > b.ID {
			return 1
		}
		return 0
	})
	return st, nil
}

func (s *Server) liveClient(c *ClientInfo, work map[string]siteWork, lastMsg map[string]time.Time, rejected map[string]map[string]uint64,
	partial, straggled map[string]int, lastEval map[string]SiteEval) {
	id := c.ID
	if t, ok := lastMsg[id]; ok && (c.LastSeen == nil || t.After(*c.LastSeen)) {
		u := t.UTC()
		c.LastSeen = &u
	}
	if w, ok := work[id]; ok {
		c.LastWork = &WorkInfo{Round: w.Round, Gamma: w.Gamma, Epochs: w.Epochs, Partial: w.Partial}
	}
	if e, ok := lastEval[id]; ok {
		c.LastEval = &e
	}
	c.Partial, c.Straggled = partial[id], straggled[id]
	if r := rejected[id]; len(r) > 0 {
		c.Rejections = r
	}
	c.SamplesCapped = s.medianCapped.Get(id) + s.capped.Get(id)
}

// scoreName names EvalFigures.Score for this run.
func (s *Server) scoreName() string {
	switch {
	case s.fed.on() && s.fed.schema().NumClasses() > 0:
		return "accuracy"
	case s.fed.on():
		return "r2"
	case s.cfg.Eval != nil && s.cfg.Model.Kind == model.KindLinear:
		return "r2"
	case s.cfg.Eval != nil:
		return "accuracy"
	}
	return ""
}

// serveStatus is GET /status[?rounds_after=R&evals_after=E].
func (s *Server) serveStatus(w http.ResponseWriter, r *http.Request) {
	after := func(name string) (int, bool) {
		q := r.URL.Query().Get(name)
		if q == "" {
			return -1, true
		}
		n, err := strconv.Atoi(q)
		if err != nil || n < -1 {
			http.Error(w, name+": want a round number", http.StatusBadRequest)
			return 0, false
		}
		return n, true
	}
	ra, ok := after("rounds_after")
	if !ok {
		return
	}
	ea, ok := after("evals_after")
	if !ok {
		return
	}
	st, err := s.LiveStatus(ra, ea)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	if r.URL.Query().Get("compact") == "" {
		enc.SetIndent("", "  ")
	}
	_ = enc.Encode(st)
}

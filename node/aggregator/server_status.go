package aggregator

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/edgefl/edgefl/node/aggstore"
	"maps"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/edgefl/edgefl/internal/metrics"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/learn/evaluate"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/node/aggregator/console"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/wire"
)

// view is what the metrics and status handlers read, refreshed by the loop
// after every batch of decisions.
type view struct {
	round       int
	phase       coordinator.Phase
	selected    []string
	received    []string
	deadline    time.Time
	counters    coordinator.Counters
	clients     int
	online      int
	global      []float64
	globalRound int
	last        RoundReport
	aggSeconds  float64
	aggCount    uint64
	finished    bool
	statsSites  []string
	stopReason  string
	privacy     *PrivacyStatus
	secAgg      *SecAggStatus
}

func (s *Server) refreshView() {
	st := s.coord.Summary()
	s.mu.Lock()
	defer s.mu.Unlock()
	v := &s.view
	v.round, v.phase, v.deadline, v.counters = st.Round, st.Phase, st.Deadline, st.Counters
	// Summary's lists are the coordinator's, read only and never written
	// after it hands them out: the view keeps them as they are, and Watch
	// copies and sorts them when someone reads it (not after every
	// message: that made a round of K messages cost K^2 log K).
	v.selected = st.Selected
	v.received = st.Received
	v.clients, v.online = st.Clients, st.Online
	v.global, v.globalRound = s.global, s.globalR
	v.finished = st.Phase == coordinator.PhaseFinished
	v.statsSites, v.stopReason = st.StatsSites, st.StopReason
	v.privacy = s.privacyStatus()
	v.secAgg = s.secAggStatus()
	s.gen++
	close(s.changed)
	s.changed = make(chan struct{})
}

// notify wakes Watch callers after a change outside the loop (a rejection
// counted in an MQTT callback).
func (s *Server) notify() {
	s.mu.Lock()
	s.gen++
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// reject counts a shell-level rejection, also as the site's when site
// names a valid id.
func (s *Server) reject(site, reason string) {
	s.rejected.Inc(reason)
	s.hist.reject(site, reason)
	s.notify()
}

// ServerView is the daemon's in-memory view: round, phase and counters.
type ServerView struct {
	Round    int                  `json:"round"`
	Phase    coordinator.Phase    `json:"phase"`
	Selected []string             `json:"selected,omitempty"`
	Received []string             `json:"received,omitempty"`
	Deadline time.Time            `json:"deadline"`
	Clients  int                  `json:"clients"`
	Online   int                  `json:"online"`
	Counters coordinator.Counters `json:"counters"`
	// Rejected counts every rejection by reason: the coordinator's and
	// the shell's (decoding and validation).
	Rejected map[string]uint64 `json:"rejected"`
	// LastRound is the last aggregated round (0 before the first).
	LastRound         int     `json:"last_round"`
	LastParticipants  int     `json:"last_participants"`
	LastStragglers    int     `json:"last_stragglers"`
	EvalLoss          float64 `json:"-"`
	EvalScore         float64 `json:"-"`
	AggregatedRounds  uint64  `json:"aggregated_rounds"` // by this process
	StorageErrors     uint64  `json:"storage_errors"`
	PublishErrors     uint64  `json:"publish_errors"`
	BadStatusMessages uint64  `json:"bad_status_messages"`
	// The schema run: the sites whose statistics were accepted,
	// why the run ended, the latest federated evaluation, site errors
	// counted by site and reason, and the statistics and evaluation
	// reports answered (by "stored"/"duplicate", and rejected by reason).
	StatsSites    []string          `json:"stats_sites,omitempty"`
	StopReason    string            `json:"stop_reason,omitempty"`
	Evaluation    *EvalStatus       `json:"evaluation,omitempty"`
	SiteErrors    map[string]uint64 `json:"site_errors,omitempty"` // "site/reason"
	StatsStored   map[string]uint64 `json:"stats_stored,omitempty"`
	StatsRejected map[string]uint64 `json:"stats_rejected,omitempty"`
	EvalsStored   map[string]uint64 `json:"evals_stored,omitempty"`
	EvalsRejected map[string]uint64 `json:"evals_rejected,omitempty"`
	// Privacy is the differential-privacy accounting (ServerConfig.DP).
	Privacy *PrivacyStatus `json:"privacy,omitempty"`
	// SecAgg is the secure aggregation (ServerConfig.SecAgg).
	SecAgg *SecAggStatus `json:"secagg,omitempty"`
}

// Watch returns the current in-memory view and a channel closed at the
// next change (tests wait on it instead of sleeping).
func (s *Server) Watch() (ServerView, <-chan struct{}) {
	s.mu.Lock()
	v := s.view
	ch := s.changed
	siteErrs := map[string]uint64{}
	for k, n := range s.siteErrCounts {
		siteErrs[k[0]+"/"+k[1]] = n
	}
	var fed ServerView
	s.fed.statusInto(&fed)
	s.mu.Unlock()
	rej := s.rejected.Snapshot()
	for r, n := range v.counters.Rejected {
		rej[r.String()] += n
	}
	return ServerView{
		Round: v.round, Phase: v.phase, Selected: slices.Clone(v.selected), Received: sortedCopy(v.received),
		Deadline: v.deadline, Clients: v.clients, Online: v.online, Counters: v.counters, Rejected: rej,
		LastRound: v.last.Round, LastParticipants: len(v.last.Contributors), LastStragglers: len(v.last.Stragglers),
		EvalLoss: v.last.EvalLoss, EvalScore: v.last.EvalScore, AggregatedRounds: v.aggCount,
		StorageErrors: s.storageErrors.Load(), PublishErrors: s.publishErrors.Load(), BadStatusMessages: s.badStatus.Load(),
		StatsSites: sortedCopy(v.statsSites), StopReason: v.stopReason, SiteErrors: siteErrs,
		Evaluation: fed.Evaluation, StatsStored: fed.StatsStored, StatsRejected: fed.StatsRejected,
		EvalsStored: fed.EvalsStored, EvalsRejected: fed.EvalsRejected, Privacy: v.privacy,
		SecAgg: v.secAgg,
	}, ch
}

// sortedCopy is a sorted copy of ids (nil for none, as before).
func sortedCopy(ids []string) []string {
	if len(ids) == 0 {
		return nil
	}
	c := slices.Clone(ids)
	slices.Sort(c)
	return c
}

// Handler serves the console at / (package console), /metrics (Prometheus
// text format), /status (JSON: the round and every client's last-seen and
// participation, read from the state file, with the running daemon's
// configuration and round history; see LiveStatus), /bundle[?round=N] (a
// run with a schema: the model bundle of a stored round, see ExportBundle)
// and /healthz. Only GET and HEAD; no authentication (Run adds it as
// configured).
func (s *Server) Handler() http.Handler { return console.Secure(s.mux()) }

func (s *Server) mux() *http.ServeMux {
	mux := http.NewServeMux()
	con := console.Handler(func() (any, error) { return s.LiveStatus(-1, -1) }, s.clock.Now)
	mux.Handle("GET /{$}", con)
	mux.Handle("GET /console/", con)
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", metrics.ContentType)
		if err := metrics.Write(w, s.families()); err != nil {
			s.log.Error("writing metrics", "err", err)
		}
	})
	mux.HandleFunc("GET /status", s.serveStatus)
	mux.HandleFunc("GET /bundle", s.serveBundle)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-s.ready:
			if s.client != nil && s.client.IsConnectionOpen() {
				fmt.Fprintln(w, "ok")
				return
			}
			http.Error(w, "not connected to the broker", http.StatusServiceUnavailable)
		default:
			http.Error(w, "starting", http.StatusServiceUnavailable)
		}
	})
	return mux
}

// guarded is Handler behind the configured authentication: client
// certificate names (HTTPClientNames, with HTTPTLS) and basic auth
// (HTTPAuth). Every answer, a refusal too, carries Secure's headers.
func (s *Server) guarded() http.Handler {
	var h http.Handler = s.mux()
	if s.cfg.HTTPAuth != nil {
		h = console.BasicAuth(h, s.cfg.HTTPAuth, s.clock.Now)
	}
	if s.cfg.HTTPTLS != nil && s.cfg.HTTPTLS.ClientCAs != nil && len(s.cfg.HTTPClientNames) > 0 {
		h = console.ClientNames(h, s.cfg.HTTPClientNames)
	}
	return console.Secure(h)
}

const ns = "edgefl_aggregator_"

func (s *Server) families() []metrics.Family {
	v, _ := s.Watch()
	s.mu.Lock()
	aggSum, aggCount, last := s.view.aggSeconds, s.view.aggCount, s.view.last
	s.mu.Unlock()
	c := v.Counters
	rej := map[string]uint64{}
	for _, r := range coordinator.Reasons() {
		rej[r.String()] = 0
	}
	for _, r := range ShellReasons() {
		rej[r] = 0
	}
	for k, n := range v.Rejected {
		rej[k] += n
	}
	phases := []metrics.Sample{}
	for _, p := range coordinator.Phases() {
		val := 0.0
		if p == v.Phase {
			val = 1
		}
		phases = append(phases, metrics.Sample{Labels: []metrics.Label{{Name: "phase", Value: string(p)}}, Value: val})
	}
	f := []metrics.Family{
		metrics.One(ns+"round", "Current round number.", metrics.Gauge, float64(v.Round)),
		{Name: ns + "phase", Help: "1 for the current round's phase.", Type: metrics.Gauge, Samples: phases},
		metrics.One(ns+"round_selected", "Clients selected for the current round.", metrics.Gauge, float64(len(v.Selected))),
		metrics.One(ns+"round_received", "Updates received for the current round.", metrics.Gauge, float64(len(v.Received))),
		metrics.One(ns+"round_deadline_seconds", "Deadline of the current round (Unix seconds; 0 when none).", metrics.Gauge, unixOrZero(v.Deadline)),
		metrics.One(ns+"rounds_closed_total", "Rounds closed.", metrics.Counter, float64(c.RoundsClosed)),
		metrics.One(ns+"participants", "Contributors of the last aggregated round.", metrics.Gauge, float64(v.LastParticipants)),
		metrics.One(ns+"stragglers", "Stragglers (selected, did not report) of the last aggregated round.", metrics.Gauge, float64(v.LastStragglers)),
		metrics.One(ns+"stragglers_total", "Stragglers summed over closed rounds.", metrics.Counter, float64(c.Stragglers)),
		metrics.One(ns+"updates_accepted_total", "Updates accepted for an open round.", metrics.Counter, float64(c.Accepted)),
		metrics.One(ns+"updates_accepted_late_total", "Late FedSplit updates stored as the client's latest z.", metrics.Counter, float64(c.AcceptedLate)),
		metrics.One(ns+"updates_partial_total", "Accepted updates with partial work: "+wire.PartialMeans+".", metrics.Counter, float64(c.PartialUpdates)),
		{Name: ns + "updates_rejected_total", Help: "Rejected updates by reason (duplicates get an accepted receipt but count here).",
			Type: metrics.Counter, Samples: metrics.Samples("reason", rej)},
		{Name: ns + "received_bytes_total", Help: "Payload bytes received, by topic kind.", Type: metrics.Counter, Samples: metrics.Samples("kind", s.bytesIn.Snapshot())},
		{Name: ns + "received_messages_total", Help: "Messages received, by topic kind.", Type: metrics.Counter, Samples: metrics.Samples("kind", s.msgsIn.Snapshot())},
		metrics.One(ns+"extensions_total", "Deadlines extended below quorum.", metrics.Counter, float64(c.Extensions)),
		metrics.One(ns+"reselections_total", "Re-selections below quorum.", metrics.Counter, float64(c.Reselections)),
		metrics.One(ns+"stalls_total", "Rounds that ran out of re-selections.", metrics.Counter, float64(c.Stalls)),
		{Name: ns + "clients", Help: "Known clients, and those online (none while the aggregator is not connected to the broker: their liveness is then unknown).", Type: metrics.Gauge, Samples: []metrics.Sample{
			{Labels: []metrics.Label{{Name: "state", Value: "known"}}, Value: float64(v.Clients)},
			{Labels: []metrics.Label{{Name: "state", Value: "online"}}, Value: float64(v.Online) * b2f(s.brokerStatus().Connected)},
		}},
		{Name: ns + "aggregation_seconds", Help: "Time to aggregate and checkpoint a round.", Type: metrics.Summary, Samples: []metrics.Sample{
			{Suffix: "_sum", Value: aggSum}, {Suffix: "_count", Value: float64(aggCount)},
		}},
		metrics.One(ns+"aggregation_last_seconds", "Time to aggregate and checkpoint the last round.", metrics.Gauge, last.Duration.Seconds()),
		{Name: ns + "fedsplit_excluded_total", Help: "FedSplit: rounds in which a client was left out of the server step, set aside by the step bound (split.BoundedStep), by client.",
			Type: metrics.Counter, Samples: metrics.Samples("client", s.excluded.Snapshot())},
		{Name: ns + "fedsplit_clipped_total", Help: "FedSplit: rounds in which a client's step of z was longer than the step bound and was clipped (split.BoundedStep), by client.",
			Type: metrics.Counter, Samples: metrics.Samples("client", s.clipped.Snapshot())},
		{Name: ns + "fedsplit_readmitted_total", Help: "FedSplit: times a client set aside was taken back into the server step, by client.",
			Type: metrics.Counter, Samples: metrics.Samples("client", s.readmitted.Snapshot())},
		metrics.One(ns+"fedsplit_non_finite_total", "FedSplit: server steps that produced a value that is not a finite number (the global model was kept).", metrics.Counter, float64(s.nonFinite.Load())),
		metrics.One(ns+"fedsplit_diverging_total", "FedSplit: server steps taken while the iterate was diverging (the median step of z grew in 5 steps in a row).", metrics.Counter, float64(s.diverging.Load())),
		{Name: ns + "rate_limited_total", Help: "Messages dropped because their site was over its rate limit (--rate-messages, --rate-bytes), by client.",
			Type: metrics.Counter, Samples: metrics.Samples("client", s.rateLimited.Snapshot())},
		{Name: ns + "sample_count_capped_total", Help: "Updates weighted by the client's first reported sample count because they reported more, by client.",
			Type: metrics.Counter, Samples: metrics.Samples("client", s.capped.Snapshot())},
		{Name: ns + "sample_count_median_capped_total", Help: "FedAvg: updates weighted as the cap's multiple of the other sites' median sample count because they reported more (aggregate.FedAvg, cap=3 by default), by client.",
			Type: metrics.Counter, Samples: metrics.Samples("client", s.medianCapped.Snapshot())},
		{Name: ns + "state_corruption_total", Help: "Damaged values found in the state file while running, by what (the copy of a client's z: the site is asked for a new one).",
			Type: metrics.Counter, Samples: metrics.Samples("what", withZero(s.corruption.Snapshot(), "client_z"))},
		metrics.One(ns+"storage_errors_total", "Failed writes to the state file.", metrics.Counter, float64(v.StorageErrors)),
		metrics.One(ns+"publish_errors_total", "Failed MQTT publishes.", metrics.Counter, float64(v.PublishErrors)),
		metrics.One(ns+"bad_status_messages_total", "Status messages that failed to decode.", metrics.Counter, float64(v.BadStatusMessages)),
		metrics.One(ns+"stale_statuses_total", "Client statuses set aside as older than one already applied (a late last will, out-of-order delivery).", metrics.Counter, float64(c.StaleStatuses)),
		metrics.One(ns+"finished", "1 once the last round is aggregated.", metrics.Gauge, b2f(v.Phase == coordinator.PhaseFinished)),
	}
	var errSamples []metrics.Sample
	for _, k := range slices.Sorted(maps.Keys(v.SiteErrors)) {
		site, reason, _ := strings.Cut(k, "/")
		errSamples = append(errSamples, metrics.Sample{Labels: []metrics.Label{{Name: "site", Value: site}, {Name: "reason", Value: reason}},
			Value: float64(v.SiteErrors[k])})
	}
	f = append(f, s.inst.families()...)
	f = append(f, metrics.Family{Name: ns + "site_errors_total", Help: "Site errors reported in the sites' statuses (a change of a site's error counts once), by site and reason.",
		Type: metrics.Counter, Samples: errSamples})
	f = append(f, privacyFamilies(v.Privacy)...)
	f = append(f, secAggFamilies(v.SecAgg)...)
	f = append(f, s.brokerFamilies()...)
	f = append(f, s.rosterFamilies()...)
	evalData := "eval"
	if s.fed.on() {
		evalData = "eval_data" // the federated figures take the eval_ names
		f = append(f, s.fedFamilies(v)...)
	}
	if (s.cfg.Eval != nil || s.fed.hasEvalData()) && last.Round > 0 {
		f = append(f,
			metrics.One(ns+evalData+"_loss", "Loss of the global model on the evaluation set (--eval-data).", metrics.Gauge, last.EvalLoss),
			metrics.One(ns+evalData+"_accuracy", "Accuracy (R^2 for regression) of the global model on the evaluation set (--eval-data).", metrics.Gauge, last.EvalScore),
			metrics.One(ns+evalData+"_round", "Round whose aggregate the "+evalData+" gauges describe.", metrics.Gauge, float64(last.Round)))
	}
	return f
}

func unixOrZero(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixMilli()) / 1000
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Status is the federation's state as `broker-agg status` prints it and the
// console at / shows it: read from the state file (ReadStatus), and from a
// running daemon's /status with its live part (Server.LiveStatus).
type Status struct {
	Federation string `json:"federation,omitempty"`
	Algorithm  string `json:"algorithm,omitempty"`
	// The run's identity and codecs, as the round log stores them.
	RunID      string            `json:"run_id,omitempty"`
	Aggregator string            `json:"aggregator,omitempty"`
	Codec      string            `json:"codec,omitempty"`
	Downlink   string            `json:"downlink,omitempty"`
	Round      int               `json:"round"`
	Phase      coordinator.Phase `json:"phase"`
	// RoundOpenedAt is when the current round (the statistics phase:
	// the run) started.
	RoundOpenedAt *time.Time           `json:"round_opened_at,omitempty"`
	Deadline      *time.Time           `json:"deadline,omitempty"`
	Selected      []string             `json:"selected,omitempty"`
	Received      []string             `json:"received,omitempty"`
	Counters      coordinator.Counters `json:"counters"`
	Clients       []ClientInfo         `json:"clients"`
	// A run with a federation schema: its digest, the sites whose
	// statistics were accepted, the model and its inputs once fitted, the
	// latest eval round's federated and per-site figures, why the run
	// ended and its final bundle.
	Schema          string      `json:"schema,omitempty"`
	StatisticsSites []string    `json:"statistics_sites,omitempty"`
	Model           *model.Spec `json:"model,omitempty"`
	Evaluation      *EvalStatus `json:"evaluation,omitempty"`
	StopReason      string      `json:"stop_reason,omitempty"`
	FinalBundle     *BundleInfo `json:"final_bundle,omitempty"`
	// StatisticsReview is the statistics review of the sites'
	// statistics, once the preprocessing is fitted (stats_review.go).
	StatisticsReview *StatsReview `json:"statistics_review,omitempty"`
	// Privacy is the differential-privacy accounting of a --dp run.
	Privacy *PrivacyStatus `json:"privacy,omitempty"`
	// SecAgg is the secure aggregation of a --secagg run.
	SecAgg *SecAggStatus `json:"secagg,omitempty"`
	// Broker is the aggregator's own broker connection, Refused the
	// latest refused connection of each identity that is neither on the
	// roster nor a known site (the embedded broker's; roster.go), and
	// StatisticsOverdue the statistics phase past its deadline below
	// quorum, with each missing site and why (the running daemon's only).
	Broker            *BrokerStatus      `json:"broker,omitempty"`
	Refused           []SiteRefusal      `json:"refused,omitempty"`
	StatisticsOverdue *StatisticsOverdue `json:"statistics_overdue,omitempty"`
	// DuplicateInstances are the sites for which a second installation
	// was seen (instances.go; the running daemon's only).
	DuplicateInstances []DuplicateInstance `json:"duplicate_instances,omitempty"`
	// FedSplitDiverging is the round since which the FedSplit iterate has
	// been diverging (its median step of z grew in 5 steps in a row; 0:
	// not diverging), FedSplitNonFinite the steps whose model was not
	// finite and was not published.
	FedSplitDiverging int `json:"fedsplit_diverging_since,omitempty"`
	FedSplitNonFinite int `json:"fedsplit_non_finite,omitempty"`

	// ServerOpt is the run's server optimiser with its parameters, as
	// the round log stores it (empty: none).
	ServerOpt string `json:"server_opt,omitempty"`
	// Live is what only the running daemon knows (its configuration,
	// the round history); nil when read from the file.
	Live *LiveStatus `json:"live,omitempty"`
}

// BundleInfo names a stored bundle.
type BundleInfo struct {
	Round  int    `json:"round"`
	Digest string `json:"digest"`
	Bytes  int    `json:"bytes"`
	// The sites its evaluation covers and those it awaited in vain, and
	// the sites whose statistics made the preprocessing.
	EvalSites       []string `json:"eval_sites,omitempty"`
	EvalMissing     []string `json:"eval_missing,omitempty"`
	StatisticsSites []string `json:"statistics_sites,omitempty"`
}

// SiteError is a site's error as its status reported it.
type SiteError struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// ClientInfo is one client's line of Status.
type ClientInfo struct {
	ID            string     `json:"id"`
	Online        bool       `json:"online"`
	LastSeen      *time.Time `json:"last_seen,omitempty"`
	Samples       uint64     `json:"samples"`
	Participation uint64     `json:"participation"` // accepted updates
	LastRound     int        `json:"last_round,omitempty"`
	RecentLoss    *float64   `json:"recent_loss,omitempty"`
	Version       string     `json:"version,omitempty"`
	Selected      bool       `json:"selected,omitempty"` // in the current round's selection
	Reported      bool       `json:"reported,omitempty"` // its update for the current round is stored
	Error         *SiteError `json:"error,omitempty"`    // the site's error, from its latest online status
	// From the running daemon: in the rounds of the history (the last
	// HistoryRounds), how often the site was a straggler (invited, did
	// not report) and sent partial work; its latest work report and
	// evaluation; its rejected messages by reason.
	Straggled  int               `json:"straggled,omitempty"`
	Partial    int               `json:"partial,omitempty"`
	LastWork   *WorkInfo         `json:"last_work,omitempty"`
	LastEval   *SiteEval         `json:"last_eval,omitempty"`
	Rejections map[string]uint64 `json:"rejections,omitempty"`
	// From the running daemon (roster.go): the site is on the roster
	// (Expected), has never been heard of (NeverConnected), its latest
	// refused connection, and whether its liveness is unknown (the
	// aggregator is not connected to the broker; Online is then false).
	// NotInPreprocessing: a schema run's site whose statistics are not
	// among those the preprocessing was fitted from (it joined later).
	NotInPreprocessing bool         `json:"not_in_preprocessing,omitempty"`
	Expected           bool         `json:"expected,omitempty"`
	NeverConnected     bool         `json:"never_connected,omitempty"`
	LastRefusal        *SiteRefusal `json:"last_refusal,omitempty"`
	LivenessUnknown    bool         `json:"liveness_unknown,omitempty"`
	// SamplesCapped: the site's updates this daemon weighted by less
	// than the sample count they reported (FedAvg's cap relative to the
	// other sites' median, or the site's first reported count).
	SamplesCapped uint64 `json:"samples_capped,omitempty"`
	// FedSplit is what the robust FedSplit server step did with the site:
	// the rounds its step was clipped or it was left out, and why (nil:
	// never).
	FedSplit *SiteScreen `json:"fedsplit,omitempty"`
}

// WorkInfo is what a site's latest accepted update said of its local
// solve: the inexactness it reached, its epochs, whether the budget
// stopped it first.
type WorkInfo struct {
	Round   int     `json:"round"`
	Gamma   float64 `json:"gamma"`
	Epochs  uint64  `json:"epochs"`
	Partial bool    `json:"partial,omitempty"`
}

// SiteEval is a site's figures in the latest evaluated round it took part in.
type SiteEval struct {
	Round int `json:"round"`
	EvalFigures
}

// LiveStatus is the running daemon's part of Status.
type LiveStatus struct {
	Now            time.Time         `json:"now"`
	Family         string            `json:"family"`
	Rounds         int               `json:"rounds"` // 0: until stopped
	PerRound       int               `json:"per_round"`
	Quorum         int               `json:"quorum"`
	QuorumFraction float64           `json:"quorum_fraction"`
	RoundTimeout   float64           `json:"round_timeout_seconds"`
	EvalEvery      int               `json:"eval_every,omitempty"`
	Params         map[string]string `json:"params"`
	// ScoreName names EvalFigures.Score: "accuracy", "r2" or "" (none).
	ScoreName string `json:"score_name,omitempty"`
	// Rejected counts every rejection by reason, as /metrics does.
	Rejected map[string]uint64 `json:"rejected,omitempty"`
	// History is the aggregated rounds after ?rounds_after (default: all
	// kept), Evaluations the evaluated rounds after ?evals_after.
	History     []RoundRecord `json:"history"`
	Evaluations []EvalPoint   `json:"evaluations"`
}

// ReadStatus reads the federation's status from a state file: the current
// round's coordinator state and the client registry. It only reads.
func ReadStatus(store *aggstore.AggStore) (Status, error) {
	var out Status
	var dpConf *dp.Config
	var saConf *SecAggConfig
	cur, err := store.CurrentRound()
	if errors.Is(err, storage.ErrNotFound) {
		return out, fmt.Errorf("aggregator: %s holds no round yet", store.Path())
	}
	if err != nil {
		return out, err
	}
	dpConf, saConf = readRunConfig(store, &out)
	if !cur.OpenedAt.IsZero() {
		t := cur.OpenedAt.UTC()
		out.RoundOpenedAt = &t
	}
	st, err := StoredState(store) // the stored state and the messages stored since (coordinator_replay.go)
	if err != nil {
		return out, err
	}
	out.Round, out.Phase, out.Selected, out.Counters = st.Round, st.Phase, st.Selected, st.Counters
	if dpConf != nil && st.DP != nil && st.DP.Accountant != nil {
		out.Privacy = storedPrivacyStatus(dpConf, st.DP)
		out.StopReason = st.StopReason // dp_budget or rounds
	}
	if saConf != nil {
		out.SecAgg = newSecAggStatus(saConf, st.SecAgg, st.Phase, st.Counters)
	}
	if !st.Deadline.IsZero() && (st.Phase == coordinator.PhaseCollecting || st.Phase == coordinator.PhaseStalled || st.Phase == coordinator.PhaseStatistics || st.Phase == coordinator.PhaseFinishing) {
		d := st.Deadline
		out.Deadline = &d
	}
	rcv := map[string]bool{}
	for _, r := range st.Received {
		out.Received = append(out.Received, r.Client)
		rcv[r.Client] = true
	}
	coord := map[string]coordinator.ClientState{}
	for _, c := range st.Clients {
		coord[c.ID] = c
	}
	recs, err := store.Clients()
	if err != nil {
		return out, err
	}
	seen := map[string]bool{}
	for _, r := range recs {
		ci := ClientInfo{ID: r.ID, Online: r.Online, Samples: r.SampleCount, Participation: r.Participation,
			Version: r.SoftwareVersion, LastRound: coord[r.ID].LastRound, Selected: slices.Contains(st.Selected, r.ID), Reported: rcv[r.ID]}
		if !r.LastSeen.IsZero() {
			t := r.LastSeen.UTC()
			ci.LastSeen = &t
		}
		if !math.IsNaN(r.RecentLoss) {
			l := r.RecentLoss
			ci.RecentLoss = &l
		}
		if c, ok := coord[r.ID]; ok {
			ci.Online = c.Online // the coordinator's view is the one rounds run on
		}
		if r.ErrorReason != "" || r.ErrorMessage != "" {
			ci.Error = &SiteError{Reason: r.ErrorReason, Message: r.ErrorMessage}
		}
		out.Clients = append(out.Clients, ci)
		seen[r.ID] = true
	}
	for _, c := range st.Clients { // known to the coordinator, not (yet) in the registry
		if !seen[c.ID] {
			out.Clients = append(out.Clients, ClientInfo{ID: c.ID, Online: c.Online, Samples: uint64(c.Samples), LastRound: c.LastRound,
				Selected: slices.Contains(st.Selected, c.ID), Reported: rcv[c.ID]})
		}
	}
	slices.SortFunc(out.Clients, func(a, b ClientInfo) int { return strings.Compare(a.ID, b.ID) })
	if rs, err := decodeRobust(cur.Split); err == nil {
		out.FedSplitDiverging, out.FedSplitNonFinite = rs.DivergingSince, rs.NonFinite
		screens := screenOf(rs)
		for i := range out.Clients {
			if sc, ok := screens[out.Clients[i].ID]; ok {
				out.Clients[i].FedSplit = &sc
			}
		}
	}
	return out, readFedStatus(store, &out, st)
}

// readRunConfig fills out's run settings from the configuration stored
// with round 1 and returns its DP and secure-aggregation settings (nil:
// none, or unreadable).
func readRunConfig(store *aggstore.AggStore, out *Status) (*dp.Config, *SecAggConfig) {
	first, err := store.Round(1)
	if err != nil {
		return nil, nil
	}
	var sc storedConfig
	if json.Unmarshal(first.Config, &sc) != nil {
		return nil, nil
	}
	out.Federation, out.Algorithm, out.Schema = sc.Federation, sc.Algorithm, sc.SchemaDigest
	out.RunID, out.Aggregator, out.Codec, out.Downlink = sc.RunID, sc.Aggregator, sc.Codec, sc.Downlink
	if sc.ServerOpt != nil {
		out.ServerOpt = sc.ServerOpt.String()
	}
	return sc.DP, sc.SecAgg
}

// withZero adds the labels a counter always shows (at 0 until counted).
func withZero(m map[string]uint64, labels ...string) map[string]uint64 {
	if m == nil {
		m = map[string]uint64{}
	}
	for _, l := range labels {
		if _, ok := m[l]; !ok {
			m[l] = 0
		}
	}
	return m
}

// readFedStatus adds a schema run's part to a status read from the file.
func readFedStatus(store *aggstore.AggStore, out *Status, st coordinator.State) error {
	if out.Schema == "" {
		return nil
	}
	out.StatisticsSites, out.StopReason = st.StatsSites, st.StopReason
	b, err := store.Fit()
	if errors.Is(err, storage.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	rec, err := parseFit(b)
	if err != nil {
		return err
	}
	spec := rec.Model
	out.Model = &spec
	if len(rec.Sites) > 0 {
		for i := range out.Clients {
			out.Clients[i].NotInPreprocessing = !slices.Contains(rec.Sites, out.Clients[i].ID)
		}
	}
	if out.StatisticsReview, err = reviewOf(store, rec, wire.Limits{}); err != nil {
		return err
	}
	rounds, err := store.EvalRounds()
	if err != nil {
		return err
	}
	if n := len(rounds); n > 0 {
		if out.Evaluation, err = evalFigures(store, rec.schema, int(rounds[n-1]), wire.Limits{}); err != nil {
			return err
		}
	}
	if raw, err := store.FinalBundle(); err == nil {
		var head struct {
			Provenance struct {
				Round           int      `json:"round"`
				StatisticsSites []string `json:"statistics_sites"`
			} `json:"provenance"`
			Evaluation *struct {
				Sites   map[string]json.RawMessage `json:"sites"`
				Missing []string                   `json:"missing"`
			} `json:"evaluation"`
			Digest string `json:"digest"`
		}
		if json.Unmarshal(raw, &head) == nil {
			out.FinalBundle = &BundleInfo{Round: head.Provenance.Round, Digest: head.Digest, Bytes: len(raw),
				StatisticsSites: head.Provenance.StatisticsSites}
			if e := head.Evaluation; e != nil {
				out.FinalBundle.EvalSites = slices.Sorted(maps.Keys(e.Sites))
				out.FinalBundle.EvalMissing = e.Missing
			}
		}
	} else if !errors.Is(err, storage.ErrNotFound) {
		return err
	}
	return nil
}

// fedFamilies are the metrics of a run with a federation schema.
func (s *Server) fedFamilies(v ServerView) []metrics.Family {
	f := []metrics.Family{
		metrics.One(ns+"statistics_sites", "Sites whose statistics of their training rows were accepted.", metrics.Gauge, float64(len(v.StatsSites))),
		{Name: ns + "statistics_total", Help: "Site statistics answered, by result (stored, duplicate, or the rejection reason).",
			Type: metrics.Counter, Samples: metrics.Samples("result", merged(v.StatsStored, v.StatsRejected))},
		{Name: ns + "evaluations_total", Help: "Evaluation reports answered, by result (stored, duplicate, or the rejection reason).",
			Type: metrics.Counter, Samples: metrics.Samples("result", merged(v.EvalsStored, v.EvalsRejected))},
	}
	ev := v.Evaluation
	if ev == nil {
		return f
	}
	fed := ev.Federation
	f = append(f,
		metrics.One(ns+"eval_round", "Eval round of the federated evaluation gauges (aggregations the evaluated model had).", metrics.Gauge, float64(ev.Round)),
		metrics.One(ns+"eval_sites", "Sites in the federated evaluation.", metrics.Gauge, float64(len(ev.Sites))),
		metrics.One(ns+"eval_samples", "Held-out rows in the federated evaluation.", metrics.Gauge, float64(fed.N)),
		metrics.One(ns+"eval_loss", "Federated evaluation loss (sample-weighted over the sites' held-out rows).", metrics.Gauge, fed.Loss))
	site := func(name, help string, val func(r evaluate.Report) (float64, bool)) {
		var ss []metrics.Sample
		for _, id := range slices.Sorted(maps.Keys(ev.Sites)) {
			if x, ok := val(ev.Sites[id]); ok {
				ss = append(ss, metrics.Sample{Labels: []metrics.Label{{Name: "site", Value: id}}, Value: x})
			}
		}
		f = append(f, metrics.Family{Name: ns + name, Help: help, Type: metrics.Gauge, Samples: ss})
	}
	site("site_eval_loss", "A site's evaluation loss on its held-out rows.", func(r evaluate.Report) (float64, bool) { return r.Loss, r.N > 0 })
	site("site_eval_below_baseline", "1 when the model does not beat the baseline on a site's held-out rows (the majority class; for regression the rows' mean, R^2 <= 0), else 0.", func(r evaluate.Report) (float64, bool) {
		if r.Baseline == nil {
			return 0, false
		}
		return b2f(!r.Baseline.Beaten), true
	})
	if fed.Confusion != nil {
		f = append(f,
			metrics.One(ns+"eval_accuracy", "Federated evaluation accuracy.", metrics.Gauge, fed.Accuracy),
			metrics.One(ns+"eval_balanced_accuracy", "Federated evaluation balanced accuracy.", metrics.Gauge, fed.BalancedAccuracy))
		if fed.AUC != nil {
			f = append(f, metrics.One(ns+"eval_auc", "Federated ROC AUC (sample-weighted mean of the sites').", metrics.Gauge, *fed.AUC))
		}
		site("site_eval_accuracy", "A site's evaluation accuracy on its held-out rows.", func(r evaluate.Report) (float64, bool) { return r.Accuracy, r.N > 0 })
		site("site_eval_balanced_accuracy", "A site's evaluation balanced accuracy on its held-out rows.", func(r evaluate.Report) (float64, bool) { return r.BalancedAccuracy, r.N > 0 })
		if b := fed.Baseline; b != nil {
			f = append(f, metrics.One(ns+"eval_baseline_accuracy", "Accuracy of always predicting the majority class of the federation's held-out rows (the baseline eval_accuracy must beat).", metrics.Gauge, b.Accuracy))
		}
		site("site_eval_baseline_accuracy", "Accuracy of always predicting the majority class of a site's held-out rows (the baseline its accuracy must beat).", func(r evaluate.Report) (float64, bool) {
			if r.Baseline == nil {
				return 0, false
			}
			return r.Baseline.Accuracy, true
		})
	} else {
		f = append(f, metrics.One(ns+"eval_rmse", "Federated evaluation RMSE.", metrics.Gauge, fed.RMSE))
		if fed.R2 != nil {
			f = append(f, metrics.One(ns+"eval_r2", "Federated evaluation R^2.", metrics.Gauge, *fed.R2))
		}
		site("site_eval_r2", "A site's evaluation R^2 on its held-out rows.", func(r evaluate.Report) (float64, bool) {
			if r.R2 == nil {
				return 0, false
			}
			return *r.R2, true
		})
	}
	return f
}

func merged(a, b map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range a {
		out[k] += v
	}
	for k, v := range b {
		out[k] += v
	}
	return out
}

package aggregator

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/edgefl/edgefl/node/aggstore"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/internal/metrics"
	"github.com/edgefl/edgefl/internal/ratelimit"
	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/learn/aggregate"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/learn/serveropt"
	"github.com/edgefl/edgefl/learn/split"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/round"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// Algorithm families (the announcement's algorithm field). Any aggregator
// name of aggregate.Names() is also accepted: clients train it like
// FedProx, and it names the aggregator.
const (
	AlgoFedAvg       = round.FedAvg
	AlgoFedProx      = round.FedProx
	AlgoFedSplit     = round.FedSplit
	AlgoFedProxSplit = round.FedProxSplit
	AlgoScaffold     = round.Scaffold
)

// Init values of ServerConfig.Init.
const (
	InitZeros = "zeros" // the zero vector
	InitModel = "model" // the model's InitParams drawn with InitSeed (zeros for the convex models, small random weights for the MLP)
)

// Params are the training parameters a round announces (package round:
// their one type, check and wire mapping).
type Params = round.Params

// ServerConfig configures the aggregator daemon (the I/O shell around the
// Coordinator). Zero values take the defaults documented per field.
type ServerConfig struct {
	// Federation names the federation; topics live under
	// "edgefl/<Federation>/".
	Federation string

	// BrokerURL is the MQTT broker, as paho spells it: tcp://host:1883,
	// ssl://host:8883, ws://, wss://. For the embedded broker, its URL.
	BrokerURL string
	// ClientID is the aggregator's MQTT client id and identity (default
	// "aggregator"); the broker's ACL must let it use the whole prefix.
	ClientID string
	// Username and Password authenticate to the broker (optional).
	Username, Password string
	// TLS configures TLS to the broker (ssl:// URLs); nil = defaults.
	TLS *tls.Config
	// Dial, when set, opens the connection to the broker instead of
	// BrokerURL's address: the embedded broker's in-process connection
	// (broker.Broker.Dial). BrokerURL then only names it in logs.
	Dial func() (net.Conn, error)

	// K clients are selected per round (>= 1); QuorumFraction of them
	// (default 1: all) must report for a round to close; see Config.
	K               int
	QuorumFraction  float64
	RoundTimeout    time.Duration // default 10 min
	Extension       time.Duration // default RoundTimeout
	Settle          time.Duration // wait for clients to come online before a draw; default 0
	MaxReselections int           // negative: unlimited
	Rounds          int           // 0 runs forever
	Seed            uint64        // selection and aggregator randomness

	// Algorithm is fedavg, fedprox, fedsplit, fedproxsplit or an aggregator
	// name (trained like fedprox). Default fedprox.
	Algorithm string
	// Aggregator is the aggregate.NewAggregator spec of the FedAvg/FedProx
	// families; default: fedavg for fedavg, mean for fedprox, the algorithm
	// itself for an aggregator name. Ignored by the FedSplit family (the
	// mean of every known client's latest z).
	Aggregator string
	// Selector is the aggregate.NewSelector spec; default uniform, and
	// poisson (aggregate.DPSelector) with DP.
	Selector string
	Params   Params
	// ServerOpt is the server optimiser of the FedAvg/FedProx families
	// (learn/serveropt; zero: none, the aggregate is the next model):
	// the aggregate minus the global model is the pseudo-gradient of an
	// AvgM, Adagrad, Adam or Yogi step (server_opt.go). Refused with the
	// FedSplit family and secure aggregation.
	ServerOpt serveropt.Params
	// AnchorSketch, when set, asks clients for the gradient at the anchor
	// (Dimension 0) or its random-projection sketch (fedsim-cluster).
	AnchorSketch *wire.SketchSpec
	// PrivacyConfig is differential privacy's configuration (DP and its
	// test keys; server_dp.go).
	PrivacyConfig
	// SecAgg, when set, is secure aggregation (SecAggConfig;
	// server_secagg.go). Its zero fields are filled in by NewServer.
	SecAgg *SecAggConfig

	// Model is the model every client trains.
	Model model.Spec
	// Init is InitZeros (default) or InitModel with InitSeed.
	Init     string
	InitSeed uint64
	// Codec is the uplink codec spec clients must use (default "fp32").
	// Updates travel as deltas: w_k - x (FedProx family, with the sites'
	// error feedback), z_j minus this server's copy of z_j (FedSplit).
	Codec string
	// Downlink is the codec of the global model in the round announcement:
	// "fp32" (default) or "fp16". The server applies the model exactly as
	// the sites decode it (it keeps decode(encode(x)) as the global model),
	// so both sides' FedSplit reflections 2x - z_j use the same x.
	Downlink string

	// StatePath is the bbolt file of the round log (required).
	StatePath string
	// MetricsAddr serves the console (/), /metrics (Prometheus text),
	// /status (JSON), /bundle and /healthz; empty disables it.
	MetricsAddr string
	// HTTPTLS, when set, serves MetricsAddr over TLS; with ClientCAs and
	// tls.RequireAndVerifyClientCert, only clients with a certificate of
	// that CA connect, and of those only the common names in
	// HTTPClientNames (when not empty) are let in.
	HTTPTLS         *tls.Config
	HTTPClientNames []string
	// HTTPAuth, when set, requires HTTP basic auth on MetricsAddr (all but
	// /healthz) and checks a username and password with it.
	HTTPAuth func(user, password string) bool
	// Eval, when set, is evaluated after every aggregation: training loss
	// and accuracy (R^2 for regression) of the global model on it.
	Eval *model.Data
	// FinalModel, when set, receives the last global model (model.Save)
	// when the federation finishes; with a Schema, the final model bundle
	// (default <state dir>/final.bundle.json).
	FinalModel string

	// SchemaConfig is the schema run's configuration (the federation
	// schema and its phases; server_fed.go).
	SchemaConfig
	// Stopping rules (0: off): see Config.
	StopPatience int
	StopTol      float64
	StopDelta    float64
	// Version is the edgefl version written in bundles' provenance.
	Version string
	// MaxMessageBytes bounds an inbound message (default 16 MiB: the
	// embedded broker's packet cap).
	MaxMessageBytes int
	// RateMessages and RateBurst limit each site's inbound messages (per
	// second, and at once), RateBytes its bytes per second (a burst of one
	// largest message always fits); over the limit a message is dropped
	// and counted (ingest.go). Defaults DefaultRateMessages,
	// DefaultRateBurst, DefaultRateBytes.
	RateMessages float64
	RateBurst    int
	RateBytes    float64
	// BrokerRateLimited, with the embedded broker, returns how many
	// publishes the broker dropped over the same limits, by client
	// (broker.Broker.RateLimited); shown in /metrics and the sites' rows
	// (ingest_broker.go).
	BrokerRateLimited func() map[string]uint64
	// BrokerDropped, with the embedded broker, returns how many messages
	// the broker dropped instead of delivering them to a client, by reason
	// (broker.Broker.Dropped: "inflight_full", "write_queue_full"); shown
	// in /metrics (ingest_broker.go).
	BrokerDropped func() map[string]uint64
	// Roster is the federation's expected sites (--sites, the password
	// file's users, the site certificates issued under the PKI): status,
	// the console and /metrics show each one, "never connected" until it
	// is heard of, with its latest refused connection (roster.go).
	Roster []string
	// BrokerRefusals, with the embedded broker, returns the latest refused
	// connection of every identity the broker refused
	// (broker.Broker.Refusals); nil with an external broker, which the
	// aggregator cannot see refuse anyone.
	BrokerRefusals func() []SiteRefusal
	// InstanceTakeover is how long a site's installation must have been
	// gone (its last will) before another installation with the site's id
	// takes it over (instances.go; default DefaultInstanceTakeover). One
	// that stopped cleanly is taken over at once.
	InstanceTakeover time.Duration
	// IngestWorkers decode inbound messages for the event loop (default
	// DefaultIngestWorkers); IngestQueue messages may wait for them (default
	// DefaultIngestQueue).
	IngestWorkers, IngestQueue int

	// Clock is the time source: event times, the coordinator's timer, the
	// aggregation's duration (default clock.Real).
	Clock clock.Clock
	// Logger receives the daemon's log (default slog.Default()).
	Logger *slog.Logger
	// OnRound, when set, is called from the event loop after each round is
	// aggregated and durably checkpointed, before the next announcement.
	// It must not block for long.
	OnRound func(RoundReport)
}

// RoundReport describes one aggregated round.
type RoundReport struct {
	Round        int
	Contributors []string
	Partial      []string
	Stragglers   []string
	Late         int           // late FedSplit updates stored since the previous aggregation
	Duration     time.Duration // aggregation and checkpoint (wall time)
	Epsilon      float64       // the privacy spent after this round (ServerConfig.DP; 0 without)
	EvalLoss     float64       // NaN without ServerConfig.Eval
	EvalScore    float64       // accuracy (R^2 for regression); NaN without Eval
	Metrics      map[string]float64
	Global       []float64 // the new global model (do not modify)

	// EpsilonUnamplified is the largest per-site epsilon without
	// amplification by subsampling after this round (ServerConfig.DP).
	EpsilonUnamplified float64
}

// Default values.
const (
	DefaultClientID        = "aggregator"
	DefaultRoundTimeout    = 10 * time.Minute
	DefaultMaxMessageBytes = 16 << 20
)

func isSplit(family string) bool { return family == AlgoFedSplit || family == AlgoFedProxSplit }

// family maps an algorithm to its family and default aggregator spec.
func family(algo string) (fam, agg string, err error) {
	switch algo {
	case AlgoFedAvg:
		return AlgoFedAvg, "fedavg", nil
	case AlgoFedProx:
		return AlgoFedProx, "mean", nil
	case AlgoFedSplit, AlgoFedProxSplit:
		return algo, split.StepRobust, nil
	case AlgoScaffold:
		return AlgoScaffold, "mean", nil
	case model.AlgoMOON:
		// MOON's local objective (mu its weight, no proximal term) feeding
		// FedAvg's sample-weighted mean; partial work is kept, as FedProx's.
		return AlgoFedProx, "fedavg", nil
	case model.AlgoFedSiamDA:
		return AlgoFedProx, "fedsiam", nil
	}
	if slices.Contains(aggregate.Names(), algo) {
		return AlgoFedProx, algo, nil
	}
	return "", "", fmt.Errorf("%w: algorithm %q (want fedavg, fedprox, fedsplit, fedproxsplit, scaffold, moon, fedsiam-da or an aggregator: %s)",
		coordinator.ErrConfig, algo, strings.Join(aggregate.Names(), ", "))
}

func (c *ServerConfig) defaults() {
	if c.ClientID == "" {
		c.ClientID = DefaultClientID
	}
	if c.QuorumFraction == 0 {
		c.QuorumFraction = 1
	}
	if c.RoundTimeout == 0 {
		c.RoundTimeout = DefaultRoundTimeout
	}
	if c.Algorithm == "" {
		c.Algorithm = AlgoFedProx
	}
	c.ServerOpt = c.ServerOpt.WithDefaults()
	c.contrastDefaults()
	if c.DP != nil && !c.DP.Distributed && !c.DP.FixedRounds && !c.DP.EarlyClose {
		// Central DP whose rounds close early: their timing tells the
		// draw's size, so they are charged at q = 1 (dp.Config.EarlyClose).
		d := *c.DP
		d.EarlyClose = true
		c.DP = &d
	}
	if c.Selector == "" {
		c.Selector = "uniform"
		if c.DP != nil && c.SecAgg == nil {
			c.Selector = aggregate.DPSelector
		}
	}
	if c.Init == "" {
		c.Init = InitZeros
	}
	if c.Codec == "" {
		c.Codec = "fp32"
	}
	if c.Downlink == "" {
		c.Downlink = "fp32"
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.RateMessages <= 0 {
		c.RateMessages = DefaultRateMessages
	}
	if c.RateBurst <= 0 {
		c.RateBurst = DefaultRateBurst
	}
	if c.RateBytes <= 0 {
		c.RateBytes = DefaultRateBytes
	}
	if c.IngestWorkers <= 0 {
		c.IngestWorkers = DefaultIngestWorkers
	}
	if c.InstanceTakeover <= 0 {
		c.InstanceTakeover = DefaultInstanceTakeover
	}
	if c.IngestQueue <= 0 {
		c.IngestQueue = DefaultIngestQueue
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.BrokerURL == "" && c.Dial != nil {
		c.BrokerURL = "tcp://in-process"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// storedConfig is what the round log remembers of the configuration (each
// round's Config), checked on restart: a state file belongs to one
// federation, algorithm family and model.
type storedConfig struct {
	Federation string     `json:"federation"`
	Algorithm  string     `json:"algorithm"`
	Family     string     `json:"family"`
	Aggregator string     `json:"aggregator,omitempty"`
	Model      model.Spec `json:"model"`
	Dimension  int        `json:"dimension"`
	Codec      string     `json:"codec"`
	Downlink   string     `json:"downlink,omitempty"`
	// SchemaDigest is the federation schema's digest (empty:
	// no schema). Model then holds the operator's model flags only.
	SchemaDigest string `json:"schema_digest,omitempty"`
	// RunID names this round log in every announcement (wire
	// RoundAnnouncement.run_id): chosen at random when the log is created,
	// so sites can tell a new run (a wiped state file) from an old one.
	RunID string `json:"run_id,omitempty"`
	// Params are the algorithm's parameters a resumed run must keep (nil
	// in a log written before they were kept: not checked then).
	Params *storedParams `json:"params,omitempty"`
	// DP is the run's differential-privacy setting (nil: none), which a
	// resumed run must keep, and NoiseKey the secret key of its noise
	// (32 bytes from crypto/rand, drawn when the log is created), so that
	// an aggregation redone after a restart draws the same noise.
	// SelectionKey is the secret key of the selection stream
	// (streams.Secret; 32 bytes from crypto/rand, drawn with NoiseKey), so
	// that nobody who knows --seed predicts who is sampled.
	DP           *dp.Config `json:"dp,omitempty"`
	NoiseKey     []byte     `json:"dp_noise_key,omitempty"`
	SelectionKey []byte     `json:"dp_selection_key,omitempty"`
	// SecAgg is the run's secure aggregation (nil: none), which a resumed
	// run must keep: a site's session and the stored server state assume
	// its quantiser and threshold.
	SecAgg *SecAggConfig `json:"secagg,omitempty"`
	// ServerOpt is the run's server optimiser (nil: none), which a
	// resumed run must keep: its stored moments assume it.
	ServerOpt *serveropt.Params `json:"server_opt,omitempty"`
	// ControlEpoch is the round the last rollback reopened (0: none),
	// from whose close SCAFFOLD's control variates count again
	// (server_scaffold.go); Rollback writes it with the new run id.
	ControlEpoch uint64 `json:"control_epoch,omitempty"`
}

// storedParams are the parameters of the algorithm's math: FedProx's mu
// (fedprox family; fedavg's is 0), FedSplit's step and relaxation (FedSplit
// family; its sites derive their proximal weight from the step). A run
// resumed with other values would mix two algorithms in one round log
// (and FedSplit's z_j, the sites' copies and residuals assume one step), so
// restore refuses it. The local work settings (solver, gamma, lr, batch,
// the budget) are not among them: they may change between restarts and
// apply from the next announcement.
type storedParams struct {
	Mu    float64 `json:"mu"`
	Step  float64 `json:"step"`
	Relax float64 `json:"relax"`
}

// resumeDiffs lists, as "--flag NEW differs from the run's OLD", the
// parameters of this configuration that differ from the run's stored one.
func (s *Server) resumeDiffs(was storedConfig) []string {
	var d []string
	diff := func(flag, now, then string) {
		if now != then {
			d = append(d, fmt.Sprintf("--%s %s differs from the run's %s", flag, now, then))
		}
	}
	num := func(v float64) string { return fmt.Sprint(v) }
	if was.Algorithm != "" {
		diff("algorithm", s.cfg.Algorithm, was.Algorithm)
	}
	if was.Aggregator != "" {
		diff("aggregator", s.aggSpec, was.Aggregator)
	}
	if was.Codec != "" {
		diff("codec", s.cfg.Codec, was.Codec)
	}
	downWas := was.Downlink
	if downWas == "" {
		downWas = "fp32"
	}
	diff("downlink", s.cfg.Downlink, downWas)
	diff("dp", dpText(s.cfg.DP), dpText(was.DP))
	diff("secagg", s.secAgg.text(), secAggText(was.SecAgg))
	diff("server-opt", optText(s.stored.ServerOpt), optText(was.ServerOpt))
	if p := was.Params; p != nil && s.stored.Params != nil {
		now := *s.stored.Params
		if s.fam == AlgoFedProx {
			diff("mu", num(now.Mu), num(p.Mu))
		}
		if isSplit(s.fam) {
			diff("step", num(now.Step), num(p.Step))
			diff("relax", num(now.Relax), num(p.Relax))
		}
	}
	return d
}

// Server is the aggregator daemon: it owns one Coordinator and carries out
// its decisions over MQTT (paho) and bbolt (aggstore.AggStore). Build it with
// NewServer, then Run it once.
//
// One goroutine (Run's event loop) owns the coordinator, the store's writes
// and the timer. MQTT callbacks decode and validate messages on paho's
// goroutines and hand status and update events to the loop through a
// channel; an update's callback waits until the loop has made the update
// durable (or rejected it) and only then acknowledges the MQTT message, so
// an update the broker has handed over is either in bbolt or will be
// redelivered.
type Server struct {
	cfg     ServerConfig
	log     *slog.Logger
	clock   clock.Clock
	topics  wire.Topics
	lim     wire.Limits
	qlim    quant.Limits
	store   *aggstore.AggStore
	coord   *coordinator.Coordinator
	model   model.Model
	spec    model.Spec // the model's spec (with a schema: once fitted)
	dim     int
	dec     atomic.Pointer[decoder] // what the MQTT callbacks decode with
	eval    *model.Data             // ServerConfig.Eval, or EvalTable once fitted
	fed     *schemaRun              // the schema run (server_fed.go; off without a schema)
	fam     string
	aggSpec string
	agg     aggregate.Aggregator // nil for the FedSplit family
	screen  float64              // the FedSplit family's step bound factor (split.BoundedStep)
	// robust is the FedSplit server step's state as of the open round
	// (server_robust.go); nextRobust the closing round's, until its
	// checkpoint is stored.
	robust, nextRobust *robustState
	// opt is the server optimiser and its state (server_opt.go).
	opt serverOpt
	// control is SCAFFOLD's c as the current round opened, nextControl
	// the closing round's until its checkpoint is stored
	// (server_scaffold.go).
	control, nextControl []float64
	// sum is the FedSplit family's sum mode (server_sum.go; nil outside
	// sum mode).
	sum     *sumMode
	privacy *privacy     // differential privacy (server_dp.go)
	stored  storedConfig // the run's configuration, with its run id once restored
	conf    []byte       // stored as JSON

	loopQ   *quant.Codec // the loop's own codec
	down    *quant.Codec // the downlink codec (the loop's)
	global  []float64    // the global model of globalR
	globalR int
	frame   []byte // the fp32 frame of global (for globalR)
	storeR  uint64 // the store's current round
	lastSt  []byte // the state bytes last written to storeR
	encodes uint64 // whole-state encodings (encodeState), loop-owned: tests count them
	fresh   bool   // the state file was new
	reqs    chan *request
	group   int // at most this many updates share a write transaction (commit_group.go; 1: one each)
	client  mqtt.Client
	timer   clock.Timer // the coordinator's one timer (SetTimer); nil when none

	// wScratch holds the w of the update being stored (updateRecord,
	// FedProx family), loop-owned: checked, then dropped.
	wScratch []float64

	runCtx     context.Context
	ran        atomic.Bool
	closed     atomic.Bool
	ready      chan struct{}
	subscribed chan struct{}
	subOnce    sync.Once
	finished   chan struct{}
	finOnce    sync.Once
	metAddr    atomic.Value // string

	secAgg *secAggRun // secure aggregation (server_secagg.go; nil without it)

	// metrics
	mu                                      sync.Mutex
	view                                    view
	changed                                 chan struct{}
	gen                                     uint64 // bumped with every change of the view (under mu)
	stCache                                 statusCache
	rejected                                metrics.LabeledCounter // shell-level rejections by reason
	corruption                              metrics.LabeledCounter // damaged stored values found at run time, by what
	excluded                                metrics.LabeledCounter // FedSplit: left out of a server step (set aside), by client
	clipped                                 metrics.LabeledCounter // FedSplit: step of z clipped, by client
	readmitted                              metrics.LabeledCounter // FedSplit: taken back after being set aside, by client
	nonFinite                               atomic.Uint64          // FedSplit: steps that produced a non-finite value (model kept)
	diverging                               atomic.Uint64          // FedSplit: steps taken while the iterate was diverging
	capped                                  metrics.LabeledCounter // updates weighted by the client's first sample count, by client
	medianCapped                            metrics.LabeledCounter // updates FedAvg's cap weighted as a multiple of the others' median count, by client
	rateLimited                             metrics.LabeledCounter // messages dropped over a site's rate limit, by client
	limits                                  *ratelimit.Limiter
	inst                                    instanceGuard // one installation per site id (instances.go)
	receipts                                receiptCache
	ingestQ                                 chan ingestJob
	samplesCapped                           map[string][2]uint64   // set by closedUpdates while aggregating: reported, first
	bytesIn                                 metrics.LabeledCounter // by topic kind
	bytesInTotal                            atomic.Uint64          // bytesIn summed
	hist                                    history                // the round history (history.go)
	conn                                    brokerConn             // the aggregator's own broker connection (roster.go)
	msgsIn                                  metrics.LabeledCounter
	storageErrors, publishErrors, badStatus atomic.Uint64

	// reviewStop: the run stopped before round 1 for the statistics
	// review (--stats-review; stats_review.go).
	reviewStop atomic.Bool

	// siteErrs are the sites' errors as their statuses last reported them
	// (loop-owned); siteErrCounts counts their changes (under mu).
	siteErrs      map[string][2]string
	siteErrCounts map[[2]string]uint64
}

// request is an event handed from an MQTT callback to the loop.
type request struct {
	status *wire.ClientStatus
	update *inUpdate
	stats  *inStats
	eval   *inEval
	secagg *inSecAgg
	done   chan struct{}
}

// inUpdate is a decoded, validated update.
type inUpdate struct {
	msg *wire.ClientUpdate
	raw []byte
	vec []float64
}

// NewServer validates cfg (Validate), opens the state file (a second
// daemon on the same file fails here) and restores the coordinator from it.
// Call Run, or Close if Run will not be called.
func NewServer(cfg ServerConfig) (*Server, error) {
	cfg.defaults()
	d, err := cfg.derive()
	if err != nil {
		return nil, err
	}
	cfg.Params = d.params
	s := &Server{cfg: cfg, log: cfg.Logger, clock: cfg.Clock, reqs: make(chan *request), ingestQ: make(chan ingestJob, cfg.IngestQueue),
		ready: make(chan struct{}), subscribed: make(chan struct{}), finished: make(chan struct{}), changed: make(chan struct{}),
		topics: d.topics, fam: d.fam, aggSpec: d.aggSpec, screen: d.screen, agg: d.agg, eval: cfg.Eval, privacy: newPrivacy(cfg.PrivacyConfig, cfg.SecAgg)}
	s.opt.params = cfg.ServerOpt
	if d.sum {
		s.sum = newSumMode(d.coord.FixedRoster)
	}
	s.group = defaultCommitGroup
	s.metAddr.Store("")
	s.inst.takeover = cfg.InstanceTakeover
	s.lim = wire.Limits{MaxMessageBytes: cfg.MaxMessageBytes}
	if s.limits, err = ratelimit.New(rateLimits(cfg)); err != nil {
		return nil, fmt.Errorf("aggregator: %w", err)
	}
	s.dec.Store(&decoder{lim: s.lim})
	s.secAgg = newSecAggRun(cfg.SecAgg, cfg.K, s.lim, s.log)
	s.fed = newSchemaRun(cfg.SchemaConfig)
	if !s.fed.on() {
		if err := s.setModel(cfg.Model); err != nil {
			return nil, err
		}
	}
	if s.coord, err = coordinator.New(d.coord); err != nil {
		return nil, err
	}
	p := d.params
	s.stored = storedConfig{Federation: cfg.Federation, Algorithm: cfg.Algorithm, Family: s.fam,
		Aggregator: s.aggSpec, Model: cfg.Model, Dimension: s.dim, Codec: cfg.Codec, Downlink: cfg.Downlink,
		Params: &storedParams{Mu: p.Mu, Step: p.Step, Relax: p.Relax}, DP: cfg.DP, SecAgg: cfg.SecAgg}
	if s.opt.params.On() {
		o := s.opt.params
		s.stored.ServerOpt = &o
	}
	if cfg.Schema != nil {
		s.stored.Model, s.stored.SchemaDigest = operatorModel(cfg.Model), cfg.Schema.Digest()
	}
	if err := s.open(); err != nil {
		return nil, err
	}
	return s, nil
}

// open opens the state file and restores the round log from it.
func (s *Server) open() error {
	var err error
	if s.store, err = aggstore.OpenAgg(s.cfg.StatePath, storage.Options{}); err != nil {
		return DamagedStateError(s.cfg.StatePath, err)
	}
	if err := s.restore(); err != nil {
		s.store.Close()
		return DamagedStateError(s.cfg.StatePath, err)
	}
	if !s.fresh {
		if err := s.rebuildHistory(); err != nil {
			// Only the console's charts lack the earlier rounds.
			s.log.Warn("the round history could not be rebuilt from the round log", "err", err)
		}
	}
	s.refreshView()
	return nil
}

// DamagedStateError adds the way out to an error that says the state file
// at path is damaged (storage.ErrCorrupt): the round to roll back to when
// the newest values are damaged, or a new run when the pages are. Other
// errors are returned as they are.
func DamagedStateError(path string, err error) error {
	if !errors.Is(err, storage.ErrCorrupt) {
		return err
	}
	n, lerr := aggstore.LastIntactRound(path)
	switch {
	case lerr == nil && n > 0:
		return fmt.Errorf("%w; rounds 1..%d are intact: roll back to round %d with `broker-agg run --rollback %d` (a copy of the file is kept)", err, n, n, n)
	default:
		return fmt.Errorf("%w; it cannot be rolled back: restore it from a copy, or move it aside to start a new run", err)
	}
}

// Rollback rolls the round log at path back to round n (0: the newest
// intact round; see aggstore.Rollback) and gives it a new run id: the sites
// have moved past round n (their applied rounds only grow), so they must
// see a new run and start their round state over, from round n's global
// model. Call it before NewServer opens the file.
func Rollback(path string, n uint64, now time.Time) (aggstore.RollbackResult, string, error) {
	runID := crand.Text()
	if n == 0 { // the round aggstore.Rollback rolls back to, named in the config
		var err error
		if n, err = aggstore.LastIntactRound(path); err != nil {
			return aggstore.RollbackResult{}, "", err
		}
	}
	res, err := aggstore.Rollback(path, n, now, func(b []byte) ([]byte, error) {
		var c map[string]any
		if err := json.Unmarshal(b, &c); err != nil {
			return nil, fmt.Errorf("%w: round 1's configuration: %w", storage.ErrCorrupt, err)
		}
		c["run_id"] = runID
		// SCAFFOLD's control variates start over from round n with the
		// sites' c_i, which the new run id clears (server_scaffold.go).
		c["control_epoch"] = n
		return json.Marshal(c)
	})
	return res, runID, err
}

// restore loads the round log: a fresh file gets round 1 with the initial
// model; otherwise the stored configuration (which must match), the
// coordinator's state with the replay log, the global model of its round
// and each feature's state come back.
func (s *Server) restore() error {
	cur, err := s.store.CurrentRound()
	if errors.Is(err, storage.ErrNotFound) && s.fed.on() {
		return s.restoreFreshFed()
	}
	if errors.Is(err, storage.ErrNotFound) {
		return s.restoreFresh()
	}
	if err != nil {
		return err
	}
	if err := s.restoreConfig(); err != nil {
		return err
	}
	replayed, err := s.restoreCoordinator(cur)
	if err != nil {
		return err
	}
	r := s.coord.Round()
	if ph := s.coord.Phase(); ph == coordinator.PhaseFinished || ph == coordinator.PhaseFinishing {
		r++ // the final aggregate, checkpointed as round Rounds+1
	}
	if s.fed.on() && s.fed.fitted() == nil {
		// The statistics phase (or a fit not yet stored): no model yet.
		s.log.Info("resuming the statistics phase", "state", s.cfg.StatePath, "phase", s.coord.Phase(),
			"statistics", len(s.coord.StatisticsSites()), "run_id", s.stored.RunID)
		return nil
	}
	if err := s.restoreGlobal(r); err != nil {
		return err
	}
	if err := s.restoreFeatures(cur, r); err != nil {
		return err
	}
	for _, e := range replayed.evalDone {
		s.finalizeEval(e) // idempotent: the latest bundle rewritten
	}
	sum := s.coord.Summary()
	s.log.Info("resuming from the round log", "state", s.cfg.StatePath, "round", r, "phase", sum.Phase,
		"received", len(sum.Received), "clients", sum.Clients)
	return nil
}

// restoreConfig checks round 1's stored configuration against this one
// (the schema, the federation, the model, the resumable parameters; the
// schema run's fit comes back on the way) and adopts the run's id, keys
// and parameters.
func (s *Server) restoreConfig() error {
	first, err := s.store.Round(1)
	if err != nil {
		return fmt.Errorf("aggregator: %s: round 1: %w", s.cfg.StatePath, err)
	}
	var was storedConfig
	if err := json.Unmarshal(first.Config, &was); err != nil {
		return fmt.Errorf("aggregator: %s: stored configuration: %w", s.cfg.StatePath, err)
	}
	if was.SchemaDigest != s.stored.SchemaDigest {
		return fmt.Errorf("%w: %s belongs to a run with federation schema %s; this configuration's schema is %s: use the same --schema, or another --state-file",
			coordinator.ErrConfig, s.cfg.StatePath, orNone(was.SchemaDigest), orNone(s.stored.SchemaDigest))
	}
	if s.fed.on() {
		if err := s.restoreFit(); err != nil {
			return err
		}
	}
	wantModel, wantDim := s.cfg.Model, s.dim
	if s.fed.on() {
		wantModel, wantDim = s.stored.Model, 0 // the fit decides the rest
	}
	if was.Federation != s.cfg.Federation || was.Family != s.fam || was.Model != wantModel || was.Dimension != wantDim {
		return fmt.Errorf("%w: %s belongs to federation %q, %s, model %+v; this configuration is federation %q, %s, model %+v: use another --state-file",
			coordinator.ErrConfig, s.cfg.StatePath, was.Federation, was.Family, was.Model, s.cfg.Federation, s.fam, wantModel)
	}
	if d := s.resumeDiffs(was); len(d) > 0 {
		return fmt.Errorf("%w: %s (state file %s); use the run's values, or start a new run with another --state-file",
			coordinator.ErrConfig, strings.Join(d, ", "), s.cfg.StatePath)
	}
	s.stored.RunID = was.RunID // "" for a log written before run ids
	s.stored.ControlEpoch = was.ControlEpoch
	s.stored.NoiseKey, s.stored.SelectionKey = was.NoiseKey, was.SelectionKey
	if err := s.checkNoiseKey(); err != nil {
		return err
	}
	if was.Params == nil {
		s.stored.Params = nil // as the run's first round: unknown, not checked
	}
	s.conf, _ = json.Marshal(s.stored)
	return nil
}

// restoreCoordinator restores the coordinator from the current round's
// state and replays the round log's replay log after it.
func (s *Server) restoreCoordinator(cur aggstore.Round) (replayResult, error) {
	var st coordinator.State
	if err := json.Unmarshal(cur.State, &st); err != nil {
		return replayResult{}, fmt.Errorf("aggregator: %s: state of round %d: %w", s.cfg.StatePath, cur.Number, err)
	}
	if err := s.coord.Restore(st); err != nil {
		return replayResult{}, fmt.Errorf("aggregator: %s: %w", s.cfg.StatePath, err)
	}
	replayed, err := s.replayLog()
	if err != nil {
		return replayResult{}, err
	}
	s.storeR, s.lastSt = cur.Number, cur.State
	s.loadSiteErrors()
	return replayed, nil
}

// restoreGlobal loads the global model of round r.
func (s *Server) restoreGlobal(r int) error {
	var err error
	if s.global, err = s.store.Checkpoint(uint64(r)); err != nil {
		return fmt.Errorf("aggregator: %s: global model of round %d: %w", s.cfg.StatePath, r, err)
	}
	if len(s.global) != s.dim {
		return fmt.Errorf("aggregator: %s: global model of round %d has %d values, the model %d", s.cfg.StatePath, r, len(s.global), s.dim)
	}
	s.globalR = r
	return nil
}

// restoreFeatures brings back each feature's state for round r (the
// current round's record cur): sum mode, the robust aggregators, the
// persisted-range check, the aggregator's replay, secure aggregation.
func (s *Server) restoreFeatures(cur aggstore.Round, r int) error {
	if err := s.restoreSum(cur); err != nil {
		return err
	}
	if err := s.restoreRobust(cur); err != nil {
		return err
	}
	if err := s.restoreOpt(cur); err != nil {
		return err
	}
	if err := s.restoreControl(cur); err != nil {
		return err
	}
	if err := s.checkPersistedRange(r); err != nil {
		return err
	}
	if err := s.replayAggregator(); err != nil {
		return err
	}
	return s.restoreSecAgg()
}

// restoreFresh starts a new round log: round 1 opens with the initial model
// (zeros, or the model's initialisation from InitSeed).
func (s *Server) restoreFresh() error {
	s.stored.RunID = crand.Text()
	if err := s.newNoiseKey(); err != nil {
		return err
	}
	s.conf, _ = json.Marshal(s.stored)
	x0 := make([]float64, s.dim)
	if s.cfg.Init == InitModel {
		x0 = s.model.InitParams(streams.ModelInit(s.cfg.InitSeed))
	}
	x0, err := s.downlinked(x0)
	if err != nil {
		return err
	}
	st, err := s.coord.MarshalState()
	if err != nil {
		return err
	}
	sum, err := s.sumBytes(s.sum.open())
	if err != nil {
		return err
	}
	now := s.clock.Now()
	if err := s.store.OpenRound(aggstore.Round{Number: 1, OpenedAt: now, Config: s.conf, State: st, Sum: sum}, x0); err != nil {
		return err
	}
	s.storeR, s.lastSt, s.fresh = 1, st, true
	s.global, s.globalR = x0, 1
	s.log.Info("new round log", "state", s.cfg.StatePath, "federation", s.cfg.Federation,
		"algorithm", s.cfg.Algorithm, "model", s.cfg.Model.Kind, "dimension", s.dim, "run_id", s.stored.RunID)
	return nil
}

// checkPersistedRange refuses to resume from a round log whose global model
// or FedSplit z holds a value the downlink cannot carry (written by a
// version that did not check updates' range: a poisoning site's z): every
// announcement would fail, so the daemon would crash at each restart. The
// error names the round to roll back to: before the oldest poisoned z was
// set, with a checkpoint in range.
func (s *Server) checkPersistedRange(r int) error {
	n := r - 1
	bad := s.checkRange("the global model", s.global)
	if isSplit(s.fam) {
		clients, err := s.store.Clients()
		if err != nil {
			return err
		}
		for _, c := range clients {
			zr, z, err := s.store.ClientZ(c.ID)
			if errors.Is(err, storage.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if zerr := s.checkRange("the z of "+c.ID, z); zerr != nil {
				if bad == nil {
					bad = zerr
				}
				n = min(n, int(zr)-1)
			}
		}
	}
	if bad == nil {
		return nil
	}
	for ; n >= 1; n-- {
		x, err := s.store.Checkpoint(uint64(n))
		if err == nil && s.checkRange("", x) == nil {
			break
		}
	}
	if n < 1 {
		return fmt.Errorf("aggregator: %s: %w; no earlier round can be resumed: start a new run with another --state-file", s.cfg.StatePath, bad)
	}
	return fmt.Errorf("aggregator: %s: %w; the federation cannot continue from it: roll back to round %d with `broker-agg run --rollback %d` (a copy of the file is kept)",
		s.cfg.StatePath, bad, n, n)
}

// replayAggregator rebuilds a stateful aggregator's memory (SimProx's
// previous models) after a restart by aggregating every closed round again
// from the round log, in order, discarding the results. Rounds whose
// updates were pruned are skipped (their clients' history starts later).
func (s *Server) replayAggregator() error {
	if s.agg == nil || !aggregate.IsStateful(s.agg) {
		return nil
	}
	out := make([]float64, s.dim)
	replayed := 0
	for r := 1; r < s.globalR; r++ {
		rd, err := s.store.Round(uint64(r))
		if err != nil {
			return fmt.Errorf("aggregator: replay round %d: %w", r, err)
		}
		var st coordinator.State
		if err := json.Unmarshal(rd.State, &st); err != nil {
			return fmt.Errorf("aggregator: replay round %d: state: %w", r, err)
		}
		cr := coordinator.CloseRound{Round: r}
		for _, rc := range st.Received {
			cr.Contributors = append(cr.Contributors, rc.Client)
		}
		x, err := s.store.Checkpoint(uint64(r))
		if err != nil {
			return fmt.Errorf("aggregator: replay round %d: %w", r, err)
		}
		ups, err := s.closedUpdates(cr, x)
		if err == nil && len(ups) > 0 {
			_, err = s.agg.Aggregate(x, ups, out)
			replayed++
		}
		if err != nil && !errors.Is(err, errPruned) {
			return fmt.Errorf("aggregator: replay round %d with %s: %w", r, s.agg.Name(), err)
		}
	}
	s.log.Info("aggregator state rebuilt from the round log", "aggregator", s.agg.Name(), "rounds", replayed)
	return nil
}

// Close releases the state file of a Server that was never Run (Run closes
// it itself).
func (s *Server) Close() error {
	if s.ran.Load() || !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	return s.store.Close()
}

// Ready is closed once Run is connected and subscribed to the broker and
// has resumed the round; MetricsAddr is valid from then on.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Finished is closed when the last round (ServerConfig.Rounds) is
// aggregated. Run keeps serving (receipts, metrics) until its context ends.
func (s *Server) Finished() <-chan struct{} { return s.finished }

// MetricsAddr is the address the metrics server listens on ("" when
// disabled or not started).
func (s *Server) MetricsAddr() string { return s.metAddr.Load().(string) }

// Global returns a copy of the current global model and its round.
func (s *Server) Global() ([]float64, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.view.global), s.view.globalRound
}

// Run connects to the broker, serves metrics, resumes the open round and
// runs the event loop until ctx ends or a fatal error (the state file
// cannot be written, a stored update cannot be read back). It closes the
// state file before returning. A Server runs once.
func (s *Server) Run(ctx context.Context) (err error) {
	if !s.ran.CompareAndSwap(false, true) || s.closed.Load() {
		return errors.New("aggregator: Server.Run called twice or after Close")
	}
	defer s.store.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.runCtx = ctx

	var httpSrv *http.Server
	if s.cfg.MetricsAddr != "" {
		ln, err := net.Listen("tcp", s.cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("aggregator: metrics listener: %w", err)
		}
		s.metAddr.Store(ln.Addr().String())
		scheme := "http"
		if s.cfg.HTTPTLS != nil {
			ln = tls.NewListener(ln, s.cfg.HTTPTLS)
			scheme = "https"
		}
		if !loopback(ln.Addr()) && s.cfg.HTTPAuth == nil && (s.cfg.HTTPTLS == nil || s.cfg.HTTPTLS.ClientCAs == nil) {
			s.log.Warn("the console, /metrics and /status are served to the network without authentication",
				"hint", "set --console-password-file or --console-client-ca, or keep --metrics-addr on loopback", "addr", ln.Addr().String())
		}
		httpSrv = &http.Server{Handler: s.guarded(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
			IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
		go func() {
			if err := httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("metrics server stopped", "err", err)
			}
		}()
		s.log.Info("console at "+scheme+"://"+ln.Addr().String()+"/", "metrics", "/metrics", "status", "/status",
			"tls", s.cfg.HTTPTLS != nil, "client_certificates", s.cfg.HTTPTLS != nil && s.cfg.HTTPTLS.ClientCAs != nil,
			"password", s.cfg.HTTPAuth != nil)
	}
	defer func() {
		if httpSrv != nil {
			sctx, c := context.WithTimeout(context.Background(), 2*time.Second)
			_ = httpSrv.Shutdown(sctx)
			c()
		}
	}()

	s.startIngest(ctx)
	s.client = mqtt.NewClient(s.clientOptions())
	if err := s.connect(ctx); err != nil {
		return err
	}
	if ctx.Err() != nil {
		s.client.Disconnect(0)
		return nil
	}
	defer func() {
		cancel() // callbacks waiting on the loop give up (their messages stay unacknowledged)
		s.client.Disconnect(500)
	}()
	if s.fresh {
		// A fresh federation: a retained announcement of an earlier run
		// under the same name would mislead clients that connect now.
		s.publish(s.topics.Round(), true, nil, "clear retained round")
		s.publish(s.topics.Run(), true, nil, "clear retained run spec")
	}
	if err := s.apply(ctx, s.coord.Resume(), nil, time.Time{}); err != nil {
		return err
	}
	close(s.ready)
	err = s.loop(ctx)
	s.setTimer(time.Time{})
	return err
}

func (s *Server) loop(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			s.log.Info("aggregator stopping", "round", s.coord.Round(), "phase", s.coord.Phase())
			return nil
		case r := <-s.reqs:
			if err := s.serve(ctx, r); err != nil {
				return err
			}
		case <-s.timerC():
			s.timer = nil
			if err := s.step(ctx, coordinator.Tick{At: s.clock.Now()}); err != nil {
				return err
			}
		}
	}
}

// serve handles one request of the loop and closes its done. An update
// outside sum mode goes through group commit (serveUpdates):
// it may take the updates waiting behind it into the same transaction.
func (s *Server) serve(ctx context.Context, r *request) error {
	switch {
	case r.update != nil && s.grouped():
		return s.serveUpdates(ctx, r)
	case r.status != nil:
		return s.serveStatuses(ctx, r)
	}
	var err error
	switch {
	case r.update != nil:
		err = s.onUpdate(ctx, r.update)
	case r.stats != nil:
		err = s.onStatistics(ctx, r.stats)
	case r.eval != nil:
		err = s.onEval(ctx, r.eval)
	case r.secagg != nil:
		err = s.onSecAgg(ctx, r.secagg)
	}
	close(r.done)
	return err
}

// submit hands r to the loop and waits until it is handled; false when the
// server stops first.
func (s *Server) submit(r *request) bool {
	ctx := s.runCtx
	r.done = make(chan struct{})
	select {
	case s.reqs <- r:
	case <-ctx.Done():
		return false
	}
	select {
	case <-r.done:
		return true
	case <-ctx.Done():
		return false
	}
}

func (s *Server) onStatus(ctx context.Context, st *wire.ClientStatus) error {
	var g statusGroup
	g.step(s, st)
	return g.apply(ctx, s)
}

// Statuses in groups. A status costs a registry write and the
// coordinator's whole state written (both fsynced, the state's encoding
// growing with the number of sites), and the retained statuses of every
// site arrive at once when the aggregator starts: one at a time, 10,000
// sites took minutes before round 1 could be drawn. serveStatuses steps
// the status r and the statuses waiting behind it (up to
// defaultCommitGroup) one by one, as before, then writes their registry
// records in one transaction and the coordinator's state once, and only
// then carries out their decisions in order and answers them (the broker's
// acknowledgements follow): what the state file holds covers every status
// answered, as with one at a time. A status whose decisions do more than
// set the timer, re-invite its site or set it aside (a round drawn, say)
// ends the group, so a draw is carried out as soon as it is decided.
func (s *Server) serveStatuses(ctx context.Context, r *request) error {
	var g statusGroup
	reqs := []*request{r}
	var next *request
	for g.step(s, r.status) && len(reqs) < defaultCommitGroup {
		select {
		case n := <-s.reqs:
			if n.status != nil {
				r = n
				reqs = append(reqs, r)
				continue
			}
			next = n
		default:
		}
		break
	}
	err := g.apply(ctx, s)
	for _, q := range reqs {
		close(q.done)
	}
	if err != nil || next == nil {
		return err
	}
	return s.serve(ctx, next)
}

// statusGroup is the statuses stepped since the state was last written:
// those the coordinator applied (for the registry) and their decisions.
type statusGroup struct {
	stepped int // statuses the coordinator was stepped with
	applied []*wire.ClientStatus
	at      []time.Time
	ds      []coordinator.Decision
}

// step steps st; false when its decisions end the group.
func (g *statusGroup) step(s *Server, st *wire.ClientStatus) bool {
	now := s.clock.Now()
	if !s.instanceStatus(st, now) {
		return true // another installation with this site's id
	}
	ds := s.coord.Step(statusEvent(st, now))
	g.stepped++
	g.ds = append(g.ds, ds...)
	if len(coordinator.OfType[coordinator.StaleStatus](ds)) > 0 {
		// Counted by the coordinator (stale_statuses); the registry keeps
		// the newer status.
		s.log.Info("stale client status set aside", "client", st.ClientId, "online", st.Online, "connection", st.Connection)
	} else {
		g.applied = append(g.applied, st)
		g.at = append(g.at, now)
	}
	for _, d := range ds {
		switch d.(type) {
		case coordinator.SetTimer, coordinator.StaleStatus, coordinator.Invite:
		default:
			return false
		}
	}
	return true
}

// apply writes the group's statuses to the registry, then the state, and
// carries out the decisions (Server.apply).
func (g *statusGroup) apply(ctx context.Context, s *Server) error {
	if g.stepped == 0 {
		return nil // every status set aside (instanceStatus)
	}
	s.recordStatuses(g.applied, g.at)
	return s.apply(ctx, g.ds, nil, time.Time{})
}

// recordStatuses writes statuses the coordinator applied to the registry
// (received at at[i]), in one transaction.
func (s *Server) recordStatuses(sts []*wire.ClientStatus, at []time.Time) {
	recs := make([]aggstore.ClientStatus, len(sts))
	for i, st := range sts {
		recs[i] = aggstore.ClientStatus{ID: st.ClientId, Online: st.Online, SampleCount: st.SampleCount,
			Capabilities: st.Capabilities, SoftwareVersion: st.SoftwareVersion, ErrorReason: st.ErrorReason, ErrorMessage: st.ErrorMessage, At: at[i]}
	}
	err := s.store.PutClientStatuses(recs)
	if err != nil {
		// The registry is informational; the coordinator's state is what
		// rounds run on.
		s.storageErrors.Add(1)
		s.log.Error("storing client statuses", "statuses", len(sts), "err", err)
	}
	for _, st := range sts {
		s.statusNoted(st)
	}
}

// statusNoted is the rest of a status the coordinator applied: the site's
// error, and the log lines.
func (s *Server) statusNoted(st *wire.ClientStatus) {
	if st.Online {
		s.siteError(st.ClientId, st.ErrorReason, st.ErrorMessage)
		s.log.Debug("client online", "client", st.ClientId, "samples", st.SampleCount, "connection", st.Connection)
		s.noteLateJoiner(st.ClientId)
		if !s.coord.InRoster(st.ClientId) {
			// A fixed FedSplit roster (server_sum.go): the operator must see
			// why this site never gets a round.
			s.log.Warn("site not on this run's roster (fixed when round 1 was drawn): it is not drawn in this run; it can take part in the next run", "client", st.ClientId, "roster", len(s.coord.Roster()))
		}
	} else {
		s.log.Info("client offline", "client", st.ClientId, "connection", st.Connection)
	}
}

// statusEvent is the coordinator's event for a status message.
func statusEvent(st *wire.ClientStatus, at time.Time) coordinator.Event {
	if st.Online {
		return coordinator.ClientOnline{ID: st.ClientId, Samples: int(min(st.SampleCount, math.MaxInt32)), Conn: st.Connection,
			Failing: st.ErrorReason != "" && st.ErrorReason != wire.SiteErrSecAgg, Refused: st.ErrorReason == wire.SiteErrSecAgg, At: at}
	}
	return coordinator.ClientOffline{ID: st.ClientId, Conn: st.Connection, At: at}
}

func (s *Server) onUpdate(ctx context.Context, u *inUpdate) error {
	m := u.msg
	ev := updateEvent(m, s.clock.Now())
	return s.propose(ctx, ev, u, func(d coordinator.Decision, at time.Time) (uint64, error) {
		if r, c := acceptedOf(d); int(m.Round) != r || m.ClientId != c {
			return 0, fmt.Errorf("%w: %#v", errNotGiven, d)
		}
		return s.storeUpdate(u, at)
	}, func(err error) error {
		if errors.Is(err, errNotGiven) {
			return err
		}
		s.refuseUpdate(u, err)
		return nil
	})
}

// updateEvent is the coordinator's event for an update received (or, on
// restart, stored) at at: the one place it is derived from the message, so
// a replay steps exactly the event the update was proposed as.
func updateEvent(m *wire.ClientUpdate, at time.Time) coordinator.UpdateArrived {
	loss := math.NaN()
	if rep := m.Report; rep != nil {
		loss = rep.AnchorLoss
	}
	return coordinator.UpdateArrived{Client: m.ClientId, Round: int(min(m.Round, math.MaxInt32)), // a future round either way
		Partial: m.Report.GetPartial(), Loss: loss, At: at}
}

// propose hands a site's message to the coordinator as a proposal
// (Coordinator.Propose): a message it accepts is stored first (store, which
// returns its replay log index: 0 for a copy stored earlier), with the
// event's time as its stored time (a replay steps the event at that time),
// and only then applied (Stored); one that cannot be stored is forgotten
// (StoreFailed), so the coordinator's state stays what it was, and answered
// by refused. A store error that is not the message's fault ends the loop
// when refused returns it. When the batch is a lone accept of a logged
// message (Replayable), the coordinator's state is not written: the replay
// log rebuilds it (coordinator_replay.go), so the message costs one write
// transaction.
func (s *Server) propose(ctx context.Context, ev coordinator.Event, u *inUpdate, store func(coordinator.Decision, time.Time) (uint64, error), refused func(error) error) error {
	ds := s.coord.Propose(ev)
	if !s.coord.Pending() {
		return s.apply(ctx, ds, u, time.Time{})
	}
	at := coordinator.EventTime(ev)
	index, err := store(ds[0], at)
	if err != nil {
		s.coord.Step(coordinator.StoreFailed{At: at})
		defer s.refreshView()
		return refused(err)
	}
	storedAt := at
	if index == 0 {
		storedAt = time.Time{}
	}
	ds = s.coord.Step(coordinator.Stored{At: at, Index: index})
	if index > 0 && coordinator.Replayable(ds) {
		defer s.refreshView()
		_, _, err := s.carryOut(ds, u, storedAt)
		return err
	}
	return s.apply(ctx, ds, u, storedAt)
}

// refuseUpdate answers an accepted update that was not stored: a value the
// downlink cannot carry, a delta against a copy this server does not hold,
// or a storage error (INTERNAL: the site retries).
func (s *Server) refuseUpdate(u *inUpdate, err error) {
	m := u.msg
	switch {
	case errors.Is(err, errOutOfRange):
		s.reject(m.ClientId, "out_of_range")
		s.log.Warn("update rejected", "client", m.ClientId, "round", m.Round, "reason", "out_of_range", "detail", err)
		s.receipt(m, false, wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE, "out_of_range: "+err.Error(), time.Time{})
	case errors.Is(err, uplink.ErrBaseMismatch):
		s.reject(m.ClientId, "base_mismatch")
		s.log.Warn("update rejected", "client", m.ClientId, "round", m.Round, "reason", "base_mismatch", "detail", err)
		s.receipt(m, false, wire.ReceiptCode_RECEIPT_CODE_BASE_MISMATCH, err.Error(), time.Time{})
	default:
		s.storageErrors.Add(1)
		s.log.Error("storing an accepted update; rejecting it for a retry", "client", m.ClientId, "round", m.Round, "err", err)
		s.reject(m.ClientId, "internal")
		s.receipt(m, false, wire.ReceiptCode_RECEIPT_CODE_INTERNAL, "server could not store the update; retry", time.Time{})
	}
}

// step feeds one event that carries no site message to the coordinator and
// carries out its decisions.
func (s *Server) step(ctx context.Context, ev coordinator.Event) error {
	return s.apply(ctx, s.coord.Step(ev), nil, time.Time{})
}

// apply carries out one batch of decisions in the coordinator's order: the
// state first (the batch's message, if any, is stored already: storedAt,
// zero for a copy stored earlier), then everything visible outside
// (receipts, announcements), the timer and the round's close.
func (s *Server) apply(ctx context.Context, ds []coordinator.Decision, u *inUpdate, storedAt time.Time) error {
	defer s.refreshView()
	if err := s.persistState(); err != nil {
		if u != nil && !storedAt.IsZero() {
			s.storageErrors.Add(1)
			s.reject(u.msg.ClientId, "internal")
			s.receipt(u.msg, false, wire.ReceiptCode_RECEIPT_CODE_INTERNAL, "server could not store its state; retry", time.Time{})
		}
		return err
	}
	closing, fitting, err := s.carryOut(ds, u, storedAt)
	if err != nil {
		return err
	}
	if adv := s.secAgg.takeAdvance(); adv != nil {
		return s.advanceSecAgg(ctx, *adv)
	}
	switch {
	case closing != nil:
		// After the rest of the batch (its SetTimer belongs to the
		// closing phase): AggregatedRound is a new event.
		return s.closeRound(ctx, *closing)
	case fitting != nil:
		return s.fitTransform(ctx, *fitting)
	}
	return nil
}

// carryOut carries out a batch's visible decisions in order and returns the
// round to close or the transform to fit, which come last.
func (s *Server) carryOut(ds []coordinator.Decision, u *inUpdate, storedAt time.Time) (closing *coordinator.CloseRound, fitting *coordinator.FitTransform, err error) {
	for _, d := range ds {
		switch d := d.(type) {
		case coordinator.Accept:
			s.noteWork(u.msg)
			s.log.Info("update accepted", "client", d.Client, "round", d.Round, "partial", d.Partial)
			s.receipt(u.msg, true, wire.ReceiptCode_RECEIPT_CODE_STORED, "", storedAt)
		case coordinator.AcceptLate:
			s.noteWork(u.msg)
			s.log.Info("late update stored as the client's latest z", "client", d.Client, "round", d.Round, "partial", d.Partial)
			s.receipt(u.msg, true, wire.ReceiptCode_RECEIPT_CODE_STORED, "late: stored as the latest z", storedAt)
		case coordinator.Reject:
			s.rejectByCoordinator(u, d)
		case coordinator.Invite:
			s.invite(d)
		case coordinator.Announce:
			err = s.announce(d.Round, d.Attempt, d.Selected, d.Deadline)
		case coordinator.Extend:
			s.log.Info("round below quorum at its deadline: extended", "round", d.Round, "deadline", d.Deadline)
			err = s.announce(d.Round, -1, d.Selected, d.Deadline)
		case coordinator.SetTimer:
			s.setTimer(d.At)
		case coordinator.CloseRound:
			closing = &d
		case coordinator.Finished:
			err = s.finish(d)
		case coordinator.AcceptStatistics, coordinator.RejectStatistics, coordinator.AcceptEval, coordinator.RejectEval:
			s.answerFed(d, storedAt)
		case coordinator.AnnounceStatistics:
			err = s.announceStatistics(d.Deadline)
		case coordinator.FitTransform:
			fitting = &d
		case coordinator.StatsOverdue:
			s.warnStatisticsOverdue(d)
		case coordinator.EvalComplete:
			s.finalizeEval(d.Round)
		case coordinator.Finish:
			err = s.announceFinish(d)
		case coordinator.AcceptSecAgg, coordinator.RejectSecAgg:
			s.answerSecAgg(d, storedAt)
		case coordinator.SecAggAdvance:
			s.secAgg.deferAdvance(d)
		case coordinator.AnnounceSecAgg:
			err = s.announceSecAgg(d)
		case coordinator.SecAggAbort:
			s.log.Warn("secure aggregation aborted: the round's session has no sum; a new session is drawn (the round closes without these sites' updates, never with a wrong sum)",
				"round", d.Round, "attempt", d.Attempt, "reason", d.Reason)
		}
		if err != nil {
			return nil, nil, err
		}
	}
	return closing, fitting, nil
}

// acceptedOf is the round and client an update's accept names.
func acceptedOf(d coordinator.Decision) (round int, client string) {
	switch d := d.(type) {
	case coordinator.Accept:
		return d.Round, d.Client
	case coordinator.AcceptLate:
		return d.Round, d.Client
	}
	return 0, ""
}

// errOutOfRange: an update whose model (w, or FedSplit's z_j) holds a value
// the downlink codec cannot carry. Stored, it would end in a global model
// no announcement can encode, and every restart would fail the same way.
var errOutOfRange = errors.New("value beyond the downlink codec's range")

// downlinkMax is the largest magnitude the downlink codec carries.
func (s *Server) downlinkMax() float64 {
	if s.cfg.Downlink == "fp16" {
		return 65504
	}
	return math.MaxFloat32
}

// checkRange returns errOutOfRange naming the first value of v beyond the
// downlink codec's range.
func (s *Server) checkRange(what string, v []float64) error {
	lim := s.downlinkMax()
	for i, x := range v {
		if !(math.Abs(x) <= lim) {
			return fmt.Errorf("%w: %s[%d] = %g, the %s downlink carries |x| <= %g", errOutOfRange, what, i, x, s.cfg.Downlink, lim)
		}
	}
	return nil
}

// storeUpdate writes an accepted update (and, for the FedSplit family, the
// client's latest z) with its replay log entry in one fsynced transaction,
// and returns the entry's index. A copy already stored (only in a round log
// written before the replay log: the replay now applies every stored
// update) is fine: index 0.
func (s *Server) storeUpdate(u *inUpdate, now time.Time) (uint64, error) {
	if s.sum != nil {
		return s.storeSumUpdate(u, now)
	}
	if isSplit(s.fam) {
		// Already stored: its z_j is this server's copy now, so vectorOf
		// would see a base the copy has moved past and refuse the re-send.
		if _, err := s.store.GetUpdate(u.msg.Round, u.msg.ClientId); err == nil {
			return 0, nil
		} else if !errors.Is(err, storage.ErrNotFound) {
			return 0, err
		}
	}
	rec, v, err := s.updateRecord(u, now)
	if err != nil {
		return 0, err
	}
	var z []float64
	if isSplit(s.fam) {
		z = v
	}
	return s.store.PutUpdate(rec, z)
}

// updateRecord is the record storeUpdate writes for an accepted update,
// and the vector it stands for (vectorOf), checked against the downlink's
// range: w, or the FedSplit family's new copy of z_j. It writes nothing.
func (s *Server) updateRecord(u *inUpdate, now time.Time) (aggstore.Update, []float64, error) {
	what := "w"
	if isSplit(s.fam) {
		what = "z"
	}
	// w as closedUpdates will compute it, or the new copy of z_j. w is
	// only checked here, so it goes into the event loop's scratch (a
	// vector's allocation per update less); z_j is kept by the group.
	var dst []float64
	if !isSplit(s.fam) {
		dst = s.wScratch
	}
	v, err := s.vectorOf(dst, u.msg, u.vec)
	if !isSplit(s.fam) && err == nil && uplink.BaseOf(uplink.HeaderOf(u.msg)) != uplink.BaseNone {
		s.wScratch = v // (a FULL vector is u.vec itself, not scratch)
	}
	if err != nil {
		return aggstore.Update{}, nil, err
	}
	if err := s.checkRange(what, v); err != nil {
		return aggstore.Update{}, nil, err
	}
	loss := math.NaN()
	if u.msg.Report != nil {
		loss = u.msg.Report.AnchorLoss
	}
	return aggstore.Update{Round: u.msg.Round, ClientID: u.msg.ClientId, StoredAt: now,
		SampleCount: u.msg.SampleCount, Loss: loss, Msg: u.raw}, v, nil
}

// vectorOf is what an update with decoded values d stands for
// (uplink.Receive): w_k (FedProx family) or the client's new z_j, which
// becomes this server's copy (FedSplit). That is d itself (FULL), the
// global model of the update's round plus d (DELTA, and a Z_DELTA with base
// round 0), or this server's copy of z_j plus d when the copy is the one
// base_round set (uplink.ErrBaseMismatch otherwise). Only the base the
// update names is read.
func (s *Server) vectorOf(dst []float64, m *wire.ClientUpdate, d []float64) ([]float64, error) {
	h := uplink.HeaderOf(m)
	var x []float64
	var held *uplink.Copy
	switch uplink.BaseOf(h) {
	case uplink.BaseGlobal:
		var err error
		if x, err = s.globalOf(m.Round); err != nil {
			return nil, err
		}
	case uplink.BaseCopy:
		r, zc, err := s.store.ClientZ(m.ClientId)
		switch {
		case errors.Is(err, storage.ErrCorrupt):
			s.corruption.Inc("client_z")
			s.log.Error("the stored copy of a client's z is damaged; asking the site for a new one", "client", m.ClientId, "err", err)
			return nil, uplink.DamagedCopy(m.BaseRound)
		case errors.Is(err, storage.ErrNotFound):
			// held stays nil: a copy this server does not hold.
		case err != nil:
			return nil, err
		default:
			held = &uplink.Copy{Round: r, Z: zc}
		}
	}
	return uplink.ReceiveInto(dst, h, d, x, held)
}

// globalOf returns the global model announced for round (read-only).
func (s *Server) globalOf(round uint64) ([]float64, error) {
	if round == uint64(s.globalR) {
		return s.global, nil
	}
	x, err := s.store.Checkpoint(round)
	if err != nil {
		return nil, fmt.Errorf("aggregator: global model of round %d: %w", round, err)
	}
	if len(x) != s.dim {
		return nil, fmt.Errorf("aggregator: global model of round %d has %d values, want %d", round, len(x), s.dim)
	}
	return x, nil
}

// downlinked returns x as the sites decode it from the announcement, which
// is what the server keeps as the global model.
func (s *Server) downlinked(x []float64) ([]float64, error) {
	f, err := s.down.Encode(nil, x, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("aggregator: encode the global model with %s: %w", s.down, err)
	}
	y, err := s.down.Decode(f, nil)
	if err != nil {
		return nil, fmt.Errorf("aggregator: decode the global model: %w", err)
	}
	return y, nil
}

// encodeState is the coordinator's whole state as the round log stores it.
func (s *Server) encodeState() ([]byte, error) {
	s.encodes++
	return s.coord.MarshalState()
}

// persistState writes the coordinator's state to the store's current round
// when it changed (which clears the replay log: node/aggstore/log.go).
func (s *Server) persistState() error {
	b, err := s.encodeState()
	if err != nil {
		return err
	}
	if bytes.Equal(b, s.lastSt) {
		return nil
	}
	if err := s.store.PutRoundState(s.storeR, b); err != nil {
		s.storageErrors.Add(1)
		return fmt.Errorf("aggregator: persist state: %w", err)
	}
	s.lastSt = b
	return nil
}

// setTimer (re)arms the coordinator's one timer for at; the zero time
// stops it.
func (s *Server) setTimer(at time.Time) {
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	if !at.IsZero() {
		s.timer = s.clock.NewTimer(at.Sub(s.clock.Now()))
	}
}

// timerC is the channel of the coordinator's timer (nil, which blocks, when
// none is armed).
func (s *Server) timerC() <-chan time.Time {
	if s.timer == nil {
		return nil
	}
	return s.timer.C()
}

func (s *Server) finish(d coordinator.Finished) error {
	if s.robust != nil && s.robust.DivergingSince > 0 {
		// Not a normal finish: the model it ends with is not to be trusted.
		s.log.Error("federation finished with the FedSplit iterate diverging: the final model is not to be trusted", "rounds", d.Rounds, "diverging_since", s.robust.DivergingSince, "reason", s.coord.StopReason())
	} else {
		s.log.Info("federation finished", "rounds", d.Rounds, "reason", s.coord.StopReason())
	}
	s.refreshView()
	var bundle []byte
	if s.fed.fitted() != nil {
		var err error
		if bundle, err = s.finalBundle(d.Rounds, d.Missing); err != nil {
			return err
		}
	} else if p := s.cfg.FinalModel; p != "" {
		if err := saveModel(p, s.model, s.global); err != nil {
			s.log.Error("writing the final model", "path", p, "err", err)
		} else {
			s.log.Info("final model written", "path", p)
		}
	}
	if err := s.announceFinished(d.Rounds, time.Time{}, bundle, true); err != nil {
		return err
	}
	s.finOnce.Do(func() { close(s.finished) })
	return nil
}

func saveModel(path string, m model.Model, x []float64) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if err := model.Save(f, m, x); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// loopback reports whether addr is a loopback address.
func loopback(addr net.Addr) bool {
	ta, ok := addr.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

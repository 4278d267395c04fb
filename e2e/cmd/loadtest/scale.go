package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/data/dataset"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
	"github.com/edgefl/edgefl/sim/localfed"
)

// ---- scale ----
//
// `loadtest scale` is the many-sites figure (docs/results.md, "Scale: 1,000
// and 10,000 sites on one aggregator"): broker-agg run as its own process,
// on Mosquitto or its embedded broker, and --sites MQTT sessions in this
// process, each a site with its own identity (client id, username and
// password), a persistent session (clean session off, its last will) and
// its receipts awaited, but no edge store and no solve per round.
//
// The updates are precomputed by real solves and re-based as the protocol
// requires. The run uses the FedProx family (fedprox, or fedavg), whose
// update is a DELTA: w_k - x, decoded by the aggregator against the global
// model of the round the update names (uplink.Receive, BaseGlobal). The
// encoded delta carries no reference to its base, so a delta solved once
// against round 1's model is a valid update of every later round as it
// is: re-basing it is naming the new round (and seq), nothing in the
// vector changes. The FedSplit family would not do: its Z_DELTA is taken
// against the aggregator's copy of z_j set by the site's previous accepted
// update (base_round), so every round's frame depends on the last receipt
// and would have to be re-encoded per site per round; in sum mode it also
// advances a per-site record.
//
// Each session solves once, at the first announcement that selects it:
// proxsolver.Solve on its client of the data's iid partition (the code the
// agent runs; at most one solve per core at a time), then uplink.Encode of
// w - x with the announced uplink codec. Later rounds publish the same
// frame under the new round number. The aggregator's own time, CPU and
// memory are what is measured; the solves' cost is in round 1, which the
// figures leave out.

type scaleOptions struct {
	procFlags
	data, broker              string
	sites, rounds, epochs     int
	batch                     int
	lr, mu, gamma, l2         float64
	algo, codec               string
	seed                      uint64
	connects                  int
	perf                      string
	perfFreq                  int
	timeout, connectTimeout   time.Duration
	keepAlive, receiptTimeout time.Duration
	resendMin, resendMax      time.Duration
}

func runScale(args []string) error {
	o, err := parseScaleFlags(args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	// Every session is a socket here, and one more in the broker: lift the
	// soft file limit to the hard one, explicitly, so that Mosquitto and
	// broker-agg started from here inherit it too (the Go runtime raises
	// its own limit but restores the old one for children unless the
	// program set it).
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return fmt.Errorf("scale: raise the open-file limit: %w", err)
		}
	}
	if int(lim.Cur) < o.sites+200 {
		return fmt.Errorf("scale: %d sites need %d open files, the limit is %d", o.sites, o.sites+200, lim.Cur)
	}
	fed, err := loadData(options{data: o.data, clients: o.sites, seed: o.seed})
	if err != nil {
		return err
	}
	work, cleanup, err := localfed.StateDir(o.work, "edgefl-scale-")
	if err != nil {
		return err
	}
	defer cleanup()
	const federation = "scale"
	ids := localfed.SiteIDs(o.sites, 5)
	pw, err := writePasswords(filepath.Join(work, "passwd"), append(slices.Clone(ids), "aggregator"))
	if err != nil {
		return err
	}
	brokerURL, mq, conf, err := startScaleBroker(o, federation, work, pw, scaleAggConf(o, federation, work, fed))
	if err != nil {
		return err
	}
	if mq != nil {
		defer mq.stop()
	}
	load0 := loadAvg()
	agg, err := startLoadAggregator(ctx, options{procFlags: o.procFlags}, work, conf)
	if err != nil {
		return err
	}
	defer agg.stop()

	fleet, err := newFleet(o, fed, federation, ids)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := fleet.connect(ctx, brokerURL, pw); err != nil {
		fleet.close()
		return err
	}
	defer fleet.close()
	fmt.Printf("scale: %d sessions connected in %.1f s (%s broker)\n", o.sites, time.Since(t0).Seconds(), o.broker)

	var cpu cpuSampler
	sctx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	go cpu.run(sctx, agg)
	go fleet.report(sctx, 15*time.Second)
	go fleet.retryLoop(sctx)

	// The profile covers the measured rounds: from round 1's aggregation
	// (every session has its update by then) to the end.
	var prof *perfRecord
	if o.perf != "" {
		if _, err := agg.waitEvent(ctx, "round aggregated", time.Time{}); err != nil {
			return fmt.Errorf("%w (sessions: %s)", err, fleet.summary())
		}
		if prof, err = startPerf(o.perf, o.perfFreq, agg.cmd.Process.Pid, filepath.Join(work, "perf.data")); err != nil {
			return err
		}
	}
	if _, err := agg.waitEvent(ctx, "federation finished", time.Time{}); err != nil {
		return fmt.Errorf("%w (sessions: %s)", err, fleet.summary())
	}
	if prof != nil {
		prof.stop()
	}
	// Every update of every round is receipted before the federation ends
	// (quorum 1: the round closes on the last update's storage); the last
	// receipts may still be on their way.
	if err := fleet.waitReceipts(ctx, o.rounds, o.receiptTimeout); err != nil {
		return err
	}
	return printScaleResult(o, agg, mq, &cpu, fleet, prof, load0)
}

// startScaleBroker starts Mosquitto (--broker mosquitto) or names broker-agg's
// embedded listener, and returns the sites' broker URL and conf with
// broker-agg's broker settings added.
func startScaleBroker(o scaleOptions, federation, work string, pw map[string]string, conf []string) (string, *mosq, []string, error) {
	port, err := freePort()
	if err != nil {
		return "", nil, nil, err
	}
	brokerURL := fmt.Sprintf("tcp://127.0.0.1:%d", port)
	if o.broker != "mosquitto" {
		return brokerURL, nil, append(conf, fmt.Sprintf("listen = 127.0.0.1:%d", port), "password_file = "+filepath.Join(work, "passwd")), nil
	}
	mq, err := startMosquitto(options{procFlags: o.procFlags}, work, federation, port)
	if err != nil {
		return "", nil, nil, err
	}
	if err := os.WriteFile(filepath.Join(work, "aggregator.password"), []byte(pw["aggregator"]+"\n"), 0o600); err != nil {
		mq.stop()
		return "", nil, nil, err
	}
	return brokerURL, mq, append(conf, "broker = "+brokerURL, "username = aggregator",
		"broker_password_file = "+filepath.Join(work, "aggregator.password")), nil
}

func parseScaleFlags(args []string) (scaleOptions, error) {
	var o scaleOptions
	fs := flag.NewFlagSet("scale", flag.ExitOnError)
	o.registerProcFlags(fs)
	fs.StringVar(&o.data, "data", "", "IDX data `DIR` (loadtest gen)")
	fs.StringVar(&o.broker, "broker", "mosquitto", "mosquitto (password file, the shipped ACL, broker-agg run --broker) | embedded (broker-agg's own listener and password file)")
	fs.IntVar(&o.sites, "sites", 1000, "sites N (MQTT sessions in this process); every round selects all of them (K = N)")
	fs.IntVar(&o.rounds, "rounds", 4, "rounds (round 1, which connects and solves, is left out of the figures)")
	fs.IntVar(&o.epochs, "epochs", 1, "local epochs of the one real solve per site")
	fs.IntVar(&o.batch, "batch", 10, "SGD mini-batch")
	fs.Float64Var(&o.lr, "lr", 0.01, "SGD learning rate")
	fs.Float64Var(&o.mu, "mu", 1, "FedProx mu")
	fs.Float64Var(&o.gamma, "gamma", 1e-3, "target inexactness")
	fs.Float64Var(&o.l2, "l2", 1e-4, "L2 coefficient of the model")
	fs.StringVar(&o.algo, "algorithm", "fedprox", "fedprox or fedavg: the FedProx family, whose DELTA updates stay valid from round to round (see scale.go)")
	fs.StringVar(&o.codec, "codec", "fp32", "uplink codec")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the partition, the selection and the solves")
	fs.IntVar(&o.connects, "connects", 32, "sessions connecting at once")
	fs.StringVar(&o.perf, "perf", "", "the perf `BINARY`: record a CPU profile of broker-agg over the measured rounds (\"\": none)")
	fs.IntVar(&o.perfFreq, "perf-freq", 199, "perf's sampling frequency (Hz)")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Minute, "give up after")
	fs.DurationVar(&o.connectTimeout, "connect-timeout", time.Minute, "a session's MQTT connect timeout")
	fs.DurationVar(&o.keepAlive, "keepalive", time.Minute, "the sessions' MQTT keep-alive, and how long a ping may wait for its answer (paho's default, 10 s, drops sessions of a loaded broker)")
	fs.DurationVar(&o.receiptTimeout, "receipt-timeout", time.Minute, "after the federation finished: how long the last receipts may take")
	fs.DurationVar(&o.resendMin, "resend-min", 2*time.Second, "re-send an update still without a receipt after this, doubling up to --resend-max, as the agent does (its reconnect_min)")
	fs.DurationVar(&o.resendMax, "resend-max", time.Minute, "the longest wait between re-sends of an update without a receipt (the agent's reconnect_max)")
	_ = fs.Parse(args) // flag.ExitOnError: Parse exits on a bad flag
	switch {
	case o.aggBin == "" || o.data == "":
		return o, errors.New("scale: --broker-agg and --data are required")
	case o.broker != "mosquitto" && o.broker != "embedded":
		return o, fmt.Errorf("scale: --broker %q: want mosquitto or embedded", o.broker)
	case o.algo != "fedprox" && o.algo != "fedavg":
		return o, fmt.Errorf("scale: --algorithm %q: want fedprox or fedavg (a delta against the announced model stays valid; see scale.go)", o.algo)
	case o.sites < 1 || o.rounds < 2 || o.connects < 1:
		return o, errors.New("scale: --sites and --connects must be >= 1, --rounds >= 2")
	case o.resendMin <= 0 || o.resendMax < o.resendMin:
		return o, errors.New("scale: --resend-min must be > 0 and --resend-max >= --resend-min")
	}
	return o, nil
}

// scaleAggConf is broker-agg's configuration of a scale run, without its
// broker: every site in every round, which closes on the last update.
func scaleAggConf(o scaleOptions, federation, work string, fed *dataset.Federated) []string {
	return []string{
		"federation = " + federation, "client_id = aggregator",
		"state_file = " + filepath.Join(work, "aggregator.db"),
		"model = logreg", fmt.Sprintf("l2 = %g", o.l2), fmt.Sprintf("features = %d", fed.D), fmt.Sprintf("classes = %d", fed.Classes),
		"algorithm = " + o.algo, "solver = sgd", "codec = " + o.codec,
		fmt.Sprintf("per_round = %d", o.sites), fmt.Sprintf("rounds = %d", o.rounds), "quorum_fraction = 1",
		"round_timeout = 10m", "settle = 0s", "max_reselections = -1", fmt.Sprintf("seed = %d", o.seed),
		fmt.Sprintf("mu = %g", o.mu), fmt.Sprintf("gamma = %g", o.gamma),
		fmt.Sprintf("lr = %g", o.lr), fmt.Sprintf("batch = %d", o.batch), fmt.Sprintf("max_epochs = %d", o.epochs),
		"max_seconds = 0", "log_format = json", "log_level = info",
	}
}

// ---- the sessions ----

// fleet is the scale run's sites: one MQTT session each, sharing the
// decoded announcements and a pool of solver slots.
type fleet struct {
	o      scaleOptions
	fed    *dataset.Federated
	topics wire.Topics
	ss     []*session
	solves chan struct{} // a token per core: the round-1 solves

	annMu sync.Mutex
	anns  []decodedAnn // the latest few distinct announcements

	errMu  sync.Mutex
	errs   []string
	nerr   atomic.Int64
	lost   atomic.Int64
	resent atomic.Int64 // on a re-announcement
	// retried: re-sent because no receipt came in time (the agent's
	// backoff from reconnect_min to reconnect_max).
	retried atomic.Int64
}

type decodedAnn struct {
	raw      []byte
	ann      *wire.RoundAnnouncement
	selected map[string]bool // nil: every client
	x        []float64       // the global model
	err      error
}

// session is one site.
type session struct {
	f        *fleet
	i        int
	id, inst string
	c        mqtt.Client
	update   string // its update topic
	status   string // its status topic
	conn     atomic.Uint64

	mu       sync.Mutex
	tmpl     *wire.ClientUpdate // the precomputed update (nil: not solved yet)
	seen     uint64             // the last round announced to it
	sent     uint64             // the last round it published an update for
	receipts map[uint64]wire.ReceiptCode
	last     []byte        // the update of round sent, as published
	backoff  time.Duration // the wait before its next re-send
	retryAt  time.Time     // when it is re-sent if no receipt has come
}

func newFleet(o scaleOptions, fed *dataset.Federated, federation string, ids []string) (*fleet, error) {
	topics, err := wire.ForFederation(federation)
	if err != nil {
		return nil, err
	}
	f := &fleet{o: o, fed: fed, topics: topics, solves: make(chan struct{}, runtime.NumCPU())}
	for i, id := range ids {
		s := &session{f: f, i: i, id: id, inst: fmt.Sprintf("scale-%d", i+1), receipts: map[uint64]wire.ReceiptCode{}}
		if s.update, err = topics.Update(id); err != nil {
			return nil, err
		}
		if s.status, err = topics.Status(id); err != nil {
			return nil, err
		}
		// Connection numbers only grow, across runs too (wire.ClientStatus).
		s.conn.Store(uint64(time.Now().UnixMicro()))
		f.ss = append(f.ss, s)
	}
	return f, nil
}

func (f *fleet) fail(format string, args ...any) {
	f.nerr.Add(1)
	f.errMu.Lock()
	defer f.errMu.Unlock()
	if len(f.errs) < 10 {
		f.errs = append(f.errs, fmt.Sprintf(format, args...))
	}
}

// connect connects every session, o.connects at a time.
func (f *fleet) connect(ctx context.Context, brokerURL string, pw map[string]string) error {
	sem := make(chan struct{}, f.o.connects)
	errc := make(chan error, len(f.ss))
	var wg sync.WaitGroup
	for _, s := range f.ss {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := s.connect(brokerURL, pw[s.id]); err != nil {
				errc <- err
			}
		}()
	}
	wg.Wait()
	close(errc)
	return <-errc // nil when every session connected
}

func (s *session) statusMsg(online bool, conn uint64) []byte {
	b, err := wire.Encode(&wire.ClientStatus{ClientId: s.id, Online: online,
		SampleCount: uint64(s.f.fed.Clients[s.i].Train.N), Capabilities: []string{proxsolver.SGD},
		SoftwareVersion: "loadtest-scale", TimestampUnixMs: time.Now().UnixMilli(), Connection: conn, InstanceId: s.inst})
	if err != nil {
		panic(err) // a message of constant shape
	}
	return b
}

func (s *session) connect(brokerURL, password string) error {
	opts := mqtt.NewClientOptions().AddBroker(brokerURL).SetClientID(s.id).
		SetUsername(s.id).SetPassword(password).SetCleanSession(false).
		SetKeepAlive(s.f.o.keepAlive).SetPingTimeout(s.f.o.keepAlive).SetConnectTimeout(s.f.o.connectTimeout).
		SetAutoReconnect(true).SetMaxReconnectInterval(2*time.Second).SetOrderMatters(false).
		SetBinaryWill(s.status, s.statusMsg(false, s.conn.Load()), 1, true).
		SetConnectionLostHandler(func(mqtt.Client, error) { s.f.lost.Add(1) }).
		SetReconnectingHandler(func(_ mqtt.Client, opts *mqtt.ClientOptions) {
			// A new connection, a new number, and the will to match.
			opts.SetBinaryWill(s.status, s.statusMsg(false, s.conn.Add(1)), 1, true)
		}).
		SetOnConnectHandler(func(c mqtt.Client) {
			c.Publish(s.status, 1, true, s.statusMsg(true, s.conn.Load()))
			rc, _ := s.f.topics.Receipt(s.id)
			c.SubscribeMultiple(map[string]byte{s.f.topics.Round(): 1, rc: 1}, s.onMessage)
		})
	s.c = mqtt.NewClient(opts)
	tok := s.c.Connect()
	if !tok.WaitTimeout(s.f.o.connectTimeout) {
		return fmt.Errorf("%s: connect timed out", s.id)
	}
	if err := tok.Error(); err != nil {
		return fmt.Errorf("%s: connect: %w", s.id, err)
	}
	return nil
}

func (s *session) onMessage(c mqtt.Client, m mqtt.Message) {
	if m.Topic() == s.f.topics.Round() {
		s.onRound(m.Payload())
		return
	}
	_, msg, err := s.f.topics.Decode(m.Topic(), m.Payload(), wire.Limits{})
	if err != nil {
		s.f.fail("%s: bad receipt: %v", s.id, err)
		return
	}
	r, ok := msg.(*wire.Receipt)
	if !ok || r.GetSubject() != wire.ReceiptSubject_RECEIPT_SUBJECT_UPDATE {
		return
	}
	if !r.Accepted {
		s.f.fail("%s: round %d refused: %s %s", s.id, r.Round, r.Code, r.Reason)
	}
	s.mu.Lock()
	// A re-sent update (after a reconnection) is answered DUPLICATE: the
	// round's update is still stored; keep the first answer.
	if _, ok := s.receipts[r.Round]; !ok || s.receipts[r.Round] != wire.ReceiptCode_RECEIPT_CODE_STORED {
		s.receipts[r.Round] = r.Code
	}
	s.mu.Unlock()
}

// announcement decodes raw once for the whole fleet: every session gets
// the same bytes.
func (f *fleet) announcement(raw []byte) decodedAnn {
	f.annMu.Lock()
	defer f.annMu.Unlock()
	for _, a := range f.anns {
		if bytes.Equal(a.raw, raw) {
			return a
		}
	}
	a := decodedAnn{raw: bytes.Clone(raw)}
	a.ann, a.err = wire.DecodeRound(raw, wire.Limits{})
	if a.err == nil && a.ann.Phase == wire.Phase_PHASE_TRAIN && a.ann.Global != nil {
		if len(a.ann.Selected) > 0 {
			a.selected = make(map[string]bool, len(a.ann.Selected))
			for _, id := range a.ann.Selected {
				a.selected[id] = true
			}
		}
		var down *quant.Codec
		if down, a.err = quant.Parse(a.ann.Global.Codec); a.err == nil {
			a.x, a.err = down.Decode(a.ann.Global.Payload, nil)
		}
		if a.err == nil {
			_, a.err = quant.Parse(a.ann.UplinkCodec)
		}
	}
	f.anns = append(f.anns, a)
	if len(f.anns) > 4 {
		f.anns = f.anns[1:]
	}
	return a
}

// onRound answers an announcement that selects the site: its precomputed
// update under this round's number, solved first if it has none. A
// re-delivered announcement (a reconnection) re-sends the update while it
// has no receipt, as the agent re-sends its outbox.
func (s *session) onRound(raw []byte) {
	a := s.f.announcement(raw)
	if a.err != nil {
		s.f.fail("%s: announcement: %v", s.id, a.err)
		return
	}
	ann := a.ann
	if ann.Phase != wire.Phase_PHASE_TRAIN || a.x == nil || (a.selected != nil && !a.selected[s.id]) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen = max(s.seen, ann.Round)
	switch {
	case ann.Round < s.sent:
		return
	case ann.Round == s.sent:
		if _, ok := s.receipts[ann.Round]; ok {
			return
		}
		s.f.resent.Add(1)
	}
	if s.tmpl == nil {
		s.f.solves <- struct{}{}
		err := s.solve(a)
		<-s.f.solves
		if err != nil {
			s.f.fail("%s: round %d: %v", s.id, ann.Round, err)
			return
		}
	}
	u := s.tmpl
	u.Round, u.Seq, u.SentAtUnixMs = ann.Round, ann.Round, time.Now().UnixMilli()
	b, err := wire.Encode(u)
	if err != nil {
		s.f.fail("%s: encode: %v", s.id, err)
		return
	}
	s.sent, s.last = ann.Round, b
	s.backoff = s.f.o.resendMin
	s.retryAt = time.Now().Add(s.backoff)
	s.c.Publish(s.update, 1, false, b) // QoS 1 in the persistent session; the receipt is what is awaited
}

// retry re-sends the session's last update when it still has no receipt
// at its retry time, and doubles the wait, as the agent re-sends an
// update from its outbox (its backoff from reconnect_min to
// reconnect_max; the aggregator answers a copy it stored DUPLICATE).
func (s *session) retry(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil || now.Before(s.retryAt) {
		return
	}
	if _, ok := s.receipts[s.sent]; ok {
		s.last = nil
		return
	}
	s.f.retried.Add(1)
	s.backoff = min(2*s.backoff, s.f.o.resendMax)
	s.retryAt = now.Add(s.backoff)
	s.c.Publish(s.update, 1, false, s.last)
}

// retryLoop checks every session for an update due to be re-sent, four
// times a second, until ctx ends.
func (f *fleet) retryLoop(ctx context.Context) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for _, s := range f.ss {
				s.retry(now)
			}
		}
	}
}

// solve is the site's one real solve: the agent's local FedProx solve on
// its data from the announced global model, encoded as the DELTA the
// agent sends (uplink.Encode, the one rule of both sides).
func (s *session) solve(a decodedAnn) error {
	o := s.f.o
	m, err := model.New(model.Spec{Kind: model.KindLogReg, Inputs: s.f.fed.D, Classes: s.f.fed.Classes, L2: a.ann.Model.GetL2()})
	if err != nil {
		return err
	}
	cfg := proxsolver.Config{Solver: proxsolver.SGD, Mu: o.mu, Gamma: o.gamma, LR: o.lr, Batch: o.batch}
	if o.algo == "fedavg" {
		cfg.Mu = 0
	}
	d := s.f.fed.Clients[s.i].Train
	rng := rand.New(rand.NewPCG(o.seed, uint64(s.i)))
	w, rep, err := proxsolver.Solve(context.Background(), m, d, a.x, nil, cfg, proxsolver.Budget{MaxEpochs: o.epochs}, rng)
	if err != nil {
		return fmt.Errorf("solve: %w", err)
	}
	// A codec is not safe for concurrent use (its compressor's state):
	// one per solve.
	c, err := quant.Parse(a.ann.UplinkCodec)
	if err != nil {
		return err
	}
	fr, err := uplink.Encode(c, uplink.Update{Round: a.ann.Round, Sent: w, Global: a.x}, rand.New(rand.NewPCG(o.seed, 1<<32+uint64(s.i))))
	if err != nil {
		return err
	}
	if fr.Kind != wire.UpdateKind_UPDATE_KIND_DELTA {
		return fmt.Errorf("a %v update: the scale run re-sends DELTA updates only", fr.Kind)
	}
	s.tmpl = &wire.ClientUpdate{ClientId: s.id, Kind: fr.Kind, InstanceId: s.inst,
		Vector:      &wire.Vector{Codec: a.ann.UplinkCodec, Dimension: uint32(len(w)), Payload: fr.Payload},
		SampleCount: uint64(d.N),
		Report: &wire.WorkReport{AchievedGamma: max(rep.Gamma, 0), Epochs: uint64(max(rep.Epochs, 0)), GradEvals: uint64(max(rep.GradEvals, 0)),
			Seconds: rep.Elapsed.Seconds(), LocalLoss: rep.Loss, AnchorLoss: rep.AnchorLoss, StopReason: stopOf(rep.Stop), Partial: rep.Stop != proxsolver.StopGamma}}
	return nil
}

func stopOf(stop string) wire.StopReason {
	if stop == proxsolver.StopGamma {
		return wire.StopReason_STOP_REASON_GAMMA_REACHED
	}
	return wire.StopReason_STOP_REASON_MAX_EPOCHS
}

// waitReceipts waits until every session holds an accepted receipt for
// each of rounds 1..rounds (STORED, or DUPLICATE for a re-sent update whose
// STORED receipt was lost with its connection), or d has passed.
func (f *fleet) waitReceipts(ctx context.Context, rounds int, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		missing := 0
		for _, s := range f.ss {
			s.mu.Lock()
			for r := 1; r <= rounds; r++ {
				if c, ok := s.receipts[uint64(r)]; !ok || (c != wire.ReceiptCode_RECEIPT_CODE_STORED && c != wire.ReceiptCode_RECEIPT_CODE_DUPLICATE) {
					missing++
				}
			}
			s.mu.Unlock()
		}
		if missing == 0 && f.nerr.Load() == 0 {
			return nil
		}
		if missing == 0 || time.Now().After(deadline) {
			return fmt.Errorf("scale: %d of %d updates without an accepted receipt (%s)", missing, rounds*len(f.ss), f.summary())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (f *fleet) summary() string {
	f.errMu.Lock()
	errs := slices.Clone(f.errs)
	f.errMu.Unlock()
	return fmt.Sprintf("%s; %d errors %q, %d connections lost, %d updates re-sent on a re-announcement, %d without a receipt in time", f.progress(), f.nerr.Load(), errs, f.lost.Load(), f.resent.Load(), f.retried.Load())
}

// progress counts the sessions by the last round announced to them, sent
// and receipted, naming a few that are behind the others.
func (f *fleet) progress() string {
	type key struct{ seen, sent, rcpt uint64 }
	n := map[key]int{}
	some := map[key][]string{}
	for _, s := range f.ss {
		s.mu.Lock()
		var rcpt uint64
		for r := range s.receipts {
			rcpt = max(rcpt, r)
		}
		k := key{s.seen, s.sent, rcpt}
		s.mu.Unlock()
		n[k]++
		if len(some[k]) < 3 {
			some[k] = append(some[k], s.id)
		}
	}
	var parts []string
	for k, c := range n {
		parts = append(parts, fmt.Sprintf("%d sessions at announced %d, sent %d, receipted %d (%s)", c, k.seen, k.sent, k.rcpt, strings.Join(some[k], " ")))
	}
	slices.Sort(parts)
	return strings.Join(parts, "; ")
}

// report prints the sessions' progress every d until ctx ends.
func (f *fleet) report(ctx context.Context, d time.Duration) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
			fmt.Fprintf(os.Stderr, "scale: %s; %d connections lost; %d updates re-sent without a receipt\n", f.progress(), f.lost.Load(), f.retried.Load())
		}
	}
}

func (f *fleet) close() {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for _, s := range f.ss {
		if s.c == nil {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() { defer wg.Done(); s.c.Disconnect(100); <-sem }()
	}
	wg.Wait()
}

// ---- the profile ----

// perfRecord is `perf record` of broker-agg: the Go binary keeps its
// symbols, so perf resolves its functions without a --cpuprofile flag.
type perfRecord struct {
	bin, out string
	cmd      *exec.Cmd
	done     chan struct{}
}

func startPerf(bin string, freq, pid int, out string) (*perfRecord, error) {
	p := &perfRecord{bin: bin, out: out, done: make(chan struct{})}
	p.cmd = exec.Command(bin, "record", "-q", "-F", fmt.Sprint(freq), "-g", "-p", fmt.Sprint(pid), "-o", out)
	p.cmd.Stdout, p.cmd.Stderr = os.Stderr, os.Stderr
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("perf: %w", err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }() // judged by the report
	return p, nil
}

func (p *perfRecord) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// report is the top of the profile: functions by self time, and by time
// including their callees.
func (p *perfRecord) report(n int) string {
	var b strings.Builder
	for _, mode := range []string{"--no-children", "--children"} {
		out, err := exec.Command(p.bin, "report", "-i", p.out, "--stdio", mode, "-g", "none", "--sort", "symbol", "--percent-limit", "0.5").Output()
		if err != nil {
			fmt.Fprintf(&b, "perf report %s: %v\n", mode, err)
			continue
		}
		fmt.Fprintf(&b, "PROFILE %s (top %d)\n", mode, n)
		k := 0
		for _, line := range strings.Split(string(out), "\n") {
			if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if k++; k > n {
				break
			}
			// --sort symbol still prints the empty source columns.
			fmt.Fprintln(&b, strings.TrimRight(strings.TrimSuffix(strings.TrimRight(line, " "), "-      -"), " "))
		}
	}
	return b.String()
}

// printScaleResult prints the figures of rounds 2..R: seconds per round
// (the aggregator's log), broker-agg's CPU seconds in them, peak memory.
func printScaleResult(o scaleOptions, agg *aggProc, mq *mosq, cpu *cpuSampler, f *fleet, prof *perfRecord, load0 string) error {
	hwm, err := vmHWM(agg.cmd.Process.Pid)
	if err != nil {
		return err
	}
	var mqHWM int
	if mq != nil {
		if mqHWM, err = vmHWM(mq.cmd.Process.Pid); err != nil {
			return err
		}
	}
	selfHWM, _ := vmHWM(os.Getpid())
	start, end, err := agg.roundSpans(o.rounds)
	if err != nil {
		return err
	}
	var secs, cpus []float64
	fmt.Print("rounds 2..R, seconds (broker-agg CPU seconds):")
	for r := 2; r <= o.rounds; r++ {
		s, c := end[r].Sub(start[r]).Seconds(), cpu.at(end[r])-cpu.at(start[r])
		secs, cpus = append(secs, s), append(cpus, c)
		fmt.Printf(" %.2f (%.2f)", s, c)
	}
	fmt.Println()
	mean, med := stats(secs)
	cmean, _ := stats(cpus)
	if prof != nil {
		fmt.Print(prof.report(25))
	}
	fmt.Printf("RESULT sites=%d broker=%s rounds=%d algorithm=%s per_round_mean_s=%.3f per_round_median_s=%.3f aggregator_cpu_s_per_round=%.2f aggregator_vmhwm_kb=%d mosquitto_vmhwm_kb=%d loadgen_vmhwm_kb=%d receipts=%d connections_lost=%d resent=%d resent_no_receipt=%d load_start=%s load_end=%s cores=%d\n",
		o.sites, o.broker, o.rounds, o.algo, mean, med, cmean, hwm, mqHWM, selfHWM, o.rounds*len(f.ss), f.lost.Load(), f.resent.Load(), f.retried.Load(), load0, loadAvg(), runtime.NumCPU())
	return nil
}

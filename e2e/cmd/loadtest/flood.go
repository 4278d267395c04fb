package main

import (
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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/proto/wire"
	"github.com/edgefl/edgefl/sim/localfed"
)

// ---- flood ----
//
// `loadtest flood` is the flood figure (docs/results.md, "A flooding site"): the same small federation run
// twice, once as a baseline and once with one authenticated site flooding
// the aggregator, and what the flood cost (see the package documentation).

type floodOptions struct {
	procFlags
	agentBin             string
	broker               string // embedded | mosquitto
	sites, rounds        int
	roundSeconds         float64
	roundEpochs          int
	rate, batch          int
	floodFor, floodAfter time.Duration
	floodRound           int
	hidden               int           // 0: the 60 x 10 logistic regression; else an MLP with this many hidden units
	content              string        // current | stale: what the flood re-publishes
	roundTimeout         time.Duration // 0: broker-agg's default
	seed                 uint64
	timeout              time.Duration
}

// floodID is the flooding site's id (and username).
const floodID = "flooder"

func runFlood(args []string) error {
	var o floodOptions
	fs := flag.NewFlagSet("flood", flag.ExitOnError)
	o.registerProcFlags(fs)
	fs.StringVar(&o.agentBin, "edge-agent", "", "the edge-agent `BINARY`")
	fs.StringVar(&o.broker, "broker", "embedded", "embedded (broker-agg's own listener and password file) | mosquitto (password file, the shipped ACL, broker-agg run --broker)")
	fs.IntVar(&o.sites, "sites", 3, "edge agents (the flooding site comes on top)")
	fs.IntVar(&o.rounds, "rounds", 8, "rounds of each run")
	fs.Float64Var(&o.roundSeconds, "round-seconds", 3, "the round's work budget (max_seconds): how long each agent solves")
	fs.IntVar(&o.roundEpochs, "round-epochs", 0, "a budget of local epochs instead of --round-seconds (the round then lengthens with whatever CPU the agents lose to the flood on this machine)")
	fs.IntVar(&o.rate, "rate", 10000, "flood rate in messages per second")
	fs.IntVar(&o.batch, "batch", 100, "messages per tick of the flood (tick = batch / rate)")
	fs.DurationVar(&o.floodFor, "flood-seconds", 10*time.Second, "how long the flood lasts")
	fs.IntVar(&o.floodRound, "flood-round", 3, "the flood starts in this round ...")
	fs.DurationVar(&o.floodAfter, "flood-after", time.Second, "... this long after its announcement")
	fs.IntVar(&o.hidden, "hidden", 0, "0: the federation trains a 60 x 10 logistic regression (updates of 2.5 kB); H > 0: a 60-H-10 MLP (71H+10 parameters, 4 bytes each in fp32: H = 512 sends 145 kB updates), the larger model a flood may carry")
	fs.StringVar(&o.content, "flood-content", "current", "what the flood re-publishes: current (the flooder's update of the round in progress, refreshed at each announcement: its copies also deliver its next update) | stale (the update of the round the flood began in, throughout: the flooder's later updates are sent once each, as an agent sends them, and must get through its own flood)")
	fs.DurationVar(&o.roundTimeout, "round-timeout", 0, "broker-agg's round_timeout (0: its default, 10 min): how long a round waits for a site whose update was lost")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the selection and the agents")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Minute, "give up a run after")
	_ = fs.Parse(args) // flag.ExitOnError: Parse exits on a bad flag
	switch {
	case o.aggBin == "" || o.agentBin == "":
		return errors.New("flood: --broker-agg and --edge-agent are required")
	case o.broker != "embedded" && o.broker != "mosquitto":
		return fmt.Errorf("flood: --broker %q: want embedded or mosquitto", o.broker)
	case o.rate <= 0 || o.batch <= 0 || o.floodFor <= 0:
		return errors.New("flood: --rate, --batch and --flood-seconds must be > 0")
	case o.hidden < 0:
		return errors.New("flood: --hidden must be >= 0")
	case o.content != "current" && o.content != "stale":
		return fmt.Errorf("flood: --flood-content %q: want current or stale", o.content)
	case o.floodRound < 1 || o.floodRound >= o.rounds:
		return errors.New("flood: --flood-round must be in [1, --rounds)")
	}
	work := o.work
	if work == "" {
		var err error
		if work, err = os.MkdirTemp("", "edgefl-flood-"); err != nil {
			return err
		}
		defer os.RemoveAll(work)
	}
	budget := fmt.Sprintf("%gs", o.roundSeconds)
	if o.roundEpochs > 0 {
		budget = fmt.Sprintf("%d epochs", o.roundEpochs)
	}
	fmt.Printf("flood: %s broker, %d agents + %s, %d rounds of %s of local work, %d msg/s of %s copies for %v from %v into round %d\n",
		o.broker, o.sites, floodID, o.rounds, budget, o.rate, o.content, o.floodFor, o.floodAfter, o.floodRound)
	load0 := loadAvg()
	base, err := floodRun(o, filepath.Join(work, o.broker+"-baseline"), false)
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	base.print("baseline")
	fl, err := floodRun(o, filepath.Join(work, o.broker+"-flood"), true)
	if err != nil {
		return fmt.Errorf("flood: %w", err)
	}
	fl.print("flood")
	load1 := loadAvg()
	fmt.Printf("load average (1 min) at the start %s, at the end %s (this machine's other work competes for its %d cores)\n", load0, load1, runtime.NumCPU())

	// The rounds the flood overlapped, against the same rounds without it.
	var flooded []int
	var baseSum, floodSum, worst float64
	for r := 1; r <= o.rounds; r++ {
		if fl.start[r].Before(fl.floodEnd) && fl.end[r].After(fl.floodStart) {
			flooded = append(flooded, r)
			b, f := base.secs(r), fl.secs(r)
			baseSum += b
			floodSum += f
			if len(flooded) == 1 || f-b > worst {
				worst = f - b
			}
		}
	}
	if len(flooded) == 0 {
		return errors.New("the flood overlapped no round")
	}
	var all float64
	for r := 1; r <= o.rounds; r++ {
		all += fl.secs(r) - base.secs(r)
	}
	fmt.Printf("flooded rounds %d-%d: %.3f s without the flood, %.3f s with it (delay %+.3f s; worst round %+.3f s; whole run %+.3f s)\n",
		flooded[0], flooded[len(flooded)-1], baseSum, floodSum, floodSum-baseSum, worst, all)
	fmt.Printf("RESULT broker=%s content=%s rate=%d flood_s=%g message_bytes=%d sent=%d sent_rate=%.0f flooder_disconnects=%d broker_rate_limited=%.0f rate_limited=%.0f passed_limit=%.0f "+
		"flooded_rounds=%d-%d baseline_rounds_s=%.3f flood_rounds_s=%.3f delay_s=%.3f worst_round_delay_s=%.3f run_delay_s=%.3f "+
		"aggregator_vmhwm_kb=%d baseline_aggregator_vmhwm_kb=%d mosquitto_vmhwm_kb=%d baseline_mosquitto_vmhwm_kb=%d "+
		"aggregator_cpu_s=%.2f baseline_aggregator_cpu_s=%.2f mosquitto_cpu_s=%.2f baseline_mosquitto_cpu_s=%.2f loadavg_start=%s loadavg_end=%s\n",
		o.broker, o.content, o.rate, o.floodFor.Seconds(), fl.msgBytes, fl.sent, float64(fl.sent)/fl.floodEnd.Sub(fl.floodStart).Seconds(), fl.disconnects,
		fl.brokerLimited, fl.rateLimited, fl.passed-base.passed, flooded[0], flooded[len(flooded)-1], baseSum, floodSum, floodSum-baseSum, worst, all,
		fl.aggHWM, base.aggHWM, fl.mqHWM, base.mqHWM, fl.aggCPU, base.aggCPU, fl.mqCPU, base.mqCPU, load0, load1)
	return nil
}

// floodResult is what one run measured.
type floodResult struct {
	rounds              int
	start, end          map[int]time.Time // round r: aggregated(r-1) (round 1: its announcement) to aggregated(r)
	floodStart          time.Time         // flood runs: when the flood began and when its last message was handed to the client
	floodEnd            time.Time
	sent, disconnects   int
	msgBytes            int     // size of one flood message (the last round's)
	rateLimited, passed float64 // flooder's messages rate-limited by the aggregator; update messages past the limits (every site)
	brokerLimited       float64 // flooder's messages the embedded broker dropped over its rate limit (0 with Mosquitto)
	aggHWM, mqHWM       int     // kB (mqHWM 0 with the embedded broker)
	aggCPU, mqCPU       float64 // seconds of user + system CPU over the run
}

func (r *floodResult) secs(round int) float64 { return r.end[round].Sub(r.start[round]).Seconds() }

func (r *floodResult) print(name string) {
	fmt.Printf("%s: seconds per round:", name)
	for i := 1; i <= r.rounds; i++ {
		fmt.Printf(" %.3f", r.secs(i))
	}
	fmt.Printf("; aggregator VmHWM %d kB, %.2f s CPU", r.aggHWM, r.aggCPU)
	if r.mqHWM > 0 {
		fmt.Printf("; mosquitto VmHWM %d kB, %.2f s CPU", r.mqHWM, r.mqCPU)
	}
	if !r.floodStart.IsZero() {
		fmt.Printf("; flood: %d messages of %d bytes in %.3f s, %.0f rate-limited by the broker, %.0f by the aggregator, %d flooder disconnects",
			r.sent, r.msgBytes, r.floodEnd.Sub(r.floodStart).Seconds(), r.brokerLimited, r.rateLimited, r.disconnects)
	}
	fmt.Println()
}

// floodRun runs the federation once in work (fresh), with or without the
// flood.
func floodRun(o floodOptions, work string, withFlood bool) (*floodResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	if err := os.RemoveAll(work); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	const federation = "flood"
	ids := localfed.SiteIDs(o.sites, 0)
	pw, err := writePasswords(filepath.Join(work, "passwd"), append(slices.Clone(ids), floodID, "aggregator"))
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	brokerURL := fmt.Sprintf("tcp://127.0.0.1:%d", port)
	conf := floodAggConf(o, federation, work)
	var mq *mosq
	if o.broker == "mosquitto" {
		if mq, err = startMosquitto(options{procFlags: o.procFlags}, work, federation, port); err != nil {
			return nil, err
		}
		defer mq.stop()
		if err := os.WriteFile(filepath.Join(work, "aggregator.password"), []byte(pw["aggregator"]+"\n"), 0o600); err != nil {
			return nil, err
		}
		conf = append(conf, "broker = "+brokerURL, "username = aggregator",
			"broker_password_file = "+filepath.Join(work, "aggregator.password"))
	} else {
		conf = append(conf, fmt.Sprintf("listen = 127.0.0.1:%d", port), "password_file = "+filepath.Join(work, "passwd"))
	}
	agg, err := startLoadAggregator(ctx, options{procFlags: o.procFlags}, work, conf)
	if err != nil {
		return nil, err
	}
	defer agg.stop()
	edges, err := startFloodEdges(o, work, federation, brokerURL, ids, pw)
	defer func() {
		for _, e := range edges {
			e.stop()
		}
	}()
	if err != nil {
		return nil, err
	}

	// The flooding site: a participant in every round, as the agents are.
	fl, err := newFlooder(brokerURL, federation, pw[floodID], o.seed)
	if err != nil {
		return nil, err
	}
	defer fl.close()

	res := &floodResult{rounds: o.rounds}
	// In the flood run, flood from --flood-after into --flood-round.
	if withFlood {
		at, err := fl.waitRound(ctx, o.floodRound)
		if err != nil {
			return nil, err
		}
		select {
		case <-time.After(time.Until(at.Add(o.floodAfter))):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		res.floodStart, res.floodEnd, res.sent = fl.flood(o.rate, o.batch, o.floodFor, o.content == "stale")
		res.disconnects = int(fl.lost.Load())
		res.msgBytes = len(*fl.cur.Load())
	}
	m, err := agg.waitMetrics(ctx, func(m map[string]float64) bool { return m["edgefl_aggregator_finished"] == 1 })
	if err != nil {
		for _, e := range edges {
			if !e.alive() {
				err = fmt.Errorf("%w (%s exited; see %s)", err, e.id, e.log)
			}
		}
		return nil, err
	}
	return res, res.measure(o, agg, mq, m, ids)
}

// floodAggConf is broker-agg's configuration of a flood run, without its
// broker.
func floodAggConf(o floodOptions, federation, work string) []string {
	conf := []string{
		"federation = " + federation, "client_id = aggregator",
		"state_file = " + filepath.Join(work, "aggregator.db"),
		"features = 60", "classes = 10", "l2 = 0.001",
		"algorithm = fedproxsplit", "solver = sgd", "mu = 1", "step = 1", "lr = 0.05", "batch = 10", "gamma = 0.000001",
		"codec = fp32",
		fmt.Sprintf("per_round = %d", o.sites+1), fmt.Sprintf("rounds = %d", o.rounds), "quorum_fraction = 1",
		"settle = 0s", "max_reselections = -1", fmt.Sprintf("seed = %d", o.seed),
		"log_format = json", "log_level = info",
	}
	if o.roundTimeout > 0 {
		conf = append(conf, fmt.Sprintf("round_timeout = %v", o.roundTimeout))
	}
	if o.hidden > 0 {
		conf = append(conf, "model = mlp", fmt.Sprintf("hidden = %d", o.hidden))
	} else {
		conf = append(conf, "model = logreg")
	}
	if o.roundEpochs > 0 {
		return append(conf, fmt.Sprintf("max_epochs = %d", o.roundEpochs), "max_seconds = 0")
	}
	return append(conf, "max_epochs = 0", fmt.Sprintf("max_seconds = %g", o.roundSeconds))
}

// startFloodEdges starts the edge agents of a flood run: edge-agent
// processes, client k of synthetic(1,1) split over the sites. It returns
// the ones started also on an error.
func startFloodEdges(o floodOptions, work, federation, brokerURL string, ids []string, pw map[string]string) ([]*edgeProc, error) {
	var edges []*edgeProc
	for i, id := range ids {
		pf := filepath.Join(work, id+".password")
		if err := os.WriteFile(pf, []byte(pw[id]+"\n"), 0o600); err != nil {
			return edges, err
		}
		c := []string{
			"site_id = " + id, "federation = " + federation, "broker = " + brokerURL,
			"username = " + id, "password_file = " + pf, "state_file = " + filepath.Join(work, id+".db"),
			"data = synthetic:1,1", fmt.Sprintf("data_client = %d", i), fmt.Sprintf("data_clients = %d", o.sites),
			"data_seed = 3", "data_max_samples = 100", fmt.Sprintf("seed = %d", o.seed+uint64(i)),
			"reconnect_min = 200ms", "reconnect_max = 1s", "log_format = json", "log_level = info",
		}
		e, err := startEdge(o.agentBin, work, id, c)
		if e != nil {
			edges = append(edges, e)
		}
		if err != nil {
			return edges, err
		}
	}
	return edges, nil
}

// measure reads a finished run's figures: peak memory and CPU (before
// anything stops), the rate limit's counts from the final scrape m, and
// the rounds' times from the aggregator's log.
func (res *floodResult) measure(o floodOptions, agg *aggProc, mq *mosq, m map[string]float64, ids []string) error {
	var err error
	if res.aggHWM, err = vmHWM(agg.cmd.Process.Pid); err != nil {
		return err
	}
	if res.aggCPU, err = cpuSeconds(agg.cmd.Process.Pid); err != nil {
		return err
	}
	if mq != nil {
		if res.mqHWM, err = vmHWM(mq.cmd.Process.Pid); err != nil {
			return err
		}
		if res.mqCPU, err = cpuSeconds(mq.cmd.Process.Pid); err != nil {
			return err
		}
	}
	res.rateLimited = m[`edgefl_aggregator_rate_limited_total{client="`+floodID+`"}`]
	res.brokerLimited = m[`edgefl_broker_rate_limited_total{client="`+floodID+`"}`]
	res.passed = m[`edgefl_aggregator_received_messages_total{kind="update"}`]
	for _, id := range ids {
		if n := m[`edgefl_aggregator_rate_limited_total{client="`+id+`"}`] + m[`edgefl_broker_rate_limited_total{client="`+id+`"}`]; n > 0 {
			return fmt.Errorf("%s was rate-limited %v times", id, n)
		}
	}
	res.start, res.end, err = agg.roundSpans(o.rounds)
	return err
}

// loadAvg is the machine's 1-minute load average ("?" when unknown).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// cpuSeconds is a process's user + system CPU time (/proc/PID/stat, in
// USER_HZ = 100 ticks a second on Linux).
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	f := strings.Fields(s[i+1:]) // f[0] is the state, field 3
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64) // utime, field 14
	st, err2 := strconv.ParseUint(f[12], 10, 64) // stime, field 15
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return float64(ut+st) / 100, nil
}

// ---- edge-agent processes ----

// agentNice is the agents' scheduling priority (nice).
const agentNice = 10

type edgeProc struct {
	id, log string
	cmd     *exec.Cmd
	done    chan struct{}
}

func startEdge(bin, work, id string, conf []string) (*edgeProc, error) {
	cf := filepath.Join(work, id+".conf")
	if err := os.WriteFile(cf, []byte(strings.Join(conf, "\n")+"\n"), 0o600); err != nil {
		return nil, err
	}
	e := &edgeProc{id: id, log: filepath.Join(work, id+".log"), done: make(chan struct{})}
	lf, err := os.Create(e.log)
	if err != nil {
		return nil, err
	}
	e.cmd = exec.Command(bin, "run", "--config", cf)
	e.cmd.Stdout, e.cmd.Stderr = lf, lf
	if err := e.cmd.Start(); err != nil {
		lf.Close()
		return nil, err
	}
	go func() { _ = e.cmd.Wait(); lf.Close(); close(e.done) }() // the exit is judged by the caller (ProcessState)
	// Behind the aggregator, the broker and the flooder: a site's gateway
	// is not the aggregator's box, so its solve should not take their CPU
	// (the solve is paced by the round's budget either way).
	if err := syscall.Setpriority(syscall.PRIO_PROCESS, e.cmd.Process.Pid, agentNice); err != nil {
		return e, fmt.Errorf("renice %s: %w", id, err)
	}
	return e, nil
}

func (e *edgeProc) alive() bool {
	select {
	case <-e.done:
		return false
	default:
		return true
	}
}

func (e *edgeProc) stop() {
	e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.done:
	case <-time.After(10 * time.Second):
		e.cmd.Process.Kill()
		<-e.done
	}
}

// ---- the flooding site ----

// flooder is an authenticated site (its own password) that takes part in
// every round like an agent, but without solving: on each announcement
// that selects it, it sends once a valid FULL update for that round (the
// global model plus a little noise, so that the fp32 frame does not
// compress away). flood re-publishes the current round's update at a paced
// rate, QoS 0, on the same connection.
type flooder struct {
	c      mqtt.Client
	topics wire.Topics
	update string // its update topic
	rng    *rand.Rand

	cur  atomic.Pointer[[]byte] // the current round's encoded update
	lost atomic.Int64           // connections lost

	mu     sync.Mutex
	rounds map[int]time.Time // round -> when its announcement arrived
	seen   chan struct{}     // closed and replaced at each announcement
}

func newFlooder(brokerURL, federation, password string, seed uint64) (*flooder, error) {
	topics, err := wire.ForFederation(federation)
	if err != nil {
		return nil, err
	}
	f := &flooder{topics: topics, rng: rand.New(rand.NewPCG(seed, 0xf100d)), rounds: map[int]time.Time{}, seen: make(chan struct{})}
	f.update, _ = topics.Update(floodID)
	statusTopic, _ := topics.Status(floodID)
	status := func(online bool) []byte {
		b, err := wire.Encode(&wire.ClientStatus{ClientId: floodID, Online: online, SampleCount: 100,
			Capabilities: []string{"sgd"}, SoftwareVersion: "loadtest-flooder", TimestampUnixMs: time.Now().UnixMilli(), Connection: 1})
		if err != nil {
			panic(err) // a constant message
		}
		return b
	}
	opts := mqtt.NewClientOptions().AddBroker(brokerURL).SetClientID(floodID).
		SetUsername(floodID).SetPassword(password).SetCleanSession(true).
		SetConnectTimeout(5*time.Second).SetAutoReconnect(true).SetOrderMatters(false).
		SetBinaryWill(statusTopic, status(false), 1, true).
		SetConnectionLostHandler(func(mqtt.Client, error) { f.lost.Add(1) }).
		SetOnConnectHandler(func(c mqtt.Client) {
			c.Publish(statusTopic, 1, true, status(true))
			c.Subscribe(topics.Round(), 1, f.onRound)
		})
	f.c = mqtt.NewClient(opts)
	if tok := f.c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return nil, fmt.Errorf("flooder connect: %v", tok.Error())
	}
	return f, nil
}

// onRound answers an announcement that selects the flooder with its update.
func (f *flooder) onRound(c mqtt.Client, m mqtt.Message) {
	_, msg, err := f.topics.Decode(m.Topic(), m.Payload(), wire.Limits{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "flooder: bad announcement:", err)
		return
	}
	ann := msg.(*wire.RoundAnnouncement)
	if len(ann.Selected) > 0 && !slices.Contains(ann.Selected, floodID) {
		f.seenRound(int(ann.Round))
		return
	}
	down, err := quant.Parse(ann.Global.Codec)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flooder:", err)
		return
	}
	x, err := down.Decode(ann.Global.Payload, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flooder: global model:", err)
		return
	}
	f.mu.Lock()
	for i := range x {
		x[i] += 0.01 * f.rng.NormFloat64()
	}
	f.mu.Unlock()
	up, err := quant.Parse(ann.UplinkCodec)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flooder:", err)
		return
	}
	frame, err := up.Encode(nil, x, nil, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flooder: encode:", err)
		return
	}
	b, err := wire.Encode(&wire.ClientUpdate{ClientId: floodID, Round: ann.Round, Kind: wire.UpdateKind_UPDATE_KIND_FULL,
		Vector: &wire.Vector{Codec: ann.UplinkCodec, Dimension: uint32(len(x)), Payload: frame}, SampleCount: 100,
		Report:       &wire.WorkReport{Epochs: 1, StopReason: wire.StopReason_STOP_REASON_MAX_EPOCHS},
		SentAtUnixMs: time.Now().UnixMilli(), Seq: ann.Round})
	if err != nil {
		fmt.Fprintln(os.Stderr, "flooder: update:", err)
		return
	}
	f.cur.Store(&b)
	c.Publish(f.update, 1, false, b) // once, as an agent does; the flood re-sends it
	f.seenRound(int(ann.Round))
}

func (f *flooder) seenRound(r int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.rounds[r]; !ok {
		f.rounds[r] = time.Now()
		close(f.seen)
		f.seen = make(chan struct{})
	}
}

// waitRound waits for round r's announcement and returns when it came.
func (f *flooder) waitRound(ctx context.Context, r int) (time.Time, error) {
	for {
		f.mu.Lock()
		at, ok := f.rounds[r]
		ch := f.seen
		f.mu.Unlock()
		if ok {
			return at, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("waiting for round %d: %w", r, ctx.Err())
		}
	}
}

// flood publishes rate messages a second for d, QoS 0: at each tick (every
// batch/rate) as many copies of the current round's update (stale: of the
// update current when the flood began) as the elapsed time calls for
// (batch when on time; a late tick catches up). It returns when the first
// and the last message were handed to the client, and how many were.
func (f *flooder) flood(rate, batch int, d time.Duration, stale bool) (start, end time.Time, sent int) {
	first := *f.cur.Load()
	total := int(float64(rate) * d.Seconds())
	tick := time.NewTicker(time.Duration(float64(time.Second) * float64(batch) / float64(rate)))
	defer tick.Stop()
	var last mqtt.Token
	start = time.Now()
	for sent < total {
		<-tick.C
		due := min(total, int(float64(rate)*time.Since(start).Seconds()))
		for ; sent < due; sent++ {
			msg := first
			if !stale {
				msg = *f.cur.Load()
			}
			last = f.c.Publish(f.update, 0, false, msg)
		}
	}
	end = time.Now()
	if last != nil {
		last.WaitTimeout(30 * time.Second)
	}
	return start, end, sent
}

func (f *flooder) close() { f.c.Disconnect(250) }

// Command loadtest is the load generator of scripts/bench-e2e.sh and
// scripts/bench-flood.sh: a whole federation over MQTT on one machine, every
// party a real one.
//
//	loadtest gen --dir DIR [--train 20000] [--test 2000] [--seed 1]
//	    writes a synthetic MNIST-shaped IDX data set (28x28 = 784 features,
//	    10 classes) that `broker-agg simulate --dataset idx:DIR` and the
//	    agents below read alike.
//
//	loadtest run --broker-agg BIN --data DIR [--clients 100] [--per-round K]
//	             [--rounds 20] [--epochs E] [--kills N] ...
//	    starts Mosquitto (password file, the shipped ACL), `broker-agg run
//	    --broker` against it as its own process, and --clients edge agents
//	    (package agent, the code of edge-agent) in this process, each with
//	    its own bbolt state file and its client of the data's iid partition
//	    (as simulate partitions it). It prints the seconds of every round
//	    (from the aggregator's log: one "round aggregated" to the next; round
//	    1 from its announcement), their mean and median, and the
//	    aggregator's peak memory (VmHWM of the broker-agg process). With
//	    --kills N it kills broker-agg with SIGKILL N times at seeded random
//	    moments mid-round, restarts it on the same state file, and prints
//	    the time from each restart (process start) to its first round
//	    announcement and to its first accepted update. With --console poll
//	    a client does what the console's page does for the whole run (GET
//	    /, its stylesheet and script, then GET /status?compact=1&
//	    rounds_after=R&evals_after=E every --console-poll, as console.js
//	    computes them); with --console chromium the page is open in a
//	    headless Chromium (through a counting proxy on loopback). It prints
//	    broker-agg's CPU seconds (utime + stime) at the federation's end and
//	    the console's requests (scripts/bench-console.sh).
//
//	loadtest flood --broker-agg BIN --edge-agent BIN [--broker embedded|mosquitto]
//	               [--sites 3] [--rounds 8] [--round-seconds 3 | --round-epochs N]
//	               [--rate 10000] [--batch 100] [--flood-seconds 10s] ...
//	    the flood figure of scripts/bench-flood.sh: broker-agg (its embedded
//	    broker with a password file, or --broker against Mosquitto with a
//	    password file and the shipped ACL), --sites edge-agent processes
//	    (synthetic(1,1), a 60 x 10 logistic regression) and an authenticated
//	    site "flooder" in this process that takes part in every round with
//	    one valid update. The federation runs twice on fresh state: a
//	    baseline, then the same run in which the flooder re-publishes its
//	    current round's update (--flood-content stale: the update of the
//	    round the flood began in, throughout) at --rate msg/s (QoS 0,
//	    --batch a tick) for --flood-seconds from --flood-after into
//	    --flood-round, with broker-agg's default round_timeout unless
//	    --round-timeout. It prints the
//	    seconds of every round of both runs, the messages sent and
//	    rate-limited (/metrics), the VmHWM and CPU seconds of broker-agg
//	    (and Mosquitto), and the round delay: the rounds the flood
//	    overlapped, summed, flood run minus baseline.
//	loadtest run ... --algorithm fedprox --secagg [--drop F] [--secagg-timeout D]
//	    the same with broker-agg's secure aggregation (scripts/bench-secagg.sh);
//	    with --drop F the first round(F K) sites of every round from the
//	    second on stop once their masked input is stored and are restarted
//	    once the round is aggregated (secagg.go).
//
//	loadtest scale --broker-agg BIN --data DIR [--broker mosquitto|embedded]
//	               [--sites 1000] [--rounds 4] [--epochs 1] [--perf /usr/bin/perf] ...
//	    the many-sites figure of scripts/bench-scale.sh: broker-agg run (on
//	    Mosquitto with a password file and the shipped ACL, or its embedded
//	    broker with a password file) and --sites MQTT sessions in this
//	    process, each a site with its own password, a persistent session
//	    and its receipts awaited, but no edge store: each solves once (the
//	    agent's FedProx solve on its client of the iid partition) and
//	    re-sends that DELTA, valid against any round's global model, under
//	    every later round's number (scale.go says why the FedProx family).
//	    K = N, quorum 1. It prints rounds 2..R's seconds and broker-agg CPU
//	    seconds, the peak memory of broker-agg, Mosquitto and itself, and
//	    with --perf the top of a perf profile of broker-agg over those
//	    rounds.
//
// The last lines are machine-readable: "RESULT key=value ...", one
// "RECOVERY key=value ..." per kill, and "ROUNDS key=value ...": rounds
// 2..R's seconds from announcement to aggregation, broker-agg's CPU
// seconds in them, and the bytes in and out per selected site.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/edgefl/edgefl/data/dataset"
	"github.com/edgefl/edgefl/node/broker"
	"github.com/edgefl/edgefl/proto/round"
	"github.com/edgefl/edgefl/sim/localfed"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: loadtest gen|run|flood|scale [flags] (see the package documentation)")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "gen":
		err = gen(os.Args[2:])
	case "run":
		err = runLoad(os.Args[2:])
	case "simstats":
		err = simStats(os.Args[2:])
	case "flood":
		err = runFlood(os.Args[2:])
	case "scale":
		err = runScale(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
}

// ---- gen ----

func gen(args []string) error {
	fs := flag.NewFlagSet("gen", flag.ExitOnError)
	dir := fs.String("dir", "", "output `DIR`")
	train := fs.Int("train", 20000, "training samples")
	test := fs.Int("test", 2000, "test samples")
	seed := fs.Uint64("seed", 1, "seed")
	noise := fs.Float64("noise", 70, "pixel noise (standard deviation, of 255)")
	flip := fs.Float64("label-noise", 0.1, "fraction of samples given a random label (keeps the classes from being separable)")
	_ = fs.Parse(args) // flag.ExitOnError: Parse exits on a bad flag
	if *dir == "" {
		return errors.New("gen: --dir is required")
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(*seed, 0x1d))
	const side, classes = 28, 10
	// Ten class prototypes: a few bright Gaussian blobs each.
	protos := make([][]float64, classes)
	for c := range protos {
		p := make([]float64, side*side)
		for range 4 {
			cx, cy, r := 4+rng.Float64()*20, 4+rng.Float64()*20, 2+rng.Float64()*4
			for y := range side {
				for x := range side {
					d2 := (float64(x)-cx)*(float64(x)-cx) + (float64(y)-cy)*(float64(y)-cy)
					p[y*side+x] += 255 * math.Exp(-d2/(2*r*r))
				}
			}
		}
		protos[c] = p
	}
	write := func(prefix string, n int) error {
		img := make([]byte, 0, n*side*side)
		lab := make([]byte, n)
		for i := range n {
			c := rng.IntN(classes)
			lab[i] = byte(c)
			if rng.Float64() < *flip {
				lab[i] = byte(rng.IntN(classes))
			}
			for _, v := range protos[c] {
				img = append(img, byte(min(max(v+rng.NormFloat64()**noise, 0), 255)))
			}
		}
		hdr := func(magic byte, dims ...int) []byte {
			b := []byte{0, 0, 0x08, magic}
			for _, d := range dims {
				b = binary.BigEndian.AppendUint32(b, uint32(d))
			}
			return b
		}
		if err := os.WriteFile(filepath.Join(*dir, prefix+"-images-idx3-ubyte"), append(hdr(3, n, side, side), img...), 0o644); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(*dir, prefix+"-labels-idx1-ubyte"), append(hdr(1, n), lab...), 0o644)
	}
	if err := write("train", *train); err != nil {
		return err
	}
	if err := write("t10k", *test); err != nil {
		return err
	}
	fmt.Printf("wrote %d + %d samples of 784 features, 10 classes, to %s\n", *train, *test, *dir)
	return nil
}

// ---- simstats ----

// simStats prints the mean and median seconds per round of a simulate
// results.json, leaving out the last round (which evaluates the model).
func simStats(args []string) error {
	fs := flag.NewFlagSet("simstats", flag.ExitOnError)
	path := fs.String("results", "", "results.json of broker-agg simulate")
	_ = fs.Parse(args) // flag.ExitOnError: Parse exits on a bad flag
	b, err := os.ReadFile(*path)
	if err != nil {
		return err
	}
	var res struct {
		Runs []struct {
			Algo   string `json:"algo"`
			Rounds []struct {
				Round   int      `json:"round"`
				Seconds *float64 `json:"seconds"`
			} `json:"rounds"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		return err
	}
	for _, r := range res.Runs {
		var secs []float64
		for _, row := range r.Rounds {
			if row.Round >= 1 && row.Round < len(r.Rounds)-1 && row.Seconds != nil {
				secs = append(secs, *row.Seconds)
			}
		}
		mean, med := stats(secs)
		fmt.Printf("SIM algo=%s rounds=%d per_round_mean_s=%.4f per_round_median_s=%.4f\n", r.Algo, len(secs), mean, med)
	}
	return nil
}

func stats(v []float64) (mean, median float64) {
	if len(v) == 0 {
		return math.NaN(), math.NaN()
	}
	for _, x := range v {
		mean += x
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return mean / float64(len(v)), s[len(s)/2]
}

// ---- run ----

// procFlags are the flags `run` and `flood` share: the programs they start
// and where they work.
type procFlags struct {
	aggBin, mosquitto, acl, work string
}

func (p *procFlags) registerProcFlags(fs *flag.FlagSet) {
	fs.StringVar(&p.aggBin, "broker-agg", "", "the broker-agg `BINARY`")
	fs.StringVar(&p.mosquitto, "mosquitto", "/usr/sbin/mosquitto", "the Mosquitto `BINARY`")
	fs.StringVar(&p.acl, "acl", "deploy/mosquitto/edgefl.acl", "the shipped ACL (ward-7 is replaced by the federation)")
	fs.StringVar(&p.work, "work", "", "working `DIR` for state files and logs (default: a temporary one, removed)")
}

type options struct {
	procFlags
	data                      string
	clients, perRound, rounds int
	params                    round.Params
	l2                        float64
	algo, codec               string
	seed                      uint64
	kills                     int
	timeout                   time.Duration
	console, chromium         string
	consolePoll               time.Duration
	secagg                    bool
	secaggTimeout             time.Duration
	drop                      float64
}

// loadData is the load's federation: o.clients IID clients of the IDX data.
func loadData(o options) (*dataset.Federated, error) {
	src, err := dataset.ParseSource("idx:" + o.data)
	if err != nil {
		return nil, err
	}
	fed, err := dataset.Build(src, dataset.Partition{Kind: dataset.PartIID}, dataset.BuildOptions{Clients: o.clients, Seed: o.seed})
	if err != nil {
		return nil, err
	}
	fmt.Printf("data: %d clients of %s, %d features, %d classes (%d-%d training samples each)\n",
		len(fed.Clients), o.data, fed.D, fed.Classes, minSamples(fed), maxSamples(fed))
	return fed, nil
}

func runLoad(args []string) error {
	o, err := parseLoadFlags(args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()

	fed, err := loadData(o)
	if err != nil {
		return err
	}
	work, cleanup, err := localfed.StateDir(o.work, "edgefl-loadtest-")
	if err != nil {
		return err
	}
	defer cleanup()
	const federation = "bench"
	ids := localfed.SiteIDs(o.clients, 3)
	pw, err := writePasswords(filepath.Join(work, "passwd"), append(slices.Clone(ids), "aggregator"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(work, "aggregator.password"), []byte(pw["aggregator"]+"\n"), 0o600); err != nil {
		return err
	}

	// Mosquitto.
	mport, err := freePort()
	if err != nil {
		return err
	}
	mq, err := startMosquitto(o, work, federation, mport)
	if err != nil {
		return err
	}
	defer mq.stop()
	brokerURL := fmt.Sprintf("tcp://127.0.0.1:%d", mport)

	// broker-agg.
	agg, err := startLoadAggregator(ctx, o, work, loadAggConf(o, federation, brokerURL, work, fed))
	if err != nil {
		return err
	}
	defer agg.stop()

	// The console, open from the aggregator's start to the federation's end.
	cons, err := openConsole(ctx, o, agg.metrics, work)
	if err != nil {
		return err
	}
	defer cons.close()

	// The agents, in this process.
	sites := make([]localfed.Site, len(ids))
	for i, id := range ids {
		data := fed.Clients[i].Train
		sites[i] = localfed.Site{ID: id, Data: &data}
	}
	drops := newDropper(o, ids)
	var cpu cpuSampler
	agents, err := localfed.StartAgents(ctx, localfed.AgentsConfig{Federation: federation, Brokers: []string{brokerURL}, Passwords: pw,
		Dir: work, Sites: sites, Seed: o.seed, ReconnectMin: 200 * time.Millisecond, ReconnectMax: 2 * time.Second,
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
		Observe: drops.observe})
	if err != nil {
		return err
	}
	sctx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	go drops.run(sctx, agents, agg)
	go cpu.run(sctx, agg)
	defer func() {
		if err := agents.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "loadtest: stopping the agents:", err)
		}
	}()

	recs, err := killAndRecover(ctx, o, agg)
	if err != nil {
		return err
	}
	// The end, from the aggregator's log (no polling of its metrics
	// address, which would add load of its own to every run).
	if _, err := agg.waitEvent(ctx, "federation finished", time.Time{}); err != nil {
		if aerr := agents.Err(); aerr != nil {
			return fmt.Errorf("%w (%v)", err, aerr)
		}
		return err
	}
	if err := printLoadResult(o, fed, agg, mq, cons, recs, work); err != nil {
		return err
	}
	return printSecAggResult(o, agg, &cpu, drops)
}

// parseLoadFlags reads `loadtest run`'s flags.
func parseLoadFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	o.registerProcFlags(fs)
	fs.StringVar(&o.data, "data", "", "IDX data `DIR` (loadtest gen)")
	fs.IntVar(&o.clients, "clients", 100, "edge agents N")
	fs.IntVar(&o.perRound, "per-round", 100, "clients per round K")
	fs.IntVar(&o.rounds, "rounds", 20, "rounds")
	round.Register(fs, &o.algo, &o.params, round.Load, nil, round.FlagAlgorithm, round.FlagSolver, round.FlagMu, round.FlagStep,
		round.FlagGamma, round.FlagLR, round.FlagBatch, round.FlagEpochs)
	fs.Float64Var(&o.l2, "l2", 0, "L2 coefficient of the model")
	fs.StringVar(&o.codec, "codec", "fp32", "uplink codec")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the partition, the selection and the agents")
	fs.IntVar(&o.kills, "kills", 0, "kill broker-agg (SIGKILL) this many times mid-round and measure its recovery")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Minute, "give up after")
	fs.StringVar(&o.console, "console", "none", "the console open for the whole run: none, poll (a client doing what the page's script does) or chromium (the page in headless Chromium)")
	fs.DurationVar(&o.consolePoll, "console-poll", 1500*time.Millisecond, "with --console poll: the page's polling interval (console.js POLL_MS)")
	fs.StringVar(&o.chromium, "chromium", "/usr/bin/chromium", "with --console chromium: the Chromium `BINARY`")
	fs.BoolVar(&o.secagg, "secagg", false, "run broker-agg with --secagg")
	fs.DurationVar(&o.secaggTimeout, "secagg-timeout", time.Minute, "with --secagg: broker-agg's --secagg-timeout")
	fs.Float64Var(&o.drop, "drop", 0, "with --secagg: the share F of each round's sites that drop out after their masked input, from round 2 on (restarted once the round is aggregated)")
	_ = fs.Parse(args) // flag.ExitOnError: Parse exits on a bad flag
	if o.aggBin == "" || o.data == "" {
		return o, errors.New("run: --broker-agg and --data are required")
	}
	if o.console != "none" && o.console != "poll" && o.console != "chromium" {
		return o, errConsoleMode
	}
	return o, nil
}

// loadAggConf is broker-agg's configuration for `loadtest run`: against
// Mosquitto at brokerURL, the model fitting fed.
func loadAggConf(o options, federation, brokerURL, work string, fed *dataset.Federated) []string {
	conf := []string{
		"federation = " + federation, "broker = " + brokerURL, "username = aggregator",
		"broker_password_file = " + filepath.Join(work, "aggregator.password"),
		"state_file = " + filepath.Join(work, "aggregator.db"),
		"model = logreg", fmt.Sprintf("l2 = %g", o.l2), fmt.Sprintf("features = %d", fed.D), fmt.Sprintf("classes = %d", fed.Classes),
		"algorithm = " + o.algo, "solver = " + o.params.Solver, "codec = " + o.codec,
		fmt.Sprintf("per_round = %d", o.perRound), fmt.Sprintf("rounds = %d", o.rounds), "quorum_fraction = 1",
		"round_timeout = 10m", "settle = 0s", "max_reselections = -1", fmt.Sprintf("seed = %d", o.seed),
		fmt.Sprintf("mu = %g", o.params.Mu), fmt.Sprintf("step = %g", o.params.Step), fmt.Sprintf("gamma = %g", o.params.Gamma),
		fmt.Sprintf("lr = %g", o.params.LR), fmt.Sprintf("batch = %d", o.params.Batch), fmt.Sprintf("max_epochs = %d", o.params.MaxEpochs),
		"max_seconds = 0", "log_format = json", "log_level = info",
	}
	if o.secagg {
		conf = append(conf, "secagg = true", "secagg_clip = 1", "secagg_timeout = "+o.secaggTimeout.String())
	}
	return conf
}

// startLoadAggregator writes conf (plus a metrics address on a free port)
// to work/aggregator.conf and starts broker-agg on it.
func startLoadAggregator(ctx context.Context, o options, work string, conf []string) (*aggProc, error) {
	metricsPort, err := freePort()
	if err != nil {
		return nil, err
	}
	agg := &aggProc{o: o, work: work, metrics: fmt.Sprintf("127.0.0.1:%d", metricsPort), conf: filepath.Join(work, "aggregator.conf")}
	conf = append(conf, "metrics_addr = "+agg.metrics)
	if err := os.WriteFile(agg.conf, []byte(strings.Join(conf, "\n")+"\n"), 0o600); err != nil {
		return nil, err
	}
	if err := agg.start(ctx); err != nil {
		return nil, err
	}
	return agg, nil
}

// console is the console's reader of --console, open from the
// aggregator's start to the federation's end.
type console struct {
	counts  consoleCounts
	stop    context.CancelFunc
	wg      sync.WaitGroup
	browser *chromium
	proxy   func()
	log     string
}

func openConsole(ctx context.Context, o options, metrics, work string) (*console, error) {
	c := &console{log: filepath.Join(work, "chromium.log")}
	cctx, stop := context.WithCancel(ctx)
	c.stop = stop
	switch o.console {
	case "poll":
		c.wg.Add(1)
		go func() { defer c.wg.Done(); pollConsole(cctx, metrics, o.consolePoll, &c.counts) }()
	case "chromium":
		proxy, closeProxy, err := countingProxy(metrics, &c.counts)
		if err != nil {
			stop()
			return nil, err
		}
		c.proxy = closeProxy
		if c.browser, err = startChromium(o.chromium, "http://"+proxy+"/", c.log); err != nil {
			c.close()
			return nil, err
		}
	}
	return c, nil
}

// close stops the reader; it may be called again.
func (c *console) close() {
	c.stop()
	c.wg.Wait()
	if c.browser != nil {
		_ = c.browser.stop() // killed on purpose: its exit status is not the point
		c.browser = nil
	}
	if c.proxy != nil {
		c.proxy()
		c.proxy = nil
	}
}

// recovery is one kill of broker-agg and its restart.
type recovery struct {
	round            int
	phase            string
	announce, accept time.Duration
}

// killAndRecover kills broker-agg --kills times at seeded random moments
// mid-round, restarts it each time and measures its recovery.
func killAndRecover(ctx context.Context, o options, agg *aggProc) ([]recovery, error) {
	rng := rand.New(rand.NewPCG(o.seed, 0x4b1))
	var recs []recovery
	for k := range o.kills {
		m, err := agg.waitMetrics(ctx, func(m map[string]float64) bool { return true })
		if err != nil {
			return nil, err
		}
		// Mid-round: a random share of the current round's updates in.
		round := int(m["edgefl_aggregator_round"])
		j := float64(1 + rng.IntN(max(o.perRound-1, 1)))
		at, err := agg.waitMetrics(ctx, func(m map[string]float64) bool {
			return int(m["edgefl_aggregator_round"]) > round && m["edgefl_aggregator_round_received"] >= j
		})
		if err != nil {
			return nil, err
		}
		if at["edgefl_aggregator_finished"] == 1 {
			return nil, fmt.Errorf("kill %d: the federation finished first: use more rounds", k+1)
		}
		agg.kill()
		started := time.Now()
		if err := agg.start(ctx); err != nil {
			return nil, err
		}
		ann, err := agg.waitEvent(ctx, "round announced", started)
		if err != nil {
			return nil, err
		}
		acc, err := agg.waitEvent(ctx, "update accepted", started)
		if err != nil {
			return nil, err
		}
		r := recovery{round: int(at["edgefl_aggregator_round"]), phase: fmt.Sprintf("%v of %d updates in", at["edgefl_aggregator_round_received"], o.perRound),
			announce: ann.Sub(started), accept: acc.Sub(started)}
		recs = append(recs, r)
		fmt.Printf("kill %d in round %d (%s): restart -> announcement %v, -> first accepted update %v\n",
			k+1, r.round, r.phase, r.announce.Round(time.Millisecond), r.accept.Round(time.Millisecond))
	}
	return recs, nil
}

// printLoadResult prints the figures of a finished `loadtest run`: the
// seconds per round, the RESULT and RECOVERY lines.
func printLoadResult(o options, fed *dataset.Federated, agg *aggProc, mq *mosq, cons *console, recs []recovery, work string) error {
	hwm, err := vmHWM(agg.cmd.Process.Pid)
	if err != nil {
		return err
	}
	aggCPU, err := cpuSeconds(agg.cmd.Process.Pid)
	if err != nil {
		return err
	}
	if cons.browser != nil && cons.browser.exited() {
		return fmt.Errorf("chromium exited during the run (see %s)", cons.log)
	}
	cons.close()
	paths, nreq, nbytes, nerr := cons.counts.summary()
	selfHWM, _ := vmHWM(os.Getpid())
	mqHWM, _ := vmHWM(mq.cmd.Process.Pid)

	// Seconds per round from the aggregator's log (its clock).
	start, end, err := agg.roundSpans(o.rounds)
	if err != nil {
		return err
	}
	var secs []float64
	for r := 1; r <= o.rounds; r++ {
		secs = append(secs, end[r].Sub(start[r]).Seconds())
	}
	mean, med := stats(secs)
	if o.kills == 0 {
		fmt.Print("seconds per round:")
		for _, s := range secs {
			fmt.Printf(" %.3f", s)
		}
		fmt.Println()
	}
	total := end[o.rounds].Sub(start[1]).Seconds()
	fmt.Printf("RESULT clients=%d per_round=%d rounds=%d epochs=%d algorithm=%s params=%d per_round_mean_s=%.4f per_round_median_s=%.4f total_s=%.3f aggregator_vmhwm_kb=%d aggregator_cpu_s=%.2f agents_process_vmhwm_kb=%d mosquitto_vmhwm_kb=%d kills=%d console=%s console_requests=%d console_bytes=%d console_errors=%d console_paths=%s\n",
		o.clients, o.perRound, o.rounds, o.params.MaxEpochs, o.algo, fed.D*fed.Classes+fed.Classes, mean, med, total, hwm, aggCPU, selfHWM, mqHWM, o.kills,
		o.console, nreq, nbytes, nerr, paths)
	for i, r := range recs {
		fmt.Printf("RECOVERY kill=%d round=%d start_to_announcement_ms=%.0f start_to_accepted_update_ms=%.0f\n",
			i+1, r.round, float64(r.announce)/1e6, float64(r.accept)/1e6)
	}
	return nil
}

func minSamples(f *dataset.Federated) int {
	m := math.MaxInt
	for _, c := range f.Clients {
		m = min(m, c.Train.N)
	}
	return m
}

func maxSamples(f *dataset.Federated) int {
	m := 0
	for _, c := range f.Clients {
		m = max(m, c.Train.N)
	}
	return m
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// writePasswords writes a Mosquitto password file (1,000 PBKDF2 iterations:
// 101 clients connect at once) and returns the passwords.
func writePasswords(path string, users []string) (map[string]string, error) {
	pw, err := localfed.Passwords(users)
	if err != nil {
		return nil, err
	}
	// Hashed on every core: 10,000 sites (loadtest scale) take seconds.
	hashes := make([]string, len(users))
	errs := make([]error, len(users))
	var wg sync.WaitGroup
	next := make(chan int)
	for range runtime.NumCPU() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				hashes[i], errs[i] = broker.HashPassword(pw[users[i]], 1000)
			}
		}()
	}
	for i := range users {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var b strings.Builder
	for i, u := range users {
		fmt.Fprintf(&b, "%s:%s\n", u, hashes[i])
	}
	return pw, os.WriteFile(path, []byte(b.String()), 0o600)
}

// ---- Mosquitto ----

type mosq struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func startMosquitto(o options, work, federation string, port int) (*mosq, error) {
	acl, err := os.ReadFile(o.acl)
	if err != nil {
		return nil, err
	}
	aclPath := filepath.Join(work, "edgefl.acl")
	if err := os.WriteFile(aclPath, []byte(strings.ReplaceAll(string(acl), "edgefl/ward-7/", "edgefl/"+federation+"/")), 0o644); err != nil {
		return nil, err
	}
	me, err := user.Current()
	if err != nil {
		return nil, err
	}
	persist := filepath.Join(work, "mosquitto-data") + "/"
	if err := os.MkdirAll(persist, 0o755); err != nil {
		return nil, err
	}
	// deploy/mosquitto/mosquitto.conf's settings, with a password listener
	// on loopback instead of its mutual-TLS one.
	conf := fmt.Sprintf(`user %s
per_listener_settings false
allow_anonymous false
acl_file %s
password_file %s
persistence true
persistence_location %s
autosave_interval 60
max_queued_messages 100000
max_queued_bytes 0
max_inflight_messages 20
max_packet_size 16777216
set_tcp_nodelay true
log_dest file %s
listener %d 127.0.0.1
`, me.Username, aclPath, filepath.Join(work, "passwd"), persist, filepath.Join(work, "mosquitto.log"), port)
	cf := filepath.Join(work, "mosquitto.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	m := &mosq{cmd: exec.Command(o.mosquitto, "-c", cf), done: make(chan struct{})}
	if err := m.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = m.cmd.Wait(); close(m.done) }() // the exit is judged by the caller (ProcessState)
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
			return m, nil
		}
		select {
		case <-m.done:
			return nil, fmt.Errorf("mosquitto exited (see %s)", filepath.Join(work, "mosquitto.log"))
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("mosquitto does not listen: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (m *mosq) stop() {
	m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.done:
	case <-time.After(10 * time.Second):
		m.cmd.Process.Kill()
	}
}

// ---- broker-agg ----

type aggProc struct {
	o       options
	work    string
	conf    string
	metrics string
	cmd     *exec.Cmd
	done    chan struct{}
	runs    int

	mu     sync.Mutex
	events []event
}

type event struct {
	msg   string
	round int
	at    time.Time
}

func (a *aggProc) start(ctx context.Context) error {
	a.runs++
	logf, err := os.Create(filepath.Join(a.work, fmt.Sprintf("aggregator.%d.log", a.runs)))
	if err != nil {
		return err
	}
	a.cmd = exec.Command(a.o.aggBin, "run", "--config", a.conf)
	r, w := io.Pipe()
	a.cmd.Stdout, a.cmd.Stderr = w, w
	if err := a.cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	a.done = done
	go func() { _ = a.cmd.Wait(); w.Close(); close(done) }() // the exit is judged by the caller (ProcessState)
	go func() {
		defer logf.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			line := sc.Bytes()
			_, _ = logf.Write(append(line, '\n')) // a copy for the reader; the figures come from the parsed lines
			var rec struct {
				Time  time.Time `json:"time"`
				Msg   string    `json:"msg"`
				Round int       `json:"round"`
			}
			if json.Unmarshal(line, &rec) == nil && rec.Msg != "" {
				a.mu.Lock()
				a.events = append(a.events, event{rec.Msg, rec.Round, rec.Time})
				a.mu.Unlock()
			}
		}
	}()
	for {
		if code, _ := httpGet(a.metrics, "/healthz"); code == http.StatusOK {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("broker-agg exited (see %s)", logf.Name())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (a *aggProc) kill() {
	a.cmd.Process.Signal(syscall.SIGKILL)
	<-a.done
}

func (a *aggProc) stop() {
	a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(20 * time.Second):
		a.kill()
	}
}

// waitEvent waits for the first log line msg stamped after since.
func (a *aggProc) waitEvent(ctx context.Context, msg string, since time.Time) (time.Time, error) {
	for {
		a.mu.Lock()
		for _, e := range a.events {
			if e.msg == msg && e.at.After(since) {
				a.mu.Unlock()
				return e.at, nil
			}
		}
		a.mu.Unlock()
		select {
		case <-a.done:
			return time.Time{}, fmt.Errorf("waiting for %q: broker-agg exited", msg)
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("waiting for %q: %w", msg, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// roundSpans returns, per round 1..rounds, its start (the previous round's
// aggregation; round 1: its first announcement) and end (its last "round
// aggregated"), from the aggregator's log.
func (a *aggProc) roundSpans(rounds int) (start, end map[int]time.Time, err error) {
	aggregated, announced := a.roundTimes()
	start, end = map[int]time.Time{}, map[int]time.Time{}
	for r := 1; r <= rounds; r++ {
		e, ok := aggregated[r]
		b, ok2 := aggregated[r-1]
		if r == 1 {
			b, ok2 = announced[1]
		}
		if !ok || !ok2 {
			return nil, nil, fmt.Errorf("no start or end time for round %d in the aggregator's log", r)
		}
		start[r], end[r] = b, e
	}
	return start, end, nil
}

// roundTimes returns, per round, the last "round aggregated" time and the
// first "round announced" time.
func (a *aggProc) roundTimes() (aggregated, announced map[int]time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	aggregated, announced = map[int]time.Time{}, map[int]time.Time{}
	for _, e := range a.events {
		switch e.msg {
		case "round aggregated":
			aggregated[e.round] = e.at
		case "round announced":
			if _, ok := announced[e.round]; !ok {
				announced[e.round] = e.at
			}
		}
	}
	return aggregated, announced
}

func (a *aggProc) waitMetrics(ctx context.Context, cond func(map[string]float64) bool) (map[string]float64, error) {
	for {
		select {
		case <-a.done:
			return nil, errors.New("broker-agg exited")
		default:
		}
		if code, body := httpGet(a.metrics, "/metrics"); code == http.StatusOK {
			m := parseMetrics(body)
			if cond(m) {
				return m, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func httpGet(addr, path string) (int, string) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return resp.StatusCode, string(b)
}

func parseMetrics(body string) map[string]float64 {
	m := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				m[line[:i]] = v
			}
		}
	}
	return m
}

// vmHWM reads a process's peak resident set size in kB.
func vmHWM(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
		}
	}
	return 0, fmt.Errorf("no VmHWM for %d", pid)
}

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The federation every test runs: FedProx's synthetic(1,1) data (60
// features, 10 classes: 610 parameters), a few samples per site.
const (
	features = 60
	classes  = 10
	dim      = features*classes + classes
)

// ---- the aggregator (broker-agg run) ----

// aggregator is one `broker-agg run --config FILE`, restartable on the
// same configuration (state file, ports).
type aggregator struct {
	t       *testing.T
	dir     string
	conf    string
	state   string
	metrics string // host:port of /metrics
	mqttURL string // the embedded broker's URL ("" with an external broker)
	p       *proc  // the current run
	runs    []*proc
}

// aggDefaults is the configuration the tests start from: FedProx-split
// with SGD on 610 parameters, short deadlines, JSON logs.
func aggDefaults(federation string) kv {
	return kv{
		{"federation", federation},
		{"client_id", "aggregator"},
		{"model", "logreg"},
		{"features", fmt.Sprint(features)},
		{"classes", fmt.Sprint(classes)},
		{"l2", "0.001"},
		{"algorithm", "fedproxsplit"},
		{"solver", "sgd"},
		{"mu", "1"},
		{"step", "1"},
		{"lr", "0.05"},
		{"batch", "10"},
		{"max_epochs", "2"},
		{"gamma", "0.000001"},
		{"codec", "fp32"},
		{"quorum_fraction", "1"},
		{"round_timeout", "20s"},
		{"settle", "300ms"},
		{"max_reselections", "-1"},
		{"seed", "7"},
		{"log_format", "json"},
		{"log_level", "info"},
	}
}

// newAggregator writes dir/aggregator.conf from c (adding the state file
// and a metrics port) and starts it.
func newAggregator(t *testing.T, dir string, c kv) *aggregator {
	t.Helper()
	a := &aggregator{t: t, dir: dir, conf: filepath.Join(dir, "aggregator.conf"), state: filepath.Join(dir, "aggregator.db")}
	a.metrics = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	c = c.set("state_file", a.state).set("metrics_addr", a.metrics)
	for _, p := range c {
		if p[0] == "listen" {
			a.mqttURL = "tcp://" + p[1]
		}
	}
	writeConf(t, a.conf, c)
	a.start()
	return a
}

// start runs broker-agg (again) and waits until it is connected,
// subscribed and has resumed its round (/healthz answers ok).
func (a *aggregator) start() {
	a.t.Helper()
	a.p = startProc(a.t, a.dir, "aggregator", nil, aggBin, "run", "--config", a.conf)
	a.runs = append(a.runs, a.p)
	a.waitHealthy(20 * time.Second)
}

func (a *aggregator) waitHealthy(timeout time.Duration) {
	a.t.Helper()
	waitFor(a.t, timeout, "the aggregator's /healthz", func() (bool, error) {
		if !a.p.alive() {
			a.t.Fatalf("the aggregator exited (%v):\n%s", a.p.exitError(), a.p.tail(30))
		}
		code, _, err := httpGet(a.metrics, "/healthz")
		return code == http.StatusOK, err
	})
}

// scrape reads /metrics.
func (a *aggregator) scrape() (metrics, error) {
	code, body, err := httpGet(a.metrics, "/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/metrics: HTTP %d", code)
	}
	return parseMetrics(body)
}

// mustScrape reads /metrics or fails the test.
func (a *aggregator) mustScrape() metrics {
	a.t.Helper()
	m, err := a.scrape()
	if err != nil {
		a.t.Fatalf("scraping the aggregator: %v", err)
	}
	return m
}

// waitMetrics polls /metrics until cond holds and returns that scrape. It
// fails at once if the aggregator exits.
func (a *aggregator) waitMetrics(timeout time.Duration, what string, cond func(metrics) bool) metrics {
	a.t.Helper()
	var got metrics
	waitFor(a.t, timeout, what, func() (bool, error) {
		if !a.p.alive() {
			a.t.Fatalf("the aggregator exited (%v) while waiting for %s:\n%s", a.p.exitError(), what, a.p.tail(30))
		}
		m, err := a.scrape()
		if err != nil {
			return false, err
		}
		got = m
		return cond(m), fmt.Errorf("round %v phase %s received %v closed %v",
			m["edgefl_aggregator_round"], m.phase(), m["edgefl_aggregator_round_received"], m["edgefl_aggregator_rounds_closed_total"])
	})
	return got
}

// waitFinished waits until the last round is aggregated.
func (a *aggregator) waitFinished(timeout time.Duration) metrics {
	a.t.Helper()
	return a.waitMetrics(timeout, "the federation to finish", func(m metrics) bool { return m["edgefl_aggregator_finished"] == 1 })
}

// lines of every run of the aggregator matching pred.
func (a *aggregator) lines(pred func(logLine) bool) []logLine { return runLines(a.runs, pred) }

// noPanics checks that no run of the aggregator panicked.
func (a *aggregator) noPanics() { a.t.Helper(); checkNoPanics(a.t, a.runs) }

// runLines is the log lines matching pred of every run of one daemon.
func runLines(runs []*proc, pred func(logLine) bool) []logLine {
	var out []logLine
	for _, p := range runs {
		for _, l := range p.all() {
			if pred(l) {
				out = append(out, l)
			}
		}
	}
	return out
}

// checkNoPanics fails t for every run that panicked.
func checkNoPanics(t *testing.T, runs []*proc) {
	t.Helper()
	for _, p := range runs {
		if l, ok := p.panicked(); ok {
			t.Errorf("%s panicked: %s", p.logPath, l)
		}
	}
}

// ---- metrics ----

// metrics maps a sample as written (name{labels}) to its value.
type metrics map[string]float64

func parseMetrics(body string) (metrics, error) {
	m := metrics{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("metrics line %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		m[line[:i]] = v
	}
	return m, sc.Err()
}

func (m metrics) rejected(reason string) float64 {
	return m[`edgefl_aggregator_updates_rejected_total{reason="`+reason+`"}`]
}

func (m metrics) phase() string {
	for _, p := range []string{"waiting", "collecting", "stalled", "closing", "finished"} {
		if m[`edgefl_aggregator_phase{phase="`+p+`"}`] == 1 {
			return p
		}
	}
	return "?"
}

func (m metrics) round() int { return int(m["edgefl_aggregator_round"]) }

func httpGet(addr, path string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	return resp.StatusCode, string(b), err
}

// ---- edge agents (edge-agent run) ----

// edge is one site's `edge-agent run --config FILE`, restartable.
type edge struct {
	t     *testing.T
	dir   string
	id    string
	conf  string
	state string
	p     *proc
	runs  []*proc
}

// agentConf is a site's configuration: client k of synthetic(1,1) split
// into n devices of at most maxSamples samples, password login, fast
// reconnects, JSON logs.
func agentConf(federation, brokerURL, id, pwFile string, k, n, maxSamples int) kv {
	return kv{
		{"site_id", id},
		{"federation", federation},
		{"broker", brokerURL},
		{"username", id},
		{"password_file", pwFile},
		{"data", "synthetic:1,1"},
		{"data_client", fmt.Sprint(k)},
		{"data_clients", fmt.Sprint(n)},
		{"data_seed", "3"},
		{"data_max_samples", fmt.Sprint(maxSamples)},
		{"seed", "11"},
		{"reconnect_min", "200ms"},
		{"reconnect_max", "1s"},
		{"connect_timeout", "2s"},
		{"publish_timeout", "5s"},
		{"deadline_margin", "300ms"},
		{"log_format", "json"},
		{"log_level", "info"},
	}
}

// newEdge writes dir/<id>.conf from c (adding the state file) and starts
// the agent.
func newEdge(t *testing.T, dir, id string, c kv) *edge {
	t.Helper()
	e := &edge{t: t, dir: dir, id: id, conf: filepath.Join(dir, id+".conf"), state: filepath.Join(dir, id+".db")}
	writeConf(t, e.conf, c.set("state_file", e.state))
	e.start()
	return e
}

func (e *edge) start() {
	e.t.Helper()
	e.p = startProc(e.t, e.dir, e.id, nil, agentBin, "run", "--config", e.conf)
	e.runs = append(e.runs, e.p)
}

func (e *edge) lines(pred func(logLine) bool) []logLine { return runLines(e.runs, pred) }

func (e *edge) noPanics() { e.t.Helper(); checkNoPanics(e.t, e.runs) }

// startFederation starts broker-agg on conf with its embedded broker on a
// free port and password logins for site-1..site-n, then n edge agents of
// at most maxSamples rows each: the setup of the tests that kill or damage
// the daemons.
func startFederation(t *testing.T, dir, federation string, conf kv, n, maxSamples int) (*aggregator, []*edge) {
	t.Helper()
	passwd := filepath.Join(dir, "passwd")
	setPasswords(t, dir, passwd, siteIDs(n)...)
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	agg := newAggregator(t, dir, conf.with(kv{{"listen", listen}, {"password_file", passwd}}))
	return agg, startEdges(t, dir, federation, "tcp://"+listen, n, maxSamples, nil)
}

// startEdges starts n agents site-1..site-n on clients 0..n-1 of an
// n-device federation.
func startEdges(t *testing.T, dir, federation, brokerURL string, n, maxSamples int, extra kv) []*edge {
	t.Helper()
	var out []*edge
	for i := range n {
		id := fmt.Sprintf("site-%d", i+1)
		c := agentConf(federation, brokerURL, id, passwordFile(dir, id), i, n, maxSamples).with(extra)
		out = append(out, newEdge(t, dir, id, c))
	}
	return out
}

// waitReceipted waits until every update each site solved (in any of its
// runs) has been answered (unansweredRound).
func waitReceipted(t *testing.T, edges []*edge) {
	t.Helper()
	for _, e := range edges {
		waitFor(t, 30*time.Second, e.id+"'s receipts", func() (bool, error) {
			runs := make([][]logLine, len(e.runs))
			for i, p := range e.runs {
				runs[i] = p.all()
			}
			if r, ok := unansweredRound(runs); ok {
				return false, fmt.Errorf("round %v unanswered", r)
			}
			return true, nil
		})
	}
}

// unansweredRound returns a round that a site solved in one of its runs
// (their log lines, in order), or that a run found in its outbox at start,
// and that no run shows answered. A round is answered when a run logged its
// receipt or its rejection, or when a later run started without it in its
// outbox (the agent logs the outbox's rounds at start, before connecting):
// the receipt was committed by a run that a SIGKILL stopped before it
// logged the line, which comes after the commit.
func unansweredRound(runs [][]logLine) (float64, bool) {
	answered := map[float64]bool{}
	for _, lines := range runs {
		for _, l := range lines {
			if msgIs("update receipted")(l) || msgIs("update rejected by the aggregator; dropped")(l) {
				answered[l.num("round")] = true
			}
		}
	}
	for i, lines := range runs {
		for _, l := range lines {
			var rounds []float64
			switch {
			case msgIs("round solved")(l):
				rounds = []float64{l.num("round")}
			case msgIs(outboxAtStart)(l):
				rounds = outboxRounds(l)
			}
			for _, r := range rounds {
				if !answered[r] && !leftOutbox(runs[i+1:], r) {
					return r, true
				}
			}
		}
	}
	return 0, false
}

// outboxAtStart is the agent's line listing the outbox's rounds at start.
const outboxAtStart = "unreceipted updates in the outbox; re-sending on connect"

// outboxRounds are the rounds of an outboxAtStart line.
func outboxRounds(l logLine) []float64 {
	var out []float64
	rs, _ := l.kv["rounds"].([]any)
	for _, r := range rs {
		if f, ok := r.(float64); ok {
			out = append(out, f)
		}
	}
	return out
}

// leftOutbox reports whether one of runs started without round in its
// outbox.
func leftOutbox(runs [][]logLine, round float64) bool {
	for _, lines := range runs {
		started, held := false, false
		for _, l := range lines {
			switch l.msg() {
			case outboxAtStart:
				held = slices.Contains(outboxRounds(l), round)
			case "connecting":
				started = true
			}
		}
		if started && !held {
			return true
		}
	}
	return false
}

// appliedAtLeast reports whether one of the site's runs shows round r or a
// later one applied: solved, found applied when announced again, or in the
// outbox at start. Rounds are drawn back to back, so the run killed last
// may have committed a round after the line a test killed it on, and the
// SIGKILL may have cut off that round's own line.
func (e *edge) appliedAtLeast(r int) bool {
	return len(e.lines(func(l logLine) bool {
		switch l.msg() {
		case "round solved", "round already applied; re-sending its unreceipted update":
			return l.num("round") >= float64(r)
		case outboxAtStart:
			return slices.ContainsFunc(outboxRounds(l), func(x float64) bool { return x >= float64(r) })
		}
		return false
	})) > 0
}

// waitAnnounced waits until one of the aggregator's runs has announced
// round r or a later one: a run killed on a log line of round r-1 may have
// moved on past r, and its restart resumes there.
func (a *aggregator) waitAnnounced(timeout time.Duration, r int) {
	a.t.Helper()
	waitFor(a.t, timeout, fmt.Sprintf("round %d announced", r), func() (bool, error) {
		return len(a.lines(func(l logLine) bool { return msgIs("round announced")(l) && l.num("round") >= float64(r) })) > 0, nil
	})
}

func siteIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("site-%d", i+1)
	}
	return ids
}

// ---- Mosquitto ----

// mosquitto is a Mosquitto broker on a loopback port with a password
// file, the shipped ACL (deploy/mosquitto/edgefl.acl, federation
// substituted, plus a read-only "observer" user for the tests) and
// persistence in its directory; restartable on the same port.
type mosquitto struct {
	t    *testing.T
	dir  string
	port int
	conf string
	p    *proc
	runs []*proc
}

func (m *mosquitto) url() string { return fmt.Sprintf("tcp://127.0.0.1:%d", m.port) }

// newMosquitto starts Mosquitto in dir (password file dir/passwd, which the
// caller fills with setPasswords before or after: Mosquitto reads it at
// start).
func newMosquitto(t *testing.T, dir, federation string) *mosquitto {
	t.Helper()
	m := &mosquitto{t: t, dir: dir, port: freePort(t), conf: filepath.Join(dir, "mosquitto.conf")}
	aclText := shippedACL(t, federation)
	aclText += "\n# e2e tests: an observer of the whole federation\nuser observer\ntopic read edgefl/" + federation + "/#\n"
	aclPath := filepath.Join(dir, "edgefl.acl")
	if err := os.WriteFile(aclPath, []byte(aclText), 0o644); err != nil {
		t.Fatal(err)
	}
	persist := filepath.Join(dir, "mosquitto-data") + "/"
	if err := os.MkdirAll(persist, 0o755); err != nil {
		t.Fatal(err)
	}
	// The security, persistence and queue settings of
	// deploy/mosquitto/mosquitto.conf; a plain password listener on
	// loopback instead of its mutual-TLS one (clients choose their client
	// id, so that mosquitto_pub under a site's name does not take over the
	// running agent's session).
	// Run as root, Mosquitto drops privileges to the "mosquitto" user, who
	// cannot read the test's files: stay the current user.
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`user %s
per_listener_settings false
allow_anonymous false
acl_file %s
password_file %s
persistence true
persistence_location %s
autosave_interval 60
persistent_client_expiration 1d
max_queued_messages 100000
max_queued_bytes 0
max_inflight_messages 20
max_packet_size 16777216
retain_available true
set_tcp_nodelay true
log_dest stderr
log_type error
log_type warning
log_type notice
log_type information
connection_messages true
listener %d 127.0.0.1
protocol mqtt
`, me.Username, aclPath, filepath.Join(dir, "passwd"), persist, m.port)
	if err := os.WriteFile(m.conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	m.start()
	return m
}

// shippedACL is deploy/mosquitto/edgefl.acl for federation.
func shippedACL(t *testing.T, federation string) string {
	t.Helper()
	acl, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "mosquitto", "edgefl.acl"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(string(acl), "edgefl/ward-7/", "edgefl/"+federation+"/")
}

// start runs Mosquitto (again, on the same port and persistence file) and
// waits until it accepts connections.
func (m *mosquitto) start() {
	m.t.Helper()
	m.p = startProc(m.t, m.dir, "mosquitto", nil, mosquittoBin, "-c", m.conf)
	m.runs = append(m.runs, m.p)
	waitFor(m.t, 10*time.Second, "Mosquitto to listen", func() (bool, error) {
		if !m.p.alive() {
			m.t.Fatalf("mosquitto exited: %v\n%s", m.p.exitError(), m.p.tail(20))
		}
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", m.port), time.Second)
		if err != nil {
			return false, err
		}
		c.Close()
		return true, nil
	})
}

// term stops Mosquitto with SIGTERM: it writes its persistence file.
func (m *mosquitto) term() {
	m.t.Helper()
	m.p.cmd.Process.Signal(syscall.SIGTERM)
	m.p.waitExit(10 * time.Second)
}

// mosquittoPub publishes payload with mosquitto_pub (QoS 1) and returns its
// combined output and exit error.
func mosquittoPub(t *testing.T, port int, user, password, clientID, topic string, payload []byte, extra ...string) (string, error) {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "payload-*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(payload); err != nil {
		t.Fatal(err)
	}
	f.Close()
	args := []string{"-h", "127.0.0.1", "-p", fmt.Sprint(port), "-q", "1", "-t", topic, "-f", f.Name()}
	if clientID != "" {
		args = append(args, "-i", clientID)
	}
	if user != "" {
		args = append(args, "-u", user)
	}
	if password != "" {
		args = append(args, "-P", password)
	}
	args = append(args, extra...)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, mosquittoPubBin, args...).CombinedOutput()
	return string(out), err
}

// ---- small numeric helpers ----

func allFinite(v []float64) bool {
	for _, x := range v {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return false
		}
	}
	return len(v) > 0
}

func bitsEqual(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float64bits(a[i]) != math.Float64bits(b[i]) {
			return false
		}
	}
	return true
}

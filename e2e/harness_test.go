package e2e

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The binaries under test, built once by TestMain.
var (
	repoRoot string
	agentBin string
	aggBin   string
)

const (
	mosquittoBin    = "/usr/sbin/mosquitto"
	mosquittoPubBin = "mosquitto_pub"
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run()) // every test skips itself
	}
	var err error
	if repoRoot, err = filepath.Abs(".."); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "edgefl-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	start := time.Now()
	cmd := exec.Command("go", "build", "-o", dir+string(os.PathSeparator), "./cmd/edge-agent", "./cmd/broker-agg")
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: building the binaries: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	agentBin, aggBin = filepath.Join(dir, "edge-agent"), filepath.Join(dir, "broker-agg")
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "e2e: built edge-agent and broker-agg in %v\n", time.Since(start).Round(time.Millisecond))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// e2eTest marks an end-to-end test: skipped under -short.
func e2eTest(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end test (skipped with -short)")
	}
}

// needMosquitto fails the test when Mosquitto or mosquitto_pub is missing
// (scripts/test.sh installs both); it only skips under -short.
func needMosquitto(t *testing.T) {
	t.Helper()
	e2eTest(t)
	if _, err := os.Stat(mosquittoBin); err != nil {
		t.Fatalf("this test needs Mosquitto at %s (apt-get install mosquitto; scripts/test.sh does it): %v", mosquittoBin, err)
	}
	if _, err := exec.LookPath(mosquittoPubBin); err != nil {
		t.Fatalf("this test needs %s (apt-get install mosquitto-clients): %v", mosquittoPubBin, err)
	}
}

// ---- ports ----

var (
	portMu sync.Mutex
	ports  = map[int]bool{}
)

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago and
// that no other caller in this process got.
func freePort(t *testing.T) int {
	t.Helper()
	portMu.Lock()
	defer portMu.Unlock()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !ports[p] {
			ports[p] = true
			return p
		}
	}
	t.Fatal("no free port")
	return 0
}

// ---- waiting ----

// pollEvery is the polling interval of every wait.
const pollEvery = 20 * time.Millisecond

// waitFor polls cond until it returns true, and fails the test with what
// and cond's last error after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s (last error: %v)", timeout, what, last)
		}
		time.Sleep(pollEvery)
	}
}

// ---- processes ----

// logLine is one line a process wrote to stderr or stdout; kv holds it
// parsed when it is a JSON log record (slog's JSON handler).
type logLine struct {
	raw string
	at  time.Time
	kv  map[string]any
}

func (l logLine) msg() string { return l.str("msg") }

func (l logLine) str(k string) string {
	if v, ok := l.kv[k]; ok {
		switch v := v.(type) {
		case string:
			return v
		default:
			return fmt.Sprint(v)
		}
	}
	return ""
}

func (l logLine) num(k string) float64 {
	if v, ok := l.kv[k].(float64); ok {
		return v
	}
	return -1
}

// proc is one run of a binary, its output captured line by line (and
// copied to a file under the test's directory).
type proc struct {
	t       *testing.T
	name    string
	cmd     *exec.Cmd
	started time.Time
	logPath string

	mu      sync.Mutex
	lines   []logLine
	changed chan struct{}
	exited  chan struct{}
	exitErr error
}

// startProc starts bin with args; its output goes to dir/name.log. The
// process is killed when the test ends, if still running.
func startProc(t *testing.T, dir, name string, stdin io.Reader, bin string, args ...string) *proc {
	t.Helper()
	return startProcIn(t, dir, name, "", stdin, bin, args...)
}

// startProcIn is startProc with the process's working directory cwd (""
// the test's own): for configuration files whose paths are relative.
func startProcIn(t *testing.T, dir, name, cwd string, stdin io.Reader, bin string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	for i := 2; ; i++ { // a restart gets its own file
		if _, err := os.Stat(logPath); errors.Is(err, os.ErrNotExist) {
			break
		}
		logPath = filepath.Join(dir, fmt.Sprintf("%s.%d.log", name, i))
	}
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, name: name, logPath: logPath, changed: make(chan struct{}), exited: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Dir = cwd
	p.cmd.Stdin = stdin
	outR, outW := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = outW, outW
	if err := p.cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p.started = time.Now()
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer f.Close()
		sc := bufio.NewScanner(outR)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			raw := sc.Text()
			fmt.Fprintln(f, raw)
			l := logLine{raw: raw, at: time.Now()}
			if strings.HasPrefix(raw, "{") {
				var kv map[string]any
				if json.Unmarshal([]byte(raw), &kv) == nil {
					l.kv = kv
				}
			}
			p.mu.Lock()
			p.lines = append(p.lines, l)
			close(p.changed)
			p.changed = make(chan struct{})
			p.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, outR) // drain what follows a read error so the process never blocks on its output
	}()
	go func() {
		err := p.cmd.Wait()
		outW.Close()
		<-readDone
		p.mu.Lock()
		p.exitErr = err
		p.mu.Unlock()
		close(p.exited)
	}()
	t.Cleanup(func() {
		if p.alive() {
			p.cmd.Process.Kill()
		}
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
		}
		if t.Failed() {
			t.Logf("---- %s (%s), last lines:\n%s", p.name, p.logPath, p.tail(40))
		}
	})
	return p
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// signal sends sig (SIGSTOP, SIGCONT...) to the process.
func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("%s: signal %v: %v", p.name, sig, err)
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() {
	p.t.Helper()
	if !p.alive() {
		p.t.Fatalf("%s exited before it could be killed:\n%s", p.name, p.tail(20))
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.waitExit(10 * time.Second)
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proc) stop() error {
	p.t.Helper()
	if !p.alive() {
		return p.exitError()
	}
	// A process that has not logged yet may still be starting: the
	// binaries install their SIGTERM handler first thing in main
	// (internal/cli.Main), and a SIGTERM before that kills the process
	// by the default action ("signal: terminated"), which with rounds
	// drawn back to back a site restarted just before the run's end met.
	// Its first line is logged after the handler is installed.
	select {
	case <-p.exited:
		return p.exitError()
	case <-p.firstLine(10 * time.Second):
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.waitExit(20 * time.Second)
	return p.exitError()
}

// firstLine is closed once the process has written a line, or after
// timeout.
func (p *proc) firstLine(timeout time.Duration) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		deadline := time.After(timeout)
		for {
			lines, changed := p.snapshot()
			if len(lines) > 0 {
				return
			}
			select {
			case <-changed:
			case <-p.exited:
				return
			case <-deadline:
				return
			}
		}
	}()
	return done
}

func (p *proc) waitExit(timeout time.Duration) {
	p.t.Helper()
	select {
	case <-p.exited:
	case <-time.After(timeout):
		p.t.Fatalf("%s did not exit within %v", p.name, timeout)
	}
}

func (p *proc) exitError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitErr
}

// snapshot returns the lines so far and a channel closed at the next one.
func (p *proc) snapshot() ([]logLine, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lines, p.changed
}

func (p *proc) all() []logLine { l, _ := p.snapshot(); return l }

// find returns the first line matching pred.
func (p *proc) find(pred func(logLine) bool) (logLine, bool) {
	for _, l := range p.all() {
		if pred(l) {
			return l, true
		}
	}
	return logLine{}, false
}

func (p *proc) count(pred func(logLine) bool) int {
	n := 0
	for _, l := range p.all() {
		if pred(l) {
			n++
		}
	}
	return n
}

// waitLine waits for a line matching pred (one already written counts) and
// fails if the process exits or the timeout passes first.
func (p *proc) waitLine(timeout time.Duration, what string, pred func(logLine) bool) logLine {
	p.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	seen := 0
	for {
		lines, ch := p.snapshot()
		for _, l := range lines[seen:] {
			if pred(l) {
				return l
			}
		}
		seen = len(lines)
		select {
		case <-ch:
		case <-p.exited:
			lines, _ := p.snapshot()
			for _, l := range lines[seen:] {
				if pred(l) {
					return l
				}
			}
			p.t.Fatalf("%s exited (%v) while waiting for %s:\n%s", p.name, p.exitError(), what, p.tail(30))
		case <-deadline.C:
			p.t.Fatalf("%s: timed out after %v waiting for %s:\n%s", p.name, timeout, what, p.tail(30))
		}
	}
}

func (p *proc) tail(n int) string {
	lines := p.all()
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("  " + l.raw + "\n")
	}
	return b.String()
}

// panicked reports a Go panic or a fatal runtime error in the output.
func (p *proc) panicked() (string, bool) {
	l, ok := p.find(func(l logLine) bool {
		return l.kv == nil && (strings.HasPrefix(l.raw, "panic:") || strings.HasPrefix(l.raw, "fatal error:"))
	})
	return l.raw, ok
}

// msgIs matches a JSON log record by message and optional key/value pairs
// (values compared as printed).
func msgIs(msg string, kv ...any) func(logLine) bool {
	return func(l logLine) bool {
		if l.kv == nil || l.msg() != msg {
			return false
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if l.str(kv[i].(string)) != fmt.Sprint(kv[i+1]) {
				return false
			}
		}
		return true
	}
}

// ---- configuration files ----

// kv is an ordered configuration: key = value lines.
type kv [][2]string

func (c kv) set(k string, v any) kv {
	s := fmt.Sprint(v)
	for i := range c {
		if c[i][0] == k {
			c[i][1] = s
			return c
		}
	}
	return append(c, [2]string{k, s})
}

func (c kv) with(more kv) kv {
	out := append(kv(nil), c...)
	for _, p := range more {
		out = out.set(p[0], p[1])
	}
	return out
}

// drop returns c without the given keys.
func (c kv) drop(keys ...string) kv {
	var out kv
	for _, p := range c {
		if !slices.Contains(keys, p[0]) {
			out = append(out, p)
		}
	}
	return out
}

func writeConf(t *testing.T, path string, c kv) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "# generated by %s\n", t.Name())
	for _, p := range c {
		fmt.Fprintf(&b, "%s = %s\n", p[0], p[1])
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// setPasswords writes a Mosquitto-format password file with
// `broker-agg pki passwd --password-stdin` (a low iteration count keeps
// Mosquitto's per-connection PBKDF2 cheap) and returns the passwords.
func setPasswords(t *testing.T, dir, file string, users ...string) map[string]string {
	t.Helper()
	pw := map[string]string{}
	for _, u := range users {
		pw[u] = "pw-" + u + "-" + fmt.Sprint(time.Now().UnixNano()%1e6)
		cmd := exec.Command(aggBin, "pki", "passwd", "--file", file, "--user", u, "--password-stdin", "--iterations", "1000")
		cmd.Stdin = strings.NewReader(pw[u] + "\n")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("broker-agg pki passwd --user %s: %v\n%s", u, err, out)
		}
		pf := filepath.Join(dir, u+".password")
		if err := os.WriteFile(pf, []byte(pw[u]+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return pw
}

// passwordFile is where setPasswords left user's password.
func passwordFile(dir, user string) string { return filepath.Join(dir, user+".password") }

func mkdir(dir string) error { return os.MkdirAll(dir, 0o755) }

// ---- the end of a test ----

// stopFederation is the end of a federation test: every site stopped
// cleanly (SIGTERM, an unclean exit an error), then the aggregator, then
// every run of each of them checked for a Go panic or a fatal runtime error
// in its output (noPanics).
func stopFederation(t *testing.T, agg *aggregator, edges ...*edge) {
	t.Helper()
	for _, e := range edges {
		if err := e.p.stop(); err != nil {
			t.Errorf("%s: %v", e.id, err)
		}
	}
	if err := agg.p.stop(); err != nil {
		t.Errorf("aggregator: %v", err)
	}
	noPanics(agg, edges...)
}

// noPanics fails the test for every run of the aggregator and the sites
// that panicked.
func noPanics(agg *aggregator, edges ...*edge) {
	agg.t.Helper()
	agg.noPanics()
	for _, e := range edges {
		e.noPanics()
	}
}

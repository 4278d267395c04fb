package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/node/aggregator"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/broker"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/testkit"
)

// runCLI runs broker-agg in-process and returns its exit code and output.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// baseRunConf is a valid `run` configuration: an embedded broker on a free
// loopback port, metrics off.
func baseRunConf(dir string) string {
	return fmt.Sprintf("federation = f\nfeatures = 4\nclasses = 2\nstate_file = %s\nmetrics_addr =\nlisten = 127.0.0.1:0\nallow_anonymous = true\n",
		filepath.Join(dir, "state.db"))
}

// TestRunFlagAndConfigErrors: every bad flag, configuration line or
// combination stops `broker-agg run` before it serves, with an error line
// naming the flag, key or file (exit 1), or the flag package's usage error
// (exit 2); none of them leaves the state file locked.
func TestRunFlagAndConfigErrors(t *testing.T) {
	dir := t.TempDir()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyAddr := busy.Addr().String()
	base := baseRunConf(dir)
	tests := []struct {
		name string
		conf string   // config file contents ("" = none)
		args []string // after "run" (and --config FILE when conf is set)
		code int
		want string // in the last stderr line
	}{
		{"unknown key", base + "frobnicate = 1\n", nil, 1, `config:8: unknown key "frobnicate"`},
		{"repeated key", base + "features = 5\n", nil, 1, "features repeats line 2"},
		{"line without =", base + "per_round 3\n", nil, 1, "config:8: want key = value"},
		{"bad value", base + "per_round = many\n", nil, 1, "config:8: per-round"},
		{"config inside the config", base + "config = other.conf\n", nil, 1, `unknown key "config"`},
		{"missing config file", "", []string{"--config", filepath.Join(dir, "nope.conf")}, 1, "--config"},
		{"unknown flag", base, []string{"--frobnicate"}, 2, "flag provided but not defined: -frobnicate"},
		{"stray argument", base, []string{"extra"}, 1, `unexpected argument "extra"`},
		{"bad log level", base + "log_level = loud\n", nil, 1, "--log-level"},
		{"bad log format", base + "log_format = xml\n", nil, 1, "--log-format"},
		{"no model inputs", strings.Replace(base, "features = 4\n", "", 1), nil, 1, "--inputs"},
		{"one class", strings.Replace(base, "classes = 2\n", "classes = 1\n", 1), nil, 1, "--classes"},
		{"zero message size", base + "max_message_bytes = 0\n", nil, 1, "--max-message-bytes"},
		{"bad eval data", base + "eval_data = mnist\n", nil, 1, "--eval-data"},
		{"per round 0", base + "per_round = 0\n", nil, 1, "K = 0"},
		{"quorum above 1", base + "quorum_fraction = 1.5\n", nil, 1, "quorum fraction 1.5"},
		{"unknown algorithm", base + "algorithm = fedfoo\n", nil, 1, `"fedfoo"`},
		{"fedsplit without a step", base + "algorithm = fedsplit\nstep = 0\n", nil, 1, "step size"},
		{"scaffold with a robust aggregator", base + "algorithm = scaffold\naggregator = median\n", nil, 1, "robust aggregators do not compose"},
		{"scaffold with lbfgs", base + "algorithm = scaffold\nsolver = lbfgs\n", nil, 1, "scaffold needs the sgd solver"},
		{"negative mu", base + "mu = -1\n", nil, 1, "--mu -1"},
		{"bad codec", base + "codec = zip\n", nil, 1, "codec"},
		{"bad selector", base + "selector = oracle\n", nil, 1, "selector"},
		{"bad init", base + "init = random\n", nil, 1, "init"},
		{"bad federation", strings.Replace(base, "federation = f\n", "federation = a/b\n", 1), nil, 1, "federation"},
		{"certificate without key", base, []string{"--tls-cert", filepath.Join(dir, "x.crt")}, 1, "--tls-cert and --tls-key go together"},
		{"missing certificate files", base, []string{"--tls-cert", filepath.Join(dir, "x.crt"), "--tls-key", filepath.Join(dir, "x.key")}, 1, "x.crt"},
		{"client CA without a server certificate", base, []string{"--tls-client-ca", filepath.Join(dir, "ca.crt")}, 1, "--tls-client-ca needs --tls-cert"},
		{"external broker with embedded settings", base, []string{"--broker", "tcp://127.0.0.1:1"}, 1, "do not apply with --broker"},
		{"embedded broker with external settings", base, []string{"--username", "aggregator"}, 1, "external --broker"},
		{"missing password file", strings.Replace(base, "allow_anonymous = true\n", "", 1), []string{"--password-file", filepath.Join(dir, "passwd")}, 1, "--password-file"},
		{"no way to authenticate", strings.Replace(base, "allow_anonymous = true\n", "allow_anonymous = false\n", 1), nil, 1, "--allow-anonymous"},
		{"bad listen address", base, []string{"--listen", "8883"}, 1, "listen address"},
		{"listen address in use", base, []string{"--listen", busyAddr}, 1, busyAddr},
		{"metrics address in use", base, []string{"--metrics-addr", busyAddr}, 1, "metrics listener"},
		{"console certificate without key", base, []string{"--metrics-addr", "127.0.0.1:0", "--console-tls-cert", filepath.Join(dir, "x.crt")}, 1,
			"--console-tls-cert and --console-tls-key go together"},
		{"console client CA without HTTPS", base, []string{"--metrics-addr", "127.0.0.1:0", "--console-client-ca", filepath.Join(dir, "ca.crt")}, 1,
			"--console-client-ca needs --console-tls-cert"},
		{"console password file missing", base, []string{"--metrics-addr", "127.0.0.1:0", "--console-password-file", filepath.Join(dir, "nope")}, 1,
			"--console-password-file"},
		{"console guard without a console", base, []string{"--console-password-file", filepath.Join(dir, "nope")}, 1, "need --metrics-addr"},
		// The command line wins over the file: --per-round 2 replaces the
		// file's invalid 0, so the run gets as far as the busy port.
		{"flag overrides the file", base + "per_round = 0\n", []string{"--per-round", "2", "--listen", busyAddr}, 1, busyAddr},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"run"}
			if tt.conf != "" {
				conf := filepath.Join(t.TempDir(), "config")
				testkit.WriteFile(t, conf, tt.conf)
				args = append(args, "--config", conf)
			}
			args = append(args, tt.args...)
			code, _, stderr := runCLI(t, args...)
			if code != tt.code {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tt.code, stderr)
			}
			line := lastLine(stderr)
			if tt.code == 2 {
				line = strings.SplitN(strings.TrimSpace(stderr), "\n", 2)[0]
			} else if !strings.HasPrefix(line, "broker-agg run: ") {
				t.Errorf("last stderr line %q is not a broker-agg run error", line)
			}
			if !strings.Contains(line, tt.want) {
				t.Errorf("stderr line %q does not name %q", line, tt.want)
			}
		})
	}
	// No failure wrote the state file: a corrected command is not refused
	// as another run's.
	if _, err := os.Stat(filepath.Join(dir, "state.db")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed start left the state file behind: %v", err)
	}
}

// TestRunFailedStartLeavesNoState: a start that fails on its
// authentication setup (a missing password file) writes no state file, so
// the corrected command, with the federation the operator forgot, starts
// the run instead of being refused as another federation's.
func TestRunFailedStartLeavesNoState(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state.db")
	passwd := filepath.Join(dir, "passwd")
	code, _, stderr := runCLI(t, "run", "--features", "4", "--classes", "2", "--state-file", state, "--metrics-addr", "",
		"--listen", "127.0.0.1:0", "--password-file", passwd)
	if code != 1 || !strings.Contains(lastLine(stderr), "--password-file") || !strings.Contains(lastLine(stderr), passwd) {
		t.Fatalf("missing password file: exit %d, %s", code, lastLine(stderr))
	}
	if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the failed start left %s: %v", state, err)
	}
	if err := os.WriteFile(passwd, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := aggregator.ServerConfig{Federation: "ward7", BrokerURL: "tcp://127.0.0.1:1", K: 1,
		Model: model.Spec{Kind: model.KindLogReg, Inputs: 4, Classes: 2}, StatePath: state, Logger: newDiscardLogger()}
	srv, err := aggregator.NewServer(cfg)
	if err != nil {
		t.Fatalf("the corrected configuration is refused: %v", err)
	}
	srv.Close()
}

// TestRunExampleConfig: deploy/broker-agg.example.conf uses only keys that
// `run` knows, with values it accepts, and with deploy/schema.example.json
// installed where it says (its schema) is a valid server configuration.
func TestRunExampleConfig(t *testing.T) {
	fs, f := serveFlagSet(io.Discard)
	if err := parseFlags(fs, []string{"--config", "../../deploy/broker-agg.example.conf"}, &f.config); err != nil {
		t.Fatal(err)
	}
	if f.federation != "ward-7" || f.k != 10 || f.quorum != 0.6 || f.roundTimeout != 5*time.Minute || f.algo != "fedproxsplit" ||
		f.inputs != 0 || f.classes != 0 || f.schema != "/etc/edgefl/schema.json" || f.maxPacket != 16<<20 || f.tlsClientCA == "" || f.allowAnonymous || f.metricsAddr != "127.0.0.1:9464" {
		t.Fatalf("example parsed as %+v", *f)
	}
	f.schema = "../../deploy/schema.example.json" // installed as /etc/edgefl/schema.json
	if _, err := f.serverConfig(newDiscardLogger()); err != nil {
		t.Fatalf("the example's server configuration: %v", err)
	}
}

func newDiscardLogger() *slog.Logger {
	l, _ := newLogger(io.Discard, "text", "error")
	return l
}

// TestRunStateFileChecks: a second daemon on a held state file gives up
// after the lock timeout; a state file of another federation is refused.
func TestRunStateFileChecks(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state.db")
	stateFile(t, state, "other", nil)
	conf := testkit.WriteFileIn(t, dir, "config", baseRunConf(dir))
	code, _, stderr := runCLI(t, "run", "--config", conf)
	if code != 1 || !strings.Contains(lastLine(stderr), `belongs to federation "other"`) || !strings.Contains(lastLine(stderr), "use another --state-file") {
		t.Errorf("another federation's state file: exit %d, %s", code, lastLine(stderr))
	}

	held, err := aggstore.OpenAgg(state, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	start := time.Now()
	code, _, stderr = runCLI(t, "run", "--config", conf, "--federation", "other")
	if code != 1 || !strings.Contains(lastLine(stderr), "locked") {
		t.Errorf("held state file: exit %d, %s", code, lastLine(stderr))
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("gave up after %v", d)
	}
}

// loggedAddr waits (20 s at most) for `run`, started with its stderr
// in stderr and its exit code to come on done, to log the console's
// address on scheme (the metrics address), and returns it.
func loggedAddr(t *testing.T, stderr *testkit.SyncBuffer, done <-chan int, scheme string) string {
	t.Helper()
	re := regexp.MustCompile(`"msg":"console at ` + scheme + `://([0-9.:]+)/"`)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if m := re.FindStringSubmatch(stderr.String()); m != nil {
			return m[1]
		}
		select {
		case code := <-done:
			t.Fatalf("run exited %d:\n%s", code, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no console address logged:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond) // polling the log under the deadline above
	}
}

// stateFile creates an aggregator state file at path for federation
// (logistic regression, 4 inputs; with a schema when sc is not nil).
func stateFile(t *testing.T, path, federation string, sc *schema.Schema) {
	t.Helper()
	spec := model.Spec{Kind: model.KindLogReg, Inputs: 4, Classes: 2}
	if sc != nil {
		spec = model.Spec{Kind: model.KindLogReg}
	}
	srv, err := aggregator.NewServer(aggregator.ServerConfig{Federation: federation, BrokerURL: "tcp://127.0.0.1:1", K: 1,
		Model: spec, SchemaConfig: aggregator.SchemaConfig{Schema: sc}, StatePath: path})
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
}

// TestRunServesAndStopsCleanly: `run` comes up (embedded broker, metrics on
// a port of its choosing), `status --addr` reads the live daemon, a
// canceled context (SIGINT/SIGTERM in main) stops it with exit 0 and
// releases the state file, which `status --state` then reads.
func TestRunServesAndStopsCleanly(t *testing.T) {
	dir := t.TempDir()
	conf := testkit.WriteFileIn(t, dir, "config", baseRunConf(dir)+"per_round = 2\nlog_format = json\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr testkit.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"run", "--config", conf, "--metrics-addr", "127.0.0.1:0"}, &stdout, &stderr)
	}()

	// The metrics address is in the log.
	addr := loggedAddr(t, &stderr, done, "http")
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz never ok (%v):\n%s", err, stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	code, out, errOut := runCLI(t, "status", "--addr", addr, "--json")
	var st aggregator.Status
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("status --addr: exit %d: %s %s", code, out, errOut)
	}
	if st.Federation != "f" || st.Round != 1 || st.Phase != aggregator.PhaseWaiting || len(st.Clients) != 0 {
		t.Errorf("live status %+v", st)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("run exited %d after cancel:\n%s", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not stop after cancel")
	}
	code, out, errOut = runCLI(t, "status", "--state", filepath.Join(dir, "state.db"))
	if code != 0 || !strings.Contains(out, "federation f (fedprox)  round 1  phase waiting") {
		t.Errorf("status --state after the stop: exit %d:\n%s%s", code, out, errOut)
	}
}

// TestStatusOfADemoStateFile: `status` reads a finished federation from
// its state file (kept by `demo --dir`), as text and as JSON.
func TestStatusOfADemoStateFile(t *testing.T) {
	dir := t.TempDir()
	code, out, errOut := runCLI(t, "demo", "--clients", "3", "--rounds", "2", "--max-epochs", "2", "--dir", dir)
	if code != 0 {
		t.Fatalf("demo: exit %d\n%s%s", code, out, errOut)
	}
	state := filepath.Join(dir, "aggregator.db")
	code, out, errOut = runCLI(t, "status", "--state", state)
	if code != 0 {
		t.Fatalf("status: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"federation demo (fedproxsplit)  round 2  phase finished", "received 3: site-01 site-02 site-03",
		"rounds closed 2  accepted 6", "CLIENT", "site-01", "site-03"} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = runCLI(t, "status", "--state", state, "--json")
	var st aggregator.Status
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("status --json: exit %d: %s", code, out)
	}
	if st.Federation != "demo" || st.Phase != aggregator.PhaseFinished || st.Round != 2 || st.Counters.RoundsClosed != 2 || len(st.Clients) != 3 {
		t.Fatalf("status %+v", st)
	}
	for _, c := range st.Clients {
		if c.Participation != 2 || c.LastRound != 2 || c.Samples == 0 {
			t.Errorf("client %+v: want 2 updates, last round 2", c)
		}
	}
}

func TestStatusErrors(t *testing.T) {
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := l.Addr().String()
	l.Close()
	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--state", filepath.Join(dir, "nope.db")}, 1, "--state"},
		{[]string{"--addr", free}, 1, free},
		{[]string{"extra"}, 1, `unexpected argument "extra"`},
		{[]string{"--jsn"}, 2, ""},
	} {
		code, _, stderr := runCLI(t, append([]string{"status"}, tt.args...)...)
		if code != tt.code || !strings.Contains(lastLine(stderr), tt.want) {
			t.Errorf("status %v: exit %d (want %d), %q (want %q)", tt.args, code, tt.code, lastLine(stderr), tt.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "nope.db")); err == nil {
		t.Error("status created the missing state file")
	}
}

// TestPKIFilesAndModes: `pki` writes a CA, a server certificate for the
// hosts and one client certificate per site (CN = id) and the aggregator,
// keys 0600 and certificates 0644, all verifying against the CA with the
// right usages; a second run writes nothing, a new site only its own pair,
// --force re-issues the leaves and never the CA.
func TestPKIFilesAndModes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	code, out, errOut := runCLI(t, "pki", "--dir", dir, "--clients", "site-a,site-b", "--hosts", "localhost,127.0.0.1")
	if code != 0 {
		t.Fatalf("pki: exit %d: %s", code, errOut)
	}
	want := []string{"ca.crt", "ca.key", "server.crt", "server.key", "clients/site-a.crt", "clients/site-a.key",
		"clients/site-b.crt", "clients/site-b.key", "clients/aggregator.crt", "clients/aggregator.key"}
	for _, f := range want {
		p := filepath.Join(dir, f)
		if !strings.Contains(out, "wrote "+p) {
			t.Errorf("pki did not report writing %s:\n%s", p, out)
		}
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		wantMode := os.FileMode(0o644)
		if strings.HasSuffix(f, ".key") {
			wantMode = 0o600
		}
		if st.Mode().Perm() != wantMode {
			t.Errorf("%s: mode %v, want %v", f, st.Mode().Perm(), wantMode)
		}
	}
	ca := readCert(t, filepath.Join(dir, "ca.crt"))
	if !ca.IsCA {
		t.Error("ca.crt is not a CA")
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	srv := readCert(t, filepath.Join(dir, "server.crt"))
	if _, err := srv.Verify(x509.VerifyOptions{Roots: roots, DNSName: "localhost", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("server certificate for localhost: %v", err)
	}
	if !slices.ContainsFunc(srv.IPAddresses, func(ip net.IP) bool { return ip.Equal(net.IPv4(127, 0, 0, 1)) }) {
		t.Errorf("server certificate IPs %v lack 127.0.0.1", srv.IPAddresses)
	}
	for _, id := range []string{"site-a", "site-b", "aggregator"} {
		c := readCert(t, filepath.Join(dir, "clients", id+".crt"))
		if c.Subject.CommonName != id {
			t.Errorf("%s.crt: CN %q", id, c.Subject.CommonName)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("%s.crt as a client certificate: %v", id, err)
		}
	}
	caPEM, _ := os.ReadFile(filepath.Join(dir, "ca.crt"))
	siteA, _ := os.ReadFile(filepath.Join(dir, "clients", "site-a.crt"))

	code, out, _ = runCLI(t, "pki", "--dir", dir, "--clients", "site-a,site-b", "--hosts", "localhost,127.0.0.1")
	if code != 0 || !strings.Contains(out, "nothing to do") {
		t.Errorf("second run: exit %d: %s", code, out)
	}
	code, out, _ = runCLI(t, "pki", "--dir", dir, "--clients", "site-a,site-c", "--hosts", "localhost,127.0.0.1")
	if code != 0 || strings.Count(out, "wrote ") != 2 || !strings.Contains(out, "site-c.crt") {
		t.Errorf("adding site-c: exit %d: %s", code, out)
	}
	code, out, _ = runCLI(t, "pki", "--dir", dir, "--clients", "site-a", "--force")
	if code != 0 || strings.Contains(out, "ca.crt") || !strings.Contains(out, "server.crt") {
		t.Errorf("--force: exit %d: %s", code, out)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "ca.crt")); !bytes.Equal(b, caPEM) {
		t.Error("--force re-issued the CA")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "clients", "site-a.crt")); bytes.Equal(b, siteA) {
		t.Error("--force did not re-issue site-a's certificate")
	}
	for _, bad := range [][]string{{"--days", "0"}, {"--clients", "bad id"}} {
		if code, _, stderr := runCLI(t, append([]string{"pki", "--dir", t.TempDir()}, bad...)...); code != 1 {
			t.Errorf("pki %v: exit %d (%s)", bad, code, lastLine(stderr))
		}
	}
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

// TestPKIPasswd: `pki passwd` writes Mosquitto-format entries (0600), prints
// a generated password once or takes one from standard input, replaces an
// existing user's entry and keeps the others.
func TestPKIPasswd(t *testing.T) {
	file := filepath.Join(t.TempDir(), "passwd")
	code, out, errOut := runCLI(t, "pki", "passwd", "--file", file, "--user", "site-a", "--iterations", "1000")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	pwA := strings.TrimSpace(out)
	if len(pwA) < 16 || strings.Contains(pwA, "\n") || !strings.Contains(errOut, "password of site-a set in") {
		t.Fatalf("printed %q / %q", out, errOut)
	}
	if st, _ := os.Stat(file); st.Mode().Perm() != 0o600 {
		t.Errorf("password file mode %v", st.Mode().Perm())
	}
	withStdin(t, "from-stdin\n", func() {
		code, out, errOut = runCLI(t, "pki", "passwd", "--file", file, "--user", "site-b", "--password-stdin", "--iterations", "1000")
	})
	if code != 0 || out != "" {
		t.Fatalf("--password-stdin: exit %d, stdout %q, %s", code, out, errOut)
	}
	entries := readPasswd(t, file)
	if len(entries) != 2 || !verify(t, entries["site-a"], pwA) || !verify(t, entries["site-b"], "from-stdin") {
		t.Fatalf("entries %v", entries)
	}
	if !strings.HasPrefix(entries["site-a"], "$7$1000$") {
		t.Errorf("site-a's hash %q is not Mosquitto's $7$ with 1000 iterations", entries["site-a"])
	}
	// Replacing site-a: the old password stops working, site-b is kept.
	code, out, _ = runCLI(t, "pki", "passwd", "--file", file, "--user", "site-a", "--iterations", "1000")
	pwA2 := strings.TrimSpace(out)
	entries = readPasswd(t, file)
	if code != 0 || len(entries) != 2 || verify(t, entries["site-a"], pwA) || !verify(t, entries["site-a"], pwA2) || !verify(t, entries["site-b"], "from-stdin") {
		t.Fatalf("after replacing site-a: %v", entries)
	}
	users, err := broker.ReadPasswordFile(file)
	if err != nil || len(users) != 2 {
		t.Errorf("the embedded broker reads %d users: %v", len(users), err)
	}
	for _, tt := range []struct {
		args  []string
		stdin string
		want  string
	}{
		{[]string{"--user", "x"}, "", "--file and --user are required"},
		{[]string{"--file", file}, "", "--file and --user are required"},
		{[]string{"--file", file, "--user", "bad id"}, "", "--user"},
		{[]string{"--file", file, "--user", "x", "--password-stdin"}, "\n", "empty password"},
	} {
		var stderr string
		withStdin(t, tt.stdin, func() { code, _, stderr = runCLI(t, append([]string{"pki", "passwd"}, tt.args...)...) })
		if code != 1 || !strings.Contains(lastLine(stderr), tt.want) {
			t.Errorf("pki passwd %v: exit %d, %q (want %q)", tt.args, code, lastLine(stderr), tt.want)
		}
	}
	if len(readPasswd(t, file)) != 2 {
		t.Error("a failed pki passwd changed the file")
	}
}

// TestPKIPasswdKeepsOwnerAndMode: adding a site to a password file that
// Mosquitto reads as its own user (owner mosquitto, mode 0640 or 0600)
// keeps the file's owner, group and mode, also through a symbolic link
// (the link stays a link); a new file is created 0600. Rewritten owned by
// root and readable by root only, Mosquitto's next reload refused every
// client.
func TestPKIPasswdKeepsOwnerAndMode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test chowns a file to another user: run it as root (scripts/test.sh does)")
	}
	for _, c := range []struct {
		name     string
		uid, gid int
		mode     os.FileMode
		link     bool
	}{
		{"mosquitto's 0600", 103, 110, 0o600, false},
		{"group-readable 0640", 65534, 65534, 0o640, false},
		{"through a symlink", 4242, 4343, 0o600, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "edgefl.passwd")
			if code, _, errOut := runCLI(t, "pki", "passwd", "--file", file, "--user", "site-a", "--iterations", "1000"); code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if err := os.Chown(file, c.uid, c.gid); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(file, c.mode); err != nil {
				t.Fatal(err)
			}
			arg := file
			if c.link {
				arg = filepath.Join(dir, "passwd-link")
				if err := os.Symlink(file, arg); err != nil {
					t.Fatal(err)
				}
			}
			if code, _, errOut := runCLI(t, "pki", "passwd", "--file", arg, "--user", "site-m", "--iterations", "1000"); code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			fi, err := os.Stat(file)
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if int(st.Uid) != c.uid || int(st.Gid) != c.gid || fi.Mode().Perm() != c.mode {
				t.Errorf("after pki passwd: uid %d gid %d mode %v, want %d %d %v", st.Uid, st.Gid, fi.Mode().Perm(), c.uid, c.gid, c.mode)
			}
			if entries := readPasswd(t, file); len(entries) != 2 {
				t.Errorf("entries %v, want site-a and site-m", entries)
			}
			if c.link {
				if li, err := os.Lstat(arg); err != nil || li.Mode()&os.ModeSymlink == 0 {
					t.Errorf("the symbolic link was replaced by a file: %v %v", li.Mode(), err)
				}
			}
			if left, _ := filepath.Glob(filepath.Join(dir, "*.tmp*")); len(left) > 0 {
				t.Errorf("temporary files left: %v", left)
			}
		})
	}
}

// withStdin runs fn with os.Stdin reading s.
func withStdin(t *testing.T, s string, fn func()) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.WriteString(w, s); w.Close() }() // fn reads it, or fails on its absence
	old := os.Stdin
	os.Stdin = r
	defer func() { os.Stdin = old; r.Close() }()
	fn()
}

func readPasswd(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		u, h, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			t.Fatalf("line %q", sc.Text())
		}
		out[u] = h
	}
	return out
}

func verify(t *testing.T, hash, pw string) bool {
	t.Helper()
	ok, err := broker.VerifyPassword(hash, pw)
	if err != nil {
		t.Fatalf("hash %q: %v", hash, err)
	}
	return ok
}

// TestDemoPrintsAccuracyNextToTheOptimum: `demo` with tiny settings runs
// its rounds over MQTT and prints each round's test accuracy, the final
// model's, and the centralised optimum's on the same test data.
func TestDemoPrintsAccuracyNextToTheOptimum(t *testing.T) {
	code, out, errOut := runCLI(t, "demo", "--clients", "3", "--rounds", "3", "--max-epochs", "2", "--seed", "2")
	if code != 0 {
		t.Fatalf("demo: exit %d\n%s%s", code, out, errOut)
	}
	// The first line says how long the demo takes (1 s + 9 site-rounds x 20 ms).
	if first, _, _ := strings.Cut(out, "\n"); !strings.HasSuffix(first, "; about 1 s on a 2-core machine") {
		t.Errorf("the first line does not say how long the demo takes: %q", first)
	}
	row := regexp.MustCompile(`(?m)^\s+(\d+)\s+3/3\s+0\s+(\S+)\s+([0-9.]+)%`)
	rows := row.FindAllStringSubmatch(out, -1)
	if len(rows) != 3 {
		t.Fatalf("%d round lines, want 3:\n%s", len(rows), out)
	}
	for i, r := range rows {
		if r[1] != strconv.Itoa(i+1) {
			t.Errorf("round line %d is round %s", i+1, r[1])
		}
	}
	final := regexp.MustCompile(`done: 3 rounds in \S+; final model: test loss (\S+), accuracy ([0-9.]+)% \(majority-class baseline [0-9.]+%(, not beaten)?\)`).FindStringSubmatch(out)
	opt := regexp.MustCompile(`centralised optimum on the pooled training data[^:]*: test loss (\S+), accuracy ([0-9.]+)%`).FindStringSubmatch(out)
	if final == nil || opt == nil {
		t.Fatalf("no final or optimum line:\n%s", out)
	}
	for _, s := range []string{final[2], opt[2]} {
		if a, err := strconv.ParseFloat(s, 64); err != nil || a < 0 || a > 100 {
			t.Errorf("accuracy %q", s)
		}
	}
	if final[2] != rows[2][3] {
		t.Errorf("final accuracy %s%% differs from round 3's %s%%", final[2], rows[2][3])
	}
	t.Logf("demo: final accuracy %s%% (test loss %s), centralised optimum %s%% (test loss %s)", final[2], final[1], opt[2], opt[1])
}

// TestRunExampleConfigComplete: the example documents every option of
// `run` (set or commented out) and every commented-out value is one `run`
// accepts; `run --help` lists them.
func TestRunExampleConfigComplete(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/broker-agg.example.conf")
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for n, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		commented := strings.HasPrefix(line, "#")
		body := strings.TrimSpace(strings.TrimPrefix(line, "#"))
		key, val, ok := strings.Cut(body, "=")
		key = strings.TrimSpace(key)
		if !ok || strings.ContainsAny(key, " \t") || key == "" {
			continue // prose
		}
		name := canonical(strings.ReplaceAll(key, "_", "-"))
		fs, _ := serveFlagSet(io.Discard)
		if fs.Lookup(name) == nil {
			if commented {
				continue // prose that happens to hold an "="
			}
			t.Errorf("line %d: unknown key %q", n+1, key)
			continue
		}
		keys[name] = true
		if err := fs.Set(name, strings.TrimSpace(val)); err != nil {
			t.Errorf("line %d: %s = %s: %v", n+1, key, strings.TrimSpace(val), err)
		}
	}
	fs, _ := serveFlagSet(io.Discard)
	var help strings.Builder
	fs.SetOutput(&help)
	fs.Usage()
	fs.VisitAll(func(fl *flag.Flag) {
		if canonical(fl.Name) != fl.Name || fl.Name == "config" || fl.Name == "rollback" {
			return // an alias, or command-line only
		}
		if !keys[fl.Name] {
			t.Errorf("deploy/broker-agg.example.conf does not document %s", strings.ReplaceAll(fl.Name, "-", "_"))
		}
		if !strings.Contains(help.String(), "-"+fl.Name) {
			t.Errorf("run --help does not list --%s", fl.Name)
		}
	})
}

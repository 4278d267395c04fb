package main

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgefl/edgefl/node/broker"
	"github.com/edgefl/edgefl/proto/pki"
	"github.com/edgefl/edgefl/testkit"
)

// TestConsoleGuards: `run` with the console behind HTTPS, client
// certificates of the federation's CA (operator only) and a password file;
// `status --addr https://...` with the operator's certificate and password
// reads it, a site's certificate, a wrong password or no certificate do not.
func TestConsoleGuards(t *testing.T) {
	dir := t.TempDir()
	pdir := filepath.Join(dir, "pki")
	if _, err := pki.MakeSite(pki.SiteOptions{Dir: pdir, Hosts: []string{"127.0.0.1"}, Clients: []string{"operator", "site-a"}}); err != nil {
		t.Fatal(err)
	}
	pw := filepath.Join(dir, "console.passwd")
	if err := broker.SetPassword(pw, "operator", "right horse battery", 1000); err != nil {
		t.Fatal(err)
	}
	conf := testkit.WriteFileIn(t, dir, "config", baseRunConf(dir)+"log_format = json\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr testkit.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"run", "--config", conf, "--metrics-addr", "127.0.0.1:0",
			"--console-tls-cert", filepath.Join(pdir, "server.crt"), "--console-tls-key", filepath.Join(pdir, "server.key"),
			"--console-client-ca", filepath.Join(pdir, "ca.crt"), "--console-password-file", pw}, &stdout, &stderr)
	}()
	addr := loggedAddr(t, &stderr, done, "https")
	client := func(id string) *http.Client {
		pool, err := pki.LoadCertPool(filepath.Join(pdir, "ca.crt"))
		if err != nil {
			t.Fatal(err)
		}
		tc := &tls.Config{RootCAs: pool}
		if id != "" {
			pair, err := tls.LoadX509KeyPair(filepath.Join(pdir, "clients", id+".crt"), filepath.Join(pdir, "clients", id+".key"))
			if err != nil {
				t.Fatal(err)
			}
			tc.Certificates = []tls.Certificate{pair}
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 10 * time.Second}
	}
	get := func(c *http.Client, path, user, pass string) (int, error) {
		req, _ := http.NewRequest("GET", "https://"+addr+path, nil)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, err
	}
	op, site := client("operator"), client("site-a")
	// The console's address is logged before the daemon has connected to
	// the broker and restored its round log; /healthz answers 503 until
	// then (server_status.go). Wait for ready, as a health probe would.
	waitHealthy(t, func() (int, error) { return get(op, "/healthz", "", "") }, done, &stderr)
	for _, tt := range []struct {
		name       string
		c          *http.Client
		path, user string
		pass       string
		want       int
	}{
		{"operator with its password", op, "/", "operator", "right horse battery", 200},
		{"operator's status", op, "/status", "operator", "right horse battery", 200},
		{"operator, wrong password", op, "/status", "operator", "wrong", 401},
		{"operator without a password", op, "/metrics", "", "", 401},
		{"healthz needs the certificate only", op, "/healthz", "", "", 200},
		{"a site's certificate", site, "/status", "operator", "right horse battery", 403},
	} {
		if code, err := get(tt.c, tt.path, tt.user, tt.pass); err != nil || code != tt.want {
			t.Errorf("%s: %d %v, want %d", tt.name, code, err, tt.want)
		}
	}
	if _, err := get(client(""), "/healthz", "", ""); err == nil {
		t.Error("no client certificate: the TLS handshake succeeded")
	}
	if resp, err := http.Get("http://" + addr + "/status"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Error("plain HTTP was answered with the status")
		}
	}

	// status --addr, as the operator.
	t.Setenv(consolePasswordEnv, "right horse battery")
	cli := []string{"status", "--addr", "https://" + addr, "--ca", filepath.Join(pdir, "ca.crt"),
		"--cert", filepath.Join(pdir, "clients", "operator.crt"), "--key", filepath.Join(pdir, "clients", "operator.key"), "--user", "operator"}
	code, out, errOut := runCLI(t, cli...)
	if code != 0 || !strings.Contains(out, "federation f (fedprox)  round 1") {
		t.Fatalf("status --addr https: exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, "quorum ") || !strings.Contains(out, "run ") {
		t.Errorf("status --addr lacks the run's line:\n%s", out)
	}
	t.Setenv(consolePasswordEnv, "wrong")
	if code, out, errOut := runCLI(t, cli...); code == 0 || !strings.Contains(out+errOut, "401") {
		t.Errorf("status with a wrong password: exit %d\n%s%s", code, out, errOut)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("run exited %d:\n%s", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not stop")
	}
	if s := stderr.String(); strings.Contains(s, "without authentication") {
		t.Errorf("a guarded console was warned about:\n%s", s)
	}
}

// `demo --metrics-addr` prints its console's URL.
func TestDemoPrintsConsole(t *testing.T) {
	code, out, errOut := runCLI(t, "demo", "--clients", "2", "--rounds", "1", "--max-epochs", "1", "--metrics-addr", "127.0.0.1:0")
	if code != 0 || !regexp.MustCompile(`(?m)^console: http://127\.0\.0\.1:[0-9]+/$`).MatchString(out) {
		t.Fatalf("demo: exit %d\n%s%s", code, out, errOut)
	}
}

// consoleFetcher is the demo's stdout: when the demo prints its console's
// URL, it fetches the page there before the demo goes on (the demo prints
// the URL from its serving callback, before round 1, so the page is still
// served).
type consoleFetcher struct {
	testkit.SyncBuffer
	mu        sync.Mutex
	url, page string
	status    int
	err       error
}

var consoleLine = regexp.MustCompile(`(?m)^console: (http://127\.0\.0\.1:[0-9]+/)$`)

func (c *consoleFetcher) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := consoleLine.FindSubmatch(p); m != nil && c.url == "" {
		c.url = string(m[1])
		resp, err := http.Get(c.url)
		if err != nil {
			c.err = err
		} else {
			b, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			c.status, c.page, c.err = resp.StatusCode, string(b), err
		}
	}
	return c.SyncBuffer.Write(p)
}

// TestDemoServesConsoleByDefault: a plain `broker-agg demo` serves its
// console on a free loopback port and prints a URL that answers with the
// console page; --metrics-addr ” turns it off.
func TestDemoServesConsoleByDefault(t *testing.T) {
	args := []string{"demo", "--clients", "2", "--rounds", "1", "--max-epochs", "1"}
	var out consoleFetcher
	var errOut testkit.SyncBuffer
	if code := run(context.Background(), args, &out, &errOut); code != 0 {
		t.Fatalf("demo: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	if out.url == "" {
		t.Fatalf("demo printed no console URL:\n%s", out.String())
	}
	if out.err != nil || out.status != http.StatusOK || !strings.Contains(out.page, "edgefl console</title>") {
		t.Fatalf("GET %s: %d, %v; not the console page:\n%.300s", out.url, out.status, out.err, out.page)
	}

	code, plain, errOut2 := runCLI(t, append(args, "--metrics-addr", "")...)
	if code != 0 || strings.Contains(plain, "console:") {
		t.Fatalf("demo --metrics-addr '': exit %d, want no console line:\n%s%s", code, plain, errOut2)
	}
}

// waitHealthy polls /healthz (through get) until it answers 200, failing
// the test when run exits first or after 20 s.
func waitHealthy(t *testing.T, get func() (int, error), done <-chan int, stderr *testkit.SyncBuffer) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, err := get()
		if err == nil && code == http.StatusOK {
			return
		}
		select {
		case c := <-done:
			t.Fatalf("run exited %d:\n%s", c, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz never answered 200 (last %d, %v):\n%s", code, err, stderr.String())
		}
		time.Sleep(10 * time.Millisecond) // polling readiness under the deadline above
	}
}

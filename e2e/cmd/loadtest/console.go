package main

// The console's reader for `loadtest run --console poll|chromium`: someone
// with broker-agg's console (/ on its metrics address) open for the whole
// run, for the figure of scripts/bench-console.sh.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// consoleCounts counts the requests the console made, by path, and the
// bytes of their answers.
type consoleCounts struct {
	mu     sync.Mutex
	byPath map[string]int
	bytes  int64
	errors int
}

func (c *consoleCounts) add(path string, n int64, err bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byPath == nil {
		c.byPath = map[string]int{}
	}
	c.byPath[path]++
	c.bytes += n
	if err {
		c.errors++
	}
}

// summary is "path:count,..." (sorted), the total, the bytes and errors.
func (c *consoleCounts) summary() (paths string, total int, bytes int64, errs int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ps []string
	for p, n := range c.byPath {
		ps = append(ps, fmt.Sprintf("%s:%d", p, n))
		total += n
	}
	sort.Strings(ps)
	if len(ps) == 0 {
		ps = []string{"-"}
	}
	return strings.Join(ps, ","), total, c.bytes, c.errors
}

var initialRE = regexp.MustCompile(`(?s)<script type="application/json" id="initial">(.*?)</script>`)

// consoleStatus is what console.js reads of /status to build its next
// request: the run id and the rounds of the history and the evaluations.
type consoleStatus struct {
	RunID string `json:"run_id"`
	Live  *struct {
		History     []struct{ Round int } `json:"history"`
		Evaluations []struct{ Round int } `json:"evaluations"`
	} `json:"live"`
}

// pollConsole does what node/aggregator/console/console.js does in a shown tab
// until ctx ends: GET / (the initial status is in the page), its
// stylesheet and script, then GET /status?compact=1&rounds_after=R&
// evals_after=E POLL after each answer (0 after a new run id), R and E the
// last round of the history and of the evaluations it holds (-1: none).
// Every answer is read and decoded, as the page does.
func pollConsole(ctx context.Context, addr string, poll time.Duration, cnt *consoleCounts) {
	client := &http.Client{Timeout: 10 * time.Second}
	get := func(path string) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			return nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				cnt.add(strings.SplitN(path, "?", 2)[0], 0, true)
			}
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		bad := err != nil || resp.StatusCode != http.StatusOK
		cnt.add(strings.SplitN(path, "?", 2)[0], int64(len(b)), bad)
		if bad {
			return nil, fmt.Errorf("GET %s: %d %v", path, resp.StatusCode, err)
		}
		return b, nil
	}
	var runID string
	ra, ea := -1, -1
	absorb := func(s consoleStatus, full bool) {
		if full || s.RunID != runID {
			ra, ea, runID = -1, -1, s.RunID
		}
		if s.Live != nil {
			for _, r := range s.Live.History {
				ra = max(ra, r.Round)
			}
			for _, e := range s.Live.Evaluations {
				ea = max(ea, e.Round)
			}
		}
	}
	page, err := get("/")
	if err != nil {
		return
	}
	get("/console/console.css")
	get("/console/console.js")
	if m := initialRE.FindSubmatch(page); m != nil {
		var s consoleStatus
		if json.Unmarshal([]byte(html.UnescapeString(string(m[1]))), &s) == nil {
			absorb(s, true)
		}
	}
	wait := poll
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = poll
		b, err := get(fmt.Sprintf("/status?compact=1&rounds_after=%d&evals_after=%d", ra, ea))
		if err != nil {
			continue
		}
		var s consoleStatus
		if json.Unmarshal(b, &s) != nil {
			continue
		}
		if s.RunID != runID {
			wait = 0
		}
		absorb(s, false)
	}
}

// countingProxy serves on a loopback port of its own and forwards to addr,
// counting what passes: the browser's requests, seen without touching it.
func countingProxy(addr string, cnt *consoleCounts) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	target := &url.URL{Scheme: "http", Host: addr}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ModifyResponse = func(resp *http.Response) error {
		resp.Body = &countedBody{ReadCloser: resp.Body, done: func(n int64) {
			cnt.add(resp.Request.URL.Path, n, resp.StatusCode != http.StatusOK)
		}}
		return nil
	}
	srv := &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }() // ErrServerClosed once the returned stop runs
	return ln.Addr().String(), func() { srv.Close() }, nil
}

type countedBody struct {
	io.ReadCloser
	n    int64
	once sync.Once
	done func(int64)
}

func (b *countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	return n, err
}

func (b *countedBody) Close() error {
	b.once.Do(func() { b.done(b.n) })
	return b.ReadCloser.Close()
}

// chromium is a headless Chromium with one page open.
type chromium struct {
	cmd     *exec.Cmd
	profile string
	done    chan struct{}
}

// startChromium opens pageURL in a headless Chromium (its own process
// group, a fresh profile), its output to logPath.
func startChromium(bin, pageURL, logPath string) (*chromium, error) {
	profile, err := os.MkdirTemp("", "edgefl-console-chromium-")
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--user-data-dir="+profile, pageURL)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		os.RemoveAll(profile)
		return nil, err
	}
	c := &chromium{cmd: cmd, profile: profile, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(c.done) }() // killed at the end: its exit status is not the point
	return c, nil
}

// stop ends the Chromium it started: its process group (the browser and
// the renderer and helper processes it forked), by the browser's PID.
func (c *chromium) stop() error {
	pid := c.cmd.Process.Pid
	syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		syscall.Kill(-pid, syscall.SIGKILL)
		<-c.done
	}
	syscall.Kill(-pid, syscall.SIGKILL) // helpers that outlived the browser
	return os.RemoveAll(c.profile)
}

func (c *chromium) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

var errConsoleMode = errors.New("--console: want none, poll or chromium")

package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"testing"
	"time"
)

// A tiny WebDriver client (W3C WebDriver over HTTP, net/http and
// encoding/json only) driving Debian's chromium through chromedriver, for
// tests that look at a page as a person does. scripts/test.sh installs both
// (apt-get install chromium chromium-driver); a test that needs them fails,
// never skips, when they are missing (except under -short).

var (
	chromiumBins     = []string{"/usr/bin/chromium", "/usr/bin/chromium-browser"}
	chromedriverBins = []string{"/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"}
)

func firstExisting(paths []string) string {
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// browser is one headless Chromium session.
type browser struct {
	t       *testing.T
	base    string // chromedriver's URL
	session string
}

// newBrowser starts chromedriver on a free port and opens a headless
// Chromium session with a fresh profile of its own; both end with the test.
// With phone set, Chromium emulates a phone's screen of width x height CSS
// pixels (a headless window is never narrower than 500 pixels).
func newBrowser(t *testing.T, dir string, width, height int, phone bool) *browser {
	t.Helper()
	e2eTest(t)
	chromium, driver := firstExisting(chromiumBins), firstExisting(chromedriverBins)
	if chromium == "" || driver == "" {
		t.Fatalf("this test needs Chromium and chromedriver (apt-get install chromium chromium-driver; scripts/test.sh does it): found chromium %q, chromedriver %q",
			chromium, driver)
	}
	port := freePort(t)
	startProc(t, dir, "chromedriver", nil, driver, fmt.Sprintf("--port=%d", port), "--allowed-ips=127.0.0.1")
	b := &browser{t: t, base: fmt.Sprintf("http://127.0.0.1:%d", port)}
	waitFor(t, 20*time.Second, "chromedriver", func() (bool, error) {
		var st struct {
			Ready bool `json:"ready"`
		}
		err := b.call(http.MethodGet, "/status", nil, &st)
		return err == nil && st.Ready, err
	})
	profile := t.TempDir()
	opts := map[string]any{
		"binary": chromium,
		"args": []string{"--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
			"--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
			"--disable-default-apps", "--disable-extensions", "--user-data-dir=" + profile,
			fmt.Sprintf("--window-size=%d,%d", max(width, 500), height)},
	}
	if phone {
		opts["mobileEmulation"] = map[string]any{"deviceMetrics": map[string]any{"width": width, "height": height, "pixelRatio": 2, "touch": true}}
	}
	caps := map[string]any{"capabilities": map[string]any{"alwaysMatch": map[string]any{
		"browserName": "chrome", "goog:chromeOptions": opts,
	}}}
	var sess struct {
		SessionID string `json:"sessionId"`
	}
	if err := b.call(http.MethodPost, "/session", caps, &sess); err != nil || sess.SessionID == "" {
		t.Fatalf("WebDriver new session: %v", err)
	}
	b.session = sess.SessionID
	t.Cleanup(func() { _ = b.call(http.MethodDelete, "/session/"+b.session, nil, nil) })
	return b
}

// call does one WebDriver command and decodes its "value" into out.
func (b *browser) call(method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		j, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(j)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, b.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	var env struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		return fmt.Errorf("%s %s: HTTP %d: %.300s", method, path, resp.StatusCode, raw)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error   string `json:"error"`
			Message string `json:"message"`
		}
		_ = json.Unmarshal(env.Value, &e)
		return fmt.Errorf("%s %s: HTTP %d: %s: %.300s", method, path, resp.StatusCode, e.Error, e.Message)
	}
	if out != nil {
		return json.Unmarshal(env.Value, out)
	}
	return nil
}

func (b *browser) sess(path string) string { return "/session/" + b.session + path }

// open navigates to url.
func (b *browser) open(url string) {
	b.t.Helper()
	if err := b.call(http.MethodPost, b.sess("/url"), map[string]any{"url": url}, nil); err != nil {
		b.t.Fatalf("open %s: %v", url, err)
	}
}

// eval runs script (a function body: use return) in the page and decodes its
// result into out.
func (b *browser) eval(out any, script string, args ...any) error {
	if args == nil {
		args = []any{}
	}
	return b.call(http.MethodPost, b.sess("/execute/sync"), map[string]any{"script": script, "args": args}, out)
}

// resize sets the window's size.
func (b *browser) resize(width, height int) {
	b.t.Helper()
	if err := b.call(http.MethodPost, b.sess("/window/rect"), map[string]any{"width": width, "height": height}, nil); err != nil {
		b.t.Fatalf("resize: %v", err)
	}
}

// screenshot writes the viewport as a PNG to path.
func (b *browser) screenshot(path string) {
	b.t.Helper()
	var s string
	if err := b.call(http.MethodGet, b.sess("/screenshot"), nil, &s); err != nil {
		b.t.Fatalf("screenshot: %v", err)
	}
	png, err := base64.StdEncoding.DecodeString(s)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		b.t.Fatalf("screenshot: not a PNG (%v)", err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// fullScreenshot writes the whole page (not just the viewport) as a PNG:
// the window is made as tall as the page for the shot, then restored.
func (b *browser) fullScreenshot(path string) {
	b.t.Helper()
	var dim struct {
		W      int `json:"w"`
		H      int `json:"h"`
		Page   int `json:"page"`
		Chrome int `json:"chrome"`
	}
	if err := b.eval(&dim, `return {w: window.outerWidth, h: window.outerHeight, page: document.documentElement.scrollHeight,
	  chrome: window.outerHeight - window.innerHeight};`); err != nil {
		b.t.Fatalf("page size: %v", err)
	}
	b.resize(dim.W, min(dim.Page+dim.Chrome, 8000))
	b.screenshot(path)
	b.resize(dim.W, dim.H)
}

// waitPage polls script (which returns a JSON value) until cond holds for
// its result, and fails after timeout with the last result.
func waitPage[T any](b *browser, timeout time.Duration, what, script string, cond func(T) bool) T {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var v T
		err := b.eval(&v, script)
		if err == nil && cond(v) {
			return v
		}
		if time.Now().After(deadline) {
			j, _ := json.Marshal(v)
			b.t.Fatalf("timed out after %v waiting for %s in the browser (error %v); the page shows %.600s", timeout, what, err, j)
		}
		time.Sleep(100 * time.Millisecond) // a poll of the page, under the deadline above
	}
}

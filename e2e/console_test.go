package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
)

// consolePage is what the console shows a person, read from the DOM
// (innerText: what is rendered, not what is hidden).
type consolePage struct {
	Round  int    `json:"round"`
	Phase  string `json:"phase"`
	Live   string `json:"live"`
	Marker bool   `json:"marker"` // set once after the first load: a reload clears it
	Navs   int    `json:"navs"`
	Sites  map[string]struct {
		State   string `json:"state"`
		Error   string `json:"error"`
		Failing bool   `json:"failing"`
		Text    string `json:"text"`
	} `json:"sites"`
	LossPts   []int  `json:"loss_pts"`  // data-round of the federation's points
	ScorePts  []int  `json:"score_pts"` // likewise, accuracy
	SitePaths int    `json:"site_paths"`
	Bundle    string `json:"bundle"`   // the final bundle's digest, when its card is shown
	Overflow  bool   `json:"overflow"` // the page is wider than the window
}

const readConsole = `
var q = function (s) { return document.querySelector(s); };
var sites = {};
document.querySelectorAll('#sites tbody tr').forEach(function (tr) {
  sites[tr.dataset.site] = { state: tr.querySelector('.state').innerText.trim(), error: tr.querySelector('.error').innerText.trim(),
    failing: tr.classList.contains('failing'), text: tr.innerText };
});
var pts = function (id) { return Array.prototype.map.call(document.querySelectorAll('#' + id + ' circle.pt.fed'), function (c) { return +c.dataset.round; }); };
var card = q('#bundle-card');
return { round: +q('#round').innerText, phase: q('#phase-badge').innerText.trim(), live: q('#live').innerText,
  marker: window.__edgeflMarker === 1, navs: performance.getEntriesByType('navigation').length, sites: sites,
  loss_pts: pts('chart-loss'), score_pts: pts('chart-score'), site_paths: document.querySelectorAll('#chart-loss path.site').length,
  bundle: card.hidden ? '' : q('#bundle-digest').innerText.trim(),
  overflow: document.documentElement.scrollWidth > window.innerWidth + 1 };`

// TestConsoleInBrowser opens the aggregator's console in headless Chromium
// during a whole run on real processes (a schema, three sites, a fourth
// whose CSV lacks a column) and checks what a person sees: the round
// advances without a reload, the broken site's error is shown and
// highlighted, a site killed mid-run turns offline, the evaluation chart
// has one point per evaluated round, and at the end the final bundle's
// digest and download. It saves screenshots (laptop and phone) in its
// artifact directory (go test -artifacts -outputdir DIR), and in
// $EDGEFL_CONSOLE_PNG when set (docs/console.png).
func TestConsoleInBrowser(t *testing.T) {
	e2eTest(t)
	const (
		sites  = 3
		rounds = 24
	)
	start := time.Now()
	dir := t.TempDir()
	// The browser first (it takes seconds to start on a loaded machine):
	// the console is open from the statistics phase on.
	br := newBrowser(t, dir, 1280, 1500, false)
	t.Logf("Chromium ready after %v", time.Since(start).Round(time.Millisecond))
	federation := "ward5"
	schemaPath := filepath.Join(dir, "schema.json")
	if err := os.WriteFile(schemaPath, []byte(clinicalSchema), 0o644); err != nil {
		t.Fatal(err)
	}
	std := []string{"age", "bmi", "smoker", "ward", "outcome"}
	var files []string
	for i := range sites {
		f := filepath.Join(dir, fmt.Sprintf("site-%d.csv", i+1))
		clinicalSite(t, f, uint64(i+1), 200+20*i, float64(10*i-10), std)
		files = append(files, f)
	}
	broken := filepath.Join(dir, "site-4.csv")
	clinicalSite(t, broken, 4, 100, 0, []string{"age", "smoker", "ward", "outcome"}) // no bmi

	passwd := filepath.Join(dir, "passwd")
	setPasswords(t, dir, passwd, "site-1", "site-2", "site-3", "site-4")
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	agg := newAggregator(t, dir, aggDefaults(federation).with(kv{
		{"listen", listen}, {"password_file", passwd}, {"schema", schemaPath},
		{"per_round", fmt.Sprint(sites)}, {"quorum_fraction", "0.6"}, {"round_timeout", "6s"}, {"settle", "400ms"},
		{"rounds", fmt.Sprint(rounds)}, {"eval_every", "2"}, {"l2", "0.01"}, {"max_epochs", "5"}, {"lr", "0.1"},
	}).drop("features", "classes"))
	url := "http://" + agg.metrics + "/"
	br.open(url)
	if err := br.eval(nil, "window.__edgeflMarker = 1; return true"); err != nil {
		t.Fatal(err)
	}
	const long = 120 * time.Second
	page := func(what string, cond func(consolePage) bool) consolePage {
		t.Helper()
		return waitPage(br, long, what, readConsole, cond)
	}
	noReload := func(p consolePage) bool { return p.Marker && p.Navs == 1 }
	// Before any site connects, the roster (the password file's users)
	// is shown, every site "never connected".
	page("the statistics phase, before any site", func(p consolePage) bool {
		if p.Phase != "statistics" || len(p.Sites) != sites+1 {
			return false
		}
		for _, s := range p.Sites {
			if s.State != "never connected" {
				return false
			}
		}
		return true
	})
	var edges []*edge
	for i := range sites {
		id := fmt.Sprintf("site-%d", i+1)
		c := agentConf(federation, "tcp://"+listen, id, passwordFile(dir, id), i, sites, 0).
			drop("data_client", "data_clients", "data_seed", "data_max_samples").
			with(kv{{"data", "csv:" + files[i]}, {"model_out", filepath.Join(dir, id+".bundle.json")}})
		edges = append(edges, newEdge(t, dir, id, c))
	}
	bad := newEdge(t, dir, "site-4", agentConf(federation, "tcp://"+listen, "site-4", passwordFile(dir, "site-4"), 0, 1, 0).
		drop("data_client", "data_clients", "data_seed", "data_max_samples").
		with(kv{{"data", "csv:" + broken}, {"model_out", filepath.Join(dir, "site-4.bundle.json")}}))

	t.Logf("sites started after %v", time.Since(start).Round(time.Millisecond))
	// site-3 freezes (SIGSTOP) once its statistics are in: it stays
	// connected and drawn, so every round waits for it until its deadline
	// and closes with the two others. That paces the run (a round whose
	// sites all report closes in milliseconds, and the next is drawn at
	// once) so that the page can be watched mid-run.
	edges[2].p.waitLine(long, "site-3's statistics receipted", func(l logLine) bool { return l.msg() == "statistics receipted" })
	edges[2].p.signal(syscall.SIGSTOP)

	// The broken site's error, highlighted, without a reload.
	p := page("site-4's schema error", func(p consolePage) bool {
		s, ok := p.Sites["site-4"]
		return ok && s.Failing && strings.Contains(s.Error, "schema_mismatch") && noReload(p)
	})
	if msg := p.Sites["site-4"].Error; !strings.Contains(msg, "bmi") {
		t.Errorf("site-4's error %q does not say which column is missing", msg)
	}
	// The round advances without a reload.
	first := page("a training round", func(p consolePage) bool { return p.Round >= 2 && p.Phase != "statistics" })
	p = page("the round advancing", func(p consolePage) bool { return p.Round >= first.Round+2 && noReload(p) })
	t.Logf("the page went from round %d to %d by itself", first.Round, p.Round)
	if p.Round >= rounds-4 || p.Phase == "finished" {
		t.Fatalf("the run is nearly over (round %d, %s) before a site could be killed mid-run", p.Round, p.Phase)
	}
	for _, id := range []string{"site-1", "site-2", "site-3"} {
		if s := p.Sites[id]; s.State != "online" || s.Failing {
			t.Errorf("%s shows %+v, want online without an error", id, s)
		}
	}

	// A site killed mid-run (the frozen one) turns offline.
	edges[2].p.kill()
	killedAt, killed := p.Round, time.Now()
	p = page("site-3 offline", func(p consolePage) bool { return p.Sites["site-3"].State == "offline" && noReload(p) })
	t.Logf("site-3 killed in round %d; the page shows it offline %v later, in round %d", killedAt, time.Since(killed).Round(time.Millisecond), p.Round)
	// The round goes on with the two others (at the deadline of a round
	// that waited for site-3), and an evaluation shows per-site lines.
	p = page("rounds after the kill, with evaluations", func(p consolePage) bool {
		return p.Round >= killedAt+4 && len(p.LossPts) >= 4 && p.SitePaths >= 2 && noReload(p)
	})
	art := t.ArtifactDir()
	shot := filepath.Join(art, "console.png")
	br.fullScreenshot(shot)
	if dst := os.Getenv("EDGEFL_CONSOLE_PNG"); dst != "" {
		b, _ := os.ReadFile(shot)
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A phone (390 CSS pixels wide): nothing wider than the screen, the
	// sites as cards.
	phone := newBrowser(t, dir, 390, 844, true)
	phone.open(url)
	var layout struct {
		Width    int  `json:"width"`
		Overflow bool `json:"overflow"`
		Cards    bool `json:"cards"`
	}
	if err := phone.eval(&layout, `return {width: window.innerWidth, overflow: document.documentElement.scrollWidth > window.innerWidth + 1,
	  cards: getComputedStyle(document.querySelector('#sites tbody tr')).display === 'block'};`); err != nil {
		t.Fatal(err)
	}
	if layout.Width != 390 || layout.Overflow || !layout.Cards {
		t.Errorf("on a phone: %+v, want 390 pixels wide, nothing wider, the sites as cards", layout)
	}
	phone.screenshot(filepath.Join(art, "console-phone.png"))

	// The end: the final bundle's digest, the same as the file's, and a
	// chart point for every evaluated round /status lists.
	p = page("the end of the run with the final bundle", func(p consolePage) bool {
		return p.Phase == "finished" && p.Bundle != "" && noReload(p)
	})
	final, err := bundle.Read(filepath.Join(dir, "final.bundle.json"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Bundle != final.Digest {
		t.Errorf("the console shows the final bundle %q, the file's digest is %q", p.Bundle, final.Digest)
	}
	code, body, err := httpGet(agg.metrics, "/status?compact=1")
	if err != nil || code != 200 {
		t.Fatalf("/status: %d %v", code, err)
	}
	var st struct {
		Live struct {
			Evaluations []struct {
				Round int `json:"round"`
			} `json:"evaluations"`
			History []struct {
				Round int `json:"round"`
			} `json:"history"`
		} `json:"live"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	var want []int
	for _, e := range st.Live.Evaluations {
		want = append(want, e.Round)
	}
	if len(want) != rounds/2 || want[len(want)-1] != rounds {
		t.Errorf("/status lists evaluated rounds %v, want every 2nd of %d", want, rounds)
	}
	p = page("one chart point per evaluated round", func(p consolePage) bool {
		return slices.Equal(p.LossPts, want) && slices.Equal(p.ScorePts, want)
	})
	if len(st.Live.History) != rounds {
		t.Errorf("/status has %d rounds of history, want %d", len(st.Live.History), rounds)
	}
	// The download link serves that bundle.
	code, body, err = httpGet(agg.metrics, "/bundle")
	if err != nil || code != 200 || !strings.Contains(body, final.Digest) {
		t.Errorf("/bundle: %d %v (digest %s in it: %v)", code, err, final.Digest, strings.Contains(body, final.Digest))
	}
	br.fullScreenshot(filepath.Join(art, "console-finished.png"))
	t.Logf("screenshots in %s; the test took %v", art, time.Since(start).Round(time.Millisecond))
	noPanics(agg, append(edges, bad)...)
}

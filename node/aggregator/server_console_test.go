package aggregator

import (
	"encoding/json"
	"html"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/proto/wire"
)

// The round history behind the console: participants, partial work,
// stragglers, bytes, the change of the global model, each site's work
// report and rejections; ?rounds_after; rebuilt from the round log after a
// restart (bytes excepted).
func TestConsoleHistory(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.QuorumFraction = 2.0 / 3
	cfg.Algorithm = AlgoFedProx
	cfg.Rounds = 3
	cfg.Settle = time.Second
	r := f.start(cfg)
	a, b, c := f.agent("site-a", 10), f.agent("site-b", 10), f.agent("site-c", 10)
	waitView(t, r.s, "3 online", func(v ServerView) bool { return v.Online == 3 })
	f.clock.Advance(time.Second) // Settle
	a.nextRound(t, 1)
	partial := update(t, "site-a", 1, vec(1), 10)
	partial.Report.Partial, partial.Report.AchievedGamma, partial.Report.Epochs = true, 0.25, 3
	a.send(t, partial)
	b.send(t, update(t, "site-b", 1, vec(3), 10))
	a.receipt(t)
	b.receipt(t)
	// A bad update of site-c: counted as its rejection.
	bad := update(t, "site-c", 1, []float64{1, 2}, 10)
	c.send(t, bad)
	wantReceipt(t, c.receipt(t), 1, false, wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE)
	waitView(t, r.s, "2 received", func(v ServerView) bool { return len(v.Received) == 2 })
	f.clock.Advance(time.Minute) // the deadline: site-c straggles
	rr := r.round(t)
	if !slices.Equal(rr.Stragglers, []string{"site-c"}) {
		t.Fatalf("round report %+v", rr)
	}
	f.clock.Advance(time.Second) // Settle
	for _, ag := range []*fakeAgent{a, b, c} {
		ag.nextRound(t, 2)
		ag.send(t, update(t, ag.id, 2, vec(2), 10))
	}
	r.round(t)

	st, err := r.s.LiveStatus(-1, -1)
	if err != nil {
		t.Fatal(err)
	}
	l := st.Live
	if l == nil || l.Rounds != 3 || l.Quorum != 2 || l.PerRound != 3 || l.Family != AlgoFedProx || l.Params["mu"] == "" ||
		st.RunID == "" || st.Codec != "fp32" || st.RoundOpenedAt == nil {
		t.Fatalf("status %+v live %+v", st, l)
	}
	if len(l.History) != 2 {
		t.Fatalf("history %+v", l.History)
	}
	h1, h2 := l.History[0], l.History[1]
	if h1.Round != 1 || h1.Participants != 2 || !slices.Equal(h1.Partial, []string{"site-a"}) || !slices.Equal(h1.Stragglers, []string{"site-c"}) ||
		h1.BytesUp == nil || *h1.BytesUp == 0 || h1.BytesDown == nil || *h1.BytesDown == 0 || h1.DeltaNorm == nil || h1.AggregatedAt.IsZero() {
		t.Fatalf("round 1 record %+v", h1)
	}
	// The FedProx mean of vec(1) and vec(3) is vec(2): ||vec(2) - 0||.
	if want := norm2(vec(2)); !(*h1.DeltaNorm > want*0.999 && *h1.DeltaNorm < want*1.001) {
		t.Errorf("round 1 delta norm %v, want %v", *h1.DeltaNorm, want)
	}
	if h2.Round != 2 || h2.Participants != 3 || len(h2.Stragglers) != 0 || h2.DeltaNorm == nil || *h2.DeltaNorm > 1e-6 {
		t.Fatalf("round 2 record %+v", h2)
	}
	byID := map[string]ClientInfo{}
	for _, ci := range st.Clients {
		byID[ci.ID] = ci
	}
	if ca := byID["site-a"]; ca.Partial != 1 || ca.LastWork == nil || ca.LastWork.Round != 2 || ca.Straggled != 0 {
		t.Errorf("site-a %+v (work %+v)", ca, ca.LastWork)
	}
	if cc := byID["site-c"]; cc.Straggled != 1 || cc.Rejections["wrong_dimension"] != 1 || cc.LastSeen == nil {
		t.Errorf("site-c %+v", cc)
	}
	if later, _ := r.s.LiveStatus(1, -1); len(later.Live.History) != 1 || later.Live.History[0].Round != 2 {
		t.Errorf("rounds after 1: %+v", later.Live.History)
	}

	// A restart rebuilds the rounds from the round log, without bytes.
	r.stop(t)
	r2 := f.start(cfg)
	st2, err := r2.s.LiveStatus(-1, -1)
	if err != nil {
		t.Fatal(err)
	}
	if len(st2.Live.History) != 2 {
		t.Fatalf("rebuilt history %+v", st2.Live.History)
	}
	g1 := st2.Live.History[0]
	if g1.Participants != 2 || !slices.Equal(g1.Partial, h1.Partial) || !slices.Equal(g1.Stragglers, h1.Stragglers) ||
		g1.DeltaNorm == nil || *g1.DeltaNorm != *h1.DeltaNorm || g1.BytesUp != nil {
		t.Errorf("rebuilt round 1 %+v, was %+v", g1, h1)
	}
	for _, ci := range st2.Clients {
		if ci.ID == "site-a" && (ci.LastWork == nil || ci.LastWork.Round != 2) {
			t.Errorf("site-a's work report not rebuilt: %+v", ci.LastWork)
		}
	}
}

// The console's page and the status endpoint over HTTP: the page is
// server-rendered with the sites, its assets are embedded, every answer
// carries the Content-Security-Policy, and nothing but GET and HEAD is
// served.
func TestConsoleHTTP(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.K = 1
	r := f.start(cfg)
	a := f.agent("site-a", 10)
	a.nextRound(t, 1)
	h := r.s.Handler()
	get := func(method, path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		return rec
	}
	page := get("GET", "/")
	body := page.Body.String()
	if page.Code != 200 || !strings.HasPrefix(page.Header().Get("Content-Type"), "text/html") ||
		!strings.Contains(body, `data-site="site-a"`) || !strings.Contains(body, `id="initial"`) || !strings.Contains(body, testFed) {
		t.Fatalf("GET /: %d %s\n%.2000s", page.Code, page.Header(), body)
	}
	// The Partial column says what partial means (it reads as a fault).
	if !strings.Contains(body, `id="partial-means">Partial: rounds whose update `+html.EscapeString(wire.PartialMeans)) {
		t.Errorf("the page does not explain the Partial column")
	}
	if csp := page.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("CSP %q", csp)
	}
	if strings.Contains(body, f.dir) || strings.Contains(body, "state.db") {
		t.Errorf("the page shows a file path of the aggregator")
	}
	for _, p := range []string{"/console/console.js", "/console/console.css"} {
		if rec := get("GET", p); rec.Code != 200 || rec.Body.Len() < 1000 {
			t.Errorf("GET %s: %d, %d bytes", p, rec.Code, rec.Body.Len())
		}
	}
	if rec := get("GET", "/console/console.go"); rec.Code != 404 {
		t.Errorf("GET /console/console.go: %d", rec.Code)
	}
	if rec := get("GET", "/nothing"); rec.Code != 404 {
		t.Errorf("GET /nothing: %d", rec.Code)
	}
	for _, m := range []string{"POST", "PUT", "DELETE"} {
		if rec := get(m, "/status"); rec.Code != http.StatusMethodNotAllowed {
			t.Errorf("%s /status: %d", m, rec.Code)
		}
	}
	st := get("GET", "/status?compact=1&rounds_after=0&evals_after=0")
	var got Status
	if err := json.Unmarshal(st.Body.Bytes(), &got); err != nil || got.Live == nil || got.Live.History == nil || got.Live.Evaluations == nil {
		t.Fatalf("/status: %v %.500s", err, st.Body.String())
	}
	if st.Header().Get("Cache-Control") != "no-store" {
		t.Errorf("/status Cache-Control %q", st.Header().Get("Cache-Control"))
	}
	if rec := get("GET", "/status?rounds_after=x"); rec.Code != 400 {
		t.Errorf("/status?rounds_after=x: %d", rec.Code)
	}
	// Over the network, without a guard configured.
	srv := httptest.NewServer(r.s.guarded())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/status")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("no guard configured: /status %d", resp.StatusCode)
	}
}

// BenchmarkConsolePoll is what one open console costs the daemon per poll
// (every 1.5 s): /status for the rounds it lacks, with 100 sites and a full
// history of 1000 rounds and 100 evaluated rounds; and the first load.
func BenchmarkConsolePoll(b *testing.B) {
	f := &fixture{t: &testing.T{}, dir: b.TempDir(), clock: clock.NewFake(start0)}
	cfg := ServerConfig{Federation: testFed, BrokerURL: "tcp://127.0.0.1:1", K: 10, Algorithm: AlgoFedAvg, Model: testModel,
		StatePath: filepath.Join(f.dir, "state.db"), Clock: f.clock, Logger: slog.New(slog.DiscardHandler)}
	s, err := NewServer(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	up, down, d := uint64(12345), uint64(67890), 0.01
	var ids []string
	for i := range 100 {
		ids = append(ids, "site-"+strconv.Itoa(i))
	}
	for r := 1; r <= HistoryRounds; r++ {
		s.hist.addRound(RoundRecord{Round: r, Participants: 10, Stragglers: ids[r%100 : r%100+1], BytesUp: &up, BytesDown: &down, DeltaNorm: &d})
		if r%10 == 0 {
			p := EvalPoint{Round: r, Federation: EvalFigures{N: 1000, Loss: 0.5}, Sites: map[string]EvalFigures{}}
			for _, id := range ids {
				sc := 0.8
				p.Sites[id] = EvalFigures{N: 10, Loss: 0.5, Score: &sc}
			}
			s.hist.addEval(p)
		}
	}
	for _, id := range ids {
		s.hist.setWork(id, siteWork{Round: 1000, Gamma: 0.1, Epochs: 5})
		s.hist.seen(id, time.Now())
	}
	h := s.Handler()
	for _, bc := range []struct{ name, path string }{
		{"poll", "/status?compact=1&rounds_after=1000&evals_after=1000"},
		{"first_load", "/"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest("GET", bc.path, nil))
				if rec.Code != 200 {
					b.Fatal(rec.Code)
				}
				b.SetBytes(int64(rec.Body.Len()))
			}
		})
	}
}

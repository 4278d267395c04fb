package aggregator

import (
	"encoding/json"
	"maps"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/node/broker"
	"github.com/edgefl/edgefl/proto/pki"
	"github.com/edgefl/edgefl/proto/wire"
	"github.com/edgefl/edgefl/testkit"
)

// waitLog waits until the log holds a line containing sub (the loop logs,
// then refreshes the view: each change of the view is a chance to look).
func waitLog(t *testing.T, s *Server, logs *testkit.SyncBuffer, sub string) string {
	t.Helper()
	deadline := time.After(waitLong)
	for {
		_, ch := s.Watch()
		if l := logs.Lines(sub); len(l) > 0 {
			return l[0]
		}
		select {
		case <-ch:
		case <-time.After(50 * time.Millisecond): // the log may be written after the last change
		case <-deadline:
			t.Fatalf("no log line with %q:\n%s", sub, logs.String())
		}
	}
}

// The statistics phase at its deadline below quorum (2 of 4 with a quorum
// of 3): a WARN names each missing site and why (a site error, never
// connected), and /status (the console's data) carries the same list.
func TestStatisticsDeadlineBelowQuorumExplained(t *testing.T) {
	f := newFixture(t)
	cfg := f.fedConfig(t)
	cfg.K, cfg.QuorumFraction = 4, 0.75
	cfg.Roster = []string{"site-a", "site-b", "site-c", "site-d"}
	log, logs := testkit.FailureLog(t, "aggregator")
	cfg.Logger = log
	r := f.start(cfg)
	a, b, c := f.fedSite(t, "site-a", 1), f.fedSite(t, "site-b", 2), f.agent("site-c", 0)
	ann := a.nextPhase(t, wire.Phase_PHASE_STATISTICS, 0, false)
	a.sendStats(t, ann.RunId)
	wantSubject(t, a.receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, 0, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	b.sendStats(t, ann.RunId)
	wantSubject(t, b.receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, 0, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	topic, _ := c.topics.Status("site-c")
	st, _ := wire.Encode(&wire.ClientStatus{ClientId: "site-c", Online: true, SampleCount: 0, Connection: 1,
		ErrorReason: wire.SiteErrSchema, ErrorMessage: `c.csv: line 1: no column "age"`})
	c.pub(t, topic, true, st)
	waitView(t, r.s, "two statistics and site-c's error", func(v ServerView) bool {
		return len(v.StatsSites) == 2 && v.SiteErrors["site-c/"+wire.SiteErrSchema] == 1
	})
	if l := logs.Lines("statistics phase below quorum"); len(l) != 0 {
		t.Fatalf("warned before the deadline: %q", l)
	}
	live, err := r.s.LiveStatus(-1, -1)
	if err != nil || live.StatisticsOverdue != nil {
		t.Fatalf("overdue before the deadline: %+v %v", live.StatisticsOverdue, err)
	}

	f.clock.Advance(time.Minute)
	line := waitLog(t, r.s, logs, "statistics phase below quorum")
	for _, want := range []string{"level=WARN", "received=2", "quorum=3", `missing.site-c="site error schema_mismatch: c.csv: line 1: no column \"age\""`, `missing.site-d="never connected`} {
		if !strings.Contains(line, want) {
			t.Fatalf("the WARN lacks %s:\n%s", want, line)
		}
	}
	live, err = r.s.LiveStatus(-1, -1)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(live)
	var doc struct {
		StatisticsOverdue struct {
			Quorum   int      `json:"quorum"`
			Received []string `json:"received"`
			Missing  []struct {
				ID  string `json:"id"`
				Why string `json:"why"`
			} `json:"missing"`
		} `json:"statistics_overdue"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	o := doc.StatisticsOverdue
	if o.Quorum != 3 || !slices.Equal(o.Received, []string{"site-a", "site-b"}) || len(o.Missing) != 2 ||
		o.Missing[0].ID != "site-c" || !strings.HasPrefix(o.Missing[0].Why, "site error schema_mismatch") ||
		o.Missing[1].ID != "site-d" || !strings.HasPrefix(o.Missing[1].Why, "never connected") {
		t.Fatalf("status's statistics_overdue %s", raw)
	}
}

// brokerRefusals adapts the embedded broker's refusals, as broker-agg run
// does.
func brokerRefusals(b *broker.Broker) func() []SiteRefusal {
	return func() []SiteRefusal {
		var out []SiteRefusal
		for _, r := range b.Refusals() {
			out = append(out, SiteRefusal{ID: r.ID, Reason: r.Reason, At: r.At, Count: r.Count})
		}
		return out
	}
}

// A roster site whose certificate the embedded broker refuses (mutual TLS,
// a real handshake: another CA's certificate) is in status and in the
// console, never connected, with the refusal's reason; a roster site never
// heard of is "never connected"; the console's count covers the roster
// ("1 of 3 online", not "1 of 1"); /metrics counts the roster by state and
// the refusals by site.
func TestRefusedCertificateInStatusAndConsole(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	if _, err := pki.MakeSite(pki.SiteOptions{Dir: dir, Clients: []string{DefaultClientID, "site-a", "site-b", "site-c"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.MakeSite(pki.SiteOptions{Dir: other, Clients: []string{"site-b"}}); err != nil {
		t.Fatal(err)
	}
	scfg, err := pki.ServerTLSConfig(filepath.Join(dir, pki.ServerCertFile), filepath.Join(dir, pki.ServerKeyFile), filepath.Join(dir, pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	topics, _ := wire.ForFederation(testFed)
	brk, err := broker.Start(broker.Config{Addr: "127.0.0.1:0", Prefix: topics.Prefix(), TLS: scfg, Superusers: []string{DefaultClientID},
		Logger: testkit.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = brk.Close() })
	f := &fixture{t: t, dir: t.TempDir(), brk: brk, clock: clock.NewFake(start0)}
	cfg := f.config()
	cfg.BrokerURL, cfg.Username, cfg.Password, cfg.Dial = "", "", "", brk.Dial
	cfg.ClientID = DefaultClientID
	cfg.Roster = []string{"site-a", "site-b", "site-c"}
	cfg.BrokerRefusals = brokerRefusals(brk)
	r := f.start(cfg)

	connect := func(d, id string) error {
		cf, kf := pki.ClientFiles(d, id)
		tc, err := pki.ClientTLSConfig(filepath.Join(dir, pki.CACertFile), cf, kf)
		if err != nil {
			t.Fatal(err)
		}
		tc.ServerName = "localhost"
		st, _ := topics.Status(id)
		on, _ := wire.Encode(&wire.ClientStatus{ClientId: id, Online: true, SampleCount: 5})
		c := paho.NewClient(paho.NewClientOptions().AddBroker(brk.URL()).SetClientID(id).SetTLSConfig(tc).
			SetProtocolVersion(4).SetConnectTimeout(waitLong).SetAutoReconnect(false))
		tok := c.Connect()
		if !tok.WaitTimeout(waitLong) {
			t.Fatal("connect timed out")
		}
		if tok.Error() != nil {
			return tok.Error()
		}
		t.Cleanup(func() { c.Disconnect(0) })
		if tok := c.Publish(st, 1, true, on); !tok.WaitTimeout(waitLong) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
		return nil
	}
	if err := connect(dir, "site-a"); err != nil {
		t.Fatal(err)
	}
	if err := connect(other, "site-b"); err == nil {
		t.Fatal("site-b's certificate of another CA was let in")
	}
	waitView(t, r.s, "site-a online", func(v ServerView) bool { return v.Online == 1 })
	deadline := time.Now().Add(waitLong)
	for brk.Stats().AuthFailures < 1 { // the broker counts the refusal after the handshake's failure
		if time.Now().After(deadline) {
			t.Fatal("no refusal counted")
		}
		time.Sleep(5 * time.Millisecond) // the broker's goroutine; no clock to inject
	}

	st, err := r.s.LiveStatus(-1, -1)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]ClientInfo{}
	for _, c := range st.Clients {
		byID[c.ID] = c
	}
	a, b, c := byID["site-a"], byID["site-b"], byID["site-c"]
	if len(st.Clients) != 3 || !a.Online || !a.Expected || a.NeverConnected || a.LastRefusal != nil {
		t.Fatalf("clients %+v", st.Clients)
	}
	if !b.Expected || !b.NeverConnected || b.LastRefusal == nil || b.LastRefusal.Reason != "client certificate not signed by the site CA" || b.LastRefusal.Count != 1 {
		t.Fatalf("site-b %+v (refusal %+v)", b, b.LastRefusal)
	}
	if !c.Expected || !c.NeverConnected || c.LastRefusal != nil {
		t.Fatalf("site-c %+v", c)
	}
	if st.Broker == nil || !st.Broker.Connected {
		t.Fatalf("broker connection %+v", st.Broker)
	}

	// The console: its page lists every roster site, its count covers the
	// roster, and its data (the JSON it renders) carries the refusal.
	rec := httptest.NewRecorder()
	r.s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	page := rec.Body.String()
	for _, want := range []string{`data-site="site-b"`, `data-site="site-c"`, `1 of 3`, "never connected", "client certificate not signed by the site CA"} {
		if !strings.Contains(page, want) {
			t.Fatalf("the console's page lacks %q", want)
		}
	}
	met := metricsText(t, r.s)
	for _, want := range []string{
		`edgefl_aggregator_roster_sites{state="never_connected"} 2`, `edgefl_aggregator_roster_sites{state="online"} 1`,
		`edgefl_aggregator_site_refusals_total{site="site-b"} 1`, `edgefl_aggregator_broker_connected 1`,
	} {
		if !strings.Contains(met, want) {
			t.Fatalf("metrics lack %s:\n%s", want, met)
		}
	}
}

// The final evaluation waits for every site online, not only those whose
// statistics made the preprocessing: site-d joined after the fit and its
// report is in the final figures although it came after the others';
// site-x, online and silent, is awaited until the deadline and then named
// as missing in the bundle, whose provenance names the statistics sites.
func TestFinalEvaluationAwaitsLateJoiners(t *testing.T) {
	f := newFixture(t)
	cfg := f.fedConfig(t)
	cfg.Rounds = 1
	log, logs := testkit.FailureLog(t, "aggregator")
	cfg.Logger = log
	r := f.start(cfg)
	sites := []*fedSite{f.fedSite(t, "site-a", 1), f.fedSite(t, "site-b", 2), f.fedSite(t, "site-c", 3)}
	ann := sites[0].nextPhase(t, wire.Phase_PHASE_STATISTICS, 0, false)
	for _, s := range sites {
		s.sendStats(t, ann.RunId)
		wantSubject(t, s.receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, 0, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	}
	a1 := sites[0].nextPhase(t, wire.Phase_PHASE_TRAIN, 1, false)
	late, silent := f.fedSite(t, "site-d", 4), f.agent("site-x", 30) // online after the fit
	waitView(t, r.s, "five sites online", func(v ServerView) bool { return v.Online == 5 })
	trainRound(t, r, sites, a1, 0.5)
	fin := sites[0].nextPhase(t, wire.Phase_PHASE_FINISHED, 1, false)
	for _, s := range sites {
		s.sendEval(t, fin)
		wantSubject(t, s.receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION, 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	}
	late.sendEval(t, fin)
	wantSubject(t, late.receipt(t), wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION, 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	if isDone(r.s.Finished()) {
		t.Fatal("finished while site-x, online, had not reported")
	}
	f.clock.Advance(time.Minute) // the finishing deadline
	select {
	case <-r.s.Finished():
	case <-time.After(waitLong):
		t.Fatal("not finished at the deadline")
	}
	done := silent.nextPhase(t, wire.Phase_PHASE_FINISHED, 1, true)
	fb, err := bundle.Unmarshal(done.Bundle)
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(maps.Keys(fb.Evaluation.Sites)); !slices.Equal(got, []string{"site-a", "site-b", "site-c", "site-d"}) {
		t.Fatalf("the final figures cover %v", got)
	}
	if !slices.Equal(fb.Evaluation.Missing, []string{"site-x"}) || !slices.Equal(fb.Provenance.StatisticsSites, []string{"site-a", "site-b", "site-c"}) ||
		fb.Version != bundle.VersionFigures {
		t.Fatalf("bundle version %d, missing %v, statistics sites %v", fb.Version, fb.Evaluation.Missing, fb.Provenance.StatisticsSites)
	}
	if l := logs.Lines("final evaluation at its deadline without"); len(l) != 1 || !strings.Contains(l[0], "missing=[site-x]") {
		t.Fatalf("the WARN: %q", l)
	}
	st, err := ReadStatus(r.s.store)
	if err != nil || st.FinalBundle == nil || !slices.Equal(st.FinalBundle.EvalMissing, []string{"site-x"}) || len(st.FinalBundle.EvalSites) != 4 {
		t.Fatalf("status's final bundle %+v %v", st.FinalBundle, err)
	}
	// The sites that joined after the fit are told of, once each, and
	// marked in status (the console's data).
	for _, c := range st.Clients {
		late := c.ID == "site-d" || c.ID == "site-x"
		if c.NotInPreprocessing != late {
			t.Errorf("%s: not_in_preprocessing %v", c.ID, c.NotInPreprocessing)
		}
		if n := len(logs.Lines("statistics are not in the federation's preprocessing")); late && n != 2 {
			t.Errorf("%d late-joiner WARNs, want one for each of site-d and site-x:\n%s", n, logs.String())
		}
	}
	for _, id := range []string{"site-d", "site-x"} {
		if l := logs.Lines("client=" + id + " statistics_sites=\"[site-a site-b site-c]\""); len(l) != 1 || !strings.Contains(l[0], "level=WARN") {
			t.Errorf("%s's late-joiner line: %q", id, l)
		}
	}
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// The broker URL in status carries no credential.
func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"ssl://agg:secret@mq.example:8883": "ssl://mq.example:8883",
		"tcp://127.0.0.1:1883":             "tcp://127.0.0.1:1883",
		"tcp://in-process":                 "tcp://in-process",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

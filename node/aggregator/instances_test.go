package aggregator

import (
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/proto/wire"
	"github.com/edgefl/edgefl/testkit"
)

func instStatus(site, inst string, online bool, conn uint64, at time.Time) *wire.ClientStatus {
	st := &wire.ClientStatus{ClientId: site, Online: online, SampleCount: 10, Connection: conn, InstanceId: inst}
	if online || !at.IsZero() {
		st.TimestampUnixMs = at.UnixMilli()
	}
	return st
}

// Two installations with one site id (a cloned gateway, each with its own
// state file): the first instance seen holds the site; the second's
// statuses and updates are set aside (no receipt, not stored), reported in
// /status, /metrics and a WARN line; the holder's update is accepted. Once
// the holder has been gone (its last will) for InstanceTakeover, the other
// takes the site over, and the first one's updates are set aside in turn.
func TestDuplicateInstanceSetAside(t *testing.T) {
	f := newFixture(t)
	var logs testkit.SyncBuffer
	cfg := f.config()
	cfg.K, cfg.Logger = 2, slog.New(slog.NewTextHandler(&logs, nil))
	r := f.start(cfg)
	s := r.s
	a := f.agent("site-a", 0)
	inj := f.agent("injector", 0)
	b := f.agent("site-b", 10) // an agent older than instance ids: not checked
	statusTopic, _ := a.topics.Status("site-a")
	updateTopic, _ := a.topics.Update("site-a")
	pubStatus := func(st *wire.ClientStatus) {
		t.Helper()
		m, err := wire.Encode(st)
		if err != nil {
			t.Fatal(err)
		}
		inj.pub(t, statusTopic, true, m)
	}
	pubUpdate := func(u *wire.ClientUpdate) {
		t.Helper()
		m, err := wire.Encode(u)
		if err != nil {
			t.Fatal(err)
		}
		inj.pub(t, updateTopic, false, m)
	}
	setAside := func(n uint64) {
		t.Helper()
		waitView(t, s, "messages set aside", func(ServerView) bool {
			return s.inst.setAside.Snapshot()["site-a"] == n
		})
	}

	pubStatus(instStatus("site-a", "INST-A", true, 1, f.clock.Now()))
	ann := a.nextRound(t, 1) // both sites online: round 1 selects them
	if len(ann.Selected) != 2 {
		t.Fatalf("round 1 selects %v", ann.Selected)
	}
	pubStatus(instStatus("site-a", "INST-B", true, 1, f.clock.Now()))
	setAside(1)
	// The clone's update: set aside before anything else, no receipt.
	u := update(t, "site-a", 1, vec(1), 10)
	u.InstanceId = "INST-B"
	pubUpdate(u)
	waitView(t, s, "the clone's update rejected", func(v ServerView) bool { return v.Rejected["duplicate_instance"] == 1 })
	if v, _ := s.Watch(); len(v.Received) != 0 {
		t.Fatalf("received %v after the clone's update", v.Received)
	}
	// The holder's update is accepted: the first receipt site-a gets.
	u = update(t, "site-a", 1, vec(2), 10)
	u.InstanceId = "INST-A"
	a.send(t, u)
	wantReceipt(t, a.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	b.send(t, update(t, "site-b", 1, vec(3), 10))
	wantReceipt(t, b.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	rr := r.round(t)
	if len(rr.Contributors) != 2 {
		t.Fatalf("round 1 contributors %v", rr.Contributors)
	}
	if err := closeTo(rr.Global, vec(2.5), 1e-6); err != nil {
		t.Errorf("round 1 averages the holder's update and site-b's: %v", err)
	}

	// Reported: /metrics, /status, the log.
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{
		`edgefl_aggregator_duplicate_instances_total{site="site-a"} 1`,
		`edgefl_aggregator_instance_set_aside_total{site="site-a"} 2`,
		`edgefl_aggregator_updates_rejected_total{reason="duplicate_instance"} 1`,
	} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	rec = httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/status", nil))
	var st Status
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.DuplicateInstances) != 1 || st.DuplicateInstances[0].Site != "site-a" || st.DuplicateInstances[0].Instance != "INST-A" ||
		len(st.DuplicateInstances[0].Others) != 1 || st.DuplicateInstances[0].Others[0].ID != "INST-B" || st.DuplicateInstances[0].SetAside != 2 {
		t.Errorf("/status duplicate_instances %+v", st.DuplicateInstances)
	}
	if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "a second installation uses this site id") ||
		!strings.Contains(l, "instance=INST-B holder=INST-A") {
		t.Errorf("no WARN line naming both installations:\n%s", l)
	}
	for _, c := range st.Clients {
		if c.ID == "site-a" && !c.Online {
			t.Errorf("site-a offline in /status: the clone's statuses were applied? %+v", c)
		}
	}

	// The holder's last will (no timestamp): the clone is still set aside
	// until the holder has been gone for the takeover time.
	pubStatus(instStatus("site-a", "INST-A", false, 1, time.Time{}))
	waitView(t, s, "site-a offline", func(v ServerView) bool { return v.Online == 1 })
	pubStatus(instStatus("site-a", "INST-B", true, 2, f.clock.Now()))
	setAside(3)
	f.clock.Advance(cfg.InstanceTakeover + DefaultInstanceTakeover) // cfg's is 0: the default applies
	pubStatus(instStatus("site-a", "INST-B", true, 3, f.clock.Now()))
	waitView(t, s, "site-a back online under INST-B", func(v ServerView) bool { return v.Online == 2 })
	if !strings.Contains(logs.String(), "site taken over by another installation") {
		t.Errorf("no takeover line:\n%s", logs.String())
	}
	u = update(t, "site-a", 2, vec(1), 10)
	u.InstanceId = "INST-A"
	pubUpdate(u)
	waitView(t, s, "the old holder's update rejected", func(v ServerView) bool { return v.Rejected["duplicate_instance"] == 2 })
	if d := s.inst.report(); len(d) != 1 || d[0].Instance != "INST-B" || d[0].Others[0].ID != "INST-A" {
		t.Errorf("after the takeover: %+v", d)
	}
}

// The guard's rules on their own: a holder that stopped cleanly is taken
// over at once; a late will of the holder's older connection does not
// free the site; messages without an instance id pass.
func TestInstanceGuardRules(t *testing.T) {
	now := start0
	g := &instanceGuard{takeover: time.Minute}
	ok := func(v instanceVerdict, want bool, what string) {
		t.Helper()
		if v.ok != want {
			t.Fatalf("%s: ok = %v, want %v (%+v)", what, v.ok, want, v)
		}
	}
	ok(g.status(instStatus("s", "A", true, 5, now), now), true, "first instance")
	ok(g.status(&wire.ClientStatus{ClientId: "s", Online: true}, now), true, "no instance id")
	ok(g.update(&wire.ClientUpdate{ClientId: "s", Round: 1}, now), true, "an update without an instance id")
	// A late will of connection 4, after connection 5's online status:
	// stale, the holder stays online.
	ok(g.status(instStatus("s", "A", false, 4, time.Time{}), now), true, "stale will")
	later := now.Add(time.Hour)
	v := g.status(instStatus("s", "B", true, 1, later), later)
	ok(v, false, "a clone while the holder is online")
	if !v.newDup || !v.logNow {
		t.Errorf("the clone's first status: %+v", v)
	}
	if v := g.status(instStatus("s", "B", true, 2, later), later); v.newDup || v.logNow {
		t.Errorf("the clone's second status is logged again at once: %+v", v)
	}
	if v := g.status(instStatus("s", "B", true, 3, later.Add(instanceLogEvery)), later.Add(instanceLogEvery)); !v.logNow || v.aside != 2 {
		t.Errorf("a minute later: %+v, want a line with 2 set aside", v)
	}
	// The holder stops cleanly (its own offline status): taken over at once.
	ok(g.status(instStatus("s", "A", false, 5, later), later), true, "holder's clean stop")
	v = g.status(instStatus("s", "B", true, 4, later), later)
	ok(v, true, "takeover after a clean stop")
	if v.takeover != "A" || v.holder != "B" {
		t.Errorf("takeover verdict %+v", v)
	}
	ok(g.update(&wire.ClientUpdate{ClientId: "s", InstanceId: "A"}, later), false, "the old holder's update")
	ok(g.update(&wire.ClientUpdate{ClientId: "s", InstanceId: "B"}, later), true, "the new holder's update")
	// An offline status of a clone never takes a site over.
	ok(g.status(instStatus("s", "B", false, 4, time.Time{}), later), true, "holder's will")
	ok(g.status(instStatus("s", "C", false, 1, later), later.Add(time.Hour)), false, "a clone's offline status")
	// A site first seen through an update: its holder counts as online.
	ok(g.update(&wire.ClientUpdate{ClientId: "t", InstanceId: "A"}, now), true, "update first")
	ok(g.status(instStatus("t", "B", true, 1, now), now), false, "a clone right after")
}

// A gateway started over (--reset-state after a crash: its last will, then
// a new instance) keeps its site at once, and is no duplicate; two
// installations taking turns (the clone takes the session while the first
// is away, then the first is back) are: the site goes back to the first,
// the clone is set aside from then on, also while the first is away for
// less than the takeover time.
func TestInstanceGuardResetAndTakingTurns(t *testing.T) {
	now := start0
	g := &instanceGuard{takeover: 10 * time.Minute}
	st := func(inst string, online bool, conn uint64, at time.Time) instanceVerdict {
		var ts time.Time
		if online {
			ts = at
		}
		return g.status(instStatus("s", inst, online, conn, ts), at)
	}
	// Reset: A's will, then B.
	if v := st("A", true, 1, now); !v.ok {
		t.Fatal(v)
	}
	if v := st("A", false, 1, now.Add(time.Second)); !v.ok {
		t.Fatal(v)
	}
	v := st("B", true, 1, now.Add(2*time.Second))
	if !v.ok || v.replaced != "A" || v.holder != "B" || v.newDup {
		t.Fatalf("a new instance after the holder's will: %+v, want it to replace A", v)
	}
	if !g.update(&wire.ClientUpdate{ClientId: "s", InstanceId: "B"}, now).ok || len(g.report()) != 0 || g.dups.Snapshot()["s"] != 0 {
		t.Fatalf("after a reset: report %+v, dups %v", g.report(), g.dups.Snapshot())
	}

	// A clone taking turns with site u's first installation F.
	t0 := now
	seq := []struct {
		inst   string
		online bool
		conn   uint64
		ok     bool
	}{
		{"F", true, 1, true},  // the first
		{"F", false, 1, true}, // knocked off by the clone: its will
		{"C", true, 1, true},  // the clone replaces it (looks like a reset)
		{"C", false, 1, false},
		{"F", true, 2, true}, // F is back: two take turns; the site is F's
		{"F", false, 2, true},
		{"C", true, 2, false}, // the clone again: set aside
		{"C", false, 2, false},
		{"F", true, 3, true},
	}
	for i, e := range seq {
		at := t0.Add(time.Duration(i) * 3 * time.Second)
		var ts time.Time
		if e.online {
			ts = at
		}
		v := g.status(instStatus("u", e.inst, e.online, e.conn, ts), at)
		if i == 3 {
			// C's will, while it holds the site: its own status.
			if !v.ok {
				t.Fatalf("step %d: %+v", i, v)
			}
			continue
		}
		if v.ok != e.ok {
			t.Fatalf("step %d (%s online %v): ok %v, want %v (%+v)", i, e.inst, e.online, v.ok, e.ok, v)
		}
		if i == 4 && (v.dupOf != "C" || v.holder != "F") {
			t.Fatalf("F back: %+v, want the site F's and C found out", v)
		}
	}
	if g.update(&wire.ClientUpdate{ClientId: "u", InstanceId: "C"}, t0).ok || !g.update(&wire.ClientUpdate{ClientId: "u", InstanceId: "F"}, t0).ok {
		t.Fatal("updates: the clone's must be set aside, the first's applied")
	}
	if d := g.report(); len(d) != 1 || d[0].Site != "u" || d[0].Instance != "F" || len(d[0].Others) != 1 || d[0].Others[0].ID != "C" {
		t.Fatalf("report %+v", d)
	}
	if n := g.dups.Snapshot()["u"]; n != 1 {
		t.Fatalf("duplicates counted %d, want 1", n)
	}
}

package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/proto/wire"
	"github.com/edgefl/edgefl/testkit"
)

// guard bounds every wait of these tests: a failure detector, never a way
// of timing anything (every wait is on a channel).
const guard = 20 * time.Second

func await(t *testing.T, tok mqtt.Token) {
	t.Helper()
	select {
	case <-tok.Done():
		if err := tok.Error(); err != nil {
			t.Fatal(err)
		}
	case <-time.After(guard):
		t.Fatal("MQTT operation timed out")
	}
}

// fakeAgg is test code standing in for the aggregator: it announces rounds,
// collects updates and status messages, and sends receipts.
type fakeAgg struct {
	t          *testing.T
	c          mqtt.Client
	topics     wire.Topics
	updates    chan []byte
	status     chan *wire.ClientStatus
	statistics chan *wire.SiteStatistics
	evals      chan *wire.EvalReport
}

func newFakeAgg(t *testing.T, url string) *fakeAgg {
	t.Helper()
	topics, err := wire.ForFederation(testFed)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeAgg{t: t, topics: topics, updates: make(chan []byte, 100), status: make(chan *wire.ClientStatus, 100),
		statistics: make(chan *wire.SiteStatistics, 100), evals: make(chan *wire.EvalReport, 100)}
	opts := mqtt.NewClientOptions().AddBroker(url).SetClientID("aggregator").SetCleanSession(true).
		SetOrderMatters(true).SetConnectRetry(true).SetConnectRetryInterval(50 * time.Millisecond).
		SetDefaultPublishHandler(func(_ mqtt.Client, m mqtt.Message) {
			kind, msg, err := topics.Decode(m.Topic(), m.Payload(), wire.Limits{})
			switch {
			case err != nil:
				t.Errorf("aggregator got a bad message on %s: %v", m.Topic(), err)
			case kind == wire.KindUpdate:
				switch msg := msg.(type) {
				case *wire.SiteStatistics:
					f.statistics <- msg
				case *wire.EvalReport:
					f.evals <- msg
				default:
					f.updates <- slices.Clone(m.Payload())
				}
			case kind == wire.KindStatus:
				f.status <- msg.(*wire.ClientStatus)
			}
		})
	f.c = mqtt.NewClient(opts)
	await(t, f.c.Connect())
	await(t, f.c.SubscribeMultiple(map[string]byte{topics.UpdateFilter(): 1, topics.StatusFilter(): 1}, nil))
	t.Cleanup(func() { f.c.Disconnect(100) })
	return f
}

func (f *fakeAgg) publishRaw(topic string, b []byte, retained bool) {
	f.t.Helper()
	await(f.t, f.c.Publish(topic, 1, retained, b))
}

func (f *fakeAgg) announce(ann *wire.RoundAnnouncement) {
	f.t.Helper()
	b, err := wire.Encode(ann)
	if err != nil {
		f.t.Fatal(err)
	}
	f.publishRaw(f.topics.Round(), b, true)
}

func (f *fakeAgg) receipt(r *wire.Receipt) {
	f.t.Helper()
	b, err := wire.Encode(r)
	if err != nil {
		f.t.Fatal(err)
	}
	topic, _ := f.topics.Receipt(r.ClientId)
	f.publishRaw(topic, b, false)
}

func accepted(round uint64) *wire.Receipt { return acceptedFor(testSite, round) }

func acceptedFor(id string, round uint64) *wire.Receipt {
	return &wire.Receipt{ClientId: id, Round: round, Accepted: true, StoredAtUnixMs: 1, Code: wire.ReceiptCode_RECEIPT_CODE_STORED, UpdateSeq: round}
}

func (f *fakeAgg) nextUpdate() ([]byte, *wire.ClientUpdate) {
	f.t.Helper()
	select {
	case b := <-f.updates:
		u, err := wire.DecodeUpdate(b, wire.Limits{})
		if err != nil {
			f.t.Fatal(err)
		}
		return b, u
	case <-time.After(guard):
		f.t.Fatal("no update from the agent")
	}
	return nil, nil
}

func (f *fakeAgg) nextStatus() *wire.ClientStatus {
	f.t.Helper()
	select {
	case s := <-f.status:
		return s
	case <-time.After(guard):
		f.t.Fatal("no status from the agent")
	}
	return nil
}

// statusAfter returns the next status other than a repeat of prev: the
// broker can deliver the online status twice (live, and as the retained
// copy when the subscription lands around the publish).
func (f *fakeAgg) statusAfter(prev *wire.ClientStatus) *wire.ClientStatus {
	f.t.Helper()
	for {
		st := f.nextStatus()
		if st.Online != prev.Online || st.Connection != prev.Connection {
			return st
		}
	}
}

// runningAgent is an Agent running in a goroutine, with its events.
type runningAgent struct {
	*Agent
	clk    *clock.Fake
	events chan Event
	cancel context.CancelFunc
	errc   chan error
	logs   *testkit.SyncBuffer // its log lines too, for tests that search them
}

func startAgent(t *testing.T, url, state string, data model.Data) *runningAgent {
	t.Helper()
	return startAgentID(t, testSite, url, state, data)
}

func startAgentID(t *testing.T, id, url, state string, data model.Data) *runningAgent {
	t.Helper()
	cfg := DefaultConfig()
	cfg.SiteID, cfg.Federation, cfg.Brokers, cfg.StateFile = id, testFed, []string{url}, state
	cfg.ReconnectMin, cfg.ReconnectMax = 100*time.Millisecond, time.Second
	return runAgent(t, cfg, &data)
}

// runAgent runs an agent with cfg (and data, when not nil) on the fake
// clock until the test ends, recording its events.
func runAgent(t *testing.T, cfg Config, data *model.Data) *runningAgent {
	t.Helper()
	return runAgentDeps(t, cfg, data, nil)
}

// runAgentDeps is runAgent with more dependencies set by mod.
func runAgentDeps(t *testing.T, cfg Config, data *model.Data, mod func(*Deps)) *runningAgent {
	t.Helper()
	ra := &runningAgent{clk: clock.NewFake(t0), events: make(chan Event, 1000), errc: make(chan error, 1), logs: &testkit.SyncBuffer{}}
	lg := slog.New(slog.NewMultiHandler(testkit.Logger(t).Handler(), slog.NewTextHandler(ra.logs, nil)))
	deps := Deps{
		Clock: ra.clk, Logger: lg, Data: data,
		Observe: func(e Event) {
			select {
			case ra.events <- e:
			default:
				t.Errorf("event dropped: %+v", e)
			}
		},
	}
	if mod != nil {
		mod(&deps)
	}
	a, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	ra.Agent = a
	ctx, cancel := context.WithCancel(context.Background())
	ra.cancel = cancel
	go func() { ra.errc <- a.Run(ctx) }()
	t.Cleanup(ra.stop)
	return ra
}

// stop cancels Run and waits for it (idempotent).
func (ra *runningAgent) stop() {
	ra.cancel()
	if ra.errc == nil {
		return
	}
	select {
	case err := <-ra.errc:
		if err != nil {
			panic(err)
		}
	case <-time.After(guard):
		panic("Run did not return after cancel")
	}
	ra.errc = nil
}

// wait returns the first event matching ok, skipping the others.
func (ra *runningAgent) wait(t *testing.T, what string, ok func(Event) bool) Event {
	t.Helper()
	timeout := time.After(guard)
	for {
		select {
		case e := <-ra.events:
			if ok(e) {
				return e
			}
		case <-timeout:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// nextTimer waits until a timer is armed on the agent's fake clock, moves
// the clock to the earliest deadline (firing what is due) and returns how
// far that was.
func (ra *runningAgent) nextTimer(t *testing.T) time.Duration {
	t.Helper()
	timeout := time.After(guard)
	for {
		armed, ats := ra.clk.Armed()
		if len(ats) > 0 {
			at := slices.MinFunc(ats, time.Time.Compare)
			d := at.Sub(ra.clk.Now())
			ra.clk.Set(at)
			return d
		}
		select {
		case <-armed:
		case <-timeout:
			t.Fatal("no timer armed")
		}
	}
}

func isKind(k EventKind) func(Event) bool { return func(e Event) bool { return e.Kind == k } }

func receiptOf(round uint64) func(Event) bool {
	return func(e Event) bool { return e.Kind == EventReceipt && e.Round == round }
}

func TestAgentThreeRoundsOverMQTT(t *testing.T) {
	_, url := testkit.StartBroker(t)
	agg := newFakeAgg(t, url)
	state := filepath.Join(t.TempDir(), "edge.db")
	data := testData(2, 60)
	ra := startAgent(t, url, state, data)

	st := agg.nextStatus()
	if !st.Online || st.ClientId != testSite || st.SampleCount != uint64(data.N) || len(st.Capabilities) != 2 {
		t.Fatalf("online status %v", st)
	}
	ra.wait(t, "connected", isKind(EventConnected))

	x := f32(testGlobal(1))
	var copyZ []float64 // the aggregator's copy of z
	copyRound := uint64(0)
	for round := uint64(1); round <= 3; round++ {
		ann := announce(t, round, AlgoFedSplit, x)
		agg.announce(ann)
		_, u := agg.nextUpdate()
		// Round 3 follows a rejection: its delta is against x again.
		if u.Round != round || u.SampleCount != uint64(data.N) || u.Kind != wire.UpdateKind_UPDATE_KIND_Z_DELTA || u.BaseRound != copyRound {
			t.Fatalf("round %d: update %v, want a z delta against the copy of round %d", round, u, copyRound)
		}
		base := copyZ
		if u.BaseRound == 0 {
			base = x
		}
		z := plus(base, decodeFrame(t, u.Vector.Payload))
		copyZ, copyRound = z, round
		if round == 2 {
			// A rejection is logged, counted and acked: the aggregator will
			// never take that update.
			agg.receipt(&wire.Receipt{ClientId: testSite, Round: round, Code: wire.ReceiptCode_RECEIPT_CODE_STALE_ROUND, Reason: "round closed"})
			copyZ, copyRound = nil, 0
		} else {
			agg.receipt(accepted(round))
		}
		ra.wait(t, "receipt", receiptOf(round))
		x = f32(z) // the server step with one client: the mean of one z, sent as fp32
	}
	// A duplicate receipt finds nothing to ack and is harmless.
	dup := accepted(3)
	dup.Code = wire.ReceiptCode_RECEIPT_CODE_DUPLICATE
	agg.receipt(dup)
	ra.wait(t, "duplicate receipt", receiptOf(3))

	s := ra.Stats()
	if s.RoundsSolved != 3 || s.ReceiptsAccepted != 3 || s.ReceiptsRejected != 1 || s.BadMessages != 0 || s.BadAnnouncements != 0 {
		t.Fatalf("stats %+v", s)
	}
	ra.stop()
	if st := agg.statusAfter(st); st.Online {
		t.Fatalf("status after a clean shutdown: %v", st)
	}

	store := openStore(t, state)
	defer store.Close()
	es := snapshot(t, store)
	if es.applied != 3 || len(es.outbox) != 0 || es.zRound != 3 || es.serverZRound != 3 || !slices.Equal(es.serverZ, copyZ) {
		t.Fatalf("state after 3 rounds: applied %d, outbox %d, z round %d, copy of round %d equal %v", es.applied, len(es.outbox), es.zRound, es.serverZRound, slices.Equal(es.serverZ, copyZ))
	}
}

func TestAgentResendsAfterReconnectAndRestart(t *testing.T) {
	srv, url := testkit.StartBroker(t)
	agg := newFakeAgg(t, url)
	state := filepath.Join(t.TempDir(), "edge.db")
	data := testData(3, 60)

	ra := startAgent(t, url, state, data)
	ra.wait(t, "connected", isKind(EventConnected))
	agg.announce(announce(t, 1, AlgoFedProx, f32(testGlobal(1))))
	first, u := agg.nextUpdate()
	if u.Round != 1 {
		t.Fatalf("update for round %d", u.Round)
	}
	ra.wait(t, "published", isKind(EventPublished))

	// The broker drops the connection before any receipt: on reconnect the
	// outbox entry goes out again, byte for byte.
	cl, ok := srv.Clients.Get(testSite)
	if !ok {
		t.Fatal("agent not connected to the broker")
	}
	// Drop the connection as a network failure does: close the socket under
	// the broker's reader, which then publishes the last will. (mochi's
	// Client.Stop can land between two packets, and its reader then takes
	// the stop for a clean disconnect and drops the will: mochi v2.7.9
	// Client.Read returns nil once Closed.)
	if err := cl.Net.Conn.Close(); err != nil {
		t.Fatal(err)
	}
	ra.wait(t, "reconnected", isKind(EventConnected))
	if again, _ := agg.nextUpdate(); !slices.Equal(again, first) {
		t.Fatal("re-sent update differs from the committed one")
	}
	ra.stop()
	if s := ra.Stats(); s.RoundsSolved != 1 || s.Connects != 2 {
		t.Fatalf("stats %+v", s)
	}

	// A new agent over the same state file re-sends it on start.
	for len(agg.updates) > 0 {
		<-agg.updates
	}
	rb := startAgent(t, url, state, data)
	rb.wait(t, "connected", isKind(EventConnected))
	if again, _ := agg.nextUpdate(); !slices.Equal(again, first) {
		t.Fatal("update re-sent after restart differs from the committed one")
	}
	// INTERNAL: the aggregator could not store it; the agent keeps it.
	agg.receipt(&wire.Receipt{ClientId: testSite, Round: 1, Code: wire.ReceiptCode_RECEIPT_CODE_INTERNAL, Reason: "disk full"})
	rb.wait(t, "internal receipt", receiptOf(1))
	agg.receipt(accepted(1))
	rb.wait(t, "receipt", receiptOf(1))
	s := rb.Stats()
	rb.stop()
	if s.RoundsSolved != 0 || s.ReceiptsRetry != 1 || s.ReceiptsAccepted != 1 {
		t.Fatalf("the restarted agent: stats %+v", s)
	}
	store := openStore(t, state)
	defer store.Close()
	if es := snapshot(t, store); es.applied != 1 || len(es.outbox) != 0 {
		t.Fatalf("state: applied %d, outbox %d", es.applied, len(es.outbox))
	}
}

func TestAgentDropsBadMessages(t *testing.T) {
	_, url := testkit.StartBroker(t)
	agg := newFakeAgg(t, url)
	state := filepath.Join(t.TempDir(), "edge.db")
	ra := startAgent(t, url, state, testData(4, 60))
	ra.wait(t, "connected", isKind(EventConnected))
	round := agg.topics.Round()
	rcpt, _ := agg.topics.Receipt(testSite)

	ann := announce(t, 1, AlgoFedProx, f32(testGlobal(1)))
	good, err := wire.Encode(ann)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := wire.EncodeVersion(ann, 2)
	if err != nil {
		t.Fatal(err)
	}
	otherReceipt, err := wire.Encode(&wire.Receipt{ClientId: "site-b", Round: 1, Accepted: true, StoredAtUnixMs: 1})
	if err != nil {
		t.Fatal(err)
	}

	bad := []struct {
		name, topic string
		payload     []byte
		want        error
	}{
		{"garbage announcement", round, []byte("\xff\xfe garbage"), wire.ErrMalformed},
		{"wrong version", round, v2, wire.ErrUnsupportedVersion},
		{"garbage receipt", rcpt, []byte{0x08}, nil},
		{"empty receipt", rcpt, nil, nil},
		{"another client's receipt", rcpt, otherReceipt, wire.ErrTopicMismatch},
		{"status on the receipt topic", rcpt, good, wire.ErrWrongType},
	}
	for _, b := range bad {
		// The aggregator's clear of the retained announcement (an empty
		// payload on the round topic) is no bad message: the event seen
		// next is the bad one's.
		agg.publishRaw(round, nil, true)
		agg.publishRaw(b.topic, b.payload, b.topic == round)
		e := ra.wait(t, b.name, isKind(EventBadMessage))
		if b.want != nil && !errors.Is(e.Err, b.want) {
			t.Errorf("%s: %v, want %v", b.name, e.Err, b.want)
		}
	}

	// Valid messages announcing rounds this site cannot run.
	wrongDim := announce(t, 1, AlgoFedProx, make([]float64, testDim+3))
	nan := announce(t, 1, AlgoFedProx, f32(testGlobal(1)))
	nan.Global.Payload = nanFrame(t, testDim)
	for _, ann := range []*wire.RoundAnnouncement{wrongDim, nan} {
		agg.announce(ann)
		e := ra.wait(t, "rejected round", isKind(EventRound))
		if !errors.Is(e.Err, ErrBadAnnouncement) {
			t.Fatalf("bad announcement handled as %v, %v", e.Action, e.Err)
		}
	}
	select {
	case b := <-agg.updates:
		t.Fatalf("an update for a bad announcement: %d bytes", len(b))
	default:
	}

	// The agent is unharmed: the next good announcement runs.
	agg.announce(announce(t, 1, AlgoFedProx, f32(testGlobal(1))))
	if _, u := agg.nextUpdate(); u.Round != 1 {
		t.Fatalf("update for round %d", u.Round)
	}
	s := ra.Stats()
	ra.stop()
	if s.BadMessages != uint64(len(bad)) || s.BadAnnouncements != 2 || s.RoundsSolved != 1 {
		t.Fatalf("stats %+v", s)
	}
	store := openStore(t, state)
	defer store.Close()
	if es := snapshot(t, store); es.applied != 1 || es.seen != 1 || len(es.outbox) != 1 {
		t.Fatalf("state %+v", es)
	}
}

func TestAgentPreemptsOnNewerRound(t *testing.T) {
	_, url := testkit.StartBroker(t)
	agg := newFakeAgg(t, url)
	state := filepath.Join(t.TempDir(), "edge.db")
	ra := startAgent(t, url, state, testData(5, 60))
	ra.wait(t, "connected", isKind(EventConnected))

	// A solve that only a signal ends: SGD to an unreachable gamma, no
	// budget, and the fallback deadline on a clock that does not move.
	endless := func(round uint64) *wire.RoundAnnouncement {
		ann := announce(t, round, AlgoFedProx, f32(testGlobal(round)))
		ann.Params.Solver, ann.Params.Lr, ann.Params.Batch, ann.Params.Gamma = "sgd", 0.01, 5, 1e-15
		ann.Budget = nil
		return ann
	}
	agg.announce(endless(1))
	ra.wait(t, "round 1 taken", func(e Event) bool { return e.Kind == EventHandling && e.Round == 1 })
	agg.announce(endless(2))
	_, u := agg.nextUpdate()
	if u.Round != 1 || u.Report.StopReason != wire.StopReason_STOP_REASON_SIGNAL || !u.Report.Partial {
		t.Fatalf("preempted round: update %v", u)
	}
	ra.wait(t, "round 2 taken", func(e Event) bool { return e.Kind == EventHandling && e.Round == 2 })
	ra.stop() // round 2 is abandoned: nothing committed

	store := openStore(t, state)
	defer store.Close()
	es := snapshot(t, store)
	if es.applied != 1 || len(es.outbox) != 1 || es.outbox[0].Round != 1 || es.globalRound != 2 {
		t.Fatalf("state: applied %d, outbox %v, global of round %d", es.applied, len(es.outbox), es.globalRound)
	}
}

// TestAgentsInOneProcess is what broker-agg demo does: several agents in one
// process, each with its own state file and its data passed in directly.
func TestAgentsInOneProcess(t *testing.T) {
	_, url := testkit.StartBroker(t)
	agg := newFakeAgg(t, url)
	ids := []string{"site-a", "site-b", "site-c"}
	agents := map[string]*runningAgent{}
	for i, id := range ids {
		agents[id] = startAgentID(t, id, url, filepath.Join(t.TempDir(), id+".db"), testData(uint64(10+i), 30+10*i))
		agents[id].wait(t, "connected", isKind(EventConnected))
	}
	for round := uint64(1); round <= 2; round++ {
		ann := announce(t, round, AlgoFedProxSplit, f32(testGlobal(round)))
		expect := len(ids) // an empty selection selects everyone
		if round == 2 {
			ann.Selected = []string{"site-a", "site-c"}
			expect = len(ann.Selected)
		}
		agg.announce(ann)
		got := map[string]bool{}
		for range expect {
			_, u := agg.nextUpdate()
			if u.Round != round || got[u.ClientId] {
				t.Fatalf("round %d: update %v", round, u)
			}
			got[u.ClientId] = true
			if want := agents[u.ClientId].Data().N; u.SampleCount != uint64(want) {
				t.Fatalf("%s: sample count %d, want %d", u.ClientId, u.SampleCount, want)
			}
			agg.receipt(acceptedFor(u.ClientId, round))
		}
		for id := range got {
			agents[id].wait(t, "receipt", receiptOf(round))
		}
	}
	b := agents["site-b"]
	b.wait(t, "not selected in round 2", func(e Event) bool { return e.Kind == EventRound && e.Round == 2 && e.Action == ActionNotSelected })
	for _, id := range ids {
		want := uint64(2)
		if id == "site-b" {
			want = 1
		}
		if s := agents[id].Stats(); s.RoundsSolved != want || s.ReceiptsAccepted != want {
			t.Errorf("%s: stats %+v", id, s)
		}
	}
}

// TestAgentWithMosquitto runs a round against the real Mosquitto broker.
func TestAgentWithMosquitto(t *testing.T) {
	const bin = "/usr/sbin/mosquitto"
	if testing.Short() {
		t.Skip("integration test")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skip("no mosquitto")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := t.TempDir()
	conf := testkit.WriteFileIn(t, dir, "mosquitto.conf", fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\npersistence false\nlog_dest stderr\n", port))
	cmd := exec.Command(bin, "-c", conf)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		_ = cmd.Wait() // its exit status only says it was killed
		if t.Failed() {
			t.Logf("mosquitto:\n%s", logs.String())
		}
	})
	url := fmt.Sprintf("tcp://127.0.0.1:%d", port)
	agg := newFakeAgg(t, url) // retries until mosquitto listens
	state := filepath.Join(dir, "edge.db")
	ra := startAgent(t, url, state, testData(6, 60))
	online := agg.nextStatus()
	if !online.Online {
		t.Fatalf("status %v", online)
	}
	ra.wait(t, "connected", isKind(EventConnected))
	for round := uint64(1); round <= 2; round++ {
		agg.announce(announce(t, round, AlgoFedSplit, f32(testGlobal(round))))
		_, u := agg.nextUpdate()
		if u.Round != round {
			t.Fatalf("update for round %d", u.Round)
		}
		agg.receipt(accepted(round))
		ra.wait(t, "receipt", receiptOf(round))
	}
	ra.stop()
	if st := agg.statusAfter(online); st.Online {
		t.Fatalf("status after shutdown %v", st)
	}
}

// TestAgentRetriesAfterInternalReceipt: an INTERNAL rejection ("the client
// may retry") keeps the update and re-sends it after a backoff, without
// waiting for a reconnection or a re-announcement.
func TestAgentRetriesAfterInternalReceipt(t *testing.T) {
	_, url := testkit.StartBroker(t)
	agg := newFakeAgg(t, url)
	state := filepath.Join(t.TempDir(), "edge.db")
	ra := startAgent(t, url, state, testData(7, 60))
	ra.wait(t, "connected", isKind(EventConnected))
	agg.announce(announce(t, 1, AlgoFedProx, f32(testGlobal(1))))
	first, _ := agg.nextUpdate()
	for attempt := 1; attempt <= 2; attempt++ {
		agg.receipt(&wire.Receipt{ClientId: testSite, Round: 1, Code: wire.ReceiptCode_RECEIPT_CODE_INTERNAL, Reason: "fsync failed"})
		ra.wait(t, "internal receipt", receiptOf(1))
		// The backoff doubles from ReconnectMin (100 ms).
		if d, want := ra.nextTimer(t), 100*time.Millisecond<<(attempt-1); d != want {
			t.Fatalf("attempt %d: re-sent after %v, want %v", attempt, d, want)
		}
		if again, _ := agg.nextUpdate(); !slices.Equal(again, first) {
			t.Fatalf("attempt %d: the re-sent update differs", attempt)
		}
	}
	agg.receipt(accepted(1))
	ra.wait(t, "receipt", func(e Event) bool { return e.Kind == EventReceipt && e.Accepted })
	s := ra.Stats()
	ra.stop()
	if s.ReceiptsRetry != 2 || s.ReceiptsAccepted != 1 || s.Resent != 2 {
		t.Fatalf("stats %+v", s)
	}
	store := openStore(t, state)
	defer store.Close()
	if es := snapshot(t, store); len(es.outbox) != 0 {
		t.Fatalf("outbox %v", es.outbox)
	}
}

// TestAgentNumbersConnections: every connection's statuses carry its number:
// the online status, the last will the broker publishes when the connection
// drops, and the next connection (also after a restart over the same state
// file) a larger number, so the aggregator can set a late will aside.
func TestAgentNumbersConnections(t *testing.T) {
	srv, url := testkit.StartBroker(t)
	agg := newFakeAgg(t, url)
	state := filepath.Join(t.TempDir(), "edge.db")
	data := testData(3, 60)
	// seen is every (online, connection) status received. paho can send a
	// status published from its OnConnect handler twice: it starts the
	// handler before resume() re-sends what its store holds, and a persistent
	// session's store may already hold the new publish (paho v1.5.1
	// client.go: startCommsWorkers, then resume). QoS 1 promises at least
	// once and statuses are idempotent, so a repeat is skipped here.
	type key struct {
		online bool
		conn   uint64
	}
	seen := map[key]bool{}
	recv := func() *wire.ClientStatus {
		t.Helper()
		for {
			s := agg.nextStatus()
			if s.ClientId != testSite || s.Connection == 0 {
				t.Fatalf("status %v, want this site's with a connection number", s)
			}
			if k := (key{s.Online, s.Connection}); !seen[k] {
				seen[k] = true
				return s
			}
		}
	}
	// next returns the next new status of this site.
	next := func(online bool) uint64 {
		t.Helper()
		s := recv()
		if s.Online != online {
			t.Fatalf("status %v, want online = %v", s, online)
		}
		return s.Connection
	}

	ra := startAgent(t, url, state, data)
	ra.wait(t, "connected", isKind(EventConnected))
	first := next(true)
	if first < uint64(t0.UnixMilli()) {
		t.Fatalf("first connection number %d is below the clock's floor %d", first, t0.UnixMilli())
	}
	cl, ok := srv.Clients.Get(testSite)
	if !ok {
		t.Fatal("agent not connected to the broker")
	}
	// Drop the connection as a network failure does: close the socket under
	// the broker's reader, which then publishes the last will. (mochi's
	// Client.Stop can land between two packets, and its reader then takes
	// the stop for a clean disconnect and drops the will: mochi v2.7.9
	// Client.Read returns nil once Closed.)
	if err := cl.Net.Conn.Close(); err != nil {
		t.Fatal(err)
	}
	// The broker publishes the dropped connection's last will from that
	// connection's goroutine while the agent reconnects at once: the will
	// and the new connection's online status arrive in either order (which
	// is why statuses carry connection numbers).
	var will, second uint64
	for will == 0 || second == 0 {
		if s := recv(); s.Online {
			second = s.Connection
		} else {
			will = s.Connection
		}
	}
	if will != first {
		t.Fatalf("the last will carries connection %d, want the dropped connection's %d", will, first)
	}
	if second <= first {
		t.Fatalf("reconnection numbered %d, not above %d", second, first)
	}
	ra.wait(t, "reconnected", isKind(EventConnected))
	ra.stop()
	if off := next(false); off != second {
		t.Fatalf("the shutdown status carries connection %d, want %d", off, second)
	}

	rb := startAgent(t, url, state, data)
	rb.wait(t, "connected", isKind(EventConnected))
	if third := next(true); third <= second {
		t.Fatalf("connection after a restart numbered %d, not above %d", third, second)
	}
}

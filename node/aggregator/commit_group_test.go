package aggregator

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/wire"
)

// receiptLog is an MQTT client that records the receipts the server
// publishes and checks, as each goes out, that the update it answers is
// committed to the state file (a bbolt read sees only committed, fsynced
// transactions).
type receiptLog struct {
	quietClient
	t    *testing.T
	s    *Server
	sent []*wire.Receipt
}

func (c *receiptLog) Publish(topic string, _ byte, _ bool, payload any) mqtt.Token {
	if b, ok := payload.([]byte); ok && strings.Contains(topic, "/receipts/") {
		r, err := wire.DecodeReceipt(b, wire.Limits{})
		if err != nil {
			c.t.Errorf("receipt on %s: %v", topic, err)
			return doneToken{}
		}
		if r.Accepted {
			if _, err := c.s.store.GetUpdate(r.Round, r.ClientId); err != nil {
				c.t.Errorf("receipt %v for (%d, %s) sent before the update was durable: %v", r.Code, r.Round, r.ClientId, err)
			}
		}
		c.sent = append(c.sent, r)
	}
	return doneToken{}
}

// queueUpdates puts updates on s's request queue as the ingest workers do
// when the loop is busy, and returns their requests.
func queueUpdates(s *Server, ups ...*inUpdate) []*request {
	var rs []*request
	for _, u := range ups {
		r := &request{update: u, done: make(chan struct{})}
		s.reqs <- r
		rs = append(rs, r)
	}
	return rs
}

// serveQueued runs the loop's handling of the queued requests and checks
// that every one of them is answered.
func serveQueued(t *testing.T, ab *acceptBench, s *Server, rs []*request) {
	t.Helper()
	for len(s.reqs) > 0 {
		if err := s.serve(ab.ctx, <-s.reqs); err != nil {
			t.Fatal(err)
		}
	}
	for i, r := range rs {
		select {
		case <-r.done:
		default:
			t.Fatalf("request %d was not answered", i)
		}
	}
}

// Group commit: updates that wait while the loop is busy share one write
// transaction; each is receipted only once that transaction is durable, in
// arrival order; a rejection that depends on an update of the group (a
// copy of it) goes out only after the group is durable; a restart (kill -9)
// rebuilds the state from the group's replay log entries; an update that
// closes the round ends its group, and the state written then clears the
// log.
func TestGroupCommit(t *testing.T) {
	const sites = 8
	ab := newAcceptBench(t, sites)
	s := ab.s
	rec := &receiptLog{t: t, s: s}
	s.client, s.reqs = rec, make(chan *request, 2*sites)

	before, enc := commits(t, s), s.encodes
	rs := queueUpdates(s, ab.ups[:5]...)
	serveQueued(t, ab, s, rs)
	if got := commits(t, s) - before; got != 1 {
		t.Errorf("5 waiting updates took %d write transactions, want 1", got)
	}
	if s.encodes != enc {
		t.Errorf("a group of lone accepts encoded the coordinator's state %d times, want 0", s.encodes-enc)
	}
	if es := replayLogOf(t, s.store); len(es) != 5 {
		t.Fatalf("replay log of %d entries, want 5", len(es))
	} else {
		for i, e := range es {
			if e.ClientID != ab.ups[i].msg.ClientId || e.Index != uint64(i+1) {
				t.Errorf("log entry %d: %s at %d", i, e.ClientID, e.Index)
			}
		}
	}
	for i, r := range rec.sent {
		if want := ab.ups[i].msg.ClientId; r.ClientId != want || r.Code != wire.ReceiptCode_RECEIPT_CODE_STORED {
			t.Errorf("receipt %d: %s %v, want %s STORED", i, r.ClientId, r.Code, want)
		}
	}
	live := s.coord.Snapshot()
	if live.Applied != 5 || live.Counters.Accepted != 5 {
		t.Fatalf("live state: applied %d, accepted %d", live.Applied, live.Counters.Accepted)
	}

	// kill -9 after the group's commit: the replay log rebuilds the state.
	s = restartServer(t, s)
	mustEqual(t, "state after restart", s.coord.Snapshot(), live)
	rec = &receiptLog{t: t, s: s}
	s.client, s.reqs = rec, make(chan *request, 2*sites)
	if err := s.apply(ab.ctx, s.coord.Resume(), nil, time.Time{}); err != nil {
		t.Fatal(err)
	}

	// Two new updates, a copy of the first of them (a duplicate only
	// because of the update before it in the same group), then the rest:
	// the copy ends the group.
	rs = queueUpdates(s, ab.ups[5], ab.ups[6], ab.ups[5], ab.ups[7])
	serveQueued(t, ab, s, rs)
	codes := []wire.ReceiptCode{wire.ReceiptCode_RECEIPT_CODE_STORED, wire.ReceiptCode_RECEIPT_CODE_STORED,
		wire.ReceiptCode_RECEIPT_CODE_DUPLICATE, wire.ReceiptCode_RECEIPT_CODE_STORED}
	if len(rec.sent) != len(codes) {
		t.Fatalf("%d receipts, want %d", len(rec.sent), len(codes))
	}
	for i, r := range rec.sent {
		if r.Code != codes[i] || r.ClientId != rs[i].update.msg.ClientId {
			t.Errorf("receipt %d: %s %v, want %s %v", i, r.ClientId, r.Code, rs[i].update.msg.ClientId, codes[i])
		}
	}
	if c := s.coord.Counters(); c.Accepted != sites || c.Rejected[coordinator.Duplicate] != 1 || s.coord.Round() != 2 {
		t.Fatalf("after the round's last update: round %d, counters %+v", s.coord.Round(), c)
	}
	if n := len(replayLogOf(t, s.store)); n != 0 {
		t.Fatalf("after the round closed: %d log entries", n)
	}
}

// The FedSplit family's updates are grouped too, each with its site's new
// z_j in the group's transaction: waiting updates share one commit, every
// receipt goes out once durable, each site's copy of z_j is what it sent,
// and a restart (kill -9) after the commit rebuilds the state; an update
// of a site whose z_j a group holds is not taken into that group.
func TestGroupCommitSplit(t *testing.T) {
	const sites = 8
	ab := newAcceptBenchAlgo(t, sites, AlgoFedSplit)
	s := ab.s
	rec := &receiptLog{t: t, s: s}
	s.client, s.reqs = rec, make(chan *request, 2*sites)
	for i, u := range ab.ups {
		u.msg.Vector.Payload = fp32Frame(t, vecN(float64(i+1)))
		raw, err := wire.Encode(u.msg)
		if err != nil {
			t.Fatal(err)
		}
		u.raw, u.vec = raw, vecN(float64(i+1))
	}
	before := commits(t, s)
	rs := queueUpdates(s, ab.ups[:5]...)
	serveQueued(t, ab, s, rs)
	if got := commits(t, s) - before; got != 1 {
		t.Errorf("5 waiting FedSplit updates took %d write transactions, want 1", got)
	}
	for i, r := range rec.sent {
		if want := ab.ups[i].msg.ClientId; r.ClientId != want || r.Code != wire.ReceiptCode_RECEIPT_CODE_STORED {
			t.Errorf("receipt %d: %s %v, want %s STORED", i, r.ClientId, r.Code, want)
		}
	}
	if len(rec.sent) != 5 {
		t.Fatalf("%d receipts, want 5", len(rec.sent))
	}
	for i, u := range ab.ups[:5] {
		r, z, err := s.store.ClientZ(u.msg.ClientId)
		if err != nil || r != 1 || !slices.Equal(z, vecN(float64(i+1))) {
			t.Errorf("z of %s: round %d, %v, %v; want round 1, %v", u.msg.ClientId, r, z, err, vecN(float64(i+1)))
		}
	}
	live := s.coord.Snapshot()
	s = restartServer(t, s)
	mustEqual(t, "state after restart", s.coord.Snapshot(), live)

	// A site's update while the group holds its z_j: queued behind the
	// group, it is answered on its own (here a copy: DUPLICATE).
	g := &commitGroup{clients: map[string]struct{}{ab.ups[5].msg.ClientId: {}}}
	if !s.splitAlone(g, ab.ups[5]) {
		t.Error("an update of a site in the group joined it")
	}
	if s.splitAlone(&commitGroup{}, ab.ups[5]) {
		t.Error("a new site's first update was kept out of the group")
	}
	if !s.splitAlone(&commitGroup{}, ab.ups[0]) {
		t.Error("an update stored already joined a group")
	}
}

// vecN is testModel's 6 parameters, all c.
func vecN(c float64) []float64 { return []float64{c, c, c, c, c, c} }

// A group whose write fails answers nothing: no receipt, no request done
// (so no broker acknowledgement: the broker redelivers), and the loop
// stops with the error; the restart rebuilds the state from the file,
// without the group's updates, which the sites then send again.
func TestGroupCommitFailureAnswersNothing(t *testing.T) {
	const sites = 4
	ab := newAcceptBench(t, sites)
	s := ab.s
	rec := &receiptLog{t: t, s: s}
	s.client, s.reqs = rec, make(chan *request, 2*sites)
	// Another update written behind the group's back moves the replay
	// log: the group's indexes no longer hold, and its write must fail.
	beforeGroupCommit = func(s *Server) {
		if _, err := s.storeUpdate(ab.ups[2], s.clock.Now()); err != nil {
			t.Error(err)
		}
	}
	defer func() { beforeGroupCommit = nil }()
	rs := queueUpdates(s, ab.ups[0], ab.ups[1])
	err := s.serve(ab.ctx, <-s.reqs)
	if !errors.Is(err, aggstore.ErrGroupMoved) {
		t.Fatalf("serve: %v, want the failed group's error", err)
	}
	if len(rec.sent) != 0 {
		t.Errorf("%d receipts sent for a group that was not written", len(rec.sent))
	}
	for i, r := range rs {
		select {
		case <-r.done:
			t.Errorf("request %d answered although its update was not written", i)
		default:
		}
	}
	for _, u := range ab.ups[:2] {
		if _, err := s.store.GetUpdate(1, u.msg.ClientId); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("%s: %v, want not stored", u.msg.ClientId, err)
		}
	}
	beforeGroupCommit = nil
	s = restartServer(t, s)
	if c := s.coord.Counters(); c.Accepted != 1 {
		t.Fatalf("after the restart: %d accepted, want 1 (the update written outside the group)", c.Accepted)
	}
	rec = &receiptLog{t: t, s: s}
	s.client, s.reqs = rec, make(chan *request, 2*sites)
	if err := s.apply(ab.ctx, s.coord.Resume(), nil, time.Time{}); err != nil {
		t.Fatal(err)
	}
	rs = queueUpdates(s, ab.ups[0], ab.ups[1])
	serveQueued(t, ab, s, rs)
	if len(rec.sent) != 2 || s.coord.Counters().Accepted != 3 {
		t.Fatalf("the re-sent updates: %d receipts, %d accepted", len(rec.sent), s.coord.Counters().Accepted)
	}
}

// Statuses that wait while the loop is busy (the burst of retained
// statuses at start) are written together: one registry transaction and
// one state write for the group, each status answered only after both;
// a restart (kill -9) finds every one of them in the state.
func TestStatusGroup(t *testing.T) {
	const sites, more = 4, 20
	ab := newAcceptBench(t, sites)
	s := ab.s
	s.reqs = make(chan *request, more)
	before, enc := commits(t, s), s.encodes
	var rs []*request
	for i := range more {
		r := &request{status: &wire.ClientStatus{ClientId: fmt.Sprintf("late-%02d", i), Online: true, SampleCount: 10}, done: make(chan struct{})}
		s.reqs <- r
		rs = append(rs, r)
	}
	serveQueued(t, ab, s, rs)
	if got := commits(t, s) - before; got != 2 {
		t.Errorf("%d waiting statuses took %d write transactions, want 2 (the registry's, the state's)", more, got)
	}
	if got := s.encodes - enc; got != 1 {
		t.Errorf("%d waiting statuses encoded the state %d times, want 1", more, got)
	}
	if on := s.coord.Summary().Online; on != sites+more {
		t.Errorf("%d online, want %d", on, sites+more)
	}
	cs, err := s.store.Clients()
	if err != nil {
		t.Fatal(err)
	}
	online := 0
	for _, c := range cs {
		if c.Online {
			online++
		}
	}
	if online != sites+more {
		t.Errorf("the registry has %d online, want %d", online, sites+more)
	}
	live := s.coord.Snapshot()
	s = restartServer(t, s)
	mustEqual(t, "state after restart", s.coord.Snapshot(), live)
}

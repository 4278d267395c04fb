package aggregator

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/broker"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/wire"
	"github.com/edgefl/edgefl/testkit"
	"github.com/edgefl/edgefl/testkit/fedbroker"
)

// The shell's tests run a real embedded broker on a random loopback port,
// the Server over paho, and fake agents (paho clients publishing statuses
// and updates). Time is a clock.Fake; tests wait on channels (agents'
// messages, Server.Watch) with a generous timeout and never sleep.

const (
	testFed  = "fed1"
	waitLong = 30 * time.Second
)

var testModel = model.Spec{Kind: model.KindLogReg, Inputs: 2, Classes: 2} // 6 parameters

var start0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

type fixture struct {
	t     *testing.T
	dir   string
	brk   *broker.Broker
	clock *clock.Fake
}

var siteIDs = []string{"site-a", "site-b", "site-c", "site-d", "site-x", "injector"}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	b := fedbroker.Start(t, testFed, testkit.Logger(t), []string{"injector"}, siteIDs...)
	return &fixture{t: t, dir: t.TempDir(), brk: b, clock: clock.NewFake(start0)}
}

func (f *fixture) config() ServerConfig {
	return ServerConfig{
		Federation: testFed, BrokerURL: f.brk.URL(), Username: fedbroker.Aggregator, Password: fedbroker.AggregatorPassword,
		K: 3, QuorumFraction: 1, RoundTimeout: time.Minute, Rounds: 0, Seed: 7,
		Algorithm: AlgoFedAvg, Model: testModel, StatePath: filepath.Join(f.dir, "state.db"),
		Clock: f.clock, Logger: testkit.Logger(f.t),
		Params: Params{Solver: "sgd", LR: 0.1, MaxEpochs: 1, Gamma: 0.5},
	}
}

type running struct {
	s      *Server
	cancel context.CancelFunc
	done   chan error
	rounds chan RoundReport
}

func (f *fixture) start(cfg ServerConfig) *running {
	f.t.Helper()
	r := &running{done: make(chan error, 1), rounds: make(chan RoundReport, 100)}
	cfg.OnRound = func(rr RoundReport) { r.rounds <- rr }
	s, err := NewServer(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	r.s = s
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- s.Run(ctx) }()
	select {
	case <-s.Ready():
	case err := <-r.done:
		f.t.Fatalf("Run returned before ready: %v", err)
	case <-time.After(waitLong):
		f.t.Fatal("server not ready")
	}
	f.t.Cleanup(func() { r.stop(f.t) })
	return r
}

func (r *running) stop(t *testing.T) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(waitLong):
		t.Fatal("Run did not return")
	}
}

func (r *running) round(t *testing.T) RoundReport {
	t.Helper()
	select {
	case rr := <-r.rounds:
		return rr
	case <-time.After(waitLong):
		t.Fatal("no round aggregated")
		return RoundReport{}
	}
}

// waitView waits until cond holds for the server's view.
func waitView(t *testing.T, s *Server, what string, cond func(ServerView) bool) ServerView {
	t.Helper()
	deadline := time.After(waitLong)
	for {
		v, ch := s.Watch()
		if cond(v) {
			return v
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %s; view %+v", what, v)
		}
	}
}

type fakeAgent struct {
	id       string
	c        paho.Client
	topics   wire.Topics
	rounds   chan *wire.RoundAnnouncement
	receipts chan *wire.Receipt
	invites  chan *wire.Receipt // RECEIPT_SUBJECT_INVITATION: private selection (--dp)

	// The run topic, as an agent uses it: announcements name the schema
	// and transform by digest; they are filled in from the run spec's
	// bodies (waiting for it if it comes second).
	mu      sync.Mutex
	bodies  wire.BodyCache
	waiting []*wire.RoundAnnouncement
	specs   []*wire.RunSpec // every run spec received, in order
	inline  int             // announcements that carried a schema or transform body
}

// agent connects a fake site (persistent session, will = offline),
// subscribes to round and its receipts, and publishes its online status
// unless samples is 0.
func (f *fixture) agent(id string, samples uint64) *fakeAgent {
	f.t.Helper()
	topics, _ := wire.ForFederation(testFed)
	a := &fakeAgent{id: id, topics: topics, rounds: make(chan *wire.RoundAnnouncement, 100), receipts: make(chan *wire.Receipt, 100), invites: make(chan *wire.Receipt, 100)}
	status, _ := topics.Status(id)
	rcpt, _ := topics.Receipt(id)
	will, _ := wire.Encode(&wire.ClientStatus{ClientId: id, Online: false})
	handler := func(_ paho.Client, m paho.Message) {
		if len(m.Payload()) == 0 {
			return
		}
		_, msg, err := topics.Decode(m.Topic(), m.Payload(), wire.Limits{})
		if err != nil {
			return
		}
		switch msg := msg.(type) {
		case *wire.RoundAnnouncement:
			a.mu.Lock()
			if len(msg.Schema) > 0 || len(msg.Transform) > 0 {
				a.inline++
			}
			if a.bodies.Resolve(msg) != nil {
				a.waiting = append(a.waiting, msg)
				a.mu.Unlock()
				return
			}
			a.mu.Unlock()
			a.rounds <- msg
		case *wire.RunSpec:
			a.mu.Lock()
			a.specs = append(a.specs, msg)
			a.bodies.Add(msg)
			var ready []*wire.RoundAnnouncement
			a.waiting = slices.DeleteFunc(a.waiting, func(r *wire.RoundAnnouncement) bool {
				if a.bodies.Resolve(r) == nil {
					ready = append(ready, r)
					return true
				}
				return false
			})
			a.mu.Unlock()
			for _, r := range ready {
				a.rounds <- r
			}
		case *wire.Receipt:
			if msg.Subject == wire.ReceiptSubject_RECEIPT_SUBJECT_INVITATION {
				a.invites <- msg // under --dp: the private selection, apart from the answers
				return
			}
			a.receipts <- msg
		}
	}
	o := paho.NewClientOptions().AddBroker(f.brk.URL()).SetClientID(id).SetUsername(id).SetPassword(fedbroker.Password(id)).
		SetCleanSession(false).SetOrderMatters(false).SetProtocolVersion(4).SetConnectTimeout(waitLong).
		SetBinaryWill(status, will, 1, true).SetDefaultPublishHandler(handler)
	a.c = paho.NewClient(o)
	if tok := a.c.Connect(); !tok.WaitTimeout(waitLong) || tok.Error() != nil {
		f.t.Fatalf("agent %s connect: %v", id, tok.Error())
	}
	f.t.Cleanup(func() { a.c.Disconnect(100) })
	tok := a.c.SubscribeMultiple(map[string]byte{topics.Round(): 1, topics.Run(): 1, rcpt: 1}, handler)
	if !tok.WaitTimeout(waitLong) || tok.Error() != nil {
		f.t.Fatalf("agent %s subscribe: %v", id, tok.Error())
	}
	if samples > 0 {
		a.status(f.t, true, samples)
	}
	return a
}

func (a *fakeAgent) status(t *testing.T, online bool, samples uint64) {
	t.Helper()
	topic, _ := a.topics.Status(a.id)
	b, err := wire.Encode(&wire.ClientStatus{ClientId: a.id, Online: online, SampleCount: samples, SoftwareVersion: "test"})
	if err != nil {
		t.Fatal(err)
	}
	a.pub(t, topic, true, b)
}

func (a *fakeAgent) pub(t *testing.T, topic string, retained bool, b []byte) {
	t.Helper()
	if tok := a.c.Publish(topic, 1, retained, b); !tok.WaitTimeout(waitLong) || tok.Error() != nil {
		t.Fatalf("%s publish %s: %v", a.id, topic, tok.Error())
	}
}

// nextRound returns the first announcement of round (skipping others).
func (a *fakeAgent) nextRound(t *testing.T, round uint64) *wire.RoundAnnouncement {
	t.Helper()
	deadline := time.After(waitLong)
	for {
		select {
		case r := <-a.rounds:
			if r.Round == round {
				return r
			}
		case <-deadline:
			t.Fatalf("%s: no announcement of round %d", a.id, round)
		}
	}
}

func (a *fakeAgent) receipt(t *testing.T) *wire.Receipt {
	t.Helper()
	select {
	case r := <-a.receipts:
		return r
	case <-time.After(waitLong):
		t.Fatalf("%s: no receipt", a.id)
		return nil
	}
}

// answer is the next receipt answering a message of subject and round,
// after any DUPLICATE answer to another one: the server acknowledges a
// message to the broker only after answering it, so a server stopped
// right after an answer may leave it unacknowledged, and the broker
// redelivers it to the next server, which answers it again (at-least-once,
// as designed).
func (a *fakeAgent) answer(t *testing.T, subject wire.ReceiptSubject, round uint64) *wire.Receipt {
	t.Helper()
	for {
		r := a.receipt(t)
		if r.Code == wire.ReceiptCode_RECEIPT_CODE_DUPLICATE && (r.Subject != subject || r.Round != round) {
			continue
		}
		return r
	}
}

// send publishes an update on the agent's own topic.
func (a *fakeAgent) send(t *testing.T, u *wire.ClientUpdate) {
	t.Helper()
	b, err := wire.Encode(u)
	if err != nil {
		t.Fatal(err)
	}
	a.sendRaw(t, b)
}

func (a *fakeAgent) sendRaw(t *testing.T, b []byte) {
	t.Helper()
	topic, _ := a.topics.Update(a.id)
	a.pub(t, topic, false, b)
}

func fp32(t *testing.T, v []float64) []byte {
	t.Helper()
	c, err := quant.Parse("fp32")
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Encode(nil, v, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// update builds a valid FULL update.
func update(t *testing.T, id string, round uint64, vec []float64, samples uint64) *wire.ClientUpdate {
	return &wire.ClientUpdate{ClientId: id, Round: round, Kind: wire.UpdateKind_UPDATE_KIND_FULL,
		Vector:      &wire.Vector{Codec: "fp32", Dimension: uint32(len(vec)), Payload: fp32(t, vec)},
		SampleCount: samples, Report: &wire.WorkReport{AnchorLoss: 0.5, Epochs: 1, StopReason: wire.StopReason_STOP_REASON_MAX_EPOCHS},
		Seq: round}
}

// vec returns a 6-vector of small halves (exact in float32).
func vec(base float64) []float64 {
	v := make([]float64, 6)
	for i := range v {
		v[i] = base + float64(i)/2
	}
	return v
}

func decodeGlobal(t *testing.T, a *wire.RoundAnnouncement) []float64 {
	t.Helper()
	c, _ := quant.Parse("fp32")
	x, err := c.Decode(a.Global.Payload, nil)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func closeTo(a, b []float64, tol float64) error {
	if len(a) != len(b) {
		return fmt.Errorf("lengths %d, %d", len(a), len(b))
	}
	for i := range a {
		if math.Abs(a[i]-b[i]) > tol {
			return fmt.Errorf("[%d]: %v vs %v", i, a[i], b[i])
		}
	}
	return nil
}

func wantReceipt(t *testing.T, r *wire.Receipt, round uint64, accepted bool, code wire.ReceiptCode) {
	t.Helper()
	if r.Round != round || r.Accepted != accepted || r.Code != code {
		t.Fatalf("receipt %v, want round %d accepted %v code %v", r, round, accepted, code)
	}
}

// rawFrameFP32 encodes v (finite or not) as an uncompressed fp32 frame:
// the header of a valid "fp32+raw" frame with its values and CRC redone.
func rawFrameFP32(v []float64) []byte {
	c, _ := quant.Parse("fp32+raw")
	zero := make([]float64, len(v))
	f, _ := c.Encode(nil, zero, nil, nil)
	// fp32 values are byte-plane shuffled: byte j of value i at 32 + j*n + i.
	n := len(v)
	for i, x := range v {
		bits := math.Float32bits(float32(x))
		for j := 0; j < 4; j++ {
			f[32+j*n+i] = byte(bits >> (8 * j))
		}
	}
	crc := crc32.Checksum(f[:len(f)-4], crc32.MakeTable(crc32.Castagnoli))
	binary.LittleEndian.PutUint32(f[len(f)-4:], crc)
	return f
}

// evalData is a small classification set with d features.
func evalData(d int) *model.Data {
	x := make([]float64, 4*d)
	for i := range x {
		x[i] = float64(i%5) - 2
	}
	return &model.Data{N: 4, D: d, X: x, Y: []float64{0, 1, 0, 1}}
}

// statusOfFile is ReadStatus of the state file at path (the daemon
// stopped), as `broker-agg status --state` reads it.
func statusOfFile(t *testing.T, path string) Status {
	t.Helper()
	st, err := aggstore.OpenAgg(path, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	status, err := ReadStatus(st)
	if err != nil {
		t.Fatal(err)
	}
	return status
}

// mustEqual fails the test unless got and want are deeply equal (the
// coordinator package's tests have their own copy).
func mustEqual(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got  %+v\n want %+v", what, got, want)
	}
}

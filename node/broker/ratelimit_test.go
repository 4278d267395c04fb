package broker

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/internal/ratelimit"
	"github.com/edgefl/edgefl/testkit"
)

var t0 = time.Date(2026, 11, 27, 8, 0, 0, 0, time.UTC)

// limitedBroker is passwordBroker with the rate limit lim on a fake clock
// (frozen unless the test advances it: no bucket refills by itself).
func limitedBroker(t *testing.T, lim ratelimit.Limits) (*Broker, *clock.Fake, *testkit.SyncBuffer) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "passwd")
	for _, u := range []string{"site-a", "site-b"} {
		if err := SetPassword(p, u, u+"-pw", testIt); err != nil {
			t.Fatal(err)
		}
	}
	fake := clock.NewFake(t0)
	logs := new(testkit.SyncBuffer)
	b, err := Start(Config{Addr: "127.0.0.1:0", Prefix: prefix, PasswordFile: p, Users: map[string]string{"aggregator": "agg-pw"},
		Superusers: []string{"aggregator"}, MaxPacketSize: 4096, RateLimit: lim, Clock: fake, Logger: slog.New(slog.NewJSONHandler(io.MultiWriter(logs, testkit.LogWriter(t)), nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, fake, logs
}

// gatedSubscriber is the aggregator on its in-process connection (as
// broker-agg runs it: net.Pipe, no socket buffer), subscribed to every
// update; its handler blocks until open is closed, so that what the broker
// routes to it waits in the broker's queue for its connection.
type gatedSubscriber struct {
	c    paho.Client
	open chan struct{}
	mu   sync.Mutex
	got  map[string]int // payload prefix -> messages
	seen chan string    // every payload, after the gate
}

func newGatedSubscriber(t *testing.T, b *Broker) *gatedSubscriber {
	t.Helper()
	g := &gatedSubscriber{open: make(chan struct{}), got: map[string]int{}, seen: make(chan string, 1<<16)}
	o := paho.NewClientOptions().AddBroker("tcp://in-process").SetClientID("aggregator").SetProtocolVersion(4).
		SetAutoReconnect(false).SetConnectTimeout(waitFor).
		SetCustomOpenConnectionFn(func(*url.URL, paho.ClientOptions) (net.Conn, error) { return b.Dial() })
	g.c = paho.NewClient(o)
	if tok := g.c.Connect(); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("in-process connect: %v", tok.Error())
	}
	t.Cleanup(func() {
		g.release()
		g.c.Disconnect(0)
	})
	tok := g.c.Subscribe(prefix+"updates/+", 1, func(_ paho.Client, m paho.Message) {
		<-g.open
		kind, _, _ := strings.Cut(string(m.Payload()), " ")
		g.mu.Lock()
		g.got[kind]++
		g.mu.Unlock()
		g.seen <- string(m.Payload())
	})
	if !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	return g
}

func (g *gatedSubscriber) release() {
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

// waitFor waits for the payload want, failing after waitFor.
func (g *gatedSubscriber) waitFor(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		select {
		case p := <-g.seen:
			if p == want {
				return
			}
		case <-deadline:
			t.Fatalf("%q never reached the subscriber", want)
		}
	}
}

func (g *gatedSubscriber) count(kind string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.got[kind]
}

// waitHandled waits until the broker has read all n publishes of id
// (passed or dropped).
func waitHandled(t *testing.T, b *Broker, id string, n uint64) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for b.Passed()[id]+b.RateLimited()[id] < n {
		if time.Now().After(deadline) {
			t.Fatalf("the broker handled %d passed + %d dropped of %s's %d publishes", b.Passed()[id], b.RateLimited()[id], id, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// One authenticated site floods its update topic while the aggregator is
// too busy to read: the broker routes only its burst, drops the rest
// before anything is queued for the aggregator (counted and logged), and
// another site's updates, sent during the flood, are not limited and are
// delivered. What waited in the broker's queue for the aggregator is
// counted when the aggregator reads again: exactly the burst and the honest
// site's messages. Without the limit all 3,000 would wait there (mochi
// queues up to 8,192 packets a client).
func TestRateLimitFlood(t *testing.T) {
	const (
		burst = 50
		flood = 3000
	)
	b, _, logs := limitedBroker(t, ratelimit.Limits{Messages: 10, Burst: burst})
	agg := newGatedSubscriber(t, b)
	siteA := mustDial(t, b.URL(), opts{id: "site-a", user: "site-a", pass: "site-a-pw"})
	siteB := mustDial(t, b.URL(), opts{id: "site-b", user: "site-b", pass: "site-b-pw"})

	var honest []paho.Token
	for i := range flood {
		siteA.c.Publish(prefix+"updates/site-a", 0, false, fmt.Sprintf("flood %d", i))
		if i%1000 == 500 {
			honest = append(honest, siteB.c.Publish(prefix+"updates/site-b", 1, false, fmt.Sprintf("honest %d", i)))
		}
	}
	waitHandled(t, b, "site-a", flood)
	if got := b.Passed()["site-a"]; got != burst {
		t.Errorf("%d of the flood passed the limit, want the burst of %d (the clock is frozen)", got, burst)
	}
	if got := b.RateLimited()["site-a"]; got != flood-burst {
		t.Errorf("%d of the flood counted as dropped, want %d", got, flood-burst)
	}
	if n := b.RateLimited()["site-b"]; n != 0 {
		t.Errorf("the honest site was rate-limited %d times", n)
	}
	if n := b.RateLimited()["aggregator"]; n != 0 {
		t.Errorf("the superuser was rate-limited %d times", n)
	}
	if n := strings.Count(logs.String(), "over its message rate limit"); n != 1 {
		t.Errorf("%d log lines about the drops, want 1 (at most one per 10 s)\n%s", n, logs)
	}
	if !strings.Contains(logs.String(), `"dropped":1,`) || !strings.Contains(logs.String(), `"client_id":"site-a"`) {
		t.Errorf("log line lacks the client or count:\n%s", logs)
	}

	// The aggregator reads again: a marker sent now arrives after
	// everything queued before it (one subscriber's queue is in order).
	agg.release()
	// (mochi routes a QoS 1 publish under its subscriber's lock, which
	// the aggregator's blocked connection holds: the honest site's
	// later updates are acknowledged once the aggregator reads again.)
	for _, tok := range honest {
		if !tok.WaitTimeout(waitFor) || tok.Error() != nil {
			t.Fatalf("an honest site's update during the flood was not acknowledged: %v", tok.Error())
		}
	}
	siteB.publish(t, prefix+"updates/site-b", 0, "marker")
	agg.waitFor(t, "marker")
	if n := agg.count("flood"); n != burst {
		t.Errorf("%d flood messages had queued for the aggregator, want %d", n, burst)
	}
	if n := agg.count("honest"); n != len(honest) {
		t.Errorf("%d of the honest site's %d updates reached the aggregator", n, len(honest))
	}
	if n := b.srv.Info.MessagesDropped; n != 0 {
		t.Errorf("mochi dropped %d messages from a full queue", n)
	}
}

// Over the limit, an MQTT 3.1.1 QoS 1 publish gets no PUBACK (it was not
// delivered) and the client stays connected; once its bucket refills, the
// message paho re-sends on its next connection is delivered and
// acknowledged: an honest site's re-sends are not starved.
func TestRateLimitQoS1Resend(t *testing.T) {
	b, fake, _ := limitedBroker(t, ratelimit.Limits{Messages: 1, Burst: 1})
	agg := newGatedSubscriber(t, b)
	agg.release()
	reconnected := make(chan struct{}, 4)
	o := paho.NewClientOptions().AddBroker(b.URL()).SetClientID("site-a").SetUsername("site-a").SetPassword("site-a-pw").
		SetCleanSession(false).SetProtocolVersion(4).SetConnectTimeout(waitFor).
		SetAutoReconnect(true).SetMaxReconnectInterval(50 * time.Millisecond).
		SetOnConnectHandler(func(paho.Client) { reconnected <- struct{}{} })
	site := paho.NewClient(o)
	if tok := site.Connect(); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	t.Cleanup(func() { site.Disconnect(0) })
	<-reconnected

	first := site.Publish(prefix+"updates/site-a", 1, false, "update 1")
	if !first.WaitTimeout(waitFor) || first.Error() != nil {
		t.Fatalf("first update: %v", first.Error())
	}
	agg.waitFor(t, "update 1")
	second := site.Publish(prefix+"updates/site-a", 1, false, "update 2")
	waitHandled(t, b, "site-a", 2)
	if second.WaitTimeout(200 * time.Millisecond) {
		t.Fatalf("an update over the limit was acknowledged (err %v)", second.Error())
	}
	if !site.IsConnectionOpen() {
		t.Fatal("the client was disconnected for going over its limit")
	}

	// A second later its bucket holds a message again. The connection
	// drops (the broker kicks it here); paho re-sends the unacknowledged
	// update when it is back, and that one passes.
	fake.Advance(time.Second)
	cl, ok := b.srv.Clients.Get("site-a")
	if !ok {
		t.Fatal("site-a unknown to the broker")
	}
	_ = b.srv.DisconnectClient(cl, packets.ErrServerBusy)
	<-reconnected
	if !second.WaitTimeout(waitFor) || second.Error() != nil {
		t.Fatalf("the re-sent update was not acknowledged: %v", second.Error())
	}
	agg.waitFor(t, "update 2")
	if got := b.RateLimited()["site-a"]; got != 1 {
		t.Errorf("dropped %d, want 1", got)
	}
}

// Over the limit, an MQTT 5 QoS 1 publish gets a PUBACK with reason code
// 0x96 (message rate too high) and is not delivered. paho.mqtt.golang
// speaks 3.1.1 only: the client here is mochi's own packet codec on a raw
// connection.
func TestRateLimitMQTT5Puback(t *testing.T) {
	b, _, _ := limitedBroker(t, ratelimit.Limits{Messages: 1, Burst: 1})
	agg := newGatedSubscriber(t, b)
	agg.release()
	conn, err := net.Dial("tcp", b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(waitFor))
	r := bufio.NewReader(conn)
	send := func(pk packets.Packet, encode func(*packets.Packet, *bytes.Buffer) error) {
		t.Helper()
		var buf bytes.Buffer
		if err := encode(&pk, &buf); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(buf.Bytes()); err != nil {
			t.Fatal(err)
		}
	}
	read := func() packets.Packet {
		t.Helper()
		hb, err := r.ReadByte()
		if err != nil {
			t.Fatal(err)
		}
		pk := packets.Packet{ProtocolVersion: 5}
		if err := pk.FixedHeader.Decode(hb); err != nil {
			t.Fatal(err)
		}
		n, _, err := packets.DecodeLength(r)
		if err != nil {
			t.Fatal(err)
		}
		pk.FixedHeader.Remaining = n
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			t.Fatal(err)
		}
		switch pk.FixedHeader.Type {
		case packets.Connack:
			err = pk.ConnackDecode(body)
		case packets.Puback:
			err = pk.PubackDecode(body)
		default:
			t.Fatalf("unexpected packet type %d", pk.FixedHeader.Type)
		}
		if err != nil {
			t.Fatal(err)
		}
		return pk
	}
	send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 5,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), Clean: true, Keepalive: 30, ClientIdentifier: "site-a",
			UsernameFlag: true, Username: []byte("site-a"), PasswordFlag: true, Password: []byte("site-a-pw")}}, (*packets.Packet).ConnectEncode)
	if ack := read(); ack.FixedHeader.Type != packets.Connack || ack.ReasonCode != 0 {
		t.Fatalf("CONNACK %+v", ack)
	}
	for id, want := range []byte{0, packets.ErrMessageRateTooHigh.Code} {
		payload := fmt.Sprintf("v5 %d", id+1)
		send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, ProtocolVersion: 5,
			TopicName: prefix + "updates/site-a", PacketID: uint16(id + 1), Payload: []byte(payload)}, (*packets.Packet).PublishEncode)
		ack := read()
		if ack.FixedHeader.Type != packets.Puback || ack.PacketID != uint16(id+1) || ack.ReasonCode != want {
			t.Fatalf("publish %d: got %+v, want a PUBACK with reason %#x", id+1, ack, want)
		}
	}
	agg.waitFor(t, "v5 1")
	if n := agg.count("v5"); n != 1 {
		t.Errorf("%d MQTT 5 publishes delivered, want 1", n)
	}
	if got := b.RateLimited()["site-a"]; got != 1 {
		t.Errorf("dropped %d, want 1", got)
	}
}

// The limit is per byte too: a message of the largest size passes once,
// then the bucket holds only what the byte rate refills.
func TestRateLimitBytes(t *testing.T) {
	b, fake, _ := limitedBroker(t, ratelimit.Limits{Messages: 100, Burst: 100, Bytes: 1000}) // packets up to 4,096 bytes
	agg := newGatedSubscriber(t, b)
	agg.release()
	site := mustDial(t, b.URL(), opts{id: "site-a", user: "site-a", pass: "site-a-pw"})
	big := "big " + strings.Repeat("x", 3000)
	site.publish(t, prefix+"updates/site-a", 0, big)
	agg.waitFor(t, big)
	site.publish(t, prefix+"updates/site-a", 0, "big dropped "+strings.Repeat("x", 1100))
	waitHandled(t, b, "site-a", 2)
	fake.Advance(time.Second)
	site.publish(t, prefix+"updates/site-a", 0, "small")
	agg.waitFor(t, "small")
	if n := agg.count("big"); n != 1 {
		t.Errorf("%d big messages delivered, want 1", n)
	}
	if got := b.RateLimited()["site-a"]; got != 1 {
		t.Errorf("dropped %d, want 1", got)
	}
}

func TestRateLimitBadConfig(t *testing.T) {
	cfg := Config{Addr: "127.0.0.1:0", Prefix: prefix, AllowAnonymous: true, RateLimit: ratelimit.Limits{Messages: -1}}
	if err := Check(cfg); err == nil {
		t.Error("Check accepted a negative rate")
	}
	if b, err := Start(cfg); err == nil {
		b.Close()
		t.Error("Start accepted a negative rate")
	}
}

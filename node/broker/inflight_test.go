package broker

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgefl/edgefl/internal/ratelimit"
)

// heldAggregator connects in-process as the aggregator does (broker-agg
// run: paho over Broker.Dial, handlers not ordered, each message
// acknowledged only once handled) and subscribes to every site's status;
// its handler counts a message and holds it, unacknowledged, until release
// is closed: an aggregator still writing what came before.
func heldAggregator(t *testing.T, b *Broker, release <-chan struct{}) *atomic.Int64 {
	t.Helper()
	var got atomic.Int64
	o := paho.NewClientOptions().AddBroker("tcp://in-process").SetClientID("aggregator").SetProtocolVersion(4).
		SetCleanSession(false).SetOrderMatters(false).SetAutoAckDisabled(true).
		SetAutoReconnect(false).SetConnectTimeout(waitFor).
		SetCustomOpenConnectionFn(func(*url.URL, paho.ClientOptions) (net.Conn, error) { return b.Dial() })
	agg := paho.NewClient(o)
	if tok := agg.Connect(); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	t.Cleanup(func() { agg.Disconnect(0) })
	tok := agg.Subscribe(prefix+"clients/+/status", 1, func(_ paho.Client, m paho.Message) {
		got.Add(1)
		<-release
		m.Ack()
	})
	if !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	return &got
}

// publishStatuses connects as site id over TCP and publishes n QoS 1
// statuses back to back, then reads the broker's n PUBACKs: a
// lightweight session (no paho, one goroutine).
func publishStatuses(t *testing.T, addr, id string, n int) error {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	var buf bytes.Buffer
	cp := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 4,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), Keepalive: 0, ClientIdentifier: id, Clean: true,
			UsernameFlag: true, Username: []byte(id), PasswordFlag: true, Password: []byte(id + "-pw")}}
	if err := cp.ConnectEncode(&buf); err != nil {
		return err
	}
	for i := range n {
		pp := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, ProtocolVersion: 4,
			PacketID: uint16(i + 1), TopicName: prefix + "clients/" + id + "/status", Payload: []byte("online")}
		if err := pp.PublishEncode(&buf); err != nil {
			return err
		}
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		return err
	}
	_ = conn.SetReadDeadline(time.Now().Add(waitFor))
	// CONNACK (4 bytes), then a PUBACK (4 bytes) per publish.
	_, err = io.ReadFull(conn, make([]byte, 4+4*n))
	return err
}

// inflightBroker starts a broker for sites site-000..site-(n-1) (plain
// passwords; no rate limit worth the name: the test's sites publish in
// bursts) with the aggregator as superuser.
func inflightBroker(t *testing.T, sites int, maxInflight uint16) *Broker {
	t.Helper()
	users := map[string]string{}
	for i := range sites {
		id := fmt.Sprintf("site-%03d", i)
		users[id] = id + "-pw"
	}
	return startBroker(t, Config{Users: users, Superusers: []string{"aggregator"}, MaxInflight: maxInflight,
		RateLimit: ratelimit.Limits{Messages: 1e6, Burst: 100_000, Bytes: 1e9}})
}

// sendAll has each of sites publish per statuses at once and waits for
// the broker's PUBACKs (every message was taken and routed).
func sendAll(t *testing.T, b *Broker, sites, per int) {
	t.Helper()
	errs := make(chan error, sites)
	for i := range sites {
		go func() { errs <- publishStatuses(t, b.Addr(), fmt.Sprintf("site-%03d", i), per) }()
	}
	for range sites {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// waitCount waits until got reaches want or stops moving for a second.
func waitCount(got *atomic.Int64, want int64) int64 {
	last, still := got.Load(), time.Now()
	for deadline := time.Now().Add(waitFor); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		n := got.Load()
		if n >= want {
			return n
		}
		if n != last {
			last, still = n, time.Now()
		} else if time.Since(still) > time.Second {
			return n
		}
	}
	return got.Load()
}

// More messages than mochi's default store of unacknowledged messages
// per client (8,192) reach the aggregator while it has acknowledged none:
// the burst of statuses at start (every site's retained status at once)
// or a round's updates, at about 8,200 sites and more. Every one must
// reach it; mochi dropped those past 8,192 without a trace.
func TestAggregatorHoldsMoreThanMochisDefault(t *testing.T) {
	const sites, per = 30, 300 // 9,000 messages
	b := inflightBroker(t, sites, 0)
	release := make(chan struct{})
	defer close(release)
	got := heldAggregator(t, b, release)
	sendAll(t, b, sites, per)
	if n := waitCount(got, sites*per); n != sites*per {
		t.Errorf("the aggregator got %d of %d messages (dropped: %v)", n, sites*per, b.Dropped())
	}
	for reason, n := range b.Dropped() {
		if n != 0 {
			t.Errorf("dropped %d (%s), want none", n, reason)
		}
	}
}

// Past Config.MaxInflight the broker still drops (MQTT numbers at most
// 65,535 unacknowledged messages on a connection), but not silently: each
// drop is counted by reason and the full store is logged.
func TestAggregatorDropsAreCounted(t *testing.T) {
	const sites, per, limit = 4, 50, 120
	b := inflightBroker(t, sites, limit)
	release := make(chan struct{})
	defer close(release)
	got := heldAggregator(t, b, release)
	sendAll(t, b, sites, per)
	// mochi checks the store's size before it adds to it, not atomically
	// with it: concurrent publishers may take it a little past the limit.
	// Every message is either delivered or counted.
	n := waitCount(got, sites*per)
	d := b.Dropped()
	if n < limit || n > limit+sites || d["inflight_full"] != uint64(sites*per-n) || d["write_queue_full"] != 0 {
		t.Errorf("the aggregator got %d of %d messages, dropped %v: want about %d delivered, the rest counted as inflight_full", n, sites*per, d, limit)
	}
}

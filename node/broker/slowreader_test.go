package broker

import (
	"bytes"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"
)

// rawSubscriber connects as id with MQTT 3.1.1 and keepalive 0 (nothing
// ever times out), subscribes to filter, and returns the connection, which
// the caller reads as it pleases.
func rawSubscriber(t *testing.T, addr, id, filter string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	var buf bytes.Buffer
	cp := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 4,
		Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), Keepalive: 0, ClientIdentifier: id,
			UsernameFlag: true, Username: []byte(id), PasswordFlag: true, Password: []byte(id + "-pw")}}
	sp := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, ProtocolVersion: 4, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: filter, Qos: 1}}}
	if cp.ConnectEncode(&buf) != nil || sp.SubscribeEncode(&buf) != nil {
		t.Fatal("encoding")
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	// CONNACK (4 bytes) and SUBACK (5 bytes).
	if _, err := io.ReadFull(conn, make([]byte, 9)); err != nil {
		t.Fatalf("CONNACK/SUBACK: %v", err)
	}
	return conn
}

// One site subscribes to the round and stops reading (keepalive 0, so no
// keepalive ends it): once its socket buffers are full, the broker's write
// to it blocks while holding its lock, and routing the aggregator's next
// QoS 1 announcement to it would block the aggregator's every later
// publish. Another site's receipt must still arrive: the stalled
// connection is closed after WriteStall (counted, logged), and the site
// that reads slowly but steadily keeps its connection and gets everything.
func TestSlowReaderDoesNotStall(t *testing.T) {
	p := filepath.Join(t.TempDir(), "passwd")
	for _, u := range []string{"site-a", "site-b", "site-c"} {
		if err := SetPassword(p, u, u+"-pw", testIt); err != nil {
			t.Fatal(err)
		}
	}
	b := startBroker(t, Config{PasswordFile: p, Superusers: []string{"aggregator"}, MaxPacketSize: 2 << 20, WriteStall: time.Second})
	stalled := rawSubscriber(t, b.Addr(), "site-a", prefix+"round")
	slow := rawSubscriber(t, b.Addr(), "site-c", prefix+"round")
	slowDone := make(chan int64, 1)
	go func() { // 128 kB every 50 ms: 2.6 MB/s, far slower than loopback
		var total int64
		chunk := make([]byte, 128<<10)
		for {
			_ = slow.SetReadDeadline(time.Now().Add(2 * time.Second))
			n, err := io.ReadFull(slow, chunk)
			total += int64(n)
			if err != nil {
				slowDone <- total
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	siteB := mustDial(t, b.URL(), opts{id: "site-b", user: "site-b", pass: "site-b-pw"})
	siteB.subscribe(t, prefix+"receipts/site-b")
	o := paho.NewClientOptions().AddBroker("tcp://in-process").SetClientID("aggregator").SetProtocolVersion(4).
		SetAutoReconnect(false).SetConnectTimeout(waitFor).
		SetCustomOpenConnectionFn(func(*url.URL, paho.ClientOptions) (net.Conn, error) { return b.Dial() })
	agg := paho.NewClient(o)
	if tok := agg.Connect(); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	defer agg.Disconnect(0)

	const rounds = 12
	big := strings.Repeat("m", 1<<20) // 12 MiB in all: more than the stalled site's socket buffers hold
	published := make(chan struct{})
	go func() {
		defer close(published)
		for range rounds {
			agg.Publish(prefix+"round", 1, false, big).WaitTimeout(waitFor)
		}
		agg.Publish(prefix+"receipts/site-b", 1, false, "receipt")
	}()
	select {
	case m := <-siteB.msgs:
		if string(m.Payload()) != "receipt" {
			t.Fatalf("site-b got %q", m.Payload())
		}
	case <-time.After(waitFor):
		t.Fatal("site-b's receipt stalled behind a site that does not read")
	}
	<-published
	if n := b.Stats().WriteStalls; n != 1 {
		t.Errorf("%d connections closed as stalled, want 1 (site-a's)", n)
	}
	// The stalled site's connection was closed: what its buffers held,
	// then the end.
	_ = stalled.SetReadDeadline(time.Now().Add(waitFor))
	if _, err := io.Copy(io.Discard, stalled); err != nil {
		t.Errorf("the stalled connection was not closed: %v", err)
	}
	// The slow reader got every announcement: 12 PUBLISH packets of 1 MiB
	// payload each, then nothing more (its read times out).
	total := <-slowDone
	if min := int64(rounds << 20); total < min {
		t.Errorf("the slow reader got %d bytes, want at least %d: its connection was cut", total, min)
	}
}

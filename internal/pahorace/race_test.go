//go:build pahorace

// Package pahorace reproduces a data race inside paho.mqtt.golang v1.5.1,
// reported upstream as eclipse-paho/paho.mqtt.golang#703 (open; #657 is
// the same trace, closed for want of details). Run it with the race
// detector:
//
//	go test -race -tags pahorace ./internal/pahorace/
//
// With CleanSession(false), Connect (and every automatic reconnect) starts
// the connection's goroutines, runs the OnConnect handler in a goroutine
// of its own, and then calls resume, which lists the store and re-sends
// every stored QoS 1 PUBLISH after setting its Dup flag. A QoS 1 message
// the OnConnect handler has just published and the broker has not yet
// acknowledged is in that store too, as the very object the writer
// goroutine encoded: resume's `p.Dup = true` (client.go:1114) races with
// the writer's FixedHeader.pack (packets.go:267), and the message is sent
// twice. edge-agent publishes its online status (and re-sends its outbox)
// from OnConnect with a persistent session, which is how
// `go test -race ./node/agent` meets it when the broker is slow to acknowledge.
// OnConnect is paho's documented place to publish after a connection, and
// its store hands out packets by pointer: the race is paho's. The daemons
// work around it with package mqttstore's store (TestCopyingStoreAvoidsTheRace).
package pahorace

import (
	"io"
	"log/slog"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgefl/edgefl/internal/mqttstore"
	"github.com/edgefl/edgefl/testkit"
)

// noAck drops every publish without a PUBACK (a broker slow to
// acknowledge, taken to the limit): the client's messages stay in its
// store.
type noAck struct{ mochi.HookBase }

func (noAck) ID() string           { return "no-ack" }
func (noAck) Provides(b byte) bool { return b == mochi.OnPublish }
func (noAck) OnPublish(_ *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	return pk, packets.ErrRejectPacket
}

// slowStore is paho's memory store whose All takes 100 ms, as a store
// holding many messages or a loaded machine would: OnConnect's publishes
// are on the wire before resume lists the store.
type slowStore struct{ *paho.MemoryStore }

func (s slowStore) All() []string {
	time.Sleep(100 * time.Millisecond)
	return s.MemoryStore.All()
}

// TestResumeRacesOnConnectPublish fails under -race: the race.
func TestResumeRacesOnConnectPublish(t *testing.T) {
	onConnectPublish(t, slowStore{paho.NewMemoryStore()})
}

// TestCopyingStoreAvoidsTheRace passes under -race: the workaround the
// daemons use (package mqttstore's copying store, around the same slow
// store).
func TestCopyingStoreAvoidsTheRace(t *testing.T) {
	onConnectPublish(t, mqttstore.Wrap(slowStore{paho.NewMemoryStore()}))
}

// onConnectPublish connects a persistent-session client whose OnConnect
// publishes one QoS 1 message, to a broker that never acknowledges it.
func onConnectPublish(t *testing.T, store paho.Store) {
	srv := mochi.New(&mochi.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	for _, h := range []mochi.Hook{new(testkit.AllowAll), new(noAck)} {
		if err := srv.AddHook(h, nil); err != nil {
			t.Fatal(err)
		}
	}
	tcp := listeners.NewTCP(listeners.Config{ID: "tcp", Address: "127.0.0.1:0"})
	if err := srv.AddListener(tcp); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	o := paho.NewClientOptions().AddBroker("tcp://" + tcp.Address()).SetClientID("site-a").SetCleanSession(false).
		SetProtocolVersion(4).SetAutoReconnect(false).SetStore(store).
		SetOnConnectHandler(func(c paho.Client) {
			c.Publish("t/site-a", 1, false, "online")
		})
	c := paho.NewClient(o)
	// Connect's token completes once resume has re-sent the store.
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	c.Disconnect(0)
}

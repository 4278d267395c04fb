// Package mqttstore is the in-memory session store edge-agent and the
// aggregator give paho: paho's MemoryStore, but holding its own copy of
// every PUBLISH and handing out copies.
//
// Why: paho.mqtt.golang v1.5.1 shares a stored PUBLISH with its writer
// goroutine. With a persistent session (CleanSession false) every
// connection runs the OnConnect handler concurrently with resume, which
// re-sends the stored messages after setting their Dup flag; a QoS 1
// message OnConnect has just published and the broker has not yet
// acknowledged is the very object the writer is encoding (and
// PublishPacket.Write sets its RemainingLength). `go test -race ./node/agent`
// reported it (the agent publishes its online status and re-sends its
// outbox from OnConnect). Upstream: eclipse-paho/paho.mqtt.golang#703
// (open; #657 the same trace). The reproduction, and this workaround
// passing it, are internal/pahorace (go test -race -tags pahorace).
//
// The copy is shallow (the payload is shared, and nobody writes it); resume
// still re-sends such a message once more, as paho always did (MQTT's
// at-least-once, which both ends handle).
package mqttstore

import (
	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
)

// New returns an empty in-memory store.
func New() mqtt.Store { return Wrap(mqtt.NewMemoryStore()) }

// Wrap makes s keep and hand out copies of PUBLISH packets.
func Wrap(s mqtt.Store) mqtt.Store { return copying{s} }

type copying struct{ mqtt.Store }

func copyPublish(p packets.ControlPacket) packets.ControlPacket {
	if pub, ok := p.(*packets.PublishPacket); ok {
		c := *pub
		return &c
	}
	return p
}

// Put keeps a copy of p.
func (s copying) Put(key string, p packets.ControlPacket) { s.Store.Put(key, copyPublish(p)) }

// Get returns a copy of the stored packet (nil when there is none).
func (s copying) Get(key string) packets.ControlPacket { return copyPublish(s.Store.Get(key)) }

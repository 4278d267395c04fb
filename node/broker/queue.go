package broker

import (
	"log/slog"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/mochi-mqtt/server/v2/system"

	"github.com/edgefl/edgefl/internal/metrics"
)

// DefaultSiteQueue bounds the QoS 1 messages the broker holds for one
// site (Config.SiteQueue).
const DefaultSiteQueue = 32

// The subscriber side: what the broker holds for a site.
//
// mochi keeps every QoS 1 message routed to a client in the client's
// in-flight store until the client acknowledges it, also while the client
// is offline (a persistent session, kept for --session-expiry), each with
// its own copy of the payload, up to MaximumInflight (8,192) messages a
// client. What a site is sent: the round announcements (the whole global
// model, every round) and its receipts. A site offline for R rounds thus
// cost R copies of the model, and ten sites offline over a weekend with a
// 1 MB model would cost gigabytes; none of it is needed. The announcement
// is retained, and the broker sends the retained one when the site
// subscribes again on reconnecting; a receipt the site missed is answered
// anew when its outbox re-sends the update (a duplicate's receipt).
//
// queueHook bounds a site's held messages to SiteQueue: when a new QoS 1
// message would make more, the oldest ones are forgotten (old
// announcements first, as they are the oldest), counted by client and
// logged at most once a minute per client. Superusers (the aggregator, whose
// in-process connection carries every site's updates) are not bounded
// here.
//
// The other queue, mochi's channel of packets waiting for a client's
// connection (MaximumClientWritesPending, 8,192), is left at its default:
// it is one setting for every client, the aggregator's too, and past it
// mochi drops what it would send, a QoS 1 update included, and forgets it.
// With the rate limit at the broker (ratelimit.go) nothing but what passed
// the limits (at most a burst per site) reaches the aggregator's queue, and
// a site's queue holds its few messages a round only while its connection
// is slower than they come.
type queueHook struct {
	mqtt.HookBase
	max   int
	super map[string]bool
	info  *system.Info
	log   *slog.Logger
	pace  refusalLog // a line per client a minute

	forgotten metrics.LabeledCounter // by client id
}

func (h *queueHook) ID() string { return "edgefl-site-queue" }

func (h *queueHook) Provides(b byte) bool { return b == mqtt.OnQosPublish }

// OnQosPublish is called when mochi has stored a QoS 1 message for cl
// (and when it re-sends one). It forgets cl's oldest held messages beyond
// h.max.
func (h *queueHook) OnQosPublish(cl *mqtt.Client, pk packets.Packet, _ int64, _ int) {
	if pk.FixedHeader.Type != packets.Publish || h.super[cl.ID] || cl.Net.Inline {
		return
	}
	over := cl.State.Inflight.Len() - h.max
	if over <= 0 {
		return
	}
	// mochi numbers a client's messages in order (the next free packet id
	// above the last, wrapping at 65,535): the age of a held message is
	// how far its id lies behind the newest one's.
	held := cl.State.Inflight.GetAll(false)
	age := func(p packets.Packet) uint16 { return pk.PacketID - p.PacketID }
	for range over {
		oldest := -1
		for i, p := range held {
			if p.FixedHeader.Type == packets.Publish && p.PacketID != pk.PacketID && (oldest < 0 || age(p) > age(held[oldest])) {
				oldest = i
			}
		}
		if oldest < 0 {
			return
		}
		if cl.State.Inflight.Delete(held[oldest].PacketID) {
			cl.State.Inflight.IncreaseSendQuota()
			atomic.AddInt64(&h.info.Inflight, -1)
			h.forgotten.Inc(cl.ID)
			if ok, suppressed := h.pace.allow(cl.ID); ok {
				h.log.Warn("the broker holds too many messages for a client: its oldest are forgotten", "client_id", cl.ID,
					"forgotten", suppressed+1, "held", h.max, "topic", held[oldest].TopicName)
			}
		}
		held = append(held[:oldest], held[oldest+1:]...)
	}
}

// Forgotten returns how many held messages the broker forgot because a
// client had more than Config.SiteQueue, by client id.
func (b *Broker) Forgotten() map[string]uint64 { return b.queue.forgotten.Snapshot() }

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
// The aggregator's side. Every site's status and update is routed to the
// aggregator's connection (a superuser, in-process with broker-agg run),
// which acknowledges each only once it is durable, so at start (every
// site's retained status at once) and in a round (every selected site's
// update) it holds about as many unacknowledged messages as there are
// sites. mochi keeps at most MaximumInflight of them per client and drops
// any message past it, counted in its Info.InflightDropped and logged at
// Warn in its own log (which this package filters to Error): at mochi's
// default of 8,192 a federation of 10,000 sites lost 1,050 statuses
// without a trace, and its first round was never drawn. Start raises
// MaximumInflight to Config.MaxInflight (default the whole packet id
// space, 65,535: MQTT cannot number more unacknowledged messages on one
// connection); it costs nothing up front (the store is a map), and a
// site's own store is still held to SiteQueue here.
//
// The other queue, mochi's channel of packets waiting for a client's
// connection (MaximumClientWritesPending, 8,192), is left at its default:
// it is one setting for every client and allocated whole for each (64 KB
// of pointers a connection, which the garbage collector scans at every
// cycle), and past it mochi drops what it would send. The aggregator's
// channel is filled by every site's routing goroutine and drained by one
// writer, so a burst from many sessions at once backs up in it: 9,000
// messages from 30 sessions at full speed backed up by thousands (a
// channel of 1,024 lost 1,700-4,000 of them; 8,192 lost none). A burst past
// 8,192 could still lose messages there: counted and logged, as below. A
// site's channel holds its few messages a round only while its
// connection is slower than they come.
//
// Either drop is counted (Broker.Dropped, broker-agg's
// edgefl_broker_dropped_total{reason}) and logged: a message dropped from
// the write channel as it happens (OnPublishDropped), and a full store of
// unacknowledged messages when the message that fills it is stored (the
// next ones are dropped until the client acknowledges some), at most once
// a minute per client each.
type queueHook struct {
	mqtt.HookBase
	max         int
	inflightMax int // mochi's MaximumInflight
	super       map[string]bool
	info        *system.Info
	log         *slog.Logger
	pace        refusalLog // a line per client a minute
	fullPace    refusalLog // the same for a full store
	dropPace    refusalLog // the same for a dropped write

	forgotten metrics.LabeledCounter // by client id
}

func (h *queueHook) ID() string { return "edgefl-site-queue" }

func (h *queueHook) Provides(b byte) bool {
	return b == mqtt.OnQosPublish || b == mqtt.OnPublishDropped
}

// OnPublishDropped is called when mochi drops a message to cl because
// cl's channel of pending writes is full.
func (h *queueHook) OnPublishDropped(cl *mqtt.Client, pk packets.Packet) {
	if ok, suppressed := h.dropPace.allow(cl.ID); ok {
		h.log.Warn("the broker dropped a message to a client whose connection falls behind (its queue of pending writes is full)",
			"client_id", cl.ID, "dropped", suppressed+1, "topic", pk.TopicName, "dropped_total", atomic.LoadInt64(&h.info.MessagesDropped))
	}
}

// OnQosPublish is called when mochi has stored a QoS 1 message for cl
// (and when it re-sends one). It warns when cl's store of unacknowledged
// messages is full (mochi drops the next ones), and forgets a site's
// oldest held messages beyond h.max.
func (h *queueHook) OnQosPublish(cl *mqtt.Client, pk packets.Packet, _ int64, _ int) {
	if pk.FixedHeader.Type != packets.Publish {
		return
	}
	if n := cl.State.Inflight.Len(); h.inflightMax > 0 && n >= h.inflightMax {
		if ok, suppressed := h.fullPace.allow(cl.ID); ok {
			h.log.Warn("the broker holds as many unacknowledged messages for a client as it may: the next ones to it are dropped until it acknowledges some",
				"client_id", cl.ID, "held", n, "times", suppressed+1, "dropped_total", atomic.LoadInt64(&h.info.InflightDropped))
		}
	}
	if h.super[cl.ID] || cl.Net.Inline {
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

// Dropped returns how many messages the broker dropped instead of
// delivering them, by reason: "inflight_full" (the client's store of
// unacknowledged messages was full, or its packet ids ran out),
// "write_queue_full" (its queue of pending writes was full). See queueHook.
func (b *Broker) Dropped() map[string]uint64 {
	return map[string]uint64{
		"inflight_full":    uint64(max(atomic.LoadInt64(&b.srv.Info.InflightDropped), 0)),
		"write_queue_full": uint64(max(atomic.LoadInt64(&b.srv.Info.MessagesDropped), 0)),
	}
}

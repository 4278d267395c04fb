package broker

import (
	"log/slog"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/internal/metrics"
	"github.com/edgefl/edgefl/internal/ratelimit"
)

// The per-site inbound rate limit, at the broker.
//
// The aggregator rate-limits each site's messages before it decodes them
// (node/aggregator/ingest.go), but with the embedded broker a flood first went
// through mochi: every publish of the flooding site was routed to the
// aggregator's in-process connection, whose queue holds up to 8,192
// packets (mochi's MaximumClientWritesPending), and only then dropped by
// the aggregator. That queue was where the embedded case's extra memory
// went (docs/results.md, "A flooding site"): about 20 MiB for 2.5 kB updates, and
// 8,192 times the update's size for a larger model.
//
// limitHook applies the same limits (package ratelimit, the same
// --rate-messages, --rate-burst and --rate-bytes) in mochi's OnPublish hook,
// which runs on the publishing client's own read loop after the ACL check
// and before the message is retained or routed to any subscriber: a
// message over its client's limit is never queued anywhere. What happens to
// it:
//
//   - QoS 0: dropped (QoS 0 may be lost).
//   - QoS 1 from an MQTT 3.1.1 client (every edgefl site): dropped without a
//     PUBACK. The message stays in the client's session; paho re-sends it
//     on its next connection, and an edge-agent whose publish is not
//     acknowledged in time retries it (node/agent/session.go) and re-sends any
//     unreceipted update after a reconnect. A PUBACK would tell the site
//     its update was delivered when it was not.
//   - QoS 1 from an MQTT 5 client: a PUBACK with reason code 0x96 (message
//     rate too high, MQTT 5.0 section 3.4.2.1), as the protocol intends.
//
// The client is not disconnected, however long it floods: it would
// reconnect at once (paho's auto-reconnect), and each reconnect costs the
// broker a password hash and a session takeover, which costs more than
// dropping on the read loop. An honest site sends a status per connection
// and an update (and at most a statistics or evaluation report) a round,
// far below the limits; its buckets are kept across its reconnects, and a
// reconnect with its outbox's re-sends is a handful of messages against a
// burst of 100.
//
// Superusers (the aggregator: round announcements, receipts to every site)
// are not limited, nor are last wills (published by the broker itself when
// a client goes, never through OnPublish).
//
// Every drop is counted by client (Broker.RateLimited, which broker-agg
// shows as edgefl_broker_rate_limited_total{client} and in the site's row
// of the status and the console) and logged at WARN at most once per 10 s
// per client, with the count dropped since the last line.
type limitHook struct {
	mqtt.HookBase
	lim   *ratelimit.Limiter
	super map[string]bool
	clock clock.Clock
	log   *slog.Logger

	dropped metrics.LabeledCounter // by client id
	passed  metrics.LabeledCounter // publishes within the limits, by client id (not superusers)
}

func (h *limitHook) ID() string { return "edgefl-rate-limit" }

func (h *limitHook) Provides(b byte) bool { return b == mqtt.OnPublish }

// OnPublish charges a non-superuser's publish to its client's buckets, or
// drops it (see limitHook).
func (h *limitHook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if h.super[cl.ID] || cl.Net.Inline {
		return pk, nil
	}
	v := h.lim.Allow(cl.ID, pk.Payload, h.clock.Now())
	if v.OK {
		h.passed.Inc(cl.ID)
		return pk, nil
	}
	if v.LogNow {
		l := h.lim.Limits()
		h.log.Warn("a site is over its message rate limit: the broker drops its messages", "client_id", cl.ID,
			"dropped", v.Dropped, "since", l.LogEvery, "limit_msgs_per_s", l.Messages, "limit_burst", l.Burst, "limit_bytes_per_s", l.Bytes)
	}
	// Counted after the log line, as refusals are: a reader of the
	// counter then finds the line.
	h.dropped.Inc(cl.ID)
	if pk.FixedHeader.Qos > 0 && cl.Properties.ProtocolVersion == 5 {
		// mochi answers a hook's reason code itself, but logs every one
		// at ERROR with the whole packet: write the PUBACK here and
		// reject the packet quietly instead.
		ack := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: pk.PacketID,
			ReasonCode: packets.ErrMessageRateTooHigh.Code, ProtocolVersion: 5}
		if err := cl.WritePacket(ack); err != nil {
			h.log.Debug("rate-limit PUBACK not sent", "client_id", cl.ID, "err", err)
		}
	}
	return pk, packets.ErrRejectPacket
}

// newLimitHook returns the hook enforcing cfg's rate limit.
func newLimitHook(cfg Config, maxPacket uint32, log *slog.Logger) (*limitHook, error) {
	l := cfg.RateLimit
	if l.MaxMessageBytes == 0 {
		l.MaxMessageBytes = int(maxPacket)
	}
	lim, err := ratelimit.New(l)
	if err != nil {
		return nil, err
	}
	c := cfg.Clock
	if c == nil {
		c = clock.Real{}
	}
	h := &limitHook{lim: lim, super: map[string]bool{}, clock: c, log: log}
	for _, id := range cfg.Superusers {
		h.super[id] = true
	}
	return h, nil
}

// RateLimited returns how many publishes the broker dropped over their
// client's rate limit, by client id.
func (b *Broker) RateLimited() map[string]uint64 { return b.limit.dropped.Snapshot() }

// Passed returns how many publishes of each non-superuser client were
// within its rate limit (and went on to be routed), by client id: with
// RateLimited, every publish the broker read from a site.
func (b *Broker) Passed() map[string]uint64 { return b.limit.passed.Snapshot() }

// RateLimits returns the limits the broker enforces (defaults filled in).
func (b *Broker) RateLimits() ratelimit.Limits { return b.limit.lim.Limits() }

package aggregator

import (
	"context"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/internal/ratelimit"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/proto/wire"
)

// Bounded ingest. One authenticated site re-publishing
// its last valid update 10,000 times a second took the aggregator from 25 MB
// to 1.5-2.4 GB and stalled the federation: paho hands every message to a
// goroutine of its own, and each decoded its vector and then waited for the
// event loop, unbounded; each duplicate also cost a store read and a
// receipt. Now, in order:
//
//  1. Per-site rate limits (token buckets of messages and bytes per second,
//     keyed by the client id of the topic), checked before anything is
//     decoded: a message over the limit is dropped and acknowledged,
//     counted per site and logged (at most once per 10 s per site). A copy
//     of a message the site got through recently is dropped first: a tenth
//     of the buckets is kept for new messages, so a site flooding copies of
//     one update does not lose its next one (package ratelimit). An
//     honest site sends a status per connection and an update per round,
//     far below the defaults; an update it sends while limited is re-sent
//     from its outbox (it gets no receipt), so nothing durable is lost.
//  2. A bounded queue and a fixed pool of workers between the MQTT
//     callbacks and the event loop: a callback enqueues its message and
//     returns to paho once a worker has handled it (the message is
//     acknowledged then, after the update is durable, as before); at most
//     IngestWorkers messages are decoded at once and at most IngestQueue
//     wait, whatever the broker delivers.
//  3. A duplicate of an update already receipted is answered from memory
//     (the receipt cache) with its receipt, once validated like any update
//     (a damaged copy is reported as damaged), without going through the
//     event loop or reading the store.

// Ingest defaults. The rate limit's are package ratelimit's: one rule for
// the aggregator and the embedded broker (broker-agg's --rate-* flags set
// both).
const (
	DefaultRateMessages = ratelimit.DefaultMessages // messages per second per site
	DefaultRateBurst    = ratelimit.DefaultBurst    // messages a site may send at once
	DefaultRateBytes    = ratelimit.DefaultBytes    // bytes per second per site (two updates of the largest size)
	DefaultIngestQueue  = 256
	// DefaultIngestWorkers is also how many updates can wait for one
	// group commit (commit_group.go): a worker waits with its update
	// until the transaction holding it is durable, so the workers bound
	// how many updates share an fsync. BenchmarkIngest, on a disk that
	// commits in 4-8 ms: about 26 updates per commit with 32 workers, 12
	// with 16. The cost is up to 32 decoded updates held at once (8 bytes
	// a value: 2 MB for d = 7,850; 1 GiB should 32 sites send updates of
	// the largest size, 16 MiB of fp32, at the same moment).
	DefaultIngestWorkers = 32
	receiptCacheSize     = 1 << 16
)

// rateLimits are the per-site limits of cfg.
func rateLimits(cfg ServerConfig) ratelimit.Limits {
	return ratelimit.Limits{Messages: cfg.RateMessages, Burst: cfg.RateBurst, Bytes: cfg.RateBytes, MaxMessageBytes: cfg.MaxMessageBytes}
}

// allow reports whether a message with this payload from site fits its
// limits (package ratelimit: a duplicate of a recent message is dropped
// before a new one is).
func (s *Server) allow(site string, payload []byte) ratelimit.Verdict {
	return s.limits.Allow(site, payload, s.clock.Now())
}

// receiptKey names an update: one per client and round.
type receiptKey struct {
	client string
	round  uint64
}

type cachedReceipt struct {
	storedAt time.Time
}

// receiptCache remembers the updates this run has receipted as stored.
type receiptCache struct {
	mu sync.Mutex
	m  map[receiptKey]*cachedReceipt
}

func (c *receiptCache) put(k receiptKey, storedAt time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= receiptCacheSize {
		c.m = map[receiptKey]*cachedReceipt{} // a miss only costs the old path
	}
	c.m[k] = &cachedReceipt{storedAt: storedAt}
}

// duplicate answers an update already receipted: true when it was one. (The
// rate limit bounds how many receipts a flood gets back.)
func (s *Server) duplicate(u *wire.ClientUpdate) bool {
	// Only for the open round: the coordinator answers an update of a
	// closed round by its own rules (stale, or a late FedSplit z).
	s.mu.Lock()
	open := s.view.phase == coordinator.PhaseCollecting && uint64(s.view.round) == u.Round
	s.mu.Unlock()
	if !open {
		return false
	}
	c := &s.receipts
	c.mu.Lock()
	r := c.m[receiptKey{u.ClientId, u.Round}]
	c.mu.Unlock()
	if r == nil {
		return false
	}
	s.reject(u.ClientId, "duplicate")
	// The same line and receipt as the coordinator's duplicate (server_round.go).
	s.log.Info("duplicate update ignored", "client", u.ClientId, "round", u.Round)
	s.receipt(u, true, wire.ReceiptCode_RECEIPT_CODE_DUPLICATE, "duplicate: stored earlier", r.storedAt)
	return true
}

// ingestJob is one inbound message waiting for a worker.
type ingestJob struct {
	topic   string
	payload []byte
	done    chan bool // handled (true) or the server stopped (false)
}

// startIngest starts the worker pool; it ends with ctx.
func (s *Server) startIngest(ctx context.Context) {
	for range s.cfg.IngestWorkers {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case j := <-s.ingestQ:
					j.done <- s.handle(j.topic, j.payload)
				}
			}
		}()
	}
}

// enqueue hands a message to the pool and waits for it to be handled;
// false when the server stops first (the message stays unacknowledged and
// the broker redelivers it).
func (s *Server) enqueue(topic string, payload []byte) bool {
	ctx := s.runCtx
	j := ingestJob{topic: topic, payload: payload, done: make(chan bool, 1)}
	select {
	case s.ingestQ <- j:
	case <-ctx.Done():
		return false
	}
	select {
	case ok := <-j.done:
		return ok
	case <-ctx.Done():
		return false
	}
}

// onMessage is the handler of every inbound message (also paho's default
// handler, for messages the persistent session delivers before the
// subscriptions are re-established). A message over its site's rate limit
// is dropped at once; the others go through the worker pool, and are
// acknowledged once handled: an accepted update is durable by then. When
// the server stops first, the message stays unacknowledged and the broker
// redelivers it.
func (s *Server) onMessage(_ mqtt.Client, m mqtt.Message) {
	if _, id, err := s.topics.Parse(m.Topic()); err == nil && id != "" {
		if v := s.allow(id, m.Payload()); !v.OK {
			s.rateLimited.Inc(id)
			s.hist.reject(id, "rate_limited")
			s.notify()
			if v.LogNow {
				s.log.Warn("a site is over its message rate limit: messages dropped", "client", id, "dropped", v.Dropped,
					"limit_msgs_per_s", s.cfg.RateMessages, "limit_bytes_per_s", s.cfg.RateBytes)
			}
			m.Ack()
			return
		}
	}
	if s.enqueue(m.Topic(), m.Payload()) {
		m.Ack()
	}
}

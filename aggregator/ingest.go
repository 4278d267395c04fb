package aggregator

import (
	"context"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/wire"
)

// Bounded ingest (issue 10, item 2). One authenticated site re-publishing
// its last valid update 10,000 times a second took the aggregator from 25 MB
// to 1.5-2.4 GB and stalled the federation: paho hands every message to a
// goroutine of its own, and each decoded its vector and then waited for the
// event loop, unbounded; each duplicate also cost a store read and a
// receipt. Now, in order:
//
//  1. Per-site rate limits (token buckets of messages and bytes per second,
//     keyed by the client id of the topic), checked before anything is
//     decoded: a message over the limit is dropped and acknowledged,
//     counted per site and logged (at most once per 10 s per site). An
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

// Ingest defaults.
const (
	DefaultRateMessages = 20       // messages per second per site
	DefaultRateBurst    = 100      // messages a site may send at once
	DefaultRateBytes    = 32 << 20 // bytes per second per site (two updates of the largest size)
	DefaultIngestQueue  = 256
	rateLogEvery        = 10 * time.Second
	receiptCacheSize    = 1 << 16
)

// tokenBucket is a rate limit: rate tokens per second, up to burst.
type tokenBucket struct {
	tokens float64
	last   time.Time
}

func (b *tokenBucket) take(now time.Time, n, rate, burst float64) bool {
	if b.last.IsZero() {
		b.tokens = burst
	} else if dt := now.Sub(b.last).Seconds(); dt > 0 {
		b.tokens = min(burst, b.tokens+dt*rate)
	}
	b.last = now
	if b.tokens < n {
		return false
	}
	b.tokens -= n
	return true
}

type siteLimit struct {
	msgs, bytes tokenBucket
	lastLog     time.Time
	dropped     uint64 // since the last log line
}

// limiter holds the per-site rate limits.
type limiter struct {
	mu    sync.Mutex
	sites map[string]*siteLimit
}

// allow reports whether a message of n bytes from site fits its limits; when
// it does not, logNow says whether to log it (with the count dropped since
// the last line).
func (s *Server) allow(site string, n int) (ok bool, logNow bool, dropped uint64) {
	now := s.clock.Now()
	l := &s.limits
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sites == nil {
		l.sites = map[string]*siteLimit{}
	}
	sl := l.sites[site]
	if sl == nil {
		if len(l.sites) >= 1<<16 {
			clear(l.sites) // ids are validated, but bound the map anyway
		}
		sl = &siteLimit{}
		l.sites[site] = sl
	}
	rate, burst := s.cfg.RateMessages, float64(s.cfg.RateBurst)
	byteRate := s.cfg.RateBytes
	byteBurst := max(byteRate, float64(s.cfg.MaxMessageBytes))
	if sl.msgs.take(now, 1, rate, burst) && sl.bytes.take(now, float64(n), byteRate, byteBurst) {
		return true, false, 0
	}
	sl.dropped++
	if sl.lastLog.IsZero() || now.Sub(sl.lastLog) >= rateLogEvery {
		sl.lastLog, dropped = now, sl.dropped
		sl.dropped = 0
		return false, true, dropped
	}
	return false, false, 0
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
	open := s.view.phase == PhaseCollecting && uint64(s.view.round) == u.Round
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
		if ok, logNow, dropped := s.allow(id, len(m.Payload())); !ok {
			s.rateLimited.Inc(id)
			s.hist.reject(id, "rate_limited")
			s.notify()
			if logNow {
				s.log.Warn("a site is over its message rate limit: messages dropped", "client", id, "dropped", dropped,
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

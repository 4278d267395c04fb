// Package ratelimit is the per-site inbound rate limit (issue 10, item 2),
// one rule used in two places: by broker-agg's embedded broker on every
// publish of a site before it is routed (package broker), and by the
// aggregator on every message it is delivered before it is decoded
// (aggregator/ingest.go), which is the only limit when the broker is an
// external Mosquitto.
//
// A site has two token buckets: messages (Messages a second, up to Burst at
// once) and payload bytes (Bytes a second, up to max(Bytes,
// MaxMessageBytes) at once, so that one message of the largest size always
// fits). A message passes when both buckets hold enough; otherwise it is
// dropped and takes nothing from either. Drops are reported for logging at
// most once per LogEvery per site, with the count since the last report.
//
// An honest site sends a status per connection and an update (and at most
// a statistics or evaluation report) per round: far below the defaults, also
// when it reconnects and its outbox re-sends its unreceipted updates.
//
// Time is the caller's (Allow takes now); the package starts no goroutine.
package ratelimit

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Defaults of Limits.
const (
	DefaultMessages = 20       // messages per second per site
	DefaultBurst    = 100      // messages a site may send at once
	DefaultBytes    = 32 << 20 // bytes per second per site (two updates of the largest size)
	// DefaultLogEvery bounds the log lines about one site's drops.
	DefaultLogEvery = 10 * time.Second
	// maxSites bounds the map of sites: ids are authenticated, but a
	// development broker admits anonymous clients under any id.
	maxSites = 1 << 16
)

// Limits are one site's inbound rate limits.
type Limits struct {
	Messages float64 // messages per second (0: DefaultMessages)
	Burst    int     // messages at once (0: DefaultBurst)
	Bytes    float64 // payload bytes per second (0: DefaultBytes)
	// MaxMessageBytes is the largest message admitted at all (the broker's
	// packet cap, the aggregator's message cap): the byte bucket holds at
	// least that much, so that such a message can pass.
	MaxMessageBytes int
	// LogEvery is how often a site's drops are reported (0:
	// DefaultLogEvery).
	LogEvery time.Duration
}

// WithDefaults returns l with its zero fields set to the defaults.
func (l Limits) WithDefaults() Limits {
	if l.Messages == 0 {
		l.Messages = DefaultMessages
	}
	if l.Burst == 0 {
		l.Burst = DefaultBurst
	}
	if l.Bytes == 0 {
		l.Bytes = DefaultBytes
	}
	if l.LogEvery == 0 {
		l.LogEvery = DefaultLogEvery
	}
	return l
}

// Validate refuses negative limits.
func (l Limits) Validate() error {
	if l.Messages < 0 || l.Burst < 0 || l.Bytes < 0 || l.MaxMessageBytes < 0 || l.LogEvery < 0 {
		return fmt.Errorf("ratelimit: negative limit in %+v", l)
	}
	if l.Messages != l.Messages || l.Bytes != l.Bytes { // NaN
		return errors.New("ratelimit: limit is not a number")
	}
	return nil
}

// bucket is a token bucket: rate tokens a second, up to burst.
type bucket struct {
	tokens float64
	last   time.Time
}

// refill brings b to now (a new bucket starts full).
func (b *bucket) refill(now time.Time, rate, burst float64) {
	if b.last.IsZero() {
		b.tokens = burst
	} else if dt := now.Sub(b.last).Seconds(); dt > 0 {
		b.tokens = min(burst, b.tokens+dt*rate)
	}
	if now.After(b.last) {
		b.last = now
	}
}

type site struct {
	msgs, bytes bucket
	lastLog     time.Time
	dropped     uint64 // since the last report
}

// Limiter holds the sites' buckets. Its zero value is not usable: New.
type Limiter struct {
	limits Limits
	mu     sync.Mutex
	sites  map[string]*site
}

// New returns a limiter of l (zero fields: the defaults).
func New(l Limits) (*Limiter, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	return &Limiter{limits: l.WithDefaults(), sites: map[string]*site{}}, nil
}

// Limits returns the limiter's limits (defaults filled in).
func (r *Limiter) Limits() Limits { return r.limits }

// Verdict is Allow's answer.
type Verdict struct {
	// OK: the message fits the limits (and was charged to them).
	OK bool
	// LogNow: the message was dropped and this drop is to be logged,
	// Dropped counting it and the drops not logged since the last line.
	LogNow  bool
	Dropped uint64
}

// Allow charges a message of n payload bytes from id at now, or drops it.
func (r *Limiter) Allow(id string, n int, now time.Time) Verdict {
	l := r.limits
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sites[id]
	if s == nil {
		if len(r.sites) >= maxSites {
			clear(r.sites) // a forgotten site starts again with full buckets
		}
		s = &site{}
		r.sites[id] = s
	}
	byteBurst := max(l.Bytes, float64(l.MaxMessageBytes))
	s.msgs.refill(now, l.Messages, float64(l.Burst))
	s.bytes.refill(now, l.Bytes, byteBurst)
	if s.msgs.tokens >= 1 && s.bytes.tokens >= float64(n) {
		s.msgs.tokens--
		s.bytes.tokens -= float64(n)
		return Verdict{OK: true}
	}
	s.dropped++
	if s.lastLog.IsZero() || now.Sub(s.lastLog) >= l.LogEvery {
		v := Verdict{LogNow: true, Dropped: s.dropped}
		s.lastLog, s.dropped = now, 0
		return v
	}
	return Verdict{}
}

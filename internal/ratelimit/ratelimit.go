// Package ratelimit is the per-site inbound rate limit,
// one rule used in two places: by broker-agg's embedded broker on every
// publish of a site before it is routed (package broker), and by the
// aggregator on every message it is delivered before it is decoded
// (node/aggregator/ingest.go), which is the only limit when the broker is an
// external Mosquitto.
//
// A site has two token buckets: messages (Messages a second, up to Burst at
// once) and payload bytes (Bytes a second, up to max(Bytes,
// MaxMessageBytes) at once, so that one message of the largest size always
// fits). A message passes when both buckets hold enough; otherwise it is
// dropped and takes nothing from either. Drops are reported for logging at
// most once per LogEvery per site, with the count since the last report.
//
// New content comes first. A site flooding copies of one message (a replay
// of its last update, a client stuck in a loop) used to empty its buckets
// for as long as it flooded, so that its own next update, the first copy of
// a new message, was dropped with the copies: the round then waited for
// that site until its deadline (10 min by default) and the site re-sent
// only when the round was announced again. Now the limiter remembers the
// fingerprints of the last few distinct messages each site got through
// (recentMessages) and keeps a tenth of each bucket (reserveFraction) for
// messages it has not seen: a copy of a message already passed (a
// duplicate) passes only while the buckets hold more than that reserve; a
// new message may take every token. A duplicate flood then leaves the
// reserve standing, and the site's next update, status or report passes
// at once. The limits are the same for both: a site sending distinct
// messages gets no more than before (all of it is "new" and it competes
// with itself), and what a site gets through in all is bounded by the same
// rate and burst as before. A duplicate dropped this way is an exact copy
// of a message this limiter passed already; what it costs is that a
// site's own re-send of such a message (after an INTERNAL receipt, say)
// waits, while the site floods, for the buckets to rise above the reserve.
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
	"hash/maphash"
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
	// recentMessages is how many distinct messages of a site are
	// remembered (by a 64-bit fingerprint of the payload) to tell a
	// duplicate from a new message: a status, an update, a statistics and
	// an evaluation report a round, with room for the outbox's re-sends.
	recentMessages = 8
	// reserveFraction of each bucket is kept for new messages: a duplicate
	// passes only while the bucket holds more than that (see the package
	// documentation).
	reserveFraction = 0.1
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
	// recent are the fingerprints of the last distinct messages passed
	// (a ring: next is where the next one goes, n how many are set).
	recent  [recentMessages]uint64
	next, n int
	lastLog time.Time
	dropped uint64 // since the last report
}

// seen reports whether fingerprint fp is one of the site's recent messages.
func (s *site) seen(fp uint64) bool {
	for _, r := range s.recent[:s.n] {
		if r == fp {
			return true
		}
	}
	return false
}

// remember adds fp to the site's recent messages, forgetting the oldest.
func (s *site) remember(fp uint64) {
	s.recent[s.next] = fp
	s.next = (s.next + 1) % recentMessages
	s.n = min(s.n+1, recentMessages)
}

// Limiter holds the sites' buckets. Its zero value is not usable: New.
type Limiter struct {
	limits Limits
	seed   maphash.Seed // of the messages' fingerprints: a site cannot aim at another message's
	mu     sync.Mutex
	sites  map[string]*site
}

// New returns a limiter of l (zero fields: the defaults).
func New(l Limits) (*Limiter, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	return &Limiter{limits: l.WithDefaults(), seed: maphash.MakeSeed(), sites: map[string]*site{}}, nil
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
	// Duplicate: the message is a copy of one of the site's recent
	// messages that passed (whether it passed or not this time).
	Duplicate bool
}

// Allow charges a message with this payload from id at now, or drops it:
// a new message when both buckets hold a token and its size, a duplicate
// of a recent message only when they hold that beyond the reserve kept
// for new messages.
func (r *Limiter) Allow(id string, payload []byte, now time.Time) Verdict {
	l := r.limits
	n := len(payload)
	fp := maphash.Bytes(r.seed, payload) // outside the lock: the only cost that grows with the message
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
	dup := s.seen(fp)
	var msgReserve, byteReserve float64
	if dup {
		msgReserve = float64(int(reserveFraction * float64(l.Burst))) // whole messages: none under a burst of 10
		byteReserve = reserveFraction * byteBurst
	}
	if s.msgs.tokens >= 1+msgReserve && s.bytes.tokens >= float64(n)+byteReserve {
		s.msgs.tokens--
		s.bytes.tokens -= float64(n)
		if !dup {
			s.remember(fp)
		}
		return Verdict{OK: true, Duplicate: dup}
	}
	s.dropped++
	if s.lastLog.IsZero() || now.Sub(s.lastLog) >= l.LogEvery {
		v := Verdict{LogNow: true, Dropped: s.dropped, Duplicate: dup}
		s.lastLog, s.dropped = now, 0
		return v
	}
	return Verdict{Duplicate: dup}
}

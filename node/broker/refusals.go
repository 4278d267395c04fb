package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"time"
)

// Connection refusals reach the operator: a refused
// connection, whether by TLS (no client certificate, a certificate of
// another CA or expired) or by the MQTT login (bad password, an id that is
// not the identity), is logged at WARN with the client id it claimed and
// the reason, at most once per refusalLogEvery per client and reason; the
// next line says how many were suppressed in between. Stats.AuthFailures
// counts every one.

// refusalLogEvery bounds the refusal lines of one client and reason.
const refusalLogEvery = time.Minute

// refusalLog rate-limits the refusal lines: per key, Burst lines at once,
// then one per Every (a token bucket), each line saying how many were
// suppressed since the previous one. Zero Every and Burst mean
// refusalLogEvery and 1 (a line per key and minute).
type refusalLog struct {
	mu    sync.Mutex
	now   func() time.Time
	every time.Duration
	burst float64
	seen  map[string]*refusalEntry
}

type refusalEntry struct {
	last       time.Time // of the last refill
	tokens     float64
	suppressed uint64
}

// allow reports whether to log a refusal keyed by key now, and how many
// were suppressed since the last line.
func (r *refusalLog) allow(key string) (bool, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if r.now != nil {
		now = r.now()
	}
	every, burst := r.every, r.burst
	if every <= 0 {
		every = refusalLogEvery
	}
	if burst < 1 {
		burst = 1
	}
	if r.seen == nil || len(r.seen) >= 4096 {
		r.seen = map[string]*refusalEntry{} // bounded: a flood of made-up ids costs lines, not memory
	}
	e := r.seen[key]
	if e == nil {
		e = &refusalEntry{last: now, tokens: burst}
		r.seen[key] = e
	} else if d := now.Sub(e.last); d > 0 {
		e.tokens = min(burst, e.tokens+float64(d)/float64(every))
		e.last = now
	}
	if e.tokens < 1 {
		e.suppressed++
		return false, 0
	}
	e.tokens--
	n := e.suppressed
	e.suppressed = 0
	return true, n
}

// Refusal is the latest refused connection of one claimed identity (the
// client id, or a TLS certificate's unverified CN; "" when a handshake
// named none), for the aggregator's roster: a site that never got in is
// shown with why, not only logged.
type Refusal struct {
	ID     string    // the identity claimed
	Reason string    // the latest refusal's reason
	At     time.Time // the latest refusal's time
	Count  uint64    // refusals of this identity since the broker started
}

// maxRefused bounds the identities whose refusals are kept: past it the
// record starts over (a flood of made-up ids costs nothing but the record).
const maxRefused = 1024

// refusalRecord keeps the latest refusal per claimed identity.
type refusalRecord struct {
	mu  sync.Mutex
	now func() time.Time
	by  map[string]*Refusal
}

func (r *refusalRecord) note(id, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if r.now != nil {
		now = r.now()
	}
	if r.by == nil || (len(r.by) >= maxRefused && r.by[id] == nil) {
		r.by = map[string]*Refusal{}
	}
	e := r.by[id]
	if e == nil {
		e = &Refusal{ID: id}
		r.by[id] = e
	}
	e.Reason, e.At = reason, now
	e.Count++
}

func (r *refusalRecord) list() []Refusal {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Refusal, 0, len(r.by))
	for _, e := range r.by {
		out = append(out, *e)
	}
	slices.SortFunc(out, func(a, b Refusal) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Refusals returns the latest refused connection of every identity
// refused since the broker started, sorted by identity.
func (b *Broker) Refusals() []Refusal { return b.hook.record.list() }

// refused counts, records and (rate-limited) logs a refused connection.
func (h *authHook) refused(clientID, remote, reason string, args ...any) {
	// Counted last: a refusal that shows in Stats has been logged (or
	// suppressed), so a reader of the counter then finds its line.
	defer h.authFailures.Add(1)
	h.record.note(clientID, reason)
	ok, suppressed := h.refusals.allow(clientID + "\x00" + reason)
	if !ok {
		return
	}
	args = append([]any{"client_id", clientID, "remote", remote, "reason", reason}, args...)
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	h.log.Warn("mqtt connection refused", args...)
}

// tlsListener does the TLS handshake of every connection before mochi
// sees it, so that a refused handshake is logged (mochi would only fail
// to read the CONNECT packet, at a level the broker does not log).
type tlsListener struct {
	net.Listener // TCP
	cfg          *tls.Config
	h            *authHook
	conns        chan net.Conn
	done         chan struct{}
	once         sync.Once
}

// handshakeTimeout bounds a TLS handshake.
const handshakeTimeout = 15 * time.Second

func newTLSListener(inner net.Listener, cfg *tls.Config, h *authHook) *tlsListener {
	l := &tlsListener{Listener: inner, cfg: cfg, h: h, conns: make(chan net.Conn), done: make(chan struct{})}
	go l.acceptLoop()
	return l
}

func (l *tlsListener) acceptLoop() {
	defer l.stop()
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		go l.handshake(c)
	}
}

func (l *tlsListener) handshake(c net.Conn) {
	tc := tls.Server(c, l.cfg)
	ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		id, reason := tlsRefusal(err)
		l.h.refused(id, c.RemoteAddr().String(), reason, "err", err.Error())
		_ = tc.Close()
		return
	}
	select {
	case l.conns <- tc:
	case <-l.done:
		_ = tc.Close()
	}
}

// tlsRefusal names a failed handshake's reason and the client id its
// certificate claims (its CN, unverified; "" without one).
func tlsRefusal(err error) (clientID, reason string) {
	var cve *tls.CertificateVerificationError
	if errors.As(err, &cve) && len(cve.UnverifiedCertificates) > 0 {
		clientID = cve.UnverifiedCertificates[0].Subject.CommonName
	}
	var ua x509.UnknownAuthorityError
	var ci x509.CertificateInvalidError
	switch {
	case errors.As(err, &ua):
		reason = "client certificate not signed by the site CA"
	case errors.As(err, &ci) && ci.Reason == x509.Expired:
		reason = "client certificate expired or not yet valid"
	case errors.As(err, &ci):
		reason = "client certificate invalid"
	case strings.Contains(err.Error(), "didn't provide a certificate"):
		reason = "no client certificate"
	default:
		reason = "TLS handshake failed"
	}
	return clientID, reason
}

func (l *tlsListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *tlsListener) stop() { l.once.Do(func() { close(l.done) }) }

func (l *tlsListener) Close() error {
	l.stop()
	return l.Listener.Close()
}

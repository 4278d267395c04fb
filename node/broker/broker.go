// Package broker is broker-agg's embedded MQTT broker: mochi-mqtt v2 on one
// TCP (or TLS) listener, with packet size capped, authentication by a
// Mosquitto-compatible password file and/or client certificates, and the
// federation's ACL (ARCHITECTURE.md, Security and the ACL) enforced by the broker itself.
//
// # Identity
//
// Every connection has one identity: the CN of a verified client
// certificate (mutual TLS), else the username checked against the password
// file (or Config.Users). When both are present they must agree. The MQTT
// client id must equal the identity: a client can neither act under another
// site's id nor take over another site's persistent session (and with it
// that site's queued receipts).
//
// # ACL
//
// Under the federation's topic prefix P (e.g. "edgefl/fed1/"), a site with
// identity id may
//
//	publish   P+"updates/"+id, P+"clients/"+id+"/status" (also as its last will)
//	subscribe P+"round", P+"run", P+"receipts/"+id
//
// and nothing else (no wildcards, no $SYS). A superuser identity (the
// aggregator) may publish and subscribe to anything under P, including
// shared subscriptions "$share/GROUP/"+P+"...". A denied QoS 0 publish is
// dropped; a denied QoS 1 publish disconnects an MQTT 3.1.1 client (MQTT 5
// gets a PUBACK with "not authorized"); a denied subscription gets the
// failure return code. Retained publishes on update topics are stored
// unretained.
//
// # Rate limit
//
// Every client but the superusers is held to the per-site inbound rate
// limit of package ratelimit on each publish, before the broker retains or
// routes it: over it a message is dropped, counted (Broker.RateLimited) and
// logged; see ratelimit.go for what a QoS 1 publish gets.
//
// # Known upstream race
//
// mochi v2.7.9 reads a topic's retained-message key without the topic's
// lock (TopicsIndex.scanMessages) while RetainMessage writes it under the
// lock, so the race detector can flag a subscription that coincides with a
// retained publish (a status, a last will, the round announcement). The
// value written is always the topic's own name, so readers see the same
// string either way; it is reported upstream (mochi-mqtt/server#200) and is
// not something this package can lock around.
package broker

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"github.com/edgefl/edgefl/internal/mochiclose"
	"io"
	"log/slog"
	"math"
	"net"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/internal/ratelimit"
	"github.com/edgefl/edgefl/proto/wire"
)

// DefaultMaxPacketSize caps an MQTT packet (16 MiB): a float32 model of
// four million parameters, with room for the envelope. Keep the aggregator's
// wire.Limits.MaxMessageBytes at or below it.
const DefaultMaxPacketSize = 16 << 20

// DefaultMaxInflight is Config.MaxInflight's default: every packet id of
// a connection, the most MQTT allows (queue.go).
const DefaultMaxInflight = math.MaxUint16

// DefaultSessionExpiry is how long a disconnected client's persistent
// session (subscriptions, queued QoS 1 messages) is kept.
const DefaultSessionExpiry = 30 * 24 * time.Hour

// Config configures the embedded broker.
type Config struct {
	// Addr is the listen address, e.g. ":8883"; port 0 picks a free port
	// (see Broker.Addr).
	Addr string
	// TLS, when set, makes the listener TLS. For mutual TLS set ClientAuth
	// to tls.RequireAndVerifyClientCert and ClientCAs to the site CA (see
	// pki.ServerTLSConfig); a verified certificate's CN is the identity.
	TLS *tls.Config
	// Prefix is the federation's topic prefix the ACL covers, ending in
	// '/' (wire.Topics.Prefix()).
	Prefix string
	// Superusers are identities allowed everything under Prefix: the
	// aggregator's client id.
	Superusers []string
	// PasswordFile is a Mosquitto-format password file (see
	// ReadPasswordFile); empty means none.
	PasswordFile string
	// Users are extra username -> plain password credentials kept in
	// memory only (e.g. a random password for the aggregator's own loopback
	// connection, generated at start-up).
	Users map[string]string
	// AllowAnonymous lets a client without credentials in, with its client
	// id as identity (the ACL still applies). For development only.
	AllowAnonymous bool
	// MaxPacketSize caps incoming packets in bytes; 0 means
	// DefaultMaxPacketSize.
	MaxPacketSize uint32
	// SessionExpiry bounds how long a disconnected persistent session is
	// kept; 0 means DefaultSessionExpiry.
	SessionExpiry time.Duration
	// RateLimit is every client's inbound limit but the superusers',
	// enforced on each publish before it is routed (ratelimit.go): zero
	// fields take package ratelimit's defaults, and MaxMessageBytes
	// defaults to the packet cap.
	RateLimit ratelimit.Limits
	// Clock times the rate limit and the ACL denials' log lines; nil
	// means the real clock.
	Clock clock.Clock
	// WriteStall is how long a write to a client (not an in-process one)
	// may make no progress before the connection is closed (stall.go); 0
	// means DefaultWriteStall.
	WriteStall time.Duration
	// MaxInflight bounds the unacknowledged QoS 1 messages the broker
	// holds for one client (mochi's MaximumInflight; queue.go): the
	// aggregator's connection needs about one per site. 0 means
	// DefaultMaxInflight.
	MaxInflight uint16
	// SiteQueue bounds the QoS 1 messages the broker holds for a client
	// that is not a superuser (unacknowledged, or waiting while it is
	// offline): past it the oldest are forgotten (queue.go). 0 means
	// DefaultSiteQueue.
	SiteQueue int
	// Sites, when not empty, is the federation's roster: an identity
	// that is neither on it nor a superuser is refused ("not on the
	// roster"), so that a certificate of the site CA with an unknown CN
	// cannot join. Empty: any identity the credentials allow.
	Sites []string
	// Logger receives the broker's log lines: refused connections (TLS
	// handshakes and MQTT logins, with the client id and the reason, at
	// most once a minute per client and reason) and ACL denials (five per
	// client at once, then one per 10 s with the count suppressed) at Warn,
	// mochi's own lines at Error only (it logs every ordinary disconnect at
	// Warn); nil means slog.Default().
	Logger *slog.Logger
}

// Stats are the broker's security counters.
type Stats struct {
	AuthFailures uint64 // refused connections (TLS handshakes, bad or missing credentials, id mismatch, forbidden will)
	ACLDenied    uint64 // refused publishes and subscriptions
	WriteStalls  uint64 // connections closed because the client stopped reading (stall.go)
	Connected    int64  // clients connected now
}

// Broker is a running embedded broker.
type Broker struct {
	srv      *mqtt.Server
	listener *mochiclose.Listener
	hook     *authHook
	limit    *limitHook
	queue    *queueHook
	addr     string
	tls      bool
	closed   atomic.Bool
}

// Check validates cfg as Start does (the listen address's syntax, the
// prefix, the password file, that clients have a way to authenticate)
// without listening: a daemon calls it before it writes anything.
func Check(cfg Config) error {
	if _, err := newAuthHook(cfg, slog.New(slog.DiscardHandler)); err != nil {
		return err
	}
	if err := cfg.RateLimit.Validate(); err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	if cfg.SiteQueue < 0 {
		return fmt.Errorf("broker: negative site queue %d", cfg.SiteQueue)
	}
	return nil
}

// newAuthHook validates cfg and loads its credentials.
func newAuthHook(cfg Config, log *slog.Logger) (*authHook, error) {
	if cfg.Addr == "" {
		return nil, errors.New("broker: empty listen address")
	}
	if _, _, err := net.SplitHostPort(cfg.Addr); err != nil {
		return nil, fmt.Errorf("broker: listen address: %w", err)
	}
	if _, err := wire.NewTopics(cfg.Prefix); err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	for _, id := range cfg.Superusers {
		if err := wire.ValidID(id); err != nil {
			return nil, fmt.Errorf("broker: superuser: %w", err)
		}
	}
	h := &authHook{prefix: cfg.Prefix, anonymous: cfg.AllowAnonymous, log: log,
		super: map[string]bool{}, hashes: map[string]passwordHash{}, plain: map[string][32]byte{},
		denials: refusalLog{every: aclLogEvery, burst: aclLogBurst}}
	if cfg.Clock != nil {
		h.denials.now = cfg.Clock.Now
		h.record.now = cfg.Clock.Now
	}
	for _, id := range cfg.Sites {
		if err := wire.ValidID(id); err != nil {
			return nil, fmt.Errorf("broker: site: %w", err)
		}
		if h.sites == nil {
			h.sites = map[string]bool{}
		}
		h.sites[id] = true
	}
	for _, id := range cfg.Superusers {
		h.super[id] = true
	}
	if cfg.PasswordFile != "" {
		users, err := ReadPasswordFile(cfg.PasswordFile)
		if err != nil {
			return nil, err
		}
		for u, s := range users {
			ph, _ := parseHash(s) // checked by ReadPasswordFile
			h.hashes[u] = ph
		}
	}
	for u, p := range cfg.Users {
		if err := wire.ValidID(u); err != nil {
			return nil, fmt.Errorf("broker: user: %w", err)
		}
		if p == "" {
			return nil, fmt.Errorf("broker: user %q has an empty password", u)
		}
		h.plain[u] = sha256.Sum256([]byte(p))
	}
	if !cfg.AllowAnonymous && cfg.PasswordFile == "" && len(cfg.Users) == 0 &&
		(cfg.TLS == nil || cfg.TLS.ClientAuth != tls.RequireAndVerifyClientCert) {
		return nil, errors.New("broker: no way to authenticate clients: give a password file, mutual TLS, or (for development) allow anonymous clients")
	}
	return h, nil
}

// Start validates cfg, starts listening and serves in the background until
// Close.
func Start(cfg Config) (*Broker, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.SiteQueue < 0 {
		return nil, fmt.Errorf("broker: negative site queue %d", cfg.SiteQueue)
	}
	h, err := newAuthHook(cfg, log)
	if err != nil {
		return nil, err
	}
	if cfg.AllowAnonymous {
		log.Warn("embedded broker accepts anonymous clients: development only")
	}
	if cfg.TLS == nil && !isLoopback(cfg.Addr) {
		log.Warn("embedded broker listens without TLS on a non-loopback address: passwords and models travel in clear", "addr", cfg.Addr)
	}

	caps := mqtt.NewDefaultServerCapabilities()
	caps.MaximumPacketSize = cfg.MaxPacketSize
	if caps.MaximumPacketSize == 0 {
		caps.MaximumPacketSize = DefaultMaxPacketSize
	}
	exp := cfg.SessionExpiry
	if exp <= 0 {
		exp = DefaultSessionExpiry
	}
	caps.MaximumSessionExpiryInterval = uint32(min(exp/time.Second, math.MaxUint32))
	// Messages (retained round announcements, statuses, queued receipts)
	// must not expire: mochi's default would drop them after one day.
	caps.MaximumMessageExpiryInterval = 0
	caps.MaximumQos = 1
	caps.MaximumInflight = cfg.MaxInflight
	if caps.MaximumInflight == 0 {
		caps.MaximumInflight = DefaultMaxInflight
	}
	if n := len(cfg.Sites); n > int(caps.MaximumInflight)/2 {
		log.Warn("more sites than two unacknowledged messages each fit for the aggregator: messages to it may be dropped (hint: use Mosquitto)",
			"sites", n, "max_inflight", caps.MaximumInflight)
	}

	srv := mqtt.New(&mqtt.Options{
		Capabilities: caps,
		Logger:       slog.New(minLevel{log.With("component", "mqtt-broker").Handler(), slog.LevelError}),
		// $SYS topics are denied to everyone by the ACL; publish rarely.
		SysTopicResendInterval: 60,
	})
	if err := srv.AddHook(h, nil); err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	lh, err := newLimitHook(cfg, caps.MaximumPacketSize, log)
	if err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	if err := srv.AddHook(lh, nil); err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	qh := &queueHook{max: cfg.SiteQueue, inflightMax: int(caps.MaximumInflight), super: h.super, info: srv.Info, log: log}
	if qh.max == 0 {
		qh.max = DefaultSiteQueue
	}
	if err := srv.AddHook(qh, nil); err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	tcp, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("broker: listen on %s: %w", cfg.Addr, err)
	}
	stall := cfg.WriteStall
	if stall <= 0 {
		stall = DefaultWriteStall
	}
	var ln net.Listener = &stallListener{Listener: tcp, stall: stall, onStall: h.stalled}
	if cfg.TLS != nil {
		// The handshake happens before mochi sees the connection, so that
		// a refused one is logged (refusals.go).
		ln = newTLSListener(ln, cfg.TLS, h)
	}
	l := mochiclose.Wrap(listeners.NewNet("edgefl", ln))
	if err := srv.AddListener(l); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("broker: listen on %s: %w", cfg.Addr, err)
	}
	if err := srv.Serve(); err != nil {
		_ = mochiclose.Close(srv, []*mochiclose.Listener{l})
		return nil, fmt.Errorf("broker: serve: %w", err)
	}
	b := &Broker{srv: srv, listener: l, hook: h, limit: lh, queue: qh, addr: l.Address(), tls: cfg.TLS != nil}
	rl := lh.lim.Limits()
	log.Info("embedded MQTT broker listening", "addr", b.addr, "tls", b.tls,
		"mutual_tls", cfg.TLS != nil && cfg.TLS.ClientAuth == tls.RequireAndVerifyClientCert,
		"password_users", len(h.hashes), "max_packet_bytes", caps.MaximumPacketSize,
		"rate_msgs_per_s", rl.Messages, "rate_burst", rl.Burst, "rate_bytes_per_s", rl.Bytes, "site_queue", qh.max,
		"max_inflight", caps.MaximumInflight)
	return b, nil
}

func isLoopback(addr string) bool {
	host := addr
	if i := strings.LastIndex(addr, ":"); i >= 0 {
		host = addr[:i]
	}
	host = strings.Trim(host, "[]")
	return host == "localhost" || strings.HasPrefix(host, "127.") || host == "::1"
}

// Addr is the address the broker listens on (with the real port when the
// configured one was 0).
func (b *Broker) Addr() string { return b.addr }

// URL is the paho broker URL of the listener: "tcp://ADDR" or "ssl://ADDR".
func (b *Broker) URL() string {
	if b.tls {
		return "ssl://" + b.addr
	}
	return "tcp://" + b.addr
}

// Stats returns the security counters.
func (b *Broker) Stats() Stats {
	return Stats{
		AuthFailures: b.hook.authFailures.Load(),
		ACLDenied:    b.hook.aclDenied.Load(),
		WriteStalls:  b.hook.writeStalls.Load(),
		Connected:    atomic.LoadInt64(&b.srv.Info.ClientsConnected),
	}
}

// internalListener labels connections made by Dial.
const internalListener = "in-process"

// Dial returns an in-memory connection to the broker for a client in this
// process (the aggregator's paho client, through
// ClientOptions.SetCustomOpenConnectionFn): no socket, no TLS, no password.
// Such a connection's identity is its MQTT client id, which must be a valid
// id; the ACL applies to it as to any other (give the aggregator's id as a
// Superuser).
func (b *Broker) Dial() (net.Conn, error) {
	if b.closed.Load() {
		return nil, errors.New("broker: closed")
	}
	cli, srv := net.Pipe()
	go func() {
		err := b.srv.EstablishConnection(internalListener, srv)
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrClosedPipe) {
			b.hook.log.Debug("in-process connection ended", "err", err)
		}
	}()
	return cli, nil
}

// Drain waits until the messages the broker has taken in have reached the
// connected clients: first until every in-process client (Dial: the
// aggregator) has disconnected, since the broker handles a client's packets
// in order, so that what it published before leaving has been passed on to
// the subscribers; then until every connected client has acknowledged the
// QoS 1 and 2 messages sent to it. It returns nil when that holds, or at
// ctx's end the ids of the clients it was still waiting for (sorted). For
// a daemon exiting after the last message of a run: Close drops whatever
// is still in flight, and with it the retained messages (an embedded
// broker keeps them in memory only).
func (b *Broker) Drain(ctx context.Context) []string {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var waiting []string
		internal := false
		for _, cl := range b.srv.Clients.GetAll() {
			switch {
			case cl.Closed():
			case cl.Net.Listener == internalListener:
				internal = true
				waiting = append(waiting, cl.ID)
			case cl.State.Inflight.Len() > 0:
				waiting = append(waiting, cl.ID)
			}
		}
		if !internal && len(waiting) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			sort.Strings(waiting)
			return waiting
		case <-tick.C:
		}
	}
}

// Close disconnects every client and stops listening.
func (b *Broker) Close() error {
	if !b.closed.CompareAndSwap(false, true) {
		return nil
	}
	// mochi's Close waits for every client but disconnects only those of
	// its registered listeners: the in-process ones are added.
	if err := mochiclose.Close(b.srv, []*mochiclose.Listener{b.listener}, internalListener); err != nil {
		return fmt.Errorf("broker: close: %w", err)
	}
	return nil
}

// authHook authenticates connections and enforces the ACL.
type authHook struct {
	mqtt.HookBase
	prefix    string
	anonymous bool
	super     map[string]bool
	hashes    map[string]passwordHash
	plain     map[string][32]byte
	log       *slog.Logger
	refusals  refusalLog
	record    refusalRecord   // the latest refusal per identity (Refusals)
	sites     map[string]bool // Config.Sites; nil: no roster
	denials   refusalLog      // ACL denials, per client (OnACLCheck)

	authFailures atomic.Uint64
	aclDenied    atomic.Uint64
	writeStalls  atomic.Uint64
}

func (h *authHook) ID() string { return "edgefl-auth-acl" }

func (h *authHook) Provides(b byte) bool {
	return b == mqtt.OnConnectAuthenticate || b == mqtt.OnACLCheck || b == mqtt.OnPublish
}

// dummy is verified against for unknown usernames, so that a failed login
// costs the same whether or not the user exists.
var dummy = passwordHash{iterations: DefaultIterations, salt: make([]byte, saltLen), dk: make([]byte, hashLen)}

func (h *authHook) checkPassword(user string, password []byte) bool {
	if ph, ok := h.hashes[user]; ok {
		return ph.verify(string(password))
	}
	if sum, ok := h.plain[user]; ok {
		got := sha256.Sum256(password)
		return subtle.ConstantTimeCompare(got[:], sum[:]) == 1
	}
	dummy.verify(string(password))
	return false
}

// certIdentity returns the CN of the connection's verified client
// certificate, or "".
func certIdentity(cl *mqtt.Client) string {
	tc, ok := cl.Net.Conn.(*tls.Conn)
	if !ok {
		return ""
	}
	st := tc.ConnectionState()
	if len(st.VerifiedChains) == 0 || len(st.PeerCertificates) == 0 {
		return ""
	}
	return st.PeerCertificates[0].Subject.CommonName
}

func (h *authHook) deny(cl *mqtt.Client, reason string, args ...any) bool {
	h.refused(cl.ID, cl.Net.Remote, reason, args...)
	return false
}

func (h *authHook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	identity := certIdentity(cl)
	user := string(pk.Connect.Username)
	switch {
	case cl.Net.Listener == internalListener:
		identity = cl.ID // only code in this process can reach Dial
	case user != "":
		if identity != "" && user != identity {
			return h.deny(cl, "username differs from the certificate's CN", "username", user, "cn", identity)
		}
		if !h.checkPassword(user, pk.Connect.Password) {
			if identity == "" || len(pk.Connect.Password) > 0 {
				return h.deny(cl, "bad username or password", "username", user)
			}
			// A verified certificate with its CN as username and no
			// password (Mosquitto's use_identity_as_username style).
		}
		identity = user
	case identity != "":
	case h.anonymous:
		identity = cl.ID
	default:
		return h.deny(cl, "no credentials")
	}
	if err := wire.ValidID(identity); err != nil {
		return h.deny(cl, "identity is not a valid edgefl id", "identity", identity)
	}
	if cl.ID != identity {
		return h.deny(cl, "client id must equal the identity (username or certificate CN)", "identity", identity)
	}
	if h.sites != nil && !h.sites[identity] && !h.super[identity] && cl.Net.Listener != internalListener {
		return h.deny(cl, "identity not on the roster (--sites)")
	}
	if pk.Connect.WillFlag && !h.allowed(identity, pk.Connect.WillTopic, true) {
		return h.deny(cl, "last will on a topic the client may not publish", "will_topic", pk.Connect.WillTopic)
	}
	return true
}

// allowed is the ACL: may identity write topic (write) or subscribe to
// filter (!write)?
func (h *authHook) allowed(identity, topic string, write bool) bool {
	if h.super[identity] {
		t := topic
		if !write && strings.HasPrefix(t, "$share/") {
			// $share/GROUP/FILTER
			parts := strings.SplitN(t, "/", 3)
			if len(parts) < 3 || parts[1] == "" {
				return false
			}
			t = parts[2]
		}
		return strings.HasPrefix(t, h.prefix)
	}
	rest, ok := strings.CutPrefix(topic, h.prefix)
	if !ok {
		return false
	}
	if write {
		return rest == "updates/"+identity || rest == "clients/"+identity+"/status"
	}
	return rest == "round" || rest == "run" || rest == "receipts/"+identity
}

func (h *authHook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	if h.allowed(cl.ID, topic, write) {
		return true
	}
	// Counted last, as refusals are: a denial in Stats has been logged or
	// suppressed.
	defer h.aclDenied.Add(1)
	op := "subscribe"
	if write {
		op = "publish"
	}
	// A site publishing to a forbidden topic in a loop would otherwise
	// write a line per message: aclLogBurst lines per client at once, then
	// one per aclLogEvery with the count suppressed in between.
	ok, suppressed := h.denials.allow(cl.ID)
	if !ok {
		return false
	}
	args := []any{"client_id", cl.ID, "topic", topic}
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	h.log.Warn("mqtt "+op+" denied by ACL", args...)
	return false
}

// The ACL denials' log lines per client: a burst (a misconfigured site's
// few denied topics each get a line), then one per aclLogEvery.
const (
	aclLogBurst = 5
	aclLogEvery = 10 * time.Second
)

// OnPublish stores sites' updates unretained: a retained update would be
// re-delivered to the aggregator on every subscription.
func (h *authHook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Retain && !h.super[cl.ID] && strings.HasPrefix(pk.TopicName, h.prefix+"updates/") {
		pk.FixedHeader.Retain = false
	}
	return pk, nil
}

// minLevel drops records below min: mochi logs every connection at Info
// and every ordinary disconnect (EOF) at Warn; the hook logs refusals.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(a []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(a), h.min}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.min}
}

package aggregator

import (
	"maps"
	"net/url"
	"slices"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/internal/metrics"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
)

// Every absent site explained: the aggregator knows its roster (the sites
// it expects: ServerConfig.Roster) and shows each one in status, the
// console and /metrics, "never connected" until it is heard of, with the
// latest connection the embedded broker refused under its name (a
// certificate of another CA or expired, a wrong password, an identity off
// the roster). Its own connection to the broker is shown the same way:
// whether it is connected, since when, and why the broker refused it; while
// it is not connected the sites' liveness is unknown, and status says so
// rather than repeating the last statuses it heard.

// SiteRefusal is the latest refused connection of one claimed identity (a
// client id, or a certificate's unverified CN; "" when a TLS handshake
// named none), with how many there were.
type SiteRefusal struct {
	ID     string    `json:"id"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
	Count  uint64    `json:"count"`
}

// BrokerStatus is the aggregator's own connection to the broker.
type BrokerStatus struct {
	URL       string `json:"url"`
	Connected bool   `json:"connected"`
	// Since is when the connection was last made (Connected) or lost or
	// first tried (not Connected); nil before the first attempt.
	Since *time.Time `json:"since,omitempty"`
	// LastError is why the latest attempt failed (the broker's refusal,
	// "not Authorized" for a wrong password, or the network's error).
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
	// ConnectFailures counts failed connection attempts, Lost the
	// connections lost, since the daemon started.
	ConnectFailures uint64 `json:"connect_failures"`
	Lost            uint64 `json:"lost"`
}

// brokerConn tracks the aggregator's broker connection from paho's
// connection notifications (whether it is open now is paho's own state).
type brokerConn struct {
	mu        sync.Mutex
	since     time.Time
	lastErr   string
	lastErrAt time.Time
	failures  uint64
	lost      uint64
	// the refusal log lines: one per reason change, else one a minute
	loggedErr string
	loggedAt  time.Time
	quiet     uint64 // failures not logged since the last line
}

// connLogEvery bounds the log lines of a broker that keeps refusing the
// aggregator for the same reason.
const connLogEvery = time.Minute

// onConnNotification is paho's connection notification handler.
func (s *Server) onConnNotification(_ mqtt.Client, n mqtt.ConnectionNotification) {
	now := s.clock.Now()
	c := &s.conn
	c.mu.Lock()
	switch n := n.(type) {
	case mqtt.ConnectionNotificationConnected:
		c.since = now
		c.loggedErr, c.quiet = "", 0
	case mqtt.ConnectionNotificationLost:
		c.since = now
		c.lost++
	case mqtt.ConnectionNotificationConnecting:
		if c.since.IsZero() {
			c.since = now
		}
	case mqtt.ConnectionNotificationFailed:
		msg := "connection failed"
		if n.Reason != nil {
			msg = n.Reason.Error()
		}
		c.failures++
		c.lastErr, c.lastErrAt = msg, now
		if msg == c.loggedErr && now.Sub(c.loggedAt) < connLogEvery {
			c.quiet++
			break
		}
		args := []any{"broker", s.cfg.BrokerURL, "client_id", s.cfg.ClientID, "err", msg, "failures", c.failures}
		if c.quiet > 0 {
			args = append(args, "suppressed", c.quiet)
		}
		c.loggedErr, c.loggedAt, c.quiet = msg, now, 0
		c.mu.Unlock()
		// "not Authorized" is the broker refusing the aggregator's own
		// login: its username/password or certificate.
		s.log.Warn("the broker refused or failed the aggregator's connection; retrying", append(args, "hint", "check --username, --broker-password-file, the TLS files, and the broker's passwords and ACL")...)
		s.notify()
		return
	}
	c.mu.Unlock()
	s.notify()
}

// brokerStatus is the connection as status shows it.
func (s *Server) brokerStatus() BrokerStatus {
	c := &s.conn
	c.mu.Lock()
	defer c.mu.Unlock()
	// paho's own state decides Connected: its notifications run on
	// goroutines of their own, so a "lost" may be handled after the
	// "connected" of the reconnection that followed it.
	open := false
	select {
	case <-s.ready: // s.client is set before, and not changed after
		open = s.client != nil && s.client.IsConnectionOpen()
	default: // starting: not connected yet
	}
	b := BrokerStatus{URL: redactURL(s.cfg.BrokerURL), Connected: open, LastError: c.lastErr, ConnectFailures: c.failures, Lost: c.lost}
	if !c.since.IsZero() {
		t := c.since.UTC()
		b.Since = &t
	}
	if !c.lastErrAt.IsZero() {
		t := c.lastErrAt.UTC()
		b.LastErrorAt = &t
	}
	return b
}

// redactURL drops a URL's user information (a password may be written in
// it): status and the console show no credential.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	u.User = nil
	return u.String()
}

// refusals returns the embedded broker's refusals by identity (nil
// without the embedded broker).
func (s *Server) refusals() map[string]SiteRefusal {
	if s.cfg.BrokerRefusals == nil {
		return nil
	}
	out := map[string]SiteRefusal{}
	for _, r := range s.cfg.BrokerRefusals() {
		r.At = r.At.UTC()
		out[r.ID] = r
	}
	return out
}

// addRoster completes a live status with the roster, the refusals and the
// broker connection: every roster site gets a row (never connected until
// heard of), every row its latest refusal, and the refusals of identities
// that are neither on the roster nor known go to st.Refused. While the
// aggregator is not connected to the broker, no site is shown online: the
// statuses it holds are from before the outage.
func (s *Server) addRoster(st *Status) {
	b := s.brokerStatus()
	st.Broker = &b
	on := map[string]bool{}
	for _, id := range s.cfg.Roster {
		on[id] = true
	}
	seen := map[string]bool{}
	for i := range st.Clients {
		seen[st.Clients[i].ID] = true
	}
	for _, id := range slices.Sorted(maps.Keys(on)) {
		if !seen[id] {
			st.Clients = append(st.Clients, ClientInfo{ID: id, NeverConnected: true})
		}
	}
	ref := s.refusals()
	for i := range st.Clients {
		c := &st.Clients[i]
		c.Expected = on[c.ID]
		if r, ok := ref[c.ID]; ok {
			c.LastRefusal = &r
			delete(ref, c.ID)
		}
		if !b.Connected {
			c.Online, c.LivenessUnknown = false, true
		}
	}
	for _, id := range slices.Sorted(maps.Keys(ref)) {
		if id == s.cfg.ClientID {
			continue
		}
		st.Refused = append(st.Refused, ref[id])
	}
	slices.SortFunc(st.Clients, func(a, b ClientInfo) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
}

// otherIdentity labels, in /metrics, the refusals of identities that are
// neither on the roster nor known clients (a made-up id cannot grow the
// label set).
const otherIdentity = "(not a site)"

// rosterFamilies are the metrics of the broker connection, the roster and
// the refusals.
func (s *Server) rosterFamilies() []metrics.Family {
	b := s.brokerStatus()
	f := []metrics.Family{
		metrics.One(ns+"broker_connected", "1 while the aggregator is connected to the broker (0: the sites' liveness is unknown, and the clients gauge shows none online).", metrics.Gauge, b2f(b.Connected)),
		metrics.One(ns+"broker_connect_failures_total", "Failed attempts of the aggregator to connect to the broker (a refused login: see the log and /status's broker.last_error).", metrics.Counter, float64(b.ConnectFailures)),
		metrics.One(ns+"broker_connections_lost_total", "Broker connections the aggregator lost.", metrics.Counter, float64(b.Lost)),
	}
	if len(s.cfg.Roster) == 0 && s.cfg.BrokerRefusals == nil {
		return f
	}
	// The roster's states as status shows them: a site the state file
	// knows is online or offline, one it does not know never connected.
	st, err := s.fileStatus()
	if err != nil {
		st = Status{}
	}
	st.Clients = slices.Clone(st.Clients)
	s.addRoster(&st)
	counts := map[string]uint64{"online": 0, "offline": 0, "never_connected": 0}
	refusals := map[string]uint64{}
	last := []metrics.Sample{}
	for _, c := range st.Clients {
		if c.Expected {
			switch {
			case c.NeverConnected:
				counts["never_connected"]++
			case c.Online:
				counts["online"]++
			default:
				counts["offline"]++
			}
		}
		if r := c.LastRefusal; r != nil {
			refusals[c.ID] = r.Count
			last = append(last, metrics.Sample{Labels: []metrics.Label{{Name: "site", Value: c.ID}}, Value: unixOrZero(r.At)})
		}
	}
	for _, r := range st.Refused {
		refusals[otherIdentity] += r.Count
	}
	if len(s.cfg.Roster) > 0 {
		f = append(f, metrics.Family{Name: ns + "roster_sites", Help: "The roster's sites (--sites) by state: online, offline, never_connected.",
			Type: metrics.Gauge, Samples: metrics.Samples("state", counts)})
	}
	if s.cfg.BrokerRefusals != nil {
		f = append(f,
			metrics.Family{Name: ns + "site_refusals_total", Help: "Connections the embedded broker refused, by the site they claimed (identities neither on the roster nor known: " + otherIdentity + ").",
				Type: metrics.Counter, Samples: metrics.Samples("site", refusals)},
			metrics.Family{Name: ns + "site_last_refusal_seconds", Help: "When the embedded broker last refused a site's connection (Unix seconds; its reason is in /status).",
				Type: metrics.Gauge, Samples: last})
	}
	return f
}

// StatisticsOverdue is the statistics phase past its deadline below its
// quorum: it closes as soon as Quorum sites sent theirs; Missing are the
// sites (the roster's and those known) whose statistics are not in, each
// with why.
type StatisticsOverdue struct {
	Deadline time.Time     `json:"deadline"`
	Quorum   int           `json:"quorum"`
	Received []string      `json:"received"`
	Missing  []MissingSite `json:"missing"`
}

// MissingSite is a site whose statistics (or other report) are awaited,
// and the aggregator's best knowledge of why they are not in.
type MissingSite struct {
	ID  string `json:"id"`
	Why string `json:"why"`
}

// missingSites lists the rows of st not in have, each with why.
func missingSites(st Status, have []string) []MissingSite {
	var out []MissingSite
	for _, c := range st.Clients {
		if slices.Contains(have, c.ID) {
			continue
		}
		out = append(out, MissingSite{ID: c.ID, Why: whyAbsent(c)})
	}
	return out
}

// whyAbsent says what the aggregator knows of a site that has not sent
// what is awaited: a site error beats a refusal newer than the site's last
// message, which beats never connected, offline, and online.
func whyAbsent(c ClientInfo) string {
	refusedSince := c.LastRefusal != nil && (c.LastSeen == nil || c.LastRefusal.At.After(*c.LastSeen))
	switch {
	case c.Error != nil:
		return "site error " + c.Error.Reason + ": " + c.Error.Message
	case refusedSince:
		return "refused by the broker: " + c.LastRefusal.Reason + " (" + c.LastRefusal.At.Format(time.RFC3339) + ")"
	case c.LivenessUnknown:
		return "unknown: the aggregator is not connected to the broker"
	case c.NeverConnected:
		return "never connected (with an external broker its refusals are not visible to the aggregator: see the broker's log)"
	case !c.Online && c.LastSeen != nil:
		return "offline since " + c.LastSeen.Format(time.RFC3339)
	case !c.Online:
		return "offline"
	case len(c.Rejections) > 0:
		return "online; its messages were rejected (see rejections)"
	}
	return "online, has not sent it"
}

// statisticsOverdue is st's statistics phase past its deadline (nil when
// it is not): the coordinator closes the phase at its deadline when the
// quorum is in, so a statistics phase past it is below quorum.
func (s *Server) statisticsOverdue(st Status) *StatisticsOverdue {
	if st.Phase != coordinator.PhaseStatistics || st.Deadline == nil || s.clock.Now().Before(*st.Deadline) {
		return nil
	}
	got := slices.Clone(st.StatisticsSites)
	if got == nil {
		got = []string{}
	}
	return &StatisticsOverdue{Deadline: st.Deadline.UTC(), Quorum: coordinator.QuorumOf(s.cfg.K, s.cfg.QuorumFraction), Received: got, Missing: missingSites(st, got)}
}

// warnStatisticsOverdue logs the statistics phase's missed deadline,
// naming each missing site and why.
func (s *Server) warnStatisticsOverdue(d coordinator.StatsOverdue) {
	st, err := ReadStatus(s.store)
	if err != nil {
		s.log.Error("reading the status for the overdue statistics phase", "err", err)
	}
	s.addRoster(&st)
	missing := missingSites(st, d.Sites)
	args := []any{"deadline", d.Deadline, "received", len(d.Sites), "quorum", d.Quorum, "sites", d.Sites}
	for _, m := range missing {
		args = append(args, "missing."+m.ID, m.Why)
	}
	s.log.Warn("statistics phase below quorum at its deadline: waiting until the quorum has sent statistics", args...)
}

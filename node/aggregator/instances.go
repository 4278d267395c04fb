package aggregator

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/edgefl/edgefl/internal/metrics"
	"github.com/edgefl/edgefl/proto/wire"
)

// Two installations with one site id (a cloned SD card, two
// gateways each with its own state file) take the MQTT session from each
// other every few seconds, and both would send updates for the site. Each
// installation draws a random instance id once and keeps it in its state
// file (edgestore.Identity.InstanceID); its statuses and updates carry it.
// The aggregator serves each site for one installation, the holder:
//
//   - the first instance seen holds the site;
//   - a new instance whose online status comes while the holder is offline
//     replaces it (a gateway started over with --reset-state after a crash,
//     or replaced): logged at WARN, not counted as a duplicate;
//   - an instance seen while the holder is online, or an earlier holder
//     that comes back after it was replaced (two installations taking turns:
//     a clone), is a second installation: the site goes back to the first
//     instance seen, a conflict is recorded, and from then on every other
//     instance's statuses and updates are set aside (not applied, not
//     stored, no receipt: a receipt on the site's receipts topic would
//     reach whichever installation holds the session), counted
//     (edgefl_aggregator_duplicate_instances_total{site} once per second
//     installation, edgefl_aggregator_instance_set_aside_total{site} per
//     message, updates also in updates_rejected_total{reason=
//     "duplicate_instance"}), shown in `status` and logged at WARN (the first
//     message of each, then at most once a minute per site with the count);
//   - in a conflict another instance takes the site over only once the
//     holder is offline and stopped cleanly (its own offline status) or
//     has been offline for ServerConfig.InstanceTakeover (its last will). A
//     holder knocked off by its clone is back within seconds (the agent's
//     reconnect backoff is at most a minute by default).
//
// So a clone is detected at the latest when the first installation
// reconnects after the clone took the session (seconds); until then the
// clone's messages count as the site's. Messages without an instance id
// (agents older than this) are applied as before. The guard's state is kept
// in memory: after a restart of the aggregator the first instance seen holds
// each site again. A state file copied with the SD card carries the same
// instance id, so two copies of one file look like one installation: run
// --reset-state on the copy (or give it its own site id).

// DefaultInstanceTakeover is how long a site's holder must have been gone
// (its last will) before another installation takes the site over.
const DefaultInstanceTakeover = 10 * time.Minute

const instanceLogEvery = time.Minute

// siteInstance is one site's holder and the other installations seen.
type siteInstance struct {
	first    string // the first instance seen: the site's in a conflict
	holder   string
	online   bool            // the holder's last status
	clean    bool            // its last offline status was its own (a clean stop), not its will
	since    time.Time       // when the holder went offline (or was last seen online)
	conn     uint64          // the highest connection number of the holder's statuses
	conflict bool            // two installations seen alive: the site stays with first
	replaced map[string]bool // earlier holders replaced while offline
	others   map[string]time.Time
	aside    uint64 // messages set aside since the last log line
	lastLog  time.Time
}

// instanceGuard holds every site's installation; it is safe for concurrent
// use (statuses come from the event loop, updates from the ingest workers).
type instanceGuard struct {
	mu       sync.Mutex
	takeover time.Duration
	sites    map[string]*siteInstance
	dups     metrics.LabeledCounter // second installations seen, by site
	setAside metrics.LabeledCounter // messages set aside, by site
}

// instanceVerdict is what the guard decided about one message.
type instanceVerdict struct {
	ok       bool   // apply the message
	holder   string // the site's holder
	newDup   bool   // the first message of a second installation
	logNow   bool   // log the set-aside message (with aside messages since the last line)
	aside    uint64 //
	takeover string // the previous holder, when this message's instance took the site over in a conflict
	replaced string // the previous holder, offline, when this message's new instance replaced it
	dupOf    string // the installation found to take turns with the first (the first is back)
}

func (g *instanceGuard) site(id string) *siteInstance {
	if g.sites == nil {
		g.sites = map[string]*siteInstance{}
	}
	si := g.sites[id]
	if si == nil {
		si = &siteInstance{}
		g.sites[id] = si
	}
	return si
}

// status judges a status message received at now.
func (g *instanceGuard) status(st *wire.ClientStatus, now time.Time) instanceVerdict {
	inst := st.InstanceId
	if inst == "" {
		return instanceVerdict{ok: true}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	si := g.site(st.ClientId)
	v := instanceVerdict{ok: true}
	switch {
	case si.holder == "":
		si.holder, si.first = inst, inst
	case si.holder != inst:
		if !st.Online {
			return g.aside(st.ClientId, si, inst, now) // another's will or stop
		}
		_, other := si.others[inst]
		returning := other || si.replaced[inst]
		switch {
		case returning && inst == si.first:
			// The first installation is back after another took the site
			// while it was away: two take turns. The site is the first's.
			g.others(st.ClientId, si, si.holder, now)
			v.dupOf, si.conflict = si.holder, true
			g.hold(si, inst)
		case si.online:
			// Two installations alive at once.
			si.conflict = true
			return g.aside(st.ClientId, si, inst, now)
		case si.conflict || returning:
			if !g.free(si, now) {
				si.conflict = true
				return g.aside(st.ClientId, si, inst, now)
			}
			v.takeover = si.holder
			g.hold(si, inst)
		default:
			// A new installation while the holder is offline: the gateway
			// started over (--reset-state) or was replaced.
			if si.replaced == nil {
				si.replaced = map[string]bool{}
			}
			if len(si.replaced) >= 16 {
				clear(si.replaced)
			}
			si.replaced[si.holder] = true
			v.replaced = si.holder
			g.hold(si, inst)
		}
	}
	v.holder = si.holder
	// The holder's own status: the same order rules as the coordinator's
	// (a status of an older connection, or an online status after the
	// offline of its connection, is stale).
	c := st.Connection
	if c != 0 && (c < si.conn || c == si.conn && st.Online && !si.online) {
		return v
	}
	si.conn = max(si.conn, c)
	if st.Online != si.online || st.Online {
		si.since = now
	}
	si.online = st.Online
	si.clean = !st.Online && st.TimestampUnixMs != 0 // a will carries no timestamp
	return v
}

// hold gives the site to inst (its statuses then set the holder's state).
func (g *instanceGuard) hold(si *siteInstance, inst string) {
	si.holder, si.online, si.clean, si.conn, si.since = inst, false, false, 0, time.Time{}
	delete(si.others, inst)
}

// others records inst as a second installation of site, counting it the
// first time.
func (g *instanceGuard) others(site string, si *siteInstance, inst string, now time.Time) {
	if si.others == nil {
		si.others = map[string]time.Time{}
	}
	if _, seen := si.others[inst]; !seen {
		if len(si.others) >= 16 {
			clear(si.others) // bound the map; the counter keeps the history
		}
		g.dups.Inc(site)
	}
	si.others[inst] = now
}

// free reports whether the site's holder has let it go: offline, and
// stopped cleanly or gone for the takeover time.
func (g *instanceGuard) free(si *siteInstance, now time.Time) bool {
	return !si.online && (si.clean || now.Sub(si.since) >= g.takeover)
}

// update judges an update: only the holder's are applied (an update never
// takes a site over; the installation's online status comes first).
func (g *instanceGuard) update(u *wire.ClientUpdate, now time.Time) instanceVerdict {
	inst := u.InstanceId
	if inst == "" {
		return instanceVerdict{ok: true}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	si := g.site(u.ClientId)
	if si.holder == "" {
		// Its online status is on its way (the ingest workers run in
		// parallel): it is connected now.
		si.holder, si.first, si.online, si.since = inst, inst, true, now
	}
	if si.holder == inst {
		return instanceVerdict{ok: true, holder: inst}
	}
	return g.aside(u.ClientId, si, inst, now)
}

// aside counts a message of inst, not the holder of site, set aside.
func (g *instanceGuard) aside(site string, si *siteInstance, inst string, now time.Time) instanceVerdict {
	v := instanceVerdict{holder: si.holder}
	_, seen := si.others[inst]
	v.newDup = !seen
	g.others(site, si, inst, now)
	g.setAside.Inc(site)
	si.aside++
	if v.newDup || now.Sub(si.lastLog) >= instanceLogEvery {
		v.logNow, v.aside = true, si.aside
		si.aside, si.lastLog = 0, now
	}
	return v
}

// DuplicateInstance is a site for which a second installation was seen.
type DuplicateInstance struct {
	Site string `json:"site"`
	// Instance holds the site: its statuses and updates are applied.
	Instance string `json:"instance"`
	// Others are the other installations, set aside, with when each was
	// last heard from.
	Others []OtherInstance `json:"others"`
	// SetAside counts their messages set aside since the aggregator
	// started.
	SetAside uint64 `json:"set_aside"`
}

// OtherInstance is an installation set aside.
type OtherInstance struct {
	ID       string    `json:"id"`
	LastSeen time.Time `json:"last_seen"`
}

// report lists the sites with a second installation, by site.
func (g *instanceGuard) report() []DuplicateInstance {
	counts := g.setAside.Snapshot()
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []DuplicateInstance
	for _, id := range slices.Sorted(maps.Keys(g.sites)) {
		si := g.sites[id]
		if len(si.others) == 0 {
			continue
		}
		d := DuplicateInstance{Site: id, Instance: si.holder, SetAside: counts[id]}
		for _, o := range slices.Sorted(maps.Keys(si.others)) {
			d.Others = append(d.Others, OtherInstance{ID: o, LastSeen: si.others[o]})
		}
		out = append(out, d)
	}
	return out
}

// families are the guard's metrics.
func (g *instanceGuard) families() []metrics.Family {
	return []metrics.Family{
		{Name: ns + "duplicate_instances_total", Help: "Second installations seen for a site id (another instance id in a status or update: a cloned gateway), by site; their messages are set aside.",
			Type: metrics.Counter, Samples: metrics.Samples("site", g.dups.Snapshot())},
		{Name: ns + "instance_set_aside_total", Help: "Statuses and updates of an installation that does not hold its site id, set aside, by site.",
			Type: metrics.Counter, Samples: metrics.Samples("site", g.setAside.Snapshot())},
	}
}

// instanceStatus applies the guard to a status in the event loop: false
// when the status is set aside.
func (s *Server) instanceStatus(st *wire.ClientStatus, now time.Time) bool {
	v := s.inst.status(st, now)
	switch {
	case v.dupOf != "":
		s.log.Warn("a second installation uses this site id: the first is back and keeps the site, the other is set aside", "hint", "a cloned gateway? give each its own site_id, or run edge-agent --reset-state on the copy",
			"client", st.ClientId, "holder", st.InstanceId, "instance", v.dupOf)
		s.notify()
	case v.takeover != "":
		s.log.Warn("site taken over by another installation (the previous one stopped, or has been offline for --instance-takeover)",
			"client", st.ClientId, "instance", st.InstanceId, "previous", v.takeover, "takeover_after", s.inst.takeover)
	case v.replaced != "":
		s.log.Warn("site now served by another installation: the previous one is offline", "hint", "a gateway started over with --reset-state, or replaced; the first keeps the site if it comes back",
			"client", st.ClientId, "instance", st.InstanceId, "previous", v.replaced)
	}
	if !v.ok {
		s.logAside(st.ClientId, st.InstanceId, v, "status")
		s.notify()
	}
	return v.ok
}

// instanceUpdate applies the guard to an update: false when it is set
// aside (counted as rejected, no receipt).
func (s *Server) instanceUpdate(u *wire.ClientUpdate) bool {
	v := s.inst.update(u, s.clock.Now())
	if !v.ok {
		s.reject(u.ClientId, "duplicate_instance")
		s.logAside(u.ClientId, u.InstanceId, v, "update")
	}
	return v.ok
}

func (s *Server) logAside(site, inst string, v instanceVerdict, what string) {
	if !v.logNow {
		return
	}
	s.log.Warn("a second installation uses this site id: its statuses and updates are set aside", "hint", "a cloned gateway? give each its own site_id, or run edge-agent --reset-state on the copy",
		"client", site, "instance", inst, "holder", v.holder, "message", what, "set_aside", v.aside, "first", v.newDup)
}

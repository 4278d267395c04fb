package coordinator

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/edgefl/edgefl/learn/aggregate"
)

// gen makes a random but mostly plausible event stream: it reads the driven
// coordinator's round, phase, timer and last selection so that most updates
// come from selected clients for the current round, plus noise.
type gen struct {
	rng      *rand.Rand
	now      time.Time
	ids      []string
	selected []string
}

func newGen(seed uint64) *gen {
	g := &gen{rng: rand.New(rand.NewPCG(seed, 99)), now: t0}
	for i := range 8 {
		g.ids = append(g.ids, fmt.Sprintf("c%d", i))
	}
	return g
}

func (g *gen) anyID() string {
	switch g.rng.IntN(20) {
	case 0:
		return "ghost" // never online
	case 1:
		return "" // malformed
	}
	return g.ids[g.rng.IntN(len(g.ids))]
}

func (g *gen) next(c *Coordinator) Event {
	g.now = g.now.Add(time.Duration(g.rng.IntN(300)) * time.Millisecond)
	switch p := g.rng.Float64(); {
	case p < 0.15:
		if g.rng.IntN(3) == 0 {
			return ClientOffline{ID: g.anyID(), At: g.now}
		}
		// Now and then with a site error: online, not selectable.
		return ClientOnline{ID: g.anyID(), Samples: g.rng.IntN(50) - 5, Failing: g.rng.IntN(8) == 0, At: g.now}
	case p < 0.60:
		id := g.anyID()
		if len(g.selected) > 0 && g.rng.IntN(10) < 7 {
			id = g.selected[g.rng.IntN(len(g.selected))]
		}
		r := c.Round()
		switch q := g.rng.IntN(20); {
		case q < 2:
			r--
		case q < 3:
			r++
		case q < 4:
			r = g.rng.IntN(r + 3)
		}
		loss := g.rng.Float64()
		if g.rng.IntN(4) == 0 {
			loss = math.NaN()
		}
		return UpdateArrived{Client: id, Round: r, Partial: g.rng.IntN(3) == 0, Loss: loss, At: g.now}
	case p < 0.85:
		if d := c.NextDeadline(); !d.IsZero() && g.rng.IntN(2) == 0 {
			if d.After(g.now) {
				g.now = d
			}
		}
		return Tick{At: g.now}
	case p < 0.97:
		r := c.Round()
		if g.rng.IntN(10) == 0 {
			r += g.rng.IntN(3) - 1
		}
		return AggregatedRound{Round: r, At: g.now}
	default:
		g.now = g.now.Add(time.Duration(g.rng.IntN(5000)) * time.Millisecond)
		return Tick{At: g.now}
	}
}

func (g *gen) observe(ds []Decision) {
	for _, d := range ds {
		if a, ok := d.(Announce); ok {
			g.selected = a.Selected
		}
	}
}

// randomConfig varies the policy with the seed.
func randomConfig(seed uint64) Config {
	rng := rand.New(rand.NewPCG(seed, 7))
	k := 1 + rng.IntN(4)
	cfg := Config{
		K: k, Quorum: 1 + rng.IntN(k),
		RoundTimeout:    time.Duration(200+rng.IntN(800)) * time.Millisecond,
		Extension:       time.Duration(rng.IntN(500)) * time.Millisecond,
		MaxReselections: rng.IntN(4) - 1,
		Settle:          time.Duration(rng.IntN(2)*30) * time.Millisecond,
		Rounds:          rng.IntN(2) * (2 + rng.IntN(4)),
		Seed:            seed,
		StoreLate:       rng.IntN(2) == 0,
	}
	switch rng.IntN(3) {
	case 0:
		cfg.Selector = aggregate.BySamples{}
	case 1:
		cfg.Selector = &rotor{}
	}
	return cfg
}

// restored returns a new coordinator holding c's state, through JSON as the
// shell stores it.
func restored(t *testing.T, cfg Config, c *Coordinator) *Coordinator {
	t.Helper()
	b, err := json.Marshal(c.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	r := mustNew(t, cfg)
	if err := r.Restore(s); err != nil {
		t.Fatalf("restore: %v\n%s", err, b)
	}
	mustEqual(t, "snapshot after restore", r.Snapshot(), c.Snapshot())
	return r
}

// checker asserts the invariants on the decision stream of one run.
type checker struct {
	t          *testing.T
	cfg        Config
	finished   bool
	open       int  // announced, not closed round (0: none)
	lastClosed int  // last closed round
	aggregated bool // lastClosed was aggregated
	online     map[string]bool
	invited    map[string]bool // of the open round
	accepted   map[int]map[string]bool
	late       map[string]bool // "round/client" accepted late
	counters   Counters
	round      int
}

func newChecker(t *testing.T, cfg Config) *checker {
	return &checker{t: t, cfg: cfg, aggregated: true, online: map[string]bool{}, invited: map[string]bool{},
		accepted: map[int]map[string]bool{}, late: map[string]bool{}, round: 1}
}

func (k *checker) fail(i int, ev Event, ds []Decision, format string, a ...any) {
	k.t.Helper()
	k.t.Fatalf("event %d %T%+v -> %+v: %s", i, ev, ev, ds, fmt.Sprintf(format, a...))
}

func (k *checker) check(i int, c *Coordinator, ev Event, ds []Decision) {
	k.t.Helper()
	k.summaryAgrees(i, c, ev, ds)
	if k.finished && (len(ds) > 1 || len(ds) == 1 && !isReject(ds[0])) {
		k.fail(i, ev, ds, "decision after Finished other than answering an update")
	}
	switch e := ev.(type) {
	case ClientOnline:
		if e.ID != "" {
			k.online[e.ID] = true
		}
	case ClientOffline:
		k.online[e.ID] = false
	case AggregatedRound:
		if k.open == 0 && e.Round == k.lastClosed && !k.aggregated {
			k.aggregated = true
		}
	case UpdateArrived:
		if k.finished {
			break
		}
		var n int
		for _, d := range ds {
			switch d := d.(type) {
			case Accept:
				n++
				if d.Round != e.Round || d.Client != e.Client {
					k.fail(i, ev, ds, "answer for another update")
				}
			case AcceptLate:
				n++
				if d.Round != e.Round || d.Client != e.Client {
					k.fail(i, ev, ds, "answer for another update")
				}
			case Reject:
				n++
				if d.Round != e.Round || d.Client != e.Client {
					k.fail(i, ev, ds, "answer for another update")
				}
			}
		}
		if n != 1 || len(ds) == 0 {
			k.fail(i, ev, ds, "want exactly one answer, first")
		}
	}
	for j, d := range ds {
		switch d := d.(type) {
		case Announce:
			if k.open == 0 {
				if !k.aggregated || d.Round != k.lastClosed+1 {
					k.fail(i, ev, ds, "announce of round %d while round %d is not aggregated (%v)", d.Round, k.lastClosed, k.aggregated)
				}
				k.open = d.Round
				k.invited = map[string]bool{}
			} else if d.Round != k.open {
				k.fail(i, ev, ds, "announce of round %d while round %d is open", d.Round, k.open)
			}
			if !slices.IsSorted(d.Selected) || len(slices.Compact(slices.Clone(d.Selected))) != len(d.Selected) ||
				len(d.Selected) < k.cfg.Quorum || len(d.Selected) > k.cfg.K {
				k.fail(i, ev, ds, "bad selection %v", d.Selected)
			}
			for id := range k.accepted[d.Round] {
				if !slices.Contains(d.Selected, id) {
					k.fail(i, ev, ds, "re-selection dropped contributor %s", id)
				}
			}
			for _, id := range d.Selected {
				if !k.accepted[d.Round][id] && !k.online[id] {
					k.fail(i, ev, ds, "selected offline client %s", id)
				}
				k.invited[id] = true
			}
			if !d.Deadline.After(norm(ev.eventTime())) {
				k.fail(i, ev, ds, "deadline not in the future")
			}
		case Extend:
			if d.Round != k.open {
				k.fail(i, ev, ds, "extend of a round not open")
			}
		case Accept:
			if d.Round != k.open || !k.invited[d.Client] || k.accepted[d.Round][d.Client] {
				k.fail(i, ev, ds, "accept of an uninvited, duplicate or closed update")
			}
			if k.accepted[d.Round] == nil {
				k.accepted[d.Round] = map[string]bool{}
			}
			k.accepted[d.Round][d.Client] = true
		case AcceptLate:
			key := fmt.Sprint(d.Round, "/", d.Client)
			if !k.cfg.StoreLate || d.Round > k.lastClosed || k.accepted[d.Round][d.Client] || k.late[key] {
				k.fail(i, ev, ds, "bad late accept")
			}
			k.late[key] = true
		case CloseRound:
			if d.Round != k.open || len(d.Contributors) < k.cfg.Quorum || !slices.IsSorted(d.Contributors) {
				k.fail(i, ev, ds, "bad close")
			}
			for _, id := range d.Contributors {
				if !k.accepted[d.Round][id] {
					k.fail(i, ev, ds, "contributor %s was not accepted", id)
				}
			}
			if len(d.Contributors) != len(k.accepted[d.Round]) {
				k.fail(i, ev, ds, "accepted updates missing from contributors")
			}
			for _, id := range d.Stragglers {
				if !k.invited[id] || slices.Contains(d.Contributors, id) {
					k.fail(i, ev, ds, "bad straggler %s", id)
				}
			}
			if len(d.Contributors)+len(d.Stragglers) != len(k.invited) {
				k.fail(i, ev, ds, "contributors + stragglers != invited")
			}
			k.lastClosed, k.open, k.aggregated = d.Round, 0, false
		case SetTimer:
			if j != len(ds)-1 || !d.At.Equal(c.NextDeadline()) {
				k.fail(i, ev, ds, "SetTimer not last or not NextDeadline")
			}
		case Finished:
			if k.cfg.Rounds == 0 || d.Rounds != k.cfg.Rounds || d.Rounds != k.lastClosed || j != len(ds)-1 {
				k.fail(i, ev, ds, "bad Finished")
			}
			k.finished = true
		case Reject:
		default:
			k.fail(i, ev, ds, "unknown decision %T", d)
		}
	}
	if r := c.Round(); r < k.round || r > k.round+1 {
		k.fail(i, ev, ds, "round went from %d to %d", k.round, r)
	}
	k.round = c.Round()
	if (c.Phase() == PhaseFinished) != k.finished {
		k.fail(i, ev, ds, "phase %s, finished %v", c.Phase(), k.finished)
	}
	n := c.Counters()
	o := k.counters
	if n.Accepted < o.Accepted || n.AcceptedLate < o.AcceptedLate || n.PartialUpdates < o.PartialUpdates ||
		n.Stragglers < o.Stragglers || n.Extensions < o.Extensions || n.Reselections < o.Reselections ||
		n.Stalls < o.Stalls || n.RoundsClosed < o.RoundsClosed || n.Ignored < o.Ignored {
		k.fail(i, ev, ds, "counters went back: %+v -> %+v", o, n)
	}
	for r, v := range o.Rejected {
		if n.Rejected[r] < v {
			k.fail(i, ev, ds, "rejected[%v] went back", r)
		}
	}
	k.counters = n
}

// TestRandomEvents feeds seeded random event streams and checks the
// invariants after every step, alongside a twin that is snapshotted and
// restored (through JSON) at random points and must decide identically.
func TestRandomEvents(t *testing.T) {
	seeds, events := 300, 300
	if testing.Short() {
		seeds = 50
	}
	var closed, finished, extended, reselected, stalled, late uint64
	for seed := range uint64(seeds) {
		cfg := randomConfig(seed)
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			c, twin, prop := mustNew(t, cfg), mustNew(t, cfg), mustNew(t, cfg)
			g, k := newGen(seed), newChecker(t, cfg)
			fails := rand.New(rand.NewPCG(seed, 7)) // not g's stream: the events stay the same
			for i := range events {
				ev := g.next(c)
				ds := c.Step(ev)
				g.observe(ds)
				k.check(i, c, ev, ds)
				if g.rng.IntN(25) == 0 {
					twin = restored(t, cfg, twin)
				}
				if tds := twin.Step(ev); !reflect.DeepEqual(tds, ds) {
					t.Fatalf("event %d %T%+v: restored twin decided\n %+v\nnot\n %+v", i, ev, ev, tds, ds)
				}
				if pds := proposed(t, prop, ev, fails.IntN(4) == 0); !reflect.DeepEqual(pds, ds) {
					t.Fatalf("event %d %T%+v: accept-then-advance decided\n %+v\nnot\n %+v", i, ev, ev, pds, ds)
				}
			}
			mustEqual(t, "final state", twin.Snapshot(), c.Snapshot())
			mustEqual(t, "final state (accept then advance)", prop.Snapshot(), c.Snapshot())
			n := c.Counters()
			closed += n.RoundsClosed
			extended += n.Extensions
			reselected += n.Reselections
			stalled += n.Stalls
			late += n.AcceptedLate
			if k.finished {
				finished++
			}
		})
	}
	// The generator must reach every path, or the invariants prove little.
	if closed == 0 || finished == 0 || extended == 0 || reselected == 0 || stalled == 0 || late == 0 {
		t.Fatalf("coverage: closed %d finished %d extended %d reselected %d stalled %d late %d",
			closed, finished, extended, reselected, stalled, late)
	}
	t.Logf("rounds closed %d, runs finished %d, extensions %d, reselections %d, stalls %d, late accepts %d",
		closed, finished, extended, reselected, stalled, late)
}

// TestRestartMidRound: a coordinator restored from a snapshot taken after
// any prefix of a stream makes the same subsequent decisions as the one that
// ran uninterrupted.
func TestRestartMidRound(t *testing.T) {
	for i, seed := range []uint64{3, 11, 42} {
		cfg := randomConfig(seed)
		cfg.K, cfg.Quorum, cfg.MaxReselections, cfg.Rounds = 3, 2, 1, 0
		cfg.Selector = []aggregate.Selector{nil, aggregate.BySamples{}, &rotor{}}[i]
		c := mustNew(t, cfg)
		g := newGen(seed)
		var evs []Event
		var want [][]Decision
		for range 200 {
			ev := g.next(c)
			ds := c.Step(ev)
			g.observe(ds)
			evs, want = append(evs, ev), append(want, ds)
		}
		if c.Counters().RoundsClosed < 2 {
			t.Fatalf("seed %d: stream closes only %d rounds", seed, c.Counters().RoundsClosed)
		}
		for cut := range len(evs) {
			a := mustNew(t, cfg)
			stepAll(a, evs[:cut]...)
			b := restored(t, cfg, a)
			for i := cut; i < len(evs); i++ {
				if got := b.Step(evs[i]); !reflect.DeepEqual(got, want[i]) {
					t.Fatalf("seed %d, restored after %d events: event %d %T%+v decided\n %+v\nnot\n %+v",
						seed, cut, i, evs[i], evs[i], got, want[i])
				}
			}
		}
	}
}

// proposed steps ev as the shell does (Propose; for a message it accepts,
// Stored), the store failing once first when fail (StoreFailed, which must
// leave the state as it was, and the message comes again). It returns the
// batch the shell carries out.
func proposed(t *testing.T, c *Coordinator, ev Event, fail bool) []Decision {
	t.Helper()
	before := c.Snapshot()
	ds := c.Propose(ev)
	if !c.Pending() {
		return ds
	}
	mustEqual(t, "state after Propose", c.Snapshot(), before)
	if fail {
		c.Step(StoreFailed{At: ev.eventTime()})
		mustEqual(t, "state after StoreFailed", c.Snapshot(), before)
		ds = c.Propose(ev)
	}
	all := c.Step(Stored{At: ev.eventTime()})
	if len(ds) != 1 || len(all) == 0 || !reflect.DeepEqual(all[0], ds[0]) {
		t.Fatalf("proposed %+v, committed %+v", ds, all)
	}
	return all
}

func isReject(d Decision) bool { _, ok := d.(Reject); return ok }

// summaryAgrees: Summary, kept up by counts and lists that only grow,
// says what Snapshot (which walks the whole state) says, and the count
// the waiting phase draws with is the pool's size.
func (k *checker) summaryAgrees(i int, c *Coordinator, ev Event, ds []Decision) {
	k.t.Helper()
	sum, st := c.Summary(), c.Snapshot()
	var online, ready int
	for _, cl := range st.Clients {
		online += b2i(cl.Online)
		ready += b2i(cl.Online && !cl.Failing)
	}
	var received []string
	for _, r := range st.Received {
		received = append(received, r.Client)
	}
	switch {
	case sum.Online != online || c.ready != ready:
		k.fail(i, ev, ds, "online %d, ready %d; the registry says %d, %d", sum.Online, c.ready, online, ready)
	case !slices.Equal(sum.Selected, st.Selected):
		k.fail(i, ev, ds, "summary selected %v, state %v", sum.Selected, st.Selected)
	case !slices.Equal(slices.Sorted(slices.Values(sum.Received)), received):
		k.fail(i, ev, ds, "summary received %v, state %v", sum.Received, received)
	case !slices.Equal(slices.Sorted(slices.Values(sum.StatsSites)), st.StatsSites):
		k.fail(i, ev, ds, "summary statistics sites %v, state %v", sum.StatsSites, st.StatsSites)
	case c.poolSize() != len(c.pool()):
		k.fail(i, ev, ds, "pool size %d, pool %v", c.poolSize(), c.pool())
	}
}

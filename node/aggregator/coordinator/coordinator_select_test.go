package coordinator

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/learn/aggregate"
	"github.com/edgefl/edgefl/learn/dp"
)

// poissonConfig: DP with the poisson selector (q from K/N or explicit),
// K = 4, quorum fraction 0.5, no re-selection.
func poissonConfig(q float64, key *[32]byte) Config {
	cfg := baseConfig()
	cfg.K, cfg.Quorum, cfg.MaxReselections, cfg.Rounds = 4, 2, 0, 0
	cfg.Selector = aggregate.Poisson{Q: q}
	cfg.SelectionKey = key
	cfg.DP = &dp.Config{Clip: 1, Noise: 1.2, Delta: 1e-5}
	return cfg
}

func poolIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("s%02d", i)
	}
	return ids
}

// wantDraw is the selection of round r from the sorted pool, drawn the way
// simulate draws it (aggregate.Poisson over the same candidates, from
// streams.Selection): the coordinator must pick exactly that.
func wantDraw(sel aggregate.Selector, pool []string, k, r int, seed uint64, key *[32]byte) []string {
	cands := make([]aggregate.Candidate, len(pool))
	for i, id := range pool {
		cands[i] = aggregate.Candidate{ID: id, Samples: 10, Loss: math.NaN()}
	}
	out := []string{}
	for _, i := range sel.Select(r, cands, k, streams.Selection(seed, key, r, 0)) {
		out = append(out, pool[i])
	}
	return out
}

// TestCoordinatorPoissonDraw: for several rates, pools and keys, every
// round's selection is the Poisson draw of streams.Selection over the
// sorted pool (the same draw simulate makes), of any size, never topped up
// or capped at K; its sampling rate and fixed denominator are
// aggregate.SamplingRate and DPDenominator; the accountant is charged at
// that rate every round, empty rounds included. With a selection key the
// draws do not depend on the public seed.
func TestCoordinatorPoissonDraw(t *testing.T) {
	key := dp.TestSelectionKey(3)
	for _, tc := range []struct {
		name  string
		q     float64
		pool  int
		key   *[32]byte
		wantQ float64
		wantM int
	}{
		{"k/n", 0, 10, nil, 0.4, 4},
		{"k/n keyed", 0, 10, &key, 0.4, 4},
		{"k/n small pool", 0, 3, &key, 1, 3},
		{"q=0.3", 0.3, 10, &key, 0.3, 3},
		{"q=0.05", 0.05, 12, &key, 0.05, 1},
		{"q=0.9", 0.9, 7, nil, 0.9, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := poissonConfig(tc.q, tc.key)
			cfg.Quorum = 1 // the pool of 3 must be drawable
			c := mustNew(t, cfg)
			pool := poolIDs(tc.pool)
			bringOnline(c, ms(0), pool...)
			sizes := map[int]bool{}
			acc := dp.NewAccountant(nil)
			base := 10000
			var carried []Decision // every site online: a round is drawn when the previous one is aggregated
			for r := 1; r <= 12; r++ {
				ds := append(carried, c.Step(Tick{At: ms(base)})...)
				a := only[Announce](t, ds)
				if want := wantDraw(cfg.Selector, pool, cfg.K, r, cfg.Seed, tc.key); !slices.Equal(a.Selected, want) {
					t.Fatalf("round %d: selected %v, the draw is %v", r, a.Selected, want)
				}
				sizes[len(a.Selected)] = true
				st := c.Snapshot().DP
				if math.Abs(st.Q-tc.wantQ) > 1e-15 || st.M != tc.wantM {
					t.Fatalf("round %d: q %v, denominator %d; want %v, %d", r, st.Q, st.M, tc.wantQ, tc.wantM)
				}
				crs := OfType[CloseRound](ds)
				for i, id := range a.Selected {
					crs = append(crs, OfType[CloseRound](c.Step(upd(id, r, base+100+i)))...)
				}
				if len(crs) != 1 || crs[0].Denominator != tc.wantM || len(crs[0].Contributors) != len(a.Selected) {
					t.Fatalf("round %d: closes %+v, want one close of %d contributors over %d", r, crs, len(a.Selected), tc.wantM)
				}
				// Charged at the close (an empty draw closes the moment
				// it is drawn, before the previous aggregation returns).
				_ = acc.Step(tc.wantQ, cfg.DP.Noise)
				if eps, n, _ := c.Privacy(); n != uint64(r) || eps != must(acc.Epsilon(cfg.DP.Delta)) {
					t.Fatalf("round %d: epsilon %v after %d charges, want %v", r, eps, n, must(acc.Epsilon(cfg.DP.Delta)))
				}
				base += 500
				carried = c.Step(AggregatedRound{Round: r, At: ms(base)})
			}
			if tc.wantQ < 1 && len(sizes) < 2 {
				t.Errorf("every round drew the same number of sites: %v", sizes)
			}
		})
	}
	// The key, not the seed, decides.
	a, b := poissonConfig(0, &key), poissonConfig(0, &key)
	b.Seed = 99
	var drawsA, drawsB [][]string
	for _, cfg := range []Config{a, b} {
		c := mustNew(t, cfg)
		bringOnline(c, ms(0), poolIDs(10)...)
		a := only[Announce](t, c.Step(Tick{At: ms(100)}))
		if cfg.Seed == 99 {
			drawsB = append(drawsB, a.Selected)
		} else {
			drawsA = append(drawsA, a.Selected)
		}
	}
	mustEqual(t, "keyed draws with two seeds", drawsA, drawsB)
}

func must(v, _ float64) float64 { return v }

// TestCoordinatorEmptyRound: a draw of no site is announced and closes at
// once, with no contributors, over the fixed denominator, and is charged;
// the next round then opens as usual.
func TestCoordinatorEmptyRound(t *testing.T) {
	cfg := poissonConfig(1e-12, nil)
	c := mustNew(t, cfg)
	bringOnline(c, ms(0), poolIDs(5)...)
	ds := c.Step(Tick{At: ms(100)})
	mustEqual(t, "an empty round", ds, []Decision{
		Announce{Round: 1, Deadline: ms(1100)},
		CloseRound{Round: 1, At: ms(100), Contributors: []string{}, Partial: []string{}, Stragglers: []string{}, Denominator: 1},
		SetTimer{}, // the settle timer, cancelled: nothing to wait for
	})
	if _, n, _ := c.Privacy(); n != 1 {
		t.Fatalf("the empty round was charged %d times, want once", n)
	}
	if eps, n, _ := c.SitePrivacy(); eps != 0 || n != 0 {
		t.Fatalf("after an empty round the per-site epsilon is %v over %d rounds, want 0", eps, n)
	}
	mustEqual(t, "resumed while closing", restored(t, cfg, c).Resume(), []Decision{ds[1]})
	c.Step(AggregatedRound{Round: 1, At: ms(200)})
	mustEqual(t, "next round", c.Round(), 2)
	if a := drawn(t, c, ms(300)); a.Round != 2 || len(a.Selected) != 0 {
		t.Fatalf("round 2: %+v", a)
	}
}

// TestCoordinatorPoissonQuorum: a round's quorum is the quorum fraction of
// the sites it drew (QuorumOf), for the deadline and the extension; below
// it the round stalls (no re-selection under DP) and closes when enough
// invited sites report.
func TestCoordinatorPoissonQuorum(t *testing.T) {
	for _, tc := range []struct {
		quorum, k, drawn, want int
	}{
		{2, 4, 10, 5}, // fraction 0.5 of 10
		{2, 4, 3, 2},
		{3, 4, 10, 8}, // 0.75 * 10 = 7.5
		{1, 4, 1, 1},
		{4, 4, 6, 6},
	} {
		cfg := poissonConfig(1, nil) // q = 1: every pool member is drawn
		cfg.K, cfg.Quorum = tc.k, tc.quorum
		c := mustNew(t, cfg)
		pool := poolIDs(tc.drawn)
		bringOnline(c, ms(0), pool...)
		a := only[Announce](t, c.Step(Tick{At: ms(100)}))
		if len(a.Selected) != tc.drawn {
			t.Fatalf("q = 1 drew %d of %d", len(a.Selected), tc.drawn)
		}
		for i := 0; i < tc.want-1; i++ {
			c.Step(upd(pool[i], 1, 200+i))
		}
		ext := c.Step(Tick{At: ms(1100)}) // one short of the quorum at the deadline
		if len(OfType[Extend](ext)) != 1 {
			t.Fatalf("%+v: %d of %d reported at the deadline: %+v, want an extension", tc, tc.want-1, tc.drawn, ext)
		}
		if tc.want == tc.drawn {
			c.Step(Tick{At: ms(1600)})
			mustEqual(t, fmt.Sprintf("%+v: phase below quorum after the extension", tc), c.Phase(), PhaseStalled)
		}
		cr := OfType[CloseRound](c.Step(upd(pool[tc.want-1], 1, 1700)))
		if tc.want < tc.drawn {
			// Overdue: closes the moment it has its quorum.
			if len(cr) != 1 || len(cr[0].Contributors) != tc.want || len(cr[0].Stragglers) != tc.drawn-tc.want {
				t.Fatalf("%+v: %+v, want a close with %d contributors", tc, cr, tc.want)
			}
			continue
		}
		if len(cr) != 1 || len(cr[0].Stragglers) != 0 {
			t.Fatalf("%+v: %+v, want a close with every drawn site", tc, cr)
		}
	}
	// A Sampler needs DP.
	cfg := poissonConfig(0, nil)
	cfg.DP = nil
	if _, err := New(cfg); !errors.Is(err, ErrConfig) {
		t.Fatalf("poisson without DP: %v, want ErrConfig", err)
	}
}

// TestCoordinatorInvitations: with Config.Invitations every selected site
// gets an Invite before the announcement, the sites still waiting get one
// again with the extension, when they come online (also after a restart
// of the aggregator: Resume) and not once they reported; nobody else ever
// does. Without Invitations there are none.
func TestCoordinatorInvitations(t *testing.T) {
	cfg := poissonConfig(1, nil) // every pool member: a, b, c
	cfg.Invitations = true
	c := mustNew(t, cfg)
	bringOnline(c, ms(0), "a", "b", "c")
	mustEqual(t, "announcement", c.Step(Tick{At: ms(100)}), []Decision{
		Invite{Round: 1, Client: "a"}, Invite{Round: 1, Client: "b"}, Invite{Round: 1, Client: "c"},
		Announce{Round: 1, Selected: []string{"a", "b", "c"}, Deadline: ms(1100)}, SetTimer{At: ms(1100)}})
	bringOnline(c, ms(150), "d")
	mustEqual(t, "a site not selected comes online", bringOnline(c, ms(160), "d"), []Decision(nil))
	c.Step(upd("a", 1, 200))
	mustEqual(t, "a reported and reconnects", bringOnline(c, ms(210), "a"), []Decision(nil))
	mustEqual(t, "b reconnects", bringOnline(c, ms(220), "b"), []Decision{Invite{Round: 1, Client: "b"}})
	mustEqual(t, "extension", c.Step(Tick{At: ms(1100)}), []Decision{
		Invite{Round: 1, Client: "b"}, Invite{Round: 1, Client: "c"},
		Extend{Round: 1, Selected: []string{"a", "b", "c"}, Deadline: ms(1600)}, SetTimer{At: ms(1600)}})
	mustEqual(t, "aggregator restarted", restored(t, cfg, c).Resume(), []Decision{
		Invite{Round: 1, Client: "b"}, Invite{Round: 1, Client: "c"},
		Announce{Round: 1, Selected: []string{"a", "b", "c"}, Deadline: ms(1600)}, SetTimer{At: ms(1600)}})
	c.Step(upd("b", 1, 1200))
	mustEqual(t, "c reconnects while the round closes", bringOnline(c, ms(1300), "c"), []Decision(nil))

	cfg.Invitations = false
	c = mustNew(t, cfg)
	bringOnline(c, ms(0), "a", "b")
	if ds := append(c.Step(Tick{At: ms(100)}), bringOnline(c, ms(200), "a")...); len(OfType[Invite](ds)) != 0 {
		t.Fatalf("invitations without Config.Invitations: %+v", ds)
	}
}

// TestCoordinatorSitePrivacy: the unamplified per-site epsilon is the
// unsampled Gaussian (q = 1) over the rounds of the site that contributed
// most (stragglers are not charged), and it survives Snapshot/Restore.
func TestCoordinatorSitePrivacy(t *testing.T) {
	cfg := poissonConfig(1, nil)
	cfg.Quorum = 1
	c := mustNew(t, cfg)
	bringOnline(c, ms(0), "a", "b", "c")
	// a reports every round, b every other round, c never (a straggler).
	base := 10000
	for r := 1; r <= 4; r++ {
		c.Step(Tick{At: ms(base)}) // round 1 after Settle; later rounds were drawn when the previous was aggregated
		c.Step(upd("a", r, base+100))
		if r%2 == 0 {
			c.Step(upd("b", r, base+110))
		}
		only[CloseRound](t, c.Step(Tick{At: ms(base + 1000)}))
		base += 2000
		c.Step(AggregatedRound{Round: r, At: ms(base)})
		want := dp.EpsilonAfter(1, cfg.DP.Noise, r, cfg.DP.Delta, nil)
		eps, n, ok := c.SitePrivacy()
		if !ok || n != uint64(r) || math.Abs(eps-want) > 1e-9*want {
			t.Fatalf("round %d: per-site epsilon %v over %d rounds, want %v over %d", r, eps, n, want, r)
		}
		amp, _, _ := c.Privacy()
		if amp > eps+1e-12 {
			t.Fatalf("round %d: the amplified epsilon %v exceeds the unamplified %v", r, amp, eps)
		}
		c = restored(t, cfg, c)
		if e2, n2, _ := c.SitePrivacy(); e2 != eps || n2 != n {
			t.Fatalf("round %d: restored per-site epsilon %v over %d, want %v over %d", r, e2, n2, eps, n)
		}
	}
	mustEqual(t, "site rounds", c.Snapshot().DP.SiteRounds, map[string]uint64{"a": 4, "b": 2})
	st := c.Snapshot()
	st.DP.SiteRounds["a"] = 5 // more than the rounds charged
	if err := mustNew(t, cfg).Restore(st); !errors.Is(err, ErrBadState) {
		t.Fatalf("a site charged more than the run: %v, want ErrBadState", err)
	}
}

// TestCoordinatorFixedRounds: with dp.Config.FixedRounds a round closes at
// its deadline and never earlier, whatever its draw (empty, some, every
// site) and however fast the invited sites report, so every round lasts
// RoundTimeout and the announcements follow each other at one interval;
// without it the same draws close as soon as the last invited site
// reported (an empty one at once). The extension below quorum is
// unchanged.
func TestCoordinatorFixedRounds(t *testing.T) {
	key := dp.TestSelectionKey(5)
	for _, tc := range []struct {
		name string
		q    float64
	}{{"empty draws", 1e-12}, {"half", 0.5}, {"every site", 1}} {
		for _, fixed := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/fixed=%v", tc.name, fixed), func(t *testing.T) {
				cfg := poissonConfig(tc.q, &key)
				cfg.DP.FixedRounds = fixed
				c := mustNew(t, cfg)
				pool := poolIDs(6)
				bringOnline(c, ms(0), pool...)
				now := 100
				var starts []int
				sizes := map[int]bool{}
				for r := 1; r <= 6; r++ {
					a := drawn(t, c, ms(now))
					starts = append(starts, now)
					sizes[len(c.Snapshot().Selected)] = true
					deadline := now + 1000
					if !a.Deadline.Equal(ms(deadline)) {
						t.Fatalf("round %d: deadline %v, want %v", r, a.Deadline, ms(deadline))
					}
					closedAt := now // an empty draw closes at once without fixed rounds
					var closes []CloseRound
					for i, id := range c.Snapshot().Selected {
						closedAt = now + 10 + i
						closes = append(closes, OfType[CloseRound](c.Step(upd(id, r, closedAt)))...)
					}
					if fixed {
						if len(closes) != 0 {
							t.Fatalf("round %d: closed at %v before its deadline", r, closes[0].At)
						}
						cr := only[CloseRound](t, c.Step(Tick{At: ms(deadline)}))
						if !cr.At.Equal(ms(deadline)) || len(cr.Stragglers) != 0 {
							t.Fatalf("round %d: %+v, want a close at the deadline with no stragglers", r, cr)
						}
						closedAt = deadline
					} else if c.Phase() != PhaseClosing || !c.Snapshot().ClosedAt.Equal(ms(closedAt)) {
						t.Fatalf("round %d: phase %v closed at %v, want closed at %v", r, c.Phase(), c.Snapshot().ClosedAt, ms(closedAt))
					}
					c.Step(AggregatedRound{Round: r, At: ms(closedAt + 5)})
					now = closedAt + 5 // every site online: the next round is drawn at once
				}
				if tc.q == 0.5 && len(sizes) < 2 {
					t.Fatalf("q = 0.5 drew rounds of sizes %v only: the case shows nothing", sizes)
				}
				if fixed {
					for i := 1; i < len(starts); i++ {
						if d := starts[i] - starts[i-1]; d != 1005 {
							t.Fatalf("rounds %d and %d started %d ms apart, want 1005 (deadline, aggregation)", i, i+1, d)
						}
					}
				}
			})
		}
	}
	// The distributed mode publishes its selection: fixed rounds refused.
	c := dp.Config{Clip: 1, Noise: 1, Delta: 1e-5, Distributed: true, FixedRounds: true}
	if err := c.Validate(); !errors.Is(err, dp.ErrDistributedFixedRounds) {
		t.Fatalf("distributed with fixed rounds: %v", err)
	}
}

// TestCoordinatorFixedRoster: with Config.FixedRoster the first draw fixes
// the roster as every registered site (online or not); a site first seen
// later is never drawn, also after a restore, while the roster's sites
// are drawn as before.
func TestCoordinatorFixedRoster(t *testing.T) {
	cfg := poissonConfig(1, nil) // every pool member every round
	cfg.FixedRoster = true
	c := mustNew(t, cfg)
	bringOnline(c, ms(0), "a", "b", "c")
	c.Step(ClientOffline{ID: "c", At: ms(1)})
	if r := c.Roster(); r != nil {
		t.Fatalf("a roster before the first draw: %v", r)
	}
	a := only[Announce](t, c.Step(Tick{At: ms(100)}))
	if !slices.Equal(a.Selected, []string{"a", "b"}) || !slices.Equal(c.Roster(), []string{"a", "b", "c"}) {
		t.Fatalf("round 1 drew %v, roster %v; want a, b of the roster a, b, c", a.Selected, c.Roster())
	}
	bringOnline(c, ms(150), "late", "c")
	c.Step(upd("a", 1, 200))
	c.Step(upd("b", 1, 200))
	// Every site is online: round 2 is drawn as round 1 is aggregated.
	a = only[Announce](t, c.Step(AggregatedRound{Round: 1, At: ms(300)}))
	c = restored(t, cfg, c)
	if r := only[Announce](t, c.Resume()); !slices.Equal(r.Selected, a.Selected) {
		t.Fatalf("resumed round 2 as %v, drawn as %v", r.Selected, a.Selected)
	}
	if !slices.Equal(a.Selected, []string{"a", "b", "c"}) {
		t.Fatalf("round 2 drew %v, want the roster's a, b, c and not the late site", a.Selected)
	}
}

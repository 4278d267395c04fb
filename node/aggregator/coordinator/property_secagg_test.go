package coordinator

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"
)

// secAggGen is gen for a secure-aggregation run: mostly the messages the
// phase expects from the sites it expects, the SecAggAdvanced that answers
// a pending SecAggAdvance (a random subset of the phase's senders as the
// next phase's sites, or an abort), plus noise.
type secAggGen struct {
	*gen
	advance *SecAggAdvance // pending, from the last batch
	sent    []string       // who sent the open phase's message
	expect  []string
}

func (g *secAggGen) next(c *Coordinator) Event {
	g.now = g.now.Add(time.Duration(g.rng.IntN(200)) * time.Millisecond)
	if a := g.advance; a != nil && g.rng.IntN(3) > 0 {
		g.advance = nil
		ev := SecAggAdvanced{Round: a.Round, Attempt: a.Attempt, Phase: a.Phase, At: g.now}
		if g.rng.IntN(6) == 0 {
			ev.Err = "secagg: fewer sites than the threshold remain"
			return ev
		}
		from := g.sent
		if a.Phase == SecAggUnmask {
			from = g.expect // the server's sum is over U3
		}
		for _, id := range from {
			if g.rng.IntN(12) > 0 {
				ev.Next = append(ev.Next, id)
			}
		}
		g.sent = nil
		return ev
	}
	attempt, phase, _ := c.SecAggSession()
	switch p := g.rng.Float64(); {
	case p < 0.1:
		if g.rng.IntN(3) == 0 {
			return ClientOffline{ID: g.anyID(), At: g.now}
		}
		return ClientOnline{ID: g.anyID(), Samples: 10, At: g.now}
	case p < 0.7:
		id := g.anyID()
		pool := g.selected
		if c.Phase() == PhaseSecAgg {
			pool = g.expect
		}
		if len(pool) > 0 && g.rng.IntN(10) < 8 {
			id = pool[g.rng.IntN(len(pool))]
		}
		ev := SecAggArrived{Client: id, Round: c.Round(), Attempt: attempt, Kind: SecAggKind(phase), At: g.now}
		switch g.rng.IntN(12) {
		case 0:
			ev.Round--
		case 1:
			ev.Attempt++
		case 2:
			ev.Kind = SecAggKind(g.rng.IntN(4))
		case 3:
			if ev.Attempt > 0 {
				ev.Attempt--
			}
		}
		return ev
	case p < 0.9:
		if d := c.NextDeadline(); !d.IsZero() && d.After(g.now) && g.rng.IntN(2) == 0 {
			g.now = d
		}
		return Tick{At: g.now}
	default:
		return AggregatedRound{Round: c.Round(), At: g.now}
	}
}

func (g *secAggGen) observe(ds []Decision) {
	for _, d := range ds {
		switch d := d.(type) {
		case Announce:
			g.selected, g.sent = d.Selected, nil
		case AcceptSecAgg:
			g.sent = append(g.sent, d.Client)
		case SecAggAdvance:
			g.advance = &d
		case AnnounceSecAgg:
			g.sent = nil
		case SecAggAbort:
			g.advance, g.sent = nil, nil
		}
	}
}

// TestRandomSecAggEvents feeds random secure-aggregation event streams and
// checks, after every step: each site message gets exactly one answer,
// first; a round closes only right after the unmask phase of its current
// session advanced without error, with exactly that phase's sites (U3) as
// its contributors, at least the threshold of them; an abort starts the
// next session and nothing of the aborted one is accepted after it; a
// twin restored from JSON at random points, and the accept-then-advance
// path, decide identically.
func TestRandomSecAggEvents(t *testing.T) {
	seeds, events := 200, 400
	if testing.Short() {
		seeds = 40
	}
	var closed, aborts, advances uint64
	for seed := range uint64(seeds) {
		cfg := secAggConfig(seed)
		k, th := cfg.K, cfg.SecAgg.Threshold
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			c, twin, prop := mustNew(t, cfg), mustNew(t, cfg), mustNew(t, cfg)
			fails := rand.New(rand.NewPCG(seed, 7))
			g := &secAggGen{gen: newGen(seed)}
			for _, id := range g.ids[:k+1] {
				c.Step(ClientOnline{ID: id, Samples: 10, At: g.now})
				twin.Step(ClientOnline{ID: id, Samples: 10, At: g.now})
				prop.Step(ClientOnline{ID: id, Samples: 10, At: g.now})
			}
			var lastUnmask *SecAggAdvanced // the last successful unmask advance, until the round closes
			for i := range events {
				attemptBefore, _, _ := c.SecAggSession()
				ev := g.next(c)
				ds := c.Step(ev)
				g.expect = c.sa.expect
				g.observe(ds)
				fail := func(format string, a ...any) {
					t.Helper()
					t.Fatalf("event %d %T%+v -> %+v: %s", i, ev, ev, ds, fmt.Sprintf(format, a...))
				}
				if e, ok := ev.(SecAggArrived); ok && c.Phase() != PhaseFinished || ok && len(ds) > 0 {
					n := 0
					for _, d := range ds {
						switch d := d.(type) {
						case AcceptSecAgg:
							n++
							if d.Client != e.Client || d.Round != e.Round || d.Kind != e.Kind || d.Attempt != attemptBefore {
								fail("an answer for another message, or of another session")
							}
						case RejectSecAgg:
							n++
							if d.Client != e.Client || d.Round != e.Round || d.Kind != e.Kind {
								fail("an answer for another message")
							}
						}
					}
					if n != 1 || !(isAnswer(ds[0])) {
						fail("want exactly one answer, first")
					}
				}
				if e, ok := ev.(SecAggAdvanced); ok && e.Phase == SecAggUnmask && e.Err == "" && len(OfType[CloseRound](ds)) == 1 {
					lastUnmask = &e
				}
				for _, d := range ds {
					switch d := d.(type) {
					case CloseRound:
						closed++
						if lastUnmask == nil || lastUnmask.Round != d.Round {
							fail("a round closed without its session's unmask")
						}
						if !slices.Equal(d.Contributors, slices.Sorted(slices.Values(lastUnmask.Next))) || len(d.Contributors) < th {
							fail("contributors %v, want U3 %v (at least %d)", d.Contributors, lastUnmask.Next, th)
						}
						lastUnmask = nil
					case SecAggAbort:
						aborts++
						if a, _, _ := c.SecAggSession(); a != d.Attempt+1 {
							fail("an abort did not start the next session")
						}
					case SecAggAdvance:
						advances++
					}
				}
				if g.rng.IntN(20) == 0 {
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
		})
	}
	if closed == 0 || aborts == 0 || advances == 0 {
		t.Fatalf("coverage: closed %d, aborts %d, advances %d", closed, aborts, advances)
	}
	t.Logf("rounds closed %d, sessions aborted %d, phase advances %d", closed, aborts, advances)
}

// secAggConfig is a random secure-aggregation configuration of seed.
func secAggConfig(seed uint64) Config {
	rng := rand.New(rand.NewPCG(seed, 13))
	k := 2 + rng.IntN(4)
	th := k/2 + 1 + rng.IntN(k-k/2)
	return Config{K: k, Quorum: th + rng.IntN(k-th+1), RoundTimeout: time.Second, Extension: 300 * time.Millisecond,
		MaxReselections: rng.IntN(3) - 1, Settle: 20 * time.Millisecond, Rounds: rng.IntN(2) * (2 + rng.IntN(3)), Seed: seed,
		SecAgg: &SecAggConfig{Threshold: th, Timeout: 500 * time.Millisecond}}
}

func isAnswer(d Decision) bool {
	switch d.(type) {
	case AcceptSecAgg, RejectSecAgg:
		return true
	}
	return false
}

package coordinator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
)

// logged is one replay log entry of the model shell below.
type logged struct {
	ev    Event
	index uint64
}

// replayShell models what the aggregator shell stores (server.go propose
// and apply): a site's message is proposed, stored with the next replay log
// index and stepped Stored; after a lone accept (Replayable) nothing else
// is written, after any other batch the state is written when it changed,
// which clears the log.
type replayShell struct {
	t      *testing.T
	cfg    Config
	c      *Coordinator
	stored []byte // the state last written
	log    []logged
	index  uint64
	writes int // state writes
}

func newReplayShell(t *testing.T, cfg Config) *replayShell {
	sh := &replayShell{t: t, cfg: cfg, c: mustNew(t, cfg)}
	sh.write() // a new round log stores the initial state
	return sh
}

func (sh *replayShell) write() {
	b, err := json.Marshal(sh.c.Snapshot())
	if err != nil {
		sh.t.Fatal(err)
	}
	if !bytes.Equal(b, sh.stored) {
		sh.stored, sh.log = b, nil
		sh.writes++
	}
}

// step carries one event through the shell's path and returns the batch
// it carries out.
func (sh *replayShell) step(ev Event) []Decision {
	ds := sh.c.Propose(ev)
	if sh.c.Pending() {
		sh.index++
		ds = sh.c.Step(Stored{At: ev.eventTime(), Index: sh.index})
		sh.log = append(sh.log, logged{ev, sh.index})
		if Replayable(ds) {
			return ds
		}
		// A crash before this batch's state write: the stored state and
		// the log, this message included, rebuild the state it reached.
		sh.check("a message's batch, before its state write")
	}
	sh.write()
	return ds
}

// rebuilt is a coordinator restarted from what the shell stored: the
// stored state through JSON, then every logged message replayed.
func (sh *replayShell) rebuilt() *Coordinator {
	var st State
	if err := json.Unmarshal(sh.stored, &st); err != nil {
		sh.t.Fatal(err)
	}
	c := mustNew(sh.t, sh.cfg)
	if err := c.Restore(st); err != nil {
		sh.t.Fatalf("restore: %v", err)
	}
	for _, e := range sh.log {
		ds := c.Replay(e.ev, e.index)
		if !HasAccept(ds) {
			sh.t.Fatalf("replay of %T%+v (entry %d) answered %+v, want its accept", e.ev, e.ev, e.index, ds)
		}
	}
	return c
}

func (sh *replayShell) check(what string) *Coordinator {
	sh.t.Helper()
	r := sh.rebuilt()
	mustEqual(sh.t, what+": rebuilt from the stored state and the replay log", r.Snapshot(), sh.c.Snapshot())
	return r
}

// fedEvent is gen's event, or now and then one of a schema run's
// (statistics, the fit, an evaluation report) when cfg has them.
func fedEvent(g *gen, cfg Config, c *Coordinator) Event {
	if !cfg.Statistics || g.rng.IntN(4) != 0 {
		return g.next(c)
	}
	switch c.Phase() {
	case PhaseFitting:
		return TransformFitted{At: g.now}
	case PhaseStatistics:
		return StatisticsArrived{Client: g.anyID(), At: g.now}
	}
	if g.rng.IntN(8) == 0 {
		return StatisticsArrived{Client: g.anyID(), At: g.now}
	}
	return EvalArrived{Client: g.anyID(), Round: max(0, c.Round()-1-g.rng.IntN(3)), At: g.now}
}

// TestReplayRebuildsState: at every point of seeded random event streams, a
// coordinator restarted from the last state the shell wrote plus the replay
// log (the messages stored since, replayed in order at their stored times)
// equals the live one; replaying the log a second time changes nothing (its
// entries are recognised as applied); and a coordinator restarted so at a
// random point decides exactly as the live one from then on.
func TestReplayRebuildsState(t *testing.T) {
	seeds, events := 200, 300
	if testing.Short() {
		seeds = 40
	}
	var lone, late, evals, stats uint64
	var written uint64
	for seed := range uint64(seeds) {
		cfg := randomConfig(seed)
		if seed%3 == 0 {
			cfg.Statistics, cfg.Evaluate, cfg.EvalEvery = true, true, 1+int(seed/3)%3
			cfg.StatsSites = 1 + int(seed)%3
		}
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			sh := newReplayShell(t, cfg)
			defer func() { written += uint64(sh.writes) }()
			g := newGen(seed)
			coin := rand.New(rand.NewPCG(seed, 11))
			var twin *Coordinator
			for i := range events {
				ev := fedEvent(g, cfg, sh.c)
				n := sh.index
				ds := sh.step(ev)
				g.observe(ds)
				if sh.index > n {
					if Replayable(ds) {
						lone++
					}
					for _, d := range ds {
						switch d.(type) {
						case AcceptLate:
							late++
						case AcceptEval:
							evals++
						case AcceptStatistics:
							stats++
						}
					}
				}
				r := sh.check(fmt.Sprintf("event %d %T%+v", i, ev, ev))
				if len(sh.log) > 0 && coin.IntN(10) == 0 {
					// Replayed again: every entry is applied already.
					for _, e := range sh.log {
						if ds := r.Replay(e.ev, e.index); ds != nil {
							t.Fatalf("entry %d replayed twice decided %+v", e.index, ds)
						}
					}
					mustEqual(t, "after replaying the log twice", r.Snapshot(), sh.c.Snapshot())
				}
				if twin != nil {
					tds := twin.Propose(ev)
					if twin.Pending() {
						tds = twin.Step(Stored{At: ev.eventTime(), Index: sh.index})
					}
					if !reflect.DeepEqual(tds, ds) {
						t.Fatalf("event %d %T%+v: the restarted twin decided\n %+v\nnot\n %+v", i, ev, ev, tds, ds)
					}
				}
				if coin.IntN(25) == 0 {
					twin = r
				}
			}
		})
	}
	// Secure aggregation (coordinator_secagg.go): a site's secagg message
	// is logged as any other; a phase's close, its advance and an abort
	// are state writes.
	var secagg, secaggLone uint64
	for seed := range uint64(seeds / 2) {
		cfg := secAggConfig(seed)
		t.Run(fmt.Sprint("secagg/seed", seed), func(t *testing.T) {
			sh := newReplayShell(t, cfg)
			g := &secAggGen{gen: newGen(seed)}
			for _, id := range g.ids[:cfg.K+1] {
				sh.step(ClientOnline{ID: id, Samples: 10, At: g.now})
			}
			for i := range events {
				ev := g.next(sh.c)
				n := sh.index
				ds := sh.step(ev)
				g.expect = sh.c.sa.expect
				g.observe(ds)
				if sh.index > n {
					secagg++
					if Replayable(ds) {
						secaggLone++
					}
				}
				sh.check(fmt.Sprintf("event %d %T%+v", i, ev, ev))
			}
		})
	}
	if lone == 0 || written == 0 || late == 0 || evals == 0 || stats == 0 || secaggLone == 0 || secagg == secaggLone {
		t.Fatalf("coverage: lone accepts %d, state writes %d, late %d, evaluations %d, statistics %d, secagg messages %d (%d lone)",
			lone, written, late, evals, stats, secagg, secaggLone)
	}
	t.Logf("lone accepts (no state write) %d, state writes %d; accepted late %d, evaluations %d, statistics %d; secagg messages %d (%d lone)",
		lone, written, late, evals, stats, secagg, secaggLone)
}

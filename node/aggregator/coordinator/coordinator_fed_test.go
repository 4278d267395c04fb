package coordinator

import "testing"

// fedConfig: baseConfig with the statistics phase and evaluations every 2
// rounds; 3 statistics sites close the phase, quorum 2.
func fedConfig() Config {
	cfg := baseConfig()
	cfg.Statistics, cfg.Evaluate, cfg.EvalEvery = true, true, 2
	return cfg
}

func stats(id string, at int) StatisticsArrived { return StatisticsArrived{Client: id, At: ms(at)} }

func evalAt(id string, round, at int) EvalArrived {
	return EvalArrived{Client: id, Round: round, At: ms(at)}
}

// The statistics phase closes when StatsSites sites have sent theirs; a
// copy is a duplicate, statistics after the phase are stale, an update
// before round 1 is for a future round; the fit opens round 1.
func TestStatisticsPhaseClosesAtStatsSites(t *testing.T) {
	cfg := fedConfig()
	c := mustNew(t, cfg)
	if c.Phase() != PhaseStatistics {
		t.Fatalf("phase %s", c.Phase())
	}
	runScript(t, c, []script{
		{ClientOnline{ID: "a", Samples: 10, At: ms(0)}, []Decision{AnnounceStatistics{Deadline: ms(1000)}, SetTimer{At: ms(1000)}}},
		{ClientOnline{ID: "b", Samples: 10, At: ms(1)}, nil},
		{stats("a", 10), []Decision{AcceptStatistics{Client: "a"}}},
		{stats("a", 11), []Decision{RejectStatistics{Client: "a", Reason: Duplicate}}},
		{upd("a", 1, 12), []Decision{Reject{Round: 1, Client: "a", Reason: FutureRound}}},
		// c sends statistics before its status: known from then on.
		{stats("c", 20), []Decision{AcceptStatistics{Client: "c"}}},
		{stats("b", 30), []Decision{AcceptStatistics{Client: "b"}, FitTransform{Sites: []string{"a", "b", "c"}, At: ms(30)}, SetTimer{}}},
		{stats("d", 31), []Decision{RejectStatistics{Client: "d", Reason: StaleRound}}},
		{Tick{At: ms(1000)}, nil}, // the phase's old deadline: nothing
	})
	mustEqual(t, "resume while fitting", restored(t, cfg, c).Resume(), []Decision{FitTransform{Sites: []string{"a", "b", "c"}, At: ms(30)}})
	c.Step(ClientOnline{ID: "c", Samples: 10, At: ms(40)})
	out := c.Step(TransformFitted{At: ms(50)})
	mustEqual(t, "after the fit", out, []Decision{SetTimer{At: ms(100)}}) // Settle
	a := only[Announce](t, c.Step(Tick{At: ms(100)}))
	if a.Round != 1 || len(a.Selected) != 3 {
		t.Fatalf("round 1 %+v", a)
	}
	mustEqual(t, "statistics sites", c.StatisticsSites(), []string{"a", "b", "c"})
	mustEqual(t, "late statistics of a site that sent them", c.Step(stats("b", 200)), []Decision{RejectStatistics{Client: "b", Reason: Duplicate}})
}

// At its deadline the phase closes with a quorum; below quorum it waits
// and closes the moment the quorum is there. A restart keeps the phase.
func TestStatisticsPhaseDeadline(t *testing.T) {
	cfg := fedConfig()
	cfg.StatsSites = 5
	c := mustNew(t, cfg)
	c.Step(stats("a", 0)) // the first event announces the phase
	c.Step(stats("b", 10))
	fit := only[FitTransform](t, c.Step(Tick{At: ms(1000)}))
	mustEqual(t, "fit at the deadline", fit, FitTransform{Sites: []string{"a", "b"}, At: ms(1000)})

	c = mustNew(t, cfg)
	runScript(t, c, []script{
		{stats("a", 0), []Decision{AnnounceStatistics{Deadline: ms(1000)}, AcceptStatistics{Client: "a"}, SetTimer{At: ms(1000)}}},
	})
	r := restored(t, cfg, c)
	mustEqual(t, "resume", r.Resume(), []Decision{AnnounceStatistics{Deadline: ms(1000)}, SetTimer{At: ms(1000)}})
	runScript(t, r, []script{
		// below quorum: overdue (the shell warns, naming the missing
		// sites), no timer
		{Tick{At: ms(1000)}, []Decision{StatsOverdue{Deadline: ms(1000), Sites: []string{"a"}, Quorum: 2}, SetTimer{}}},
		{stats("b", 5000), []Decision{AcceptStatistics{Client: "b"}, FitTransform{Sites: []string{"a", "b"}, At: ms(5000)}}},
	})
}

// statsRound1 is a coordinator past the statistics phase (sites a, b, c)
// with round 1 announced to a, b, c.
func statsRound1(t *testing.T, cfg Config) *Coordinator {
	t.Helper()
	c := mustNew(t, cfg)
	bringOnline(c, ms(0), "a", "b", "c")
	for _, id := range []string{"a", "b", "c"} {
		c.Step(stats(id, 1))
	}
	c.Step(TransformFitted{At: ms(2)})
	only[Announce](t, c.Step(Tick{At: ms(52)}))
	return c
}

// playRound closes the current round with a, b, c's updates and steps its
// aggregation with ev's stopping inputs; it returns the aggregation's
// decisions.
func playRound(t *testing.T, c *Coordinator, at int, ev AggregatedRound) []Decision {
	t.Helper()
	r := c.Round()
	var cr []Decision
	for _, id := range []string{"a", "b", "c"} {
		cr = append(cr, c.Step(upd(id, r, at))...)
	}
	only[CloseRound](t, cr)
	ev.Round, ev.At = r, ms(at+1)
	out := c.Step(ev)
	if len(OfType[Finished](out)) == 0 && len(OfType[Finish](out)) == 0 {
		c.Step(Tick{At: ms(at + 100)}) // Settle: the next round is announced
	}
	return out
}

// Announcement r asks for eval round r-1 every EvalEvery rounds; reports
// of a requested round are accepted (copies too: the shell tells a copy by
// its store), others rejected; EvalComplete once every statistics site
// reported.
func TestEvaluationRequests(t *testing.T) {
	cfg := fedConfig()
	c := statsRound1(t, cfg)
	for r, want := range map[int]bool{1: false, 2: false, 3: true, 4: false, 5: true} {
		if c.EvalAt(r) != want {
			t.Errorf("EvalAt(%d) = %v", r, !want)
		}
	}
	mustEqual(t, "eval of round 1 before it is asked", c.Step(evalAt("a", 1, 60)), []Decision{RejectEval{Round: 1, Client: "a", Reason: FutureRound}})
	playRound(t, c, 100, AggregatedRound{}) // round 2 announced: no evaluation
	mustEqual(t, "eval round 1 not asked", c.Step(evalAt("a", 1, 210)), []Decision{RejectEval{Round: 1, Client: "a", Reason: StaleRound}})
	playRound(t, c, 300, AggregatedRound{}) // round 3 asks for eval round 2
	if !c.EvalRequested(2) || c.EvalRequested(4) {
		t.Fatal("requested")
	}
	runScript(t, c, []script{
		{evalAt("z", 2, 410), []Decision{RejectEval{Round: 2, Client: "z", Reason: UnknownClient}}},
		{evalAt("a", 2, 410), []Decision{AcceptEval{Round: 2, Client: "a"}}},
		{evalAt("a", 2, 411), []Decision{AcceptEval{Round: 2, Client: "a"}}},
		{evalAt("b", 2, 412), []Decision{AcceptEval{Round: 2, Client: "b"}}},
	})
	r := restored(t, cfg, c)
	mustEqual(t, "last report", r.Step(evalAt("c", 2, 413)), []Decision{AcceptEval{Round: 2, Client: "c"}, EvalComplete{Round: 2}})
	mustEqual(t, "a report after completion", r.Step(evalAt("c", 2, 414)), []Decision{AcceptEval{Round: 2, Client: "c"}})
}

// The patience rule: P evaluations in a row without an improvement of more
// than StopTol end the run; without Evaluate the run finishes at once.
func TestStopPatience(t *testing.T) {
	cfg := fedConfig()
	cfg.StopPatience, cfg.StopTol = 2, 0.01
	c := statsRound1(t, cfg)
	losses := []float64{1, 0.5, 0.495, 0.499}
	for i, l := range losses {
		out := playRound(t, c, 1000*(i+1), AggregatedRound{EvalLoss: l, HasEval: true})
		if i < 3 && len(out) > 0 {
			if len(OfType[Finish](out)) > 0 {
				t.Fatalf("finished after loss %d", i)
			}
		}
		if i == 3 {
			mustEqual(t, "finish", out, []Decision{Finish{Rounds: 4, Deadline: ms(5001), Reason: StopPatience}, SetTimer{At: ms(5001)}})
		}
	}
	if c.Phase() != PhaseFinishing || c.StopReason() != StopPatience {
		t.Fatalf("phase %s reason %s", c.Phase(), c.StopReason())
	}
}

// The delta rule, and the finishing phase: the final reports (eval round =
// rounds done) are awaited until every statistics site reported.
func TestStopDeltaAndFinishing(t *testing.T) {
	cfg := fedConfig()
	cfg.StopDelta = 1e-3
	c := statsRound1(t, cfg)
	if out := playRound(t, c, 1000, AggregatedRound{Change: 0.5, HasChange: true}); len(OfType[Finish](out)) > 0 {
		t.Fatal("finished on a large change")
	}
	out := playRound(t, c, 2000, AggregatedRound{Change: 1e-4, HasChange: true})
	mustEqual(t, "finish", out, []Decision{Finish{Rounds: 2, Deadline: ms(3001), Reason: StopDelta}, SetTimer{At: ms(3001)}})
	mustEqual(t, "resume finishing", restored(t, cfg, c).Resume(), []Decision{Finish{Rounds: 2, Deadline: ms(3001), Reason: StopDelta}, SetTimer{At: ms(3001)}})
	runScript(t, c, []script{
		{upd("a", 2, 2100), []Decision{Reject{Round: 2, Client: "a", Reason: Duplicate}}},
		{evalAt("a", 2, 2100), []Decision{AcceptEval{Round: 2, Client: "a"}}},
		{evalAt("b", 2, 2100), []Decision{AcceptEval{Round: 2, Client: "b"}}},
	})
	r := restored(t, cfg, c)
	mustEqual(t, "the last final report", r.Step(evalAt("c", 2, 2200)),
		[]Decision{AcceptEval{Round: 2, Client: "c"}, Finished{Rounds: 2, At: ms(2200)}, SetTimer{}})
	mustEqual(t, "resume finished", restored(t, cfg, r).Resume(), []Decision{Finished{Rounds: 2, At: ms(2200)}})
	mustEqual(t, "a late copy", r.Step(evalAt("c", 2, 2300)), []Decision{AcceptEval{Round: 2, Client: "c"}})
}

// At the finishing deadline the run finishes with the reports it has.
func TestFinishingTimeout(t *testing.T) {
	cfg := fedConfig()
	cfg.Rounds = 1
	c := statsRound1(t, cfg)
	out := playRound(t, c, 1000, AggregatedRound{})
	mustEqual(t, "finish", out, []Decision{Finish{Rounds: 1, Deadline: ms(2001), Reason: StopRounds}, SetTimer{At: ms(2001)}})
	c.Step(evalAt("a", 1, 1500))
	mustEqual(t, "before the deadline", c.Step(Tick{At: ms(2000)}), []Decision(nil))
	mustEqual(t, "deadline: the figures cover a only", c.Step(Tick{At: ms(2001)}),
		[]Decision{Finished{Rounds: 1, At: ms(2001), Missing: []string{"b", "c"}}, SetTimer{}})

	// Without evaluation the end is immediate, as in a run without a schema.
	plain := baseConfig()
	plain.Rounds = 1
	p := round1(t, plain)
	for _, id := range []string{"a", "b", "c"} {
		p.Step(upd(id, 1, 100))
	}
	mustEqual(t, "plain finish", p.Step(AggregatedRound{Round: 1, At: ms(200)}), []Decision{Finished{Rounds: 1, At: ms(200)}})
	if p.StopReason() != StopRounds {
		t.Fatalf("reason %q", p.StopReason())
	}
}

// The final evaluation waits for every site online without a site error,
// not only the statistics sites: d joined after the preprocessing was
// fitted and took part, and its report is awaited up to the deadline (the
// final figures were written a moment before its report came). A site
// going offline is no longer awaited; the sites still missing at the
// deadline are named in Finished.
func TestFinishingAwaitsOnlineSites(t *testing.T) {
	cfg := fedConfig()
	cfg.Rounds = 1
	c := statsRound1(t, cfg)
	bringOnline(c, ms(900), "d", "e") // joined after the fit
	out := playRound(t, c, 1000, AggregatedRound{})
	mustEqual(t, "finish", out, []Decision{Finish{Rounds: 1, Deadline: ms(2001), Reason: StopRounds}, SetTimer{At: ms(2001)}})
	for _, id := range []string{"a", "b", "c"} {
		if out := c.Step(evalAt(id, 1, 1100)); len(OfType[Finished](out)) > 0 {
			t.Fatalf("finished without d's and e's reports: %v", out)
		}
	}
	mustEqual(t, "d's report", c.Step(evalAt("d", 1, 1200)), []Decision{AcceptEval{Round: 1, Client: "d"}})
	mustEqual(t, "e goes offline: complete", c.Step(ClientOffline{ID: "e", At: ms(1300)}),
		[]Decision{Finished{Rounds: 1, At: ms(1300)}, SetTimer{}})

	// At the deadline the missing are named.
	c = statsRound1(t, cfg)
	bringOnline(c, ms(900), "d")
	playRound(t, c, 1000, AggregatedRound{})
	for _, id := range []string{"a", "b", "c"} {
		c.Step(evalAt(id, 1, 1100))
	}
	mustEqual(t, "deadline", c.Step(Tick{At: ms(2001)}), []Decision{Finished{Rounds: 1, At: ms(2001), Missing: []string{"d"}}, SetTimer{}})
}

func TestFedConfigValidation(t *testing.T) {
	for _, mod := range []func(*Config){
		func(c *Config) { c.Statistics = false }, // Evaluate without the statistics phase
		func(c *Config) { c.EvalEvery = -1 },
		func(c *Config) { c.StopTol = -1 },
		func(c *Config) { c.StopDelta = -1e-3 },
		func(c *Config) { c.StopPatience = -1 },
	} {
		cfg := fedConfig()
		mod(&cfg)
		if _, err := New(cfg); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
}

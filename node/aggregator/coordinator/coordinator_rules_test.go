package coordinator

import (
	"reflect"
	"testing"
)

// The rules the shell used to decide itself, now the coordinator's: which
// status is stale, which round is the last, the selection an extension
// re-announces, how many late updates a round's aggregation follows, and
// accept-then-advance (Propose, then Stored or StoreFailed).

func TestStaleStatusDecision(t *testing.T) {
	for _, tc := range []struct {
		name  string
		prior []Event
		ev    Event
		want  []Decision
	}{
		{"unknown client", nil, ClientOnline{ID: "a", Conn: 1, Samples: 10, At: ms(1)}, nil},
		{"unnumbered status", []Event{ClientOnline{ID: "a", Conn: 3, At: ms(0)}}, ClientOffline{ID: "a", At: ms(1)}, nil},
		{"newer connection", []Event{ClientOnline{ID: "a", Conn: 1, At: ms(0)}}, ClientOnline{ID: "a", Conn: 2, At: ms(1)}, nil},
		{"older connection online", []Event{ClientOnline{ID: "a", Conn: 2, At: ms(0)}}, ClientOnline{ID: "a", Conn: 1, At: ms(1)},
			[]Decision{StaleStatus{ID: "a", Conn: 1, Online: true}}},
		{"late will of a taken-over connection", []Event{ClientOnline{ID: "a", Conn: 2, At: ms(0)}}, ClientOffline{ID: "a", Conn: 1, At: ms(1)},
			[]Decision{StaleStatus{ID: "a", Conn: 1}}},
		{"online after its own will", []Event{ClientOnline{ID: "a", Conn: 1, At: ms(0)}, ClientOffline{ID: "a", Conn: 1, At: ms(1)}},
			ClientOnline{ID: "a", Conn: 1, At: ms(2)}, []Decision{StaleStatus{ID: "a", Conn: 1, Online: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig()
			cfg.Settle = 0
			cfg.Quorum, cfg.K = 3, 3 // one client never makes a selection
			c := mustNew(t, cfg)
			stepAll(c, tc.prior...)
			before := c.Snapshot()
			mustEqual(t, "decisions", c.Step(tc.ev), tc.want)
			after := c.Snapshot()
			if tc.want != nil {
				// Set aside: only the counter moves.
				before.Counters.StaleStatuses++
				mustEqual(t, "state after a stale status", after, before)
			}
		})
	}
}

func TestCloseRoundFinal(t *testing.T) {
	for _, tc := range []struct {
		rounds int
		final  []bool // CloseRound.Final of rounds 1, 2, 3
	}{
		{0, []bool{false, false, false}},
		{1, []bool{true}},
		{2, []bool{false, true}},
		{3, []bool{false, false, true}},
	} {
		cfg := baseConfig()
		cfg.Rounds = tc.rounds
		c := mustNew(t, cfg)
		bringOnline(c, ms(0), "a", "b", "c")
		now := 50
		next := c.Step(Tick{At: ms(now)}) // round 1 after Settle; later rounds at once
		for r, want := range tc.final {
			a := only[Announce](t, next)
			ds := stepAll(c, upd("a", r+1, now+1), upd("b", r+1, now+1), upd("c", r+1, now+1))
			cr := only[CloseRound](t, ds)
			if cr.Final != want {
				t.Fatalf("rounds %d, round %d (%v): Final %v, want %v", tc.rounds, r+1, a.Selected, cr.Final, want)
			}
			mustEqual(t, "Resume's CloseRound", only[CloseRound](t, restored(t, cfg, c).Resume()), cr)
			next = c.Step(AggregatedRound{Round: r + 1, At: ms(now + 10)})
			fin := OfType[Finished](next)
			if (len(fin) == 1) != want {
				t.Fatalf("rounds %d, round %d: Finished %v after a CloseRound with Final %v", tc.rounds, r+1, fin, want)
			}
			now += 100
		}
	}
}

func TestExtendCarriesTheSelection(t *testing.T) {
	for _, tc := range []struct {
		name    string
		offline []string // go offline before the deadline
		reports []string
	}{
		{"nobody reported", nil, nil},
		{"one of three reported", nil, []string{"b"}},
		{"a selected client went offline", []string{"c"}, []string{"a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := round1(t, baseConfig())
			for _, id := range tc.offline {
				c.Step(ClientOffline{ID: id, At: ms(70)})
			}
			for _, id := range tc.reports {
				c.Step(upd(id, 1, 100))
			}
			ext := only[Extend](t, c.Step(Tick{At: ms(1050)}))
			mustEqual(t, "extension", ext, Extend{Round: 1, Selected: []string{"a", "b", "c"}, Deadline: ms(1550)})
		})
	}
}

func TestLateCount(t *testing.T) {
	for _, tc := range []struct {
		name      string
		storeLate bool
		late      []UpdateArrived // after round 1 closed (a, b reported; c straggled)
		restart   bool            // snapshot and restore before round 2 closes
		want      int             // round 2's CloseRound.Late
	}{
		{"no late update", true, nil, false, 0},
		{"a straggler's late z", true, []UpdateArrived{upd("c", 1, 1200)}, false, 1},
		{"its copy is a duplicate", true, []UpdateArrived{upd("c", 1, 1200), upd("c", 1, 1210)}, false, 1},
		{"kept over a restart", true, []UpdateArrived{upd("c", 1, 1200)}, true, 1},
		{"FedAvg keeps no late update", false, []UpdateArrived{upd("c", 1, 1200)}, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig()
			cfg.StoreLate = tc.storeLate
			c := round1(t, cfg)
			stepAll(c, upd("a", 1, 100), upd("b", 1, 100))
			if cr := only[CloseRound](t, c.Step(Tick{At: ms(1050)})); cr.Late != 0 {
				t.Fatalf("round 1 Late %d", cr.Late)
			}
			a := only[Announce](t, c.Step(AggregatedRound{Round: 1, At: ms(1100)}))
			for _, u := range tc.late {
				c.Step(u)
			}
			if tc.restart {
				c = restored(t, cfg, c)
			}
			var ds []Decision
			for i, id := range a.Selected {
				ds = append(ds, c.Step(upd(id, 2, 1300+i))...)
			}
			if cr := only[CloseRound](t, ds); cr.Late != tc.want {
				t.Fatalf("round 2 Late %d, want %d", cr.Late, tc.want)
			}
			c.Step(AggregatedRound{Round: 2, At: ms(1400)})
			if got := c.Snapshot().Late; got != 0 {
				t.Fatalf("Late %d after the aggregation, want 0", got)
			}
		})
	}
}

// TestAcceptThenAdvance: Propose changes nothing for a message it accepts
// and returns the accept alone; StoreFailed leaves the state as it was
// before the message, and the next event proceeds as if the message had
// never come; Stored applies it exactly as Step does.
func TestAcceptThenAdvance(t *testing.T) {
	fed := fedConfig()
	fed.K, fed.Quorum, fed.StatsSites = 3, 2, 3
	fed1 := fed
	fed1.Rounds = 1
	// fedRound1: statistics from a, b, c, the fit, round 1 announced.
	fedRound1 := func(t *testing.T, c *Coordinator) {
		bringOnline(c, ms(0), "a", "b", "c")
		stepAll(c, stats("a", 1), stats("b", 1), stats("c", 1), TransformFitted{At: ms(2)})
		only[Announce](t, c.Step(Tick{At: ms(60)}))
	}
	for _, tc := range []struct {
		name    string
		cfg     Config
		setup   func(t *testing.T, c *Coordinator)
		ev      Event
		propose []Decision // Propose's answer
	}{
		{"accept closes nothing", baseConfig(), func(t *testing.T, c *Coordinator) {},
			upd("a", 1, 100), []Decision{Accept{Round: 1, Client: "a"}}},
		{"accept that closes the round", baseConfig(), func(t *testing.T, c *Coordinator) { stepAll(c, upd("a", 1, 90), upd("b", 1, 95)) },
			upd("c", 1, 100), []Decision{Accept{Round: 1, Client: "c"}}},
		{"late accept", func() Config { c := baseConfig(); c.StoreLate = true; return c }(), func(t *testing.T, c *Coordinator) {
			stepAll(c, upd("a", 1, 90), upd("b", 1, 95), Tick{At: ms(1050)})
		}, upd("c", 1, 1060), []Decision{AcceptLate{Round: 1, Client: "c"}}},
		{"rejected: stepped at once", baseConfig(), func(t *testing.T, c *Coordinator) {},
			upd("d", 1, 100), []Decision{Reject{Round: 1, Client: "d", Reason: NotSelected}}},
		{"statistics", fed, func(t *testing.T, c *Coordinator) { stepAll(c, stats("a", 10), stats("b", 20)) },
			stats("c", 30), []Decision{AcceptStatistics{Client: "c"}}},
		{"evaluation report of a round not asked for", fed, fedRound1,
			evalAt("a", 2, 60), []Decision{RejectEval{Round: 2, Client: "a", Reason: FutureRound}}},
		{"final evaluation report", fed1, func(t *testing.T, c *Coordinator) {
			fedRound1(t, c)
			only[Finish](t, stepAll(c, upd("a", 1, 70), upd("b", 1, 70), upd("c", 1, 70), AggregatedRound{Round: 1, At: ms(80)}))
		}, evalAt("a", 1, 90), []Decision{AcceptEval{Round: 1, Client: "a"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mk := func() *Coordinator {
				var c *Coordinator
				if tc.cfg.Statistics {
					c = mustNew(t, tc.cfg)
				} else {
					c = round1(t, tc.cfg)
				}
				tc.setup(t, c)
				return c
			}
			c, twin := mk(), mk()
			want := twin.Step(tc.ev) // what Step decides at once
			before := c.Snapshot()
			got := c.Propose(tc.ev)
			mustEqual(t, "Propose", got, tc.propose)
			if _, rejected := want[0].(Reject); rejected || !c.Pending() {
				mustEqual(t, "a message not accepted is stepped at once", got, want)
				mustEqual(t, "state", c.Snapshot(), twin.Snapshot())
				return
			}
			mustEqual(t, "state after Propose", c.Snapshot(), before)

			// The store fails: nothing happened.
			mustEqual(t, "StoreFailed", c.Step(StoreFailed{At: ms(2000)}), []Decision(nil))
			if c.Pending() {
				t.Fatal("still pending after StoreFailed")
			}
			mustEqual(t, "state after StoreFailed", c.Snapshot(), before)

			// The site re-sends; this time the store succeeds.
			mustEqual(t, "Propose again", c.Propose(tc.ev), tc.propose)
			mustEqual(t, "Stored", c.Step(Stored{At: ms(2001)}), want)
			mustEqual(t, "state after Stored", c.Snapshot(), twin.Snapshot())
			if !reflect.DeepEqual(want[0], tc.propose[0]) && len(OfType[AnnounceStatistics](want)) == 0 {
				t.Fatalf("the committed batch %+v does not start with the proposed %+v", want, tc.propose)
			}
		})
	}

	t.Run("settling without a proposal is ignored", func(t *testing.T) {
		c := round1(t, baseConfig())
		for _, ev := range []Event{Stored{At: ms(100)}, StoreFailed{At: ms(100)}} {
			before := c.Snapshot()
			mustEqual(t, "decisions", c.Step(ev), []Decision(nil))
			before.Counters.Ignored++
			mustEqual(t, "state", c.Snapshot(), before)
		}
	})
}

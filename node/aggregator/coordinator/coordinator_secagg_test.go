package coordinator

import (
	"strings"
	"testing"
	"time"
)

func secAggCoordConfig() Config {
	cfg := baseConfig()
	cfg.K, cfg.Quorum, cfg.MaxReselections = 3, 2, 1
	cfg.SecAgg = &SecAggConfig{Threshold: 2, Timeout: 200 * time.Millisecond}
	return cfg
}

func sa(client string, round, attempt, kind, at int) SecAggArrived {
	return SecAggArrived{Client: client, Round: round, Attempt: attempt, Kind: kind, At: ms(at)}
}

// propose is the shell's path for a site's message: Propose, then Stored.
func propose(t *testing.T, c *Coordinator, ev Event) []Decision {
	t.Helper()
	ds := c.Propose(ev)
	if !c.Pending() {
		return ds
	}
	return c.Step(Stored{At: ev.eventTime()})
}

// TestCoordinatorSecAggRound walks one round through the four phases: the
// advertise phase is the collecting phase, each later phase closes when
// every expected site is in or at its deadline, and U3 are the round's
// contributors.
func TestCoordinatorSecAggRound(t *testing.T) {
	cfg := secAggCoordConfig()
	c := mustNew(t, cfg)
	bringOnline(c, ms(0), "a", "b", "c")
	a := only[Announce](t, c.Step(Tick{At: ms(50)}))
	mustEqual(t, "selection", a.Selected, []string{"a", "b", "c"})
	if att, ph, ok := c.SecAggSession(); !ok || att != 0 || ph != SecAggAdvertise {
		t.Fatalf("session %d phase %d ok %v", att, ph, ok)
	}
	// A plain update is refused under secagg.
	mustEqual(t, "plain update", propose(t, c, upd("a", 1, 60)), []Decision{Reject{Round: 1, Client: "a", Reason: NotSelected}})

	propose(t, c, sa("a", 1, 0, 1, 100))
	mustEqual(t, "duplicate advertise", propose(t, c, sa("a", 1, 0, 1, 110)),
		[]Decision{RejectSecAgg{Round: 1, Kind: 1, Client: "a", Reason: Duplicate}})
	mustEqual(t, "a share before its phase", propose(t, c, sa("b", 1, 0, 3, 115)),
		[]Decision{RejectSecAgg{Round: 1, Kind: 3, Client: "b", Reason: FutureRound}})
	propose(t, c, sa("b", 1, 0, 1, 120))
	out := propose(t, c, sa("c", 1, 0, 1, 130))
	mustEqual(t, "every site advertised", out, []Decision{
		AcceptSecAgg{Round: 1, Attempt: 0, Kind: 1, Client: "c"}, SecAggAdvance{Round: 1, Attempt: 0, Phase: SecAggAdvertise},
		SetTimer{}})
	mustEqual(t, "phase", c.Phase(), PhaseSecAgg)

	out = c.Step(SecAggAdvanced{Round: 1, Phase: SecAggAdvertise, Next: []string{"c", "a", "b"}, At: ms(140)})
	mustEqual(t, "share keys", out, []Decision{
		AnnounceSecAgg{Round: 1, Phase: SecAggShareKeys, Selected: []string{"a", "b", "c"}, Deadline: ms(340)}, SetTimer{At: ms(340)}})
	propose(t, c, sa("a", 1, 0, 3, 150))
	mustEqual(t, "an advertise of a counted site", propose(t, c, sa("a", 1, 0, 1, 155)),
		[]Decision{RejectSecAgg{Round: 1, Kind: 1, Client: "a", Reason: Duplicate}})
	propose(t, c, sa("b", 1, 0, 3, 160))
	// c never shares its keys (and stays online): the phase closes at its
	// deadline.
	mustEqual(t, "share-keys deadline", c.Step(Tick{At: ms(340)}), []Decision{
		SecAggAdvance{Round: 1, Phase: SecAggShareKeys}, SetTimer{}})
	c = restored(t, cfg, c)
	mustEqual(t, "resume while advancing", c.Resume(), []Decision{SecAggAdvance{Round: 1, Phase: SecAggShareKeys}})

	out = c.Step(SecAggAdvanced{Round: 1, Phase: SecAggShareKeys, Next: []string{"a", "b"}, At: ms(350)})
	only[AnnounceSecAgg](t, out)
	mustEqual(t, "c is not in U2", propose(t, c, sa("c", 1, 0, 5, 360)),
		[]Decision{RejectSecAgg{Round: 1, Kind: 5, Client: "c", Reason: NotSelected}})
	propose(t, c, sa("a", 1, 0, 5, 370))
	c = restored(t, cfg, c)
	mustEqual(t, "resume in the masked phase", c.Resume(), []Decision{
		AnnounceSecAgg{Round: 1, Phase: SecAggMasked, Selected: []string{"a", "b", "c"}, Deadline: ms(550)}, SetTimer{At: ms(550)}})
	mustEqual(t, "a's masked input again", propose(t, c, sa("a", 1, 0, 5, 380)),
		[]Decision{RejectSecAgg{Round: 1, Kind: 5, Client: "a", Reason: Duplicate}})
	out = propose(t, c, sa("b", 1, 0, 5, 390))
	only[SecAggAdvance](t, out)
	only[AnnounceSecAgg](t, c.Step(SecAggAdvanced{Round: 1, Phase: SecAggMasked, Next: []string{"a", "b"}, At: ms(400)}))
	propose(t, c, sa("a", 1, 0, 7, 410))
	only[SecAggAdvance](t, propose(t, c, sa("b", 1, 0, 7, 420)))
	out = c.Step(SecAggAdvanced{Round: 1, Phase: SecAggUnmask, Next: []string{"a", "b"}, At: ms(430)})
	cr := only[CloseRound](t, out)
	mustEqual(t, "contributors", cr.Contributors, []string{"a", "b"})
	mustEqual(t, "stragglers", cr.Stragglers, []string{"c"})
	mustEqual(t, "a late unmask response", propose(t, c, sa("a", 1, 0, 7, 440)),
		[]Decision{RejectSecAgg{Round: 1, Kind: 7, Client: "a", Reason: Duplicate}})
	c.Step(AggregatedRound{Round: 1, At: ms(450)})
	mustEqual(t, "a's unmask response re-sent in the next round", propose(t, c, sa("a", 1, 0, 7, 460)),
		[]Decision{RejectSecAgg{Round: 1, Kind: 7, Client: "a", Reason: Duplicate, Closed: true}})
	mustEqual(t, "c's (not in the sum)", propose(t, c, sa("c", 1, 0, 3, 460)),
		[]Decision{RejectSecAgg{Round: 1, Kind: 3, Client: "c", Reason: StaleRound, Closed: true}})
	if att, ph, _ := c.SecAggSession(); att != 0 || ph != SecAggAdvertise || c.Round() != 2 {
		t.Fatalf("next round: round %d session %d phase %d", c.Round(), att, ph)
	}
	if n := c.Counters().SecAggMessages; n != 9 {
		t.Fatalf("%d secagg messages counted, want 9", n)
	}
}

// TestCoordinatorSecAggAbort: a session the server aborts closes nothing;
// the round draws a new selection for the next session, and the old
// session's messages are stale.
func TestCoordinatorSecAggAbort(t *testing.T) {
	cfg := secAggCoordConfig()
	c := mustNew(t, cfg)
	bringOnline(c, ms(0), "a", "b", "c")
	c.Step(Tick{At: ms(50)})
	for i, id := range []string{"a", "b", "c"} {
		propose(t, c, sa(id, 1, 0, 1, 100+i))
	}
	c.Step(SecAggAdvanced{Round: 1, Phase: SecAggAdvertise, Next: []string{"a", "b", "c"}, At: ms(110)})
	for _, id := range []string{"a", "b", "c"} {
		propose(t, c, sa(id, 1, 0, 3, 120))
	}
	c.Step(SecAggAdvanced{Round: 1, Phase: SecAggShareKeys, Next: []string{"a", "b", "c"}, At: ms(130)})
	propose(t, c, sa("a", 1, 0, 5, 140))
	only[SecAggAdvance](t, c.Step(Tick{At: ms(330)}))
	out := c.Step(SecAggAdvanced{Round: 1, Phase: SecAggMasked, Err: "secagg: fewer sites than the threshold remain: 1 masked inputs, threshold 2", At: ms(340)})
	ab := only[SecAggAbort](t, out)
	if ab.Round != 1 || ab.Attempt != 0 || !strings.Contains(ab.Reason, "threshold") {
		t.Fatalf("abort %+v", ab)
	}
	if len(OfType[CloseRound](out)) != 0 {
		t.Fatalf("an aborted session closed the round: %+v", out)
	}
	// A new selection with the next session (at once if every site is
	// online, else once Settle has passed).
	an := drawn(t, c, ms(400))
	if an.Round != 1 || an.Attempt != 1 {
		t.Fatalf("re-announced %+v", an)
	}
	if att, _, _ := c.SecAggSession(); att != 1 {
		t.Fatalf("session %d after an abort, want 1", att)
	}
	mustEqual(t, "a message of the aborted session", propose(t, c, sa("b", 1, 0, 5, 410)),
		[]Decision{RejectSecAgg{Round: 1, Kind: 5, Client: "b", Reason: StaleRound}})
	if c.Counters().SecAggAborts != 1 || c.SecAggLastAbort() != ab.Reason {
		t.Fatalf("aborts %d, last %q", c.Counters().SecAggAborts, c.SecAggLastAbort())
	}
	c = restored(t, cfg, c)
	if att, _, _ := c.SecAggSession(); att != 1 || c.SecAggLastAbort() != ab.Reason {
		t.Fatalf("restored: session %d, last abort %q", att, c.SecAggLastAbort())
	}
	// The new session runs to its end.
	var got []Decision
	for i, id := range an.Selected {
		got = append(got, propose(t, c, sa(id, 1, 1, 1, 500+i))...)
	}
	mustEqual(t, "the new session advances", only[SecAggAdvance](t, got), SecAggAdvance{Round: 1, Attempt: 1, Phase: SecAggAdvertise})
}

// TestCoordinatorSecAggConfig: the refusals of Config.SecAgg.
func TestCoordinatorSecAggConfig(t *testing.T) {
	for _, tt := range []struct {
		name   string
		mutate func(*Config)
	}{
		{"threshold 1", func(c *Config) { c.SecAgg.Threshold = 1 }},
		{"threshold above K", func(c *Config) { c.SecAgg.Threshold = 4 }},
		{"threshold not above K/2", func(c *Config) { c.K, c.Quorum, c.SecAgg.Threshold = 4, 2, 2 }},
		{"quorum below threshold", func(c *Config) { c.Quorum, c.SecAgg.Threshold = 1, 2 }},
		{"no timeout", func(c *Config) { c.SecAgg.Timeout = 0 }},
		{"late updates", func(c *Config) { c.StoreLate = true }},
		{"schema", func(c *Config) { c.Statistics = true }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := secAggCoordConfig()
			tt.mutate(&cfg)
			if _, err := New(cfg); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// TestCoordinatorSecAggOffline: a phase closes as soon as every site it
// expects has sent its message or gone offline, not at its deadline.
func TestCoordinatorSecAggOffline(t *testing.T) {
	c := mustNew(t, secAggCoordConfig())
	bringOnline(c, ms(0), "a", "b", "c")
	c.Step(Tick{At: ms(50)})
	for i, id := range []string{"a", "b", "c"} {
		propose(t, c, sa(id, 1, 0, 1, 100+i))
	}
	c.Step(SecAggAdvanced{Round: 1, Phase: SecAggAdvertise, Next: []string{"a", "b", "c"}, At: ms(110)})
	propose(t, c, sa("a", 1, 0, 3, 120))
	if ds := c.Step(ClientOffline{ID: "c", At: ms(130)}); len(OfType[SecAggAdvance](ds)) != 0 {
		t.Fatalf("closed with b still online and silent: %+v", ds)
	}
	out := propose(t, c, sa("b", 1, 0, 3, 140))
	mustEqual(t, "b's message closes the phase (c is offline)", only[SecAggAdvance](t, out), SecAggAdvance{Round: 1, Phase: SecAggShareKeys})
	c.Step(SecAggAdvanced{Round: 1, Phase: SecAggShareKeys, Next: []string{"a", "b"}, At: ms(150)})
	propose(t, c, sa("a", 1, 0, 5, 160))
	out = c.Step(ClientOffline{ID: "b", At: ms(170)})
	mustEqual(t, "b going offline closes the phase", only[SecAggAdvance](t, out), SecAggAdvance{Round: 1, Phase: SecAggMasked})
}

// TestCoordinatorSecAggConsistency: a session whose KeyList was signed by
// every listed site gets the consistency round between the masked inputs
// and the unmask (the survivors' signed survivor sets, kind 9), restored
// as any phase; an unsigned session goes straight to the unmask; fewer
// than t signatures abort the session.
func TestCoordinatorSecAggConsistency(t *testing.T) {
	ids := []string{"a", "b", "c"}
	toMasked := func(t *testing.T, c *Coordinator, signed int) {
		t.Helper()
		bringOnline(c, ms(0), ids...)
		c.Step(Tick{At: ms(50)})
		for i, id := range ids {
			propose(t, c, sa(id, 1, 0, 1, 100+i))
		}
		c.Step(SecAggAdvanced{Round: 1, Phase: SecAggAdvertise, Next: ids, Signed: signed, Listed: 3, At: ms(110)})
		for _, id := range ids {
			propose(t, c, sa(id, 1, 0, 3, 120))
		}
		c.Step(SecAggAdvanced{Round: 1, Phase: SecAggShareKeys, Next: ids, At: ms(130)})
		for _, id := range ids {
			propose(t, c, sa(id, 1, 0, 5, 140))
		}
	}
	t.Run("signed", func(t *testing.T) {
		cfg := secAggCoordConfig()
		c := mustNew(t, cfg)
		toMasked(t, c, 3)
		out := c.Step(SecAggAdvanced{Round: 1, Phase: SecAggMasked, Next: ids, At: ms(150)})
		mustEqual(t, "the consistency round", out, []Decision{
			AnnounceSecAgg{Round: 1, Phase: SecAggConsistency, Selected: ids, Deadline: ms(350)}, SetTimer{At: ms(350)}})
		mustEqual(t, "an unmask response before it", propose(t, c, sa("a", 1, 0, 7, 160)),
			[]Decision{RejectSecAgg{Round: 1, Kind: 7, Client: "a", Reason: FutureRound}})
		propose(t, c, sa("a", 1, 0, 9, 170))
		c = restored(t, cfg, c)
		mustEqual(t, "resume in the consistency round", c.Resume(), []Decision{
			AnnounceSecAgg{Round: 1, Phase: SecAggConsistency, Selected: ids, Deadline: ms(350)}, SetTimer{At: ms(350)}})
		if att, ph, _ := c.SecAggSession(); att != 0 || ph != SecAggConsistency {
			t.Fatalf("session %d phase %d", att, ph)
		}
		propose(t, c, sa("b", 1, 0, 9, 180))
		mustEqual(t, "every survivor signed", propose(t, c, sa("c", 1, 0, 9, 190)), []Decision{
			AcceptSecAgg{Round: 1, Attempt: 0, Kind: 9, Client: "c"}, SecAggAdvance{Round: 1, Phase: SecAggConsistency}, SetTimer{}})
		out = c.Step(SecAggAdvanced{Round: 1, Phase: SecAggConsistency, Next: ids[:2], At: ms(200)})
		mustEqual(t, "the survivors cannot change", out[0],
			Decision(SecAggAbort{Round: 1, Reason: "secagg: the survivors changed from [a b c] to [a b] in the consistency round"}))
	})
	t.Run("signed, unmask", func(t *testing.T) {
		c := mustNew(t, secAggCoordConfig())
		toMasked(t, c, 3)
		c.Step(SecAggAdvanced{Round: 1, Phase: SecAggMasked, Next: ids, At: ms(150)})
		for _, id := range ids {
			propose(t, c, sa(id, 1, 0, 9, 160))
		}
		out := c.Step(SecAggAdvanced{Round: 1, Phase: SecAggConsistency, Next: ids, At: ms(170)})
		mustEqual(t, "the unmask", out, []Decision{
			AnnounceSecAgg{Round: 1, Phase: SecAggUnmask, Selected: ids, Deadline: ms(370)}, SetTimer{At: ms(370)}})
		mustEqual(t, "a signed survivor set after its phase", propose(t, c, sa("a", 1, 0, 9, 175)),
			[]Decision{RejectSecAgg{Round: 1, Kind: 9, Client: "a", Reason: Duplicate}})
		for _, id := range ids[:2] {
			propose(t, c, sa(id, 1, 0, 7, 180))
		}
		only[SecAggAdvance](t, c.Step(Tick{At: ms(370)}))
		cr := only[CloseRound](t, c.Step(SecAggAdvanced{Round: 1, Phase: SecAggUnmask, Next: ids, At: ms(380)}))
		mustEqual(t, "contributors", cr.Contributors, ids)
	})
	t.Run("too few signatures", func(t *testing.T) {
		c := mustNew(t, secAggCoordConfig())
		toMasked(t, c, 3)
		c.Step(SecAggAdvanced{Round: 1, Phase: SecAggMasked, Next: ids, At: ms(150)})
		propose(t, c, sa("a", 1, 0, 9, 160))
		only[SecAggAdvance](t, c.Step(Tick{At: ms(350)}))
		out := c.Step(SecAggAdvanced{Round: 1, Phase: SecAggConsistency, Next: ids, At: ms(360)})
		ab, _ := out[0].(SecAggAbort)
		if !strings.Contains(ab.Reason, "1 survivors signed the survivor set, threshold 2") {
			t.Fatalf("abort %q", ab.Reason)
		}
	})
	t.Run("unsigned", func(t *testing.T) {
		c := mustNew(t, secAggCoordConfig())
		toMasked(t, c, 2) // one site of three without a certificate
		out := c.Step(SecAggAdvanced{Round: 1, Phase: SecAggMasked, Next: ids, At: ms(150)})
		mustEqual(t, "straight to the unmask", out, []Decision{
			AnnounceSecAgg{Round: 1, Phase: SecAggUnmask, Selected: ids, Deadline: ms(350)}, SetTimer{At: ms(350)}})
	})
}

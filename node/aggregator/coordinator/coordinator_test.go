package coordinator

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/learn/aggregate"
)

// t0 is the fake time base; tests move in milliseconds from it.
var t0 = time.Unix(1_700_000_000, 0).UTC()

func ms(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }

// baseConfig: 3 per round, quorum 2, 1 s deadline, 500 ms extension, one
// re-selection, 50 ms settle.
func baseConfig() Config {
	return Config{K: 3, Quorum: 2, RoundTimeout: time.Second, Extension: 500 * time.Millisecond,
		MaxReselections: 1, Settle: 50 * time.Millisecond, Seed: 1}
}

func mustNew(t *testing.T, cfg Config) *Coordinator {
	t.Helper()
	if _, ok := cfg.Selector.(*rotor); ok {
		cfg.Selector = &rotor{} // stateful: one per coordinator, like the shell builds it
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func only[T Decision](t *testing.T, ds []Decision) T {
	t.Helper()
	v := OfType[T](ds)
	if len(v) != 1 {
		var zero T
		t.Fatalf("want exactly one %T in %+v", zero, ds)
	}
	return v[0]
}

// stepAll steps the events in order and returns all decisions.
// drawn steps a Tick at `at` and returns the current round's announcement:
// the Tick's own (the first round, once Settle has passed), or, when the
// round was drawn the moment the previous one was aggregated (every expected
// site online: settleUntil), the one decided then, read back from the state.
func drawn(t *testing.T, c *Coordinator, at time.Time) Announce {
	t.Helper()
	if a := OfType[Announce](c.Step(Tick{At: at})); len(a) == 1 {
		return a[0]
	}
	s := c.Snapshot()
	if s.Phase == PhaseWaiting || s.Attempts == 0 {
		t.Fatalf("round %d not drawn by %v (phase %v)", s.Round, at, s.Phase)
	}
	return Announce{Round: s.Round, Attempt: s.Attempts - 1, Selected: s.Selected, Deadline: s.Deadline}
}

func stepAll(c *Coordinator, evs ...Event) []Decision {
	var out []Decision
	for _, ev := range evs {
		out = append(out, c.Step(ev)...)
	}
	return out
}

// bringOnline steps ClientOnline for ids at `at`, 10 samples each.
func bringOnline(c *Coordinator, at time.Time, ids ...string) []Decision {
	var out []Decision
	for _, id := range ids {
		out = append(out, c.Step(ClientOnline{ID: id, Samples: 10, At: at})...)
	}
	return out
}

func upd(client string, round, at int) UpdateArrived {
	return UpdateArrived{Client: client, Round: round, Loss: math.NaN(), At: ms(at)}
}

func mustEqual(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got  %+v\n want %+v", what, got, want)
	}
}

// script is one step of a scripted scenario and the exact decisions it must
// return.
type script struct {
	ev   Event
	want []Decision
}

func runScript(t *testing.T, c *Coordinator, steps []script) {
	t.Helper()
	for i, s := range steps {
		got := c.Step(s.ev)
		mustEqual(t, fmt.Sprintf("step %d (%T %+v)", i, s.ev, s.ev), got, s.want)
		if got := c.NextDeadline(); len(OfType[SetTimer](s.want)) > 0 && !got.Equal(OfType[SetTimer](s.want)[0].At) {
			t.Fatalf("step %d: NextDeadline %v disagrees with SetTimer", i, got)
		}
	}
}

func TestQuorumOf(t *testing.T) {
	for _, tc := range []struct {
		k    int
		f    float64
		want int
	}{
		{10, 0.7, 7}, // 0.7*10 is 7.000000000000001 in floating point
		{10, 0.5, 5},
		{3, 0.5, 2},
		{9, 0.6, 6},
		{1, 0.1, 1},
		{10, 0, 1},
		{10, 1, 10},
		{10, 1.5, 10},
		{0, 0.5, 1},
	} {
		if got := QuorumOf(tc.k, tc.f); got != tc.want {
			t.Errorf("QuorumOf(%d, %v) = %d, want %d", tc.k, tc.f, got, tc.want)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"zero K", func(c *Config) { c.K = 0 }},
		{"zero quorum", func(c *Config) { c.Quorum = 0 }},
		{"quorum above K", func(c *Config) { c.Quorum = 4 }},
		{"no timeout", func(c *Config) { c.RoundTimeout = 0 }},
		{"negative extension", func(c *Config) { c.Extension = -1 }},
		{"negative settle", func(c *Config) { c.Settle = -1 }},
		{"negative rounds", func(c *Config) { c.Rounds = -1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig()
			tc.mod(&cfg)
			if _, err := New(cfg); !errors.Is(err, ErrConfig) {
				t.Fatalf("New: %v, want ErrConfig", err)
			}
		})
	}
}

// TestScenarios walks scripted rounds with exact expected decisions. Three
// clients a, b, c online at 0 are all selected (K = 3) at 50 ms (Settle);
// the deadline is at 1050 ms, the extension 500 ms.
func TestScenarios(t *testing.T) {
	abc := []string{"a", "b", "c"}
	announce := []Decision{Announce{Round: 1, Selected: abc, Deadline: ms(1050)}, SetTimer{At: ms(1050)}}
	cancel := SetTimer{}
	// dropsInRound1: c goes offline during round 1, which closes at its
	// deadline with a and b and is aggregated at 1100.
	dropsInRound1 := func() []script {
		return []script{
			{Tick{At: ms(50)}, announce},
			{ClientOffline{ID: "c", At: ms(80)}, nil},
			{UpdateArrived{Client: "a", Round: 1, At: ms(100)}, []Decision{Accept{Round: 1, Client: "a"}}},
			{UpdateArrived{Client: "b", Round: 1, At: ms(100)}, []Decision{Accept{Round: 1, Client: "b"}}},
			{Tick{At: ms(1050)}, []Decision{
				CloseRound{Round: 1, Contributors: []string{"a", "b"}, Partial: []string{}, Stragglers: []string{"c"}, At: ms(1050)},
				cancel,
			}},
			{AggregatedRound{Round: 1, At: ms(1100)}, []Decision{SetTimer{At: ms(1150)}}},
		}
	}
	for _, tc := range []struct {
		name  string
		mod   func(*Config)
		steps []script
		check func(*testing.T, Counters)
	}{
		{
			name: "all selected report: closes immediately, next round drawn at once",
			steps: []script{
				{Tick{At: ms(10)}, nil}, // before Settle: nothing
				{Tick{At: ms(50)}, announce},
				{Tick{At: ms(60)}, nil}, // before the deadline: nothing
				{UpdateArrived{Client: "b", Round: 1, At: ms(100)}, []Decision{Accept{Round: 1, Client: "b"}}},
				{UpdateArrived{Client: "a", Round: 1, Partial: true, At: ms(200)}, []Decision{Accept{Round: 1, Client: "a", Partial: true}}},
				{Tick{At: ms(1049)}, nil},
				{UpdateArrived{Client: "c", Round: 1, At: ms(300)}, []Decision{
					Accept{Round: 1, Client: "c"},
					CloseRound{Round: 1, Contributors: abc, Partial: []string{"a"}, Stragglers: []string{}, At: ms(300)},
					cancel,
				}},
				{Tick{At: ms(1050)}, nil}, // a stale timer firing is harmless
				// Every site is online: nobody to settle for.
				{AggregatedRound{Round: 1, At: ms(400)}, []Decision{Announce{Round: 2, Selected: abc, Deadline: ms(1400)}, SetTimer{At: ms(1400)}}},
			},
			check: func(t *testing.T, n Counters) {
				mustEqual(t, "counters", n, Counters{Accepted: 3, PartialUpdates: 1, RoundsClosed: 1})
			},
		},
		{
			name: "a site that dropped during the round is waited for up to Settle",
			steps: append(dropsInRound1(),
				script{ClientOnline{ID: "c", Samples: 10, At: ms(1120)}, []Decision{Announce{Round: 2, Selected: abc, Deadline: ms(2120)}, SetTimer{At: ms(2120)}}},
			),
		},
		{
			name: "a site offline since before the draw is not waited for again",
			steps: append(dropsInRound1(),
				script{Tick{At: ms(1150)}, []Decision{Announce{Round: 2, Selected: []string{"a", "b"}, Deadline: ms(2150)}, SetTimer{At: ms(2150)}}},
				script{UpdateArrived{Client: "a", Round: 2, At: ms(1200)}, []Decision{Accept{Round: 2, Client: "a"}}},
				script{UpdateArrived{Client: "b", Round: 2, At: ms(1200)}, []Decision{
					Accept{Round: 2, Client: "b"},
					CloseRound{Round: 2, Contributors: []string{"a", "b"}, Partial: []string{}, Stragglers: []string{}, At: ms(1200)},
					cancel,
				}},
				// c dropped before round 2's draw: round 3 does not wait for it.
				script{AggregatedRound{Round: 2, At: ms(1250)}, []Decision{Announce{Round: 3, Selected: []string{"a", "b"}, Deadline: ms(2250)}, SetTimer{At: ms(2250)}}},
			),
		},
		{
			name: "deadline with quorum: closes with the offline client as straggler",
			steps: []script{
				{Tick{At: ms(50)}, announce},
				{UpdateArrived{Client: "a", Round: 1, At: ms(100)}, []Decision{Accept{Round: 1, Client: "a"}}},
				{ClientOffline{ID: "c", At: ms(150)}, nil},
				{UpdateArrived{Client: "b", Round: 1, At: ms(500)}, []Decision{Accept{Round: 1, Client: "b"}}}, // quorum, but c has until the deadline
				{Tick{At: ms(1000)}, nil},
				{Tick{At: ms(1051)}, []Decision{
					CloseRound{Round: 1, Contributors: []string{"a", "b"}, Partial: []string{}, Stragglers: []string{"c"}, At: ms(1051)},
					cancel,
				}},
			},
			check: func(t *testing.T, n Counters) {
				if n.Stragglers != 1 || n.Extensions != 0 {
					t.Fatalf("counters %+v", n)
				}
			},
		},
		{
			name: "below quorum: extend once, then re-select keeping the update received",
			steps: []script{
				{Tick{At: ms(50)}, announce},
				{UpdateArrived{Client: "a", Round: 1, At: ms(100)}, []Decision{Accept{Round: 1, Client: "a"}}},
				{ClientOffline{ID: "b", At: ms(200)}, nil},
				{ClientOffline{ID: "c", At: ms(200)}, nil},
				{Tick{At: ms(1050)}, []Decision{Extend{Round: 1, Selected: abc, Deadline: ms(1550)}, SetTimer{At: ms(1550)}}},
				{ClientOnline{ID: "d", Samples: 5, At: ms(1100)}, nil},
				{ClientOnline{ID: "e", Samples: 5, At: ms(1100)}, nil},
				{Tick{At: ms(1549)}, nil},
				// The re-selection settles too.
				{Tick{At: ms(1550)}, []Decision{SetTimer{At: ms(1600)}}},
				{Tick{At: ms(1600)}, []Decision{Announce{Round: 1, Attempt: 1, Selected: []string{"a", "d", "e"}, Deadline: ms(2600)}, SetTimer{At: ms(2600)}}},
				// Overdue since 1050: quorum closes the round at once.
				{UpdateArrived{Client: "e", Round: 1, At: ms(1700)}, []Decision{
					Accept{Round: 1, Client: "e"},
					CloseRound{Round: 1, Contributors: []string{"a", "e"}, Partial: []string{}, Stragglers: []string{"b", "c", "d"}, At: ms(1700)},
					cancel,
				}},
			},
			check: func(t *testing.T, n Counters) {
				if n.Extensions != 1 || n.Reselections != 1 || n.Stragglers != 3 || n.Stalls != 0 {
					t.Fatalf("counters %+v", n)
				}
			},
		},
		{
			name: "extended round closes the moment it reaches quorum",
			steps: []script{
				{Tick{At: ms(50)}, announce},
				{UpdateArrived{Client: "a", Round: 1, At: ms(100)}, []Decision{Accept{Round: 1, Client: "a"}}},
				// A late timer: the extension counts from when it is noticed.
				{Tick{At: ms(1060)}, []Decision{Extend{Round: 1, Selected: abc, Deadline: ms(1560)}, SetTimer{At: ms(1560)}}},
				{UpdateArrived{Client: "c", Round: 1, At: ms(1200)}, []Decision{
					Accept{Round: 1, Client: "c"},
					CloseRound{Round: 1, Contributors: []string{"a", "c"}, Partial: []string{}, Stragglers: []string{"b"}, At: ms(1200)},
					cancel,
				}},
			},
		},
		{
			name: "a re-selected client that was dropped may still report",
			steps: []script{
				{Tick{At: ms(50)}, announce},
				{ClientOffline{ID: "b", At: ms(60)}, nil},
				{ClientOffline{ID: "c", At: ms(60)}, nil},
				{Tick{At: ms(1050)}, []Decision{Extend{Round: 1, Selected: abc, Deadline: ms(1550)}, SetTimer{At: ms(1550)}}},
				// Nobody reported and only a is online: re-selection waits (no timer).
				{Tick{At: ms(1550)}, []Decision{cancel}},
				{ClientOnline{ID: "d", Samples: 1, At: ms(3000)}, []Decision{
					Announce{Round: 1, Attempt: 1, Selected: []string{"a", "d"}, Deadline: ms(4000)}, SetTimer{At: ms(4000)}}},
				{UpdateArrived{Client: "b", Round: 1, At: ms(3100)}, []Decision{Accept{Round: 1, Client: "b"}}},
				{UpdateArrived{Client: "d", Round: 1, At: ms(3200)}, []Decision{
					Accept{Round: 1, Client: "d"},
					CloseRound{Round: 1, Contributors: []string{"b", "d"}, Partial: []string{}, Stragglers: []string{"a", "c"}, At: ms(3200)},
					cancel,
				}},
			},
		},
		{
			name: "re-selections exhausted: the round stalls until invited clients report",
			mod:  func(c *Config) { c.MaxReselections = 0 },
			steps: []script{
				{Tick{At: ms(50)}, announce},
				{UpdateArrived{Client: "a", Round: 1, At: ms(100)}, []Decision{Accept{Round: 1, Client: "a"}}},
				{Tick{At: ms(1050)}, []Decision{Extend{Round: 1, Selected: abc, Deadline: ms(1550)}, SetTimer{At: ms(1550)}}},
				{Tick{At: ms(1550)}, []Decision{cancel}},
				{ClientOnline{ID: "d", Samples: 1, At: ms(2000)}, nil},
				{Tick{At: ms(9000)}, nil},
				{UpdateArrived{Client: "d", Round: 1, At: ms(9100)}, []Decision{Reject{Round: 1, Client: "d", Reason: NotSelected}}},
				{UpdateArrived{Client: "b", Round: 1, At: ms(9200)}, []Decision{
					Accept{Round: 1, Client: "b"},
					CloseRound{Round: 1, Contributors: []string{"a", "b"}, Partial: []string{}, Stragglers: []string{"c"}, At: ms(9200)},
				}},
			},
			check: func(t *testing.T, n Counters) {
				if n.Stalls != 1 || n.Reselections != 0 || n.Extensions != 1 {
					t.Fatalf("counters %+v", n)
				}
			},
		},
		{
			name: "last round: Finished, then only answers to updates",
			mod:  func(c *Config) { c.Rounds = 1 },
			steps: []script{
				{Tick{At: ms(50)}, announce},
				{UpdateArrived{Client: "a", Round: 1, At: ms(100)}, []Decision{Accept{Round: 1, Client: "a"}}},
				{UpdateArrived{Client: "b", Round: 1, At: ms(100)}, []Decision{Accept{Round: 1, Client: "b"}}},
				{Tick{At: ms(1050)}, []Decision{
					CloseRound{Round: 1, Contributors: []string{"a", "b"}, Partial: []string{}, Stragglers: []string{"c"}, At: ms(1050), Final: true}, cancel}},
				{AggregatedRound{Round: 2, At: ms(1100)}, nil}, // wrong round: ignored
				{AggregatedRound{Round: 1, At: ms(1200)}, []Decision{Finished{Rounds: 1, At: ms(1200)}}},
				{UpdateArrived{Client: "c", Round: 1, At: ms(1300)}, []Decision{Reject{Round: 1, Client: "c", Reason: RoundClosed}}},
				{ClientOnline{ID: "z", At: ms(1300)}, nil},
				{Tick{At: ms(5000)}, nil},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig()
			if tc.mod != nil {
				tc.mod(&cfg)
			}
			c := mustNew(t, cfg)
			if ds := bringOnline(c, ms(0), abc...); len(OfType[Announce](ds)) > 0 {
				t.Fatalf("announced before Settle: %+v", ds)
			}
			runScript(t, c, tc.steps)
			if tc.check != nil {
				tc.check(t, c.Counters())
			}
		})
	}
}

func TestNoClientsOnlineWaits(t *testing.T) {
	c := mustNew(t, baseConfig())
	runScript(t, c, []script{
		{Tick{At: ms(0)}, nil},
		{ClientOnline{ID: "a", Samples: 3, At: ms(10)}, nil}, // below quorum: no timer
		{Tick{At: ms(60)}, nil},
		{ClientOffline{ID: "a", At: ms(100)}, nil},
		{ClientOnline{ID: "b", Samples: 3, At: ms(20_000)}, nil},
		{ClientOnline{ID: "a", Samples: 3, At: ms(30_000)}, []Decision{
			// Settle long passed: announce at once, to fewer than K.
			Announce{Round: 1, Selected: []string{"a", "b"}, Deadline: ms(31_000)}, SetTimer{At: ms(31_000)}}},
	})
	if c.Phase() != PhaseCollecting || c.Round() != 1 {
		t.Fatalf("phase %s round %d", c.Phase(), c.Round())
	}
}

// round1 returns a coordinator whose round 1 was announced to a, b, c at
// 50 ms; d came online afterwards (known, not invited).
func round1(t *testing.T, cfg Config) *Coordinator {
	t.Helper()
	c := mustNew(t, cfg)
	bringOnline(c, ms(0), "a", "b", "c")
	a := only[Announce](t, c.Step(Tick{At: ms(50)}))
	mustEqual(t, "selected", a.Selected, []string{"a", "b", "c"})
	bringOnline(c, ms(60), "d")
	return c
}

func TestUpdateRejections(t *testing.T) {
	for _, tc := range []struct {
		name string
		evs  []UpdateArrived // the last one's decisions are checked
		want []Decision
	}{
		{"unknown client", []UpdateArrived{upd("zz", 1, 100)}, []Decision{Reject{Round: 1, Client: "zz", Reason: UnknownClient}}},
		{"future round", []UpdateArrived{upd("a", 2, 100)}, []Decision{Reject{Round: 2, Client: "a", Reason: FutureRound}}},
		{"round zero", []UpdateArrived{upd("a", 0, 100)}, []Decision{Reject{Round: 0, Client: "a", Reason: StaleRound}}},
		{"not selected", []UpdateArrived{upd("d", 1, 100)}, []Decision{Reject{Round: 1, Client: "d", Reason: NotSelected}}},
		{"duplicate", []UpdateArrived{upd("a", 1, 100), upd("a", 1, 200)}, []Decision{Reject{Round: 1, Client: "a", Reason: Duplicate}}},
		{"duplicate of a partial update", []UpdateArrived{{Client: "a", Round: 1, Partial: true, At: ms(100)}, upd("a", 1, 200)},
			[]Decision{Reject{Round: 1, Client: "a", Reason: Duplicate}}},
		{"offline but selected client is accepted", []UpdateArrived{upd("a", 1, 100)}, []Decision{Accept{Round: 1, Client: "a"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := round1(t, baseConfig())
			c.Step(ClientOffline{ID: "a", At: ms(70)})
			var got []Decision
			for _, u := range tc.evs {
				got = c.Step(u)
			}
			mustEqual(t, "decisions", got, tc.want)
			if r, ok := tc.want[0].(Reject); ok && c.Counters().Rejected[r.Reason] != 1 {
				t.Fatalf("counter for %v: %+v", r.Reason, c.Counters())
			}
		})
	}
}

// TestLateUpdates: round 1 closes at its deadline with a, b; c is the
// straggler; d is known but was not invited.
func TestLateUpdates(t *testing.T) {
	closeRound1 := func(t *testing.T, storeLate bool) *Coordinator {
		cfg := baseConfig()
		cfg.StoreLate = storeLate
		c := round1(t, cfg)
		stepAll(c, upd("a", 1, 100), upd("b", 1, 100))
		only[CloseRound](t, c.Step(Tick{At: ms(1050)}))
		return c
	}
	nextRound := func(t *testing.T, c *Coordinator) {
		t.Helper()
		// Every client is online: round 2 is drawn the moment round 1 is aggregated.
		a := only[Announce](t, c.Step(AggregatedRound{Round: 1, At: ms(1100)}))
		if a.Round != 2 {
			t.Fatalf("announce %+v", a)
		}
	}
	acceptLate := func(cl string, r int) Decision { return AcceptLate{Round: r, Client: cl} }
	reject := func(cl string, r int, why Reason) Decision { return Reject{Round: r, Client: cl, Reason: why} }

	for _, tc := range []struct {
		name     string
		next     bool // open round 2 first
		evs      []UpdateArrived
		fedsplit []Decision // decision for each event, StoreLate
		fedavg   []Decision // decision for each event, !StoreLate
	}{
		{"straggler while closing", false, []UpdateArrived{upd("c", 1, 1060)},
			[]Decision{acceptLate("c", 1)}, []Decision{reject("c", 1, RoundClosed)}},
		{"straggler after the next round opened", true, []UpdateArrived{upd("c", 1, 1200)},
			[]Decision{acceptLate("c", 1)}, []Decision{reject("c", 1, StaleRound)}},
		{"late update sent twice", true, []UpdateArrived{upd("c", 1, 1200), upd("c", 1, 1300)},
			[]Decision{acceptLate("c", 1), reject("c", 1, Duplicate)},
			[]Decision{reject("c", 1, StaleRound), reject("c", 1, StaleRound)}},
		{"contributor re-sends after close", true, []UpdateArrived{upd("a", 1, 1200)},
			[]Decision{reject("a", 1, Duplicate)}, []Decision{reject("a", 1, Duplicate)}},
		{"client not invited to that round", true, []UpdateArrived{upd("d", 1, 1200)},
			[]Decision{reject("d", 1, StaleRound)}, []Decision{reject("d", 1, StaleRound)}},
	} {
		for _, family := range []struct {
			name      string
			storeLate bool
			want      []Decision
		}{{"fedsplit", true, tc.fedsplit}, {"fedavg", false, tc.fedavg}} {
			t.Run(tc.name+"/"+family.name, func(t *testing.T) {
				c := closeRound1(t, family.storeLate)
				if tc.next {
					nextRound(t, c)
				}
				var got []Decision
				for _, u := range tc.evs {
					got = append(got, c.Step(u)...)
				}
				mustEqual(t, "decisions", got, family.want)
				n := c.Counters()
				if want := uint64(len(OfType[AcceptLate](family.want))); n.AcceptedLate != want {
					t.Fatalf("AcceptedLate %d, want %d", n.AcceptedLate, want)
				}
			})
		}
	}

	t.Run("superseded by a newer update", func(t *testing.T) {
		c := closeRound1(t, true)
		nextRound(t, c) // round 2 selects a, b, c (all online)
		stepAll(c, upd("a", 2, 1200), upd("b", 2, 1200))
		got := c.Step(upd("c", 2, 1300))
		only[CloseRound](t, got)
		mustEqual(t, "late round 1", c.Step(upd("c", 1, 1400)), []Decision{reject("c", 1, StaleRound)})
	})
}

// TestOfflineThird: a third of the clients drop out during round 1 and stay
// offline for rounds 2-4; every round still closes on quorum; back online
// from round 5, they are selected again.
func TestOfflineThird(t *testing.T) {
	for _, tc := range []struct {
		n, k   int
		quorum int
	}{
		{9, 9, QuorumOf(9, 0.6)},
		{12, 6, QuorumOf(6, 0.3)},
	} {
		t.Run(fmt.Sprintf("N=%d,K=%d", tc.n, tc.k), func(t *testing.T) {
			cfg := baseConfig()
			cfg.K, cfg.Quorum = tc.k, tc.quorum
			c := mustNew(t, cfg)
			var ids, third []string
			for i := range tc.n {
				id := fmt.Sprintf("c%02d", i)
				ids = append(ids, id)
				if i%3 == 2 {
					third = append(third, id)
				}
			}
			bringOnline(c, ms(0), ids...)
			online := map[string]bool{}
			for _, id := range ids {
				online[id] = true
			}
			now := 0
			back := map[string]bool{}
			for r := 1; r <= 12; r++ {
				now += 50
				a := drawn(t, c, ms(now))
				if a.Round != r {
					t.Fatalf("announce %+v, want round %d", a, r)
				}
				if r == 1 {
					for _, id := range third {
						c.Step(ClientOffline{ID: id, At: ms(now + 1)})
						online[id] = false
					}
				}
				if r == 5 {
					bringOnline(c, ms(now+1), third...)
					for _, id := range third {
						online[id] = true
					}
				}
				var ds []Decision
				for _, id := range a.Selected {
					if !online[id] {
						if r >= 2 && r <= 4 {
							t.Fatalf("round %d selected offline %s", r, id)
						}
						continue
					}
					ds = append(ds, c.Step(UpdateArrived{Client: id, Round: r, Loss: 1, At: ms(now + 10)})...)
					if r >= 5 && slices.Contains(third, id) {
						back[id] = true
					}
				}
				if len(OfType[CloseRound](ds)) == 0 {
					ds = c.Step(Tick{At: a.Deadline})
				}
				cr := only[CloseRound](t, ds)
				if len(cr.Contributors) < cfg.Quorum {
					t.Fatalf("round %d closed below quorum: %+v", r, cr)
				}
				for _, id := range cr.Stragglers {
					if online[id] || r > 1 {
						t.Fatalf("round %d: unexpected straggler %s in %+v", r, id, cr)
					}
				}
				now = int(a.Deadline.Sub(t0)/time.Millisecond) + 10
				c.Step(AggregatedRound{Round: r, At: ms(now)})
			}
			mustEqual(t, "returning clients that contributed", len(back), len(third))
		})
	}
}

// TestSelectionDeterminism: the draw is a function of the seed, the round and
// the attempt (and of who is online), not of the coordinator's history.
func TestSelectionDeterminism(t *testing.T) {
	ids := make([]string, 10)
	cands := make([]aggregate.Candidate, 10)
	for i := range ids {
		ids[i] = fmt.Sprintf("s%d", i)
		cands[i] = aggregate.Candidate{ID: ids[i], Samples: 10, Loss: math.NaN()}
	}
	run := func(seed uint64) [][]string {
		cfg := baseConfig()
		cfg.Seed = seed
		c := mustNew(t, cfg)
		bringOnline(c, ms(0), ids...)
		var sels [][]string
		now := 50
		for r := 1; r <= 5; r++ {
			a := drawn(t, c, ms(now))
			sels = append(sels, a.Selected)
			ds := stepAll(c, upd(a.Selected[0], r, now+1), upd(a.Selected[1], r, now+2), upd(a.Selected[2], r, now+3))
			only[CloseRound](t, ds)
			now += 100
			c.Step(AggregatedRound{Round: r, At: ms(now - 50)})
		}
		return sels
	}
	a, b := run(7), run(7)
	mustEqual(t, "same seed", a, b)
	if reflect.DeepEqual(a, run(8)) {
		t.Fatalf("seeds 7 and 8 drew the same five selections: %v", a)
	}
	for r, sel := range a {
		idx := aggregate.Uniform{}.Select(r+1, cands, 3, streams.Of(7, streams.Select, r+1, 0))
		var want []string
		for _, i := range idx {
			want = append(want, ids[i])
		}
		slices.Sort(want)
		mustEqual(t, fmt.Sprintf("round %d draw", r+1), sel, want)
	}
}

// badSelector returns out-of-range and repeated indices, and too few.
type badSelector struct{}

func (badSelector) Name() string { return "bad" }
func (badSelector) Select(_ int, cands []aggregate.Candidate, k int, _ *rand.Rand) []int {
	return []int{-1, len(cands), 1, 1}
}

// rotor is a stateful selector: each draw continues where the last stopped.
// Its state travels in Snapshot through MarshalJSON/UnmarshalJSON.
type rotor struct {
	Next int `json:"next"`
}

func (*rotor) Name() string { return "rotor" }
func (r *rotor) Select(_ int, cands []aggregate.Candidate, k int, _ *rand.Rand) []int {
	out := []int{}
	for i := range min(k, len(cands)) {
		out = append(out, (r.Next+i)%len(cands))
	}
	r.Next += len(out)
	return out
}

type plainRotor rotor // without the methods, for encoding/json

func (r *rotor) MarshalJSON() ([]byte, error) { return json.Marshal((*plainRotor)(r)) }
func (r *rotor) UnmarshalJSON(b []byte) error { return json.Unmarshal(b, (*plainRotor)(r)) }

func TestSelectorState(t *testing.T) {
	cfg := baseConfig()
	cfg.Selector = &rotor{}
	c := mustNew(t, cfg)
	bringOnline(c, ms(0), "a", "b", "c", "d", "e")
	only[Announce](t, c.Step(Tick{At: ms(50)}))
	s := c.Snapshot()
	if s.SelectorName != "rotor" || string(s.Selector) != `{"next":3}` {
		t.Fatalf("selector state %q %s", s.SelectorName, s.Selector)
	}
	for _, tc := range []struct {
		name    string
		mod     func(*State)
		wantErr bool
		want    int // rotor.Next after Restore
	}{
		{"restored", func(*State) {}, false, 3},
		{"other selector's state is ignored", func(s *State) { s.SelectorName = "window" }, false, 0},
		{"corrupt state is refused", func(s *State) { s.Selector = json.RawMessage(`{"next":"x"}`) }, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := c.Snapshot()
			tc.mod(&s)
			r := mustNew(t, cfg)
			err := r.Restore(s)
			if (err != nil) != tc.wantErr || (err != nil && !errors.Is(err, ErrBadState)) {
				t.Fatalf("Restore: %v", err)
			}
			if got := r.sel.(*rotor).Next; !tc.wantErr && got != tc.want {
				t.Fatalf("rotor.Next = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestSelectors(t *testing.T) {
	for _, tc := range []struct {
		name string
		sel  aggregate.Selector
		want []string // nil: any valid selection
	}{
		{"nil is uniform", nil, nil},
		{"by samples", aggregate.BySamples{}, nil},
		{"invalid answer is repaired", badSelector{}, []string{"a", "b", "c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig()
			cfg.Selector = tc.sel
			c := mustNew(t, cfg)
			bringOnline(c, ms(0), "a", "b", "c", "d", "e")
			a := only[Announce](t, c.Step(Tick{At: ms(50)}))
			if len(a.Selected) != 3 || !slices.IsSorted(a.Selected) || len(slices.Compact(slices.Clone(a.Selected))) != 3 {
				t.Fatalf("selection %v", a.Selected)
			}
			if tc.want != nil {
				mustEqual(t, "selection", a.Selected, tc.want)
			}
		})
	}
}

func TestResume(t *testing.T) {
	cfg := baseConfig()
	c := mustNew(t, cfg)
	mustEqual(t, "fresh", restored(t, cfg, c).Resume(), []Decision(nil))

	c = round1(t, baseConfig())
	c.Step(upd("a", 1, 100))
	c.Step(Tick{At: ms(1050)}) // extended to 1550
	mustEqual(t, "collecting", restored(t, cfg, c).Resume(), []Decision{
		Announce{Round: 1, Selected: []string{"a", "b", "c"}, Deadline: ms(1550)}, SetTimer{At: ms(1550)}})

	cr := only[CloseRound](t, c.Step(upd("b", 1, 1200)))
	mustEqual(t, "closing", restored(t, cfg, c).Resume(), []Decision{cr})

	cfg.Rounds = 1 // the restarted broker-agg was told to stop after round 1
	r := restored(t, cfg, c)
	fin := r.Step(AggregatedRound{Round: 1, At: ms(1300)})
	mustEqual(t, "finished", fin, []Decision{Finished{Rounds: 1, At: ms(1300)}})
	mustEqual(t, "resume finished", restored(t, cfg, r).Resume(), fin)

	// After the end an update still gets an answer (and changes nothing
	// else): a copy of a stored one is a duplicate, a late one is refused.
	before := r.Snapshot()
	mustEqual(t, "stored update re-sent", r.Step(upd("b", 1, 1400)), []Decision{Reject{Round: 1, Client: "b", Reason: Duplicate}})
	mustEqual(t, "late update", r.Step(upd("c", 1, 1400)), []Decision{Reject{Round: 1, Client: "c", Reason: RoundClosed}})
	mustEqual(t, "unknown site", r.Step(upd("z", 1, 1400)), []Decision{Reject{Round: 1, Client: "z", Reason: UnknownClient}})
	after := r.Snapshot()
	after.Counters.Rejected, before.Counters.Rejected = nil, nil
	mustEqual(t, "state after the answers", after, before)
}

func TestRestoreRejectsBadState(t *testing.T) {
	good := func() State {
		c := round1(t, baseConfig())
		c.Step(upd("a", 1, 100))
		return c.Snapshot()
	}
	for _, tc := range []struct {
		name string
		mod  func(*State)
	}{
		{"version", func(s *State) { s.Version = 99 }},
		{"phase", func(s *State) { s.Phase = "dancing" }},
		{"round zero", func(s *State) { s.Round = 0 }},
		{"collecting without selection", func(s *State) { s.Attempts = 0 }},
		{"duplicate client", func(s *State) { s.Clients = append(s.Clients, s.Clients[0]) }},
		{"empty client id", func(s *State) { s.Clients[0].ID = "" }},
		{"non-finite loss", func(s *State) { s.Clients[0].HasLoss, s.Clients[0].Loss = true, math.Inf(1) }},
		{"invited unknown", func(s *State) { s.Invited = append(s.Invited, "ghost") }},
		{"selected not invited", func(s *State) { s.Selected = append(s.Selected, "d") }},
		{"received not invited", func(s *State) { s.Received = append(s.Received, Received{Client: "d"}) }},
		{"pending future round", func(s *State) { s.Clients[1].Pending = []int{2} }},
		{"pending unsorted", func(s *State) { s.Clients[1].Pending = []int{1, 1} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := good()
			tc.mod(&s)
			c := mustNew(t, baseConfig())
			before := c.Snapshot()
			if err := c.Restore(s); !errors.Is(err, ErrBadState) {
				t.Fatalf("Restore: %v, want ErrBadState", err)
			}
			mustEqual(t, "unchanged", c.Snapshot(), before)
		})
	}
}

func TestCountersJSON(t *testing.T) {
	n := Counters{Accepted: 3, Rejected: map[Reason]uint64{Duplicate: 2, UnknownClient: 1}}
	b, err := json.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"rejected":{"duplicate":2,"unknown_client":1}`; !strings.Contains(string(b), want) {
		t.Fatalf("json %s lacks %s", b, want)
	}
	var back Counters
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	mustEqual(t, "round trip", back, n)
	if err := json.Unmarshal([]byte(`{"rejected":{"bogus":1}}`), &back); err == nil {
		t.Fatal("unknown reason accepted")
	}
	for _, r := range Reasons() {
		if _, err := r.MarshalText(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTimesNormalised: times in another zone, with a monotonic reading
// stripped or not, produce UTC decisions that compare equal after a JSON
// round trip.
func TestTimesNormalised(t *testing.T) {
	zone := time.FixedZone("CET", 3600)
	c := mustNew(t, baseConfig())
	for _, id := range []string{"a", "b", "c"} {
		c.Step(ClientOnline{ID: id, Samples: 1, At: ms(0).In(zone)})
	}
	a := only[Announce](t, c.Step(Tick{At: ms(50).In(zone)}))
	if a.Deadline != ms(1050) {
		t.Fatalf("deadline %v (%v), want %v in UTC", a.Deadline, a.Deadline.Location(), ms(1050))
	}
}

// status is one client status message in TestStatusOrderIndependent.
type status struct {
	conn   uint64
	online bool
}

func (s status) event(id string, at time.Time) Event {
	if s.online {
		return ClientOnline{ID: id, Samples: 10, Conn: s.conn, At: at}
	}
	return ClientOffline{ID: id, Conn: s.conn, At: at}
}

// permutations calls fn with every ordering of xs.
func permutations[T any](xs []T, fn func([]T)) {
	var rec func(k int)
	rec = func(k int) {
		if k == len(xs) {
			fn(slices.Clone(xs))
			return
		}
		for i := k; i < len(xs); i++ {
			xs[k], xs[i] = xs[i], xs[k]
			rec(k + 1)
			xs[k], xs[i] = xs[i], xs[k]
		}
	}
	rec(0)
}

// TestStatusOrderIndependent: with numbered connections, the client's
// online state after a set of statuses is the same whatever order they
// arrive in: the highest connection decides, and its offline (last will)
// beats its online.
func TestStatusOrderIndependent(t *testing.T) {
	cases := []struct {
		name     string
		statuses []status
		online   bool
	}{
		{"a late will of a taken-over connection", []status{{1, true}, {2, true}, {1, false}}, true},
		{"a connection that ended", []status{{1, true}, {1, false}}, false},
		{"queued history and the retained status after a restart", []status{{1, true}, {1, false}, {2, true}, {2, true}}, true},
		{"two connections, both ended", []status{{1, true}, {1, false}, {2, true}, {2, false}}, false},
		{"a clean shutdown status and the next connection", []status{{3, false}, {4, true}, {3, true}}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			permutations(tc.statuses, func(order []status) {
				c := mustNew(t, baseConfig())
				stale := 0
				for i, s := range order {
					if c.StatusStale("a", s.conn, s.online) {
						stale++
					}
					c.Step(s.event("a", ms(i)))
				}
				cs := c.Snapshot().Clients
				if len(cs) != 1 || cs[0].Online != tc.online {
					t.Fatalf("order %v: clients %+v, want online = %v", order, cs, tc.online)
				}
				if got := c.Counters().StaleStatuses; got != uint64(stale) {
					t.Fatalf("order %v: stale_statuses = %d, StatusStale said %d", order, got, stale)
				}
			})
		})
	}
	// Unnumbered statuses (older agents) apply as they arrive.
	c := mustNew(t, baseConfig())
	stepAll(c, status{0, false}.event("a", ms(0)), status{0, true}.event("a", ms(1)))
	if cs := c.Snapshot().Clients; !cs[0].Online || c.Counters().StaleStatuses != 0 {
		t.Fatalf("unnumbered offline then online: %+v, %+v", cs, c.Counters())
	}
	stepAll(c, status{0, false}.event("a", ms(2)))
	if cs := c.Snapshot().Clients; cs[0].Online {
		t.Fatalf("unnumbered online then offline: %+v", cs)
	}
}

// A site whose status carries a site error is online but not selected
// (it cannot take part: every round it was drawn into would wait for it),
// also after a restart, until a status without an error arrives.
func TestFailingSitesAreNotSelected(t *testing.T) {
	cfg := baseConfig()
	cfg.K, cfg.Quorum = 3, 3
	c := mustNew(t, cfg)
	bringOnline(c, ms(0), "s1", "s2", "s3")
	c.Step(ClientOnline{ID: "s4", Samples: 10, Failing: true, At: ms(0)})
	for r := 1; r <= 4; r++ {
		a := drawn(t, c, ms(100*r))
		if slices.Contains(a.Selected, "s4") {
			t.Fatalf("round %d selected the failing site: %v", r, a.Selected)
		}
		ds := stepAll(c, upd(a.Selected[0], r, 100*r+1), upd(a.Selected[1], r, 100*r+2), upd(a.Selected[2], r, 100*r+3))
		only[CloseRound](t, ds)
		if r == 4 {
			// s1 drops before round 4 is aggregated: round 5 is not drawn at once.
			c.Step(ClientOffline{ID: "s1", At: ms(100*r + 40)})
		}
		c.Step(AggregatedRound{Round: r, At: ms(100*r + 50)})
	}
	// The failing flag survives Snapshot/Restore.
	st := c.Snapshot()
	d := mustNew(t, cfg)
	if err := d.Restore(st); err != nil {
		t.Fatal(err)
	}
	for _, co := range []*Coordinator{c, d} {
		if ds := co.Step(Tick{At: ms(600)}); len(ds) != 0 {
			for _, x := range ds {
				if a, ok := x.(Announce); ok {
					t.Fatalf("announced %v with only two selectable sites and quorum 3", a.Selected)
				}
			}
		}
	}
	// Fixed: its next status has no error, and it is drawn.
	a := only[Announce](t, stepAll(d, ClientOnline{ID: "s4", Samples: 10, At: ms(700)}, Tick{At: ms(800)}))
	if !slices.Contains(a.Selected, "s4") {
		t.Fatalf("the site without its error was not selected: %v", a.Selected)
	}
}

// TestSettleExpected: the first draw waits Settle only until every expected
// site (the roster) is online; without a roster, or with one of its sites
// missing, it waits the whole Settle.
func TestSettleExpected(t *testing.T) {
	for _, tc := range []struct {
		name     string
		expected []string
		online   []string
		drawAt   int // ms: the ClientOnline of the last site (5), or Settle (50)
	}{
		{"every expected site online: drawn at once", []string{"a", "b", "c"}, []string{"a", "b", "c"}, 5},
		{"an expected site missing: the whole Settle", []string{"a", "b", "c", "d"}, []string{"a", "b", "c"}, 50},
		{"no roster: the whole Settle", nil, []string{"a", "b", "c"}, 50},
		{"a site off the roster does not hold the draw", []string{"a", "b"}, []string{"c", "a", "b"}, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig()
			cfg.Expected = tc.expected
			c := mustNew(t, cfg)
			var got []Announce
			for i, id := range tc.online {
				at := ms(0)
				if i == len(tc.online)-1 {
					at = ms(5)
				}
				got = append(got, OfType[Announce](bringOnline(c, at, id))...)
			}
			if tc.drawAt == 50 {
				if len(got) > 0 {
					t.Fatalf("announced before Settle: %+v", got)
				}
				got = OfType[Announce](c.Step(Tick{At: ms(50)}))
			}
			want := Announce{Round: 1, Selected: []string{"a", "b", "c"}, Deadline: ms(tc.drawAt).Add(cfg.RoundTimeout)}
			if len(got) != 1 || !reflect.DeepEqual(got[0], want) {
				t.Fatalf("announcements %+v, want %+v", got, want)
			}
		})
	}
}

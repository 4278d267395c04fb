package coordinator

import (
	"encoding/json"
	"testing"
)

// FuzzRestoreState: a damaged coordinator state (the JSON the round log
// stores) under DP with Poisson selection and invitations is refused by
// Restore or restores into a coordinator that resumes, steps and
// snapshots without panicking, and whose snapshot restores again.
func FuzzRestoreState(f *testing.F) {
	cfg := poissonConfig(0.5, nil)
	cfg.Invitations = true
	c, err := New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	bringOnline(c, ms(0), poolIDs(4)...)
	for r := 1; r <= 3; r++ {
		base := r * 10000
		a, ok := lastAnnounce(c.Step(Tick{At: ms(base)}))
		if !ok {
			continue
		}
		for i, id := range a.Selected {
			c.Step(upd(id, r, base+100+i))
		}
		c.Step(AggregatedRound{Round: r, At: ms(base + 500)})
	}
	c.Step(Tick{At: ms(40000)})
	b, err := c.MarshalState()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte(`{"version":1,"phase":"closing","round":2,"dp":{"accountant":{"orders":[2],"rdp":[0.1],"rounds":1},"q":0.5,"denominator":2,"site_rounds":{"s00":1}}}`))
	f.Add([]byte(`{"version":1,"phase":"waiting","round":1,"dp":{"accountant":{"orders":[2],"rdp":[0.1],"rounds":0},"site_rounds":{"s00":3}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s State
		if json.Unmarshal(b, &s) != nil {
			return
		}
		r, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if r.Restore(s) != nil {
			return
		}
		r.Resume()
		r.SitePrivacy()
		r.Privacy()
		r.Step(ClientOnline{ID: "s01", Samples: 3, At: ms(50000)})
		r.Step(Tick{At: ms(90000)})
		again, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		out, err := json.Marshal(r.Snapshot())
		if err != nil {
			t.Fatalf("snapshot of a restored state: %v", err)
		}
		var s2 State
		if err := json.Unmarshal(out, &s2); err != nil {
			t.Fatal(err)
		}
		if err := again.Restore(s2); err != nil {
			t.Fatalf("the snapshot of a restored coordinator does not restore: %v\n%s", err, out)
		}
	})
}

func lastAnnounce(ds []Decision) (Announce, bool) {
	for i := len(ds) - 1; i >= 0; i-- {
		if a, ok := ds[i].(Announce); ok {
			return a, true
		}
	}
	return Announce{}, false
}

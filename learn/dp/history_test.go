package dp

import (
	"slices"
	"strings"
	"testing"
)

// TestReplayMatchesTheLiveAccountant: the accountant replayed from the
// charging history is bit for bit the one that charged the rounds as they
// closed, at every prefix, including across a JSON round trip of the live
// one (a restart).
func TestReplayMatchesTheLiveAccountant(t *testing.T) {
	qs := []float64{0.3, 0.3, 0.3, 0.25, 0.25, 0.3, 1, 1}
	live := NewAccountant(nil)
	var rs []Rate
	for i, q := range qs {
		if err := live.Step(q, 1.3); err != nil {
			t.Fatal(err)
		}
		rs = AppendRate(rs, q, 1.3)
		got, err := Replay(rs, uint64(i+1), nil)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.RDP, live.RDP) || got.Rounds != live.Rounds {
			t.Fatalf("round %d: replayed RDP differs from the live accountant's", i+1)
		}
	}
	if want := []Rate{{0.3, 1.3, 3}, {0.25, 1.3, 2}, {0.3, 1.3, 1}, {1, 1.3, 2}}; !slices.Equal(rs, want) {
		t.Fatalf("history %v, want %v", rs, want)
	}
	if RatesRounds(rs) != uint64(len(qs)) {
		t.Fatalf("RatesRounds = %d", RatesRounds(rs))
	}
	// A prefix ends inside a run.
	pre, err := RatesPrefix(rs, 4)
	if err != nil || !slices.Equal(pre, []Rate{{0.3, 1.3, 3}, {0.25, 1.3, 1}}) {
		t.Fatalf("prefix of 4: %v %v", pre, err)
	}
	two, _ := Replay(rs, 2, nil)
	e2, _ := two.Epsilon(1e-5)
	want := EpsilonAfter(0.3, 1.3, 2, 1e-5, nil)
	if e2 != want {
		t.Fatalf("epsilon after 2 rounds: replay %v, EpsilonAfter %v", e2, want)
	}
	if _, err := Replay(rs, 9, nil); err == nil || !strings.Contains(err.Error(), "records 8 rounds, not 9") {
		t.Fatalf("replaying more rounds than recorded: %v", err)
	}
	if a, err := Replay(nil, 0, nil); err != nil || a.Rounds != 0 {
		t.Fatalf("empty history: %v", err)
	}
}

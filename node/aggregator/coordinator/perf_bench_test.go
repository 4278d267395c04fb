package coordinator

import (
	"fmt"
	"testing"
	"time"
)

// The aggregator's loop per site message: the coordinator's step and the
// shell's read of Summary (its status view) after it. These benchmarks
// give the cost of one message at K sites; it must not grow with K beyond
// a logarithm (a round of K messages was quadratic when Summary sorted the
// selection after each).

func benchSites(k int) []string {
	ids := make([]string, k)
	for i := range ids {
		ids[i] = fmt.Sprintf("site-%05d", i)
	}
	return ids
}

func benchConfig(k int) Config {
	return Config{K: k, Quorum: 1, Rounds: 1 << 30, RoundTimeout: time.Hour, Extension: time.Minute,
		MaxReselections: 1, Settle: time.Minute, Seed: 1}
}

// BenchmarkStatus: one site's online status (the burst of retained
// statuses when the aggregator starts), K sites in all.
func BenchmarkStatus(b *testing.B) {
	for _, k := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("K=%d", k), func(b *testing.B) {
			ids := benchSites(k)
			var c *Coordinator
			for i := range b.N {
				if i%k == 0 {
					b.StopTimer()
					c, _ = New(benchConfig(k))
					b.StartTimer()
				}
				c.Step(ClientOnline{ID: ids[i%k], Samples: 10, Conn: 1, At: t0})
				_ = c.Summary()
			}
		})
	}
}

// BenchmarkUpdate: one accepted update of a round of K (every site
// selected), proposed, stored and read back as the shell does; a closing
// update also aggregates and draws the next round, so the round's own
// costs are spread over its K updates.
func BenchmarkUpdate(b *testing.B) {
	for _, k := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("K=%d", k), func(b *testing.B) {
			ids := benchSites(k)
			c, err := New(benchConfig(k))
			if err != nil {
				b.Fatal(err)
			}
			for _, id := range ids {
				c.Step(ClientOnline{ID: id, Samples: 10, Conn: 1, At: t0})
			}
			at := t0.Add(time.Minute)
			c.Step(Tick{At: at})
			if c.Phase() != PhaseCollecting {
				b.Fatalf("round not drawn: phase %v", c.Phase())
			}
			var index uint64
			b.ResetTimer()
			for i := range b.N {
				ev := UpdateArrived{Client: ids[i%k], Round: c.Round(), Loss: 1, At: at}
				c.Propose(ev)
				index++
				for _, d := range c.Step(Stored{At: at, Index: index}) {
					if cr, ok := d.(CloseRound); ok {
						c.Step(AggregatedRound{Round: cr.Round, At: at})
						if c.Phase() != PhaseCollecting {
							b.Fatalf("round %d not drawn: phase %v", c.Round(), c.Phase())
						}
					}
				}
				_ = c.Summary()
			}
		})
	}
}

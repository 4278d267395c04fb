package e2e

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/uplink"
)

// TestSumModeKills: FedProx:FedSplit under --dp central runs in sum mode
// (docs/privacy.md, "FedSplit"): the aggregator keeps only S, each site its
// record c_j, advanced on its update's accepted receipt. One site is
// killed with SIGKILL on its commit's log line (the update committed and
// published, its receipt not yet handled) every round, and the aggregator
// is killed once with a round's first update in, both restarted at once.
// The run completes; the aggregator keeps no per-site z; no site is left
// with an unreceipted update; and the aggregator's final S (the one
// stored with the last round, plus that round's re-clipped updates) is the
// sum of the sites' records: every contribution advanced its site's record
// exactly once, whatever the kills interrupted. The noise (z = 1e-9) is too
// small to hide a missed or doubled contribution.
func TestSumModeKills(t *testing.T) {
	e2eTest(t)
	const (
		sites  = 3
		rounds = 6
		victim = "site-1"
		clip   = 0.5
	)
	dir := t.TempDir()
	federation := "sumkill"
	agg, edges := startFederation(t, dir, federation, aggDefaults(federation).with(kv{
		{"per_round", fmt.Sprint(sites)}, {"rounds", fmt.Sprint(rounds)},
		{"dp", "central"}, {"dp_clip", fmt.Sprint(clip)}, {"dp_noise", "1e-9"},
		// Rounds close when every site has reported (charged at q = 1; the
		// fixed-length default would make each last round_timeout).
		{"dp_fixed_rounds", "false"},
	}), sites, 80)
	v := edges[0]
	for r := 1; r < rounds; r++ {
		agg.waitAnnounced(60*time.Second, r)
		if r == 3 {
			agg.p.waitLine(60*time.Second, "an update of round 3", msgIs("update accepted", "round", r))
			agg.p.kill()
			agg.start()
		}
		if r >= 2 {
			// In any of its runs: rounds are drawn back to back, so the
			// run killed last may have applied this round already.
			waitFor(t, 60*time.Second, fmt.Sprintf("%s's round %d", victim, r), func() (bool, error) {
				return v.appliedAtLeast(r), nil
			})
			v.p.kill()
			v.start()
		}
		agg.waitMetrics(60*time.Second, fmt.Sprintf("round %d to close", r), func(m metrics) bool {
			return m["edgefl_aggregator_rounds_closed_total"] >= float64(r)
		})
	}
	agg.waitFinished(60 * time.Second)
	waitReceipted(t, edges)
	stopFederation(t, agg, edges...)

	st := readAggState(t, agg.state)
	if st.phase != "finished" || st.coordRnd != rounds {
		t.Fatalf("aggregator state: phase %s round %d", st.phase, st.coordRnd)
	}
	if len(st.z) != 0 {
		t.Fatalf("under DP the aggregator kept the z of %d sites", len(st.z))
	}
	// The final S: the state stored with the last round, plus that round.
	var sum uplink.SumState
	if err := sum.UnmarshalBinary(st.current.Sum); err != nil || st.current.Number != rounds {
		t.Fatalf("the sum state of round %d: %v", st.current.Number, err)
	}
	s, err := aggstore.OpenAgg(copyState(t, agg.state), storage.Options{LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	x, err := s.Checkpoint(rounds)
	s.Close()
	if err != nil {
		t.Fatal(err)
	}
	var cs []uplink.SumContribution
	for id, u := range st.updates[rounds] {
		m, d := decodeStored(t, u)
		cs = append(cs, uplink.SumContribution{Client: id, Instance: m.InstanceId, Join: uplink.IsJoin(uplink.HeaderOf(m)), Delta: d})
	}
	last, err := uplink.ClippedSum(len(x), cs, clip)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sum.Add(rounds, x, last, uplink.JoinersOf(cs)); err != nil {
		t.Fatal(err)
	}
	if sum.M != sites {
		t.Fatalf("%d sites counted, want %d", sum.M, sites)
	}
	records := make([]float64, len(x))
	for _, e := range edges {
		es := readEdgeState(t, e.state)
		if len(es.outbox) != 0 {
			t.Errorf("%s: %d unreceipted updates", e.id, len(es.outbox))
		}
		es2, err := edgestore.OpenEdge(copyState(t, e.state), storage.Options{LockTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		r, c, err := es2.Contribution()
		es2.Close()
		if errors.Is(err, storage.ErrNotFound) || r == 0 {
			t.Fatalf("%s: no record of its contributions", e.id)
		}
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range c {
			records[i] += v
		}
	}
	worst := 0.0
	for i := range records {
		worst = max(worst, math.Abs(records[i]-sum.S[i]))
	}
	if worst > 1e-6 {
		t.Fatalf("the aggregator's S differs from the sum of the sites' records by %g: a contribution was lost or counted twice", worst)
	}
	t.Logf("S = the sum of the sites' records to %.3g after %d kills of %s and one of the aggregator; duplicates answered: %d",
		worst, rounds-2, victim, len(v.lines(msgIs("update receipted", "code", "RECEIPT_CODE_DUPLICATE"))))
}

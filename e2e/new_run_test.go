package e2e

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"
)

// TestAggregatorStateReplaced: a federation runs to the end; then the
// aggregator's state file is removed (hospital IT starts the federation over)
// and broker-agg is started again. Its new round log has a new run id, so
// the sites, which applied the old run's rounds 1..N, start their round
// state over instead of ignoring the new rounds 1..N as old: the new run
// completes with every site in every round, and every site's copy of z
// equals the new aggregator's, bit for bit.
func TestAggregatorStateReplaced(t *testing.T) {
	e2eTest(t)
	const (
		sites  = 3
		rounds = 3
	)
	dir := t.TempDir()
	federation := "newrun"
	agg, edges := startFederation(t, dir, federation, aggDefaults(federation).with(kv{
		{"per_round", fmt.Sprint(sites)}, {"rounds", fmt.Sprint(rounds)},
		{"codec", "q8"},
	}), sites, 60)
	waitRun := func(run int) {
		t.Helper()
		agg.waitFinished(60 * time.Second)
		for _, e := range edges {
			waitFor(t, 20*time.Second, fmt.Sprintf("%s's receipt of round %d of run %d", e.id, rounds, run), func() (bool, error) {
				return len(e.lines(msgIs("update receipted", "round", rounds))) >= run, nil
			})
		}
	}
	waitRun(1)
	first := agg.lines(msgIs("new round log"))
	if err := agg.p.stop(); err != nil {
		t.Fatalf("aggregator: %v", err)
	}
	if err := os.Remove(agg.state); err != nil {
		t.Fatal(err)
	}
	agg.start()
	waitRun(2)
	second := agg.lines(msgIs("new round log"))
	if len(first) != 1 || len(second) != 2 || second[1].str("run_id") == "" || second[1].str("run_id") == first[0].str("run_id") {
		t.Fatalf("run ids: first run %v, both runs %v: want two different ones", first, second)
	}
	runID := second[1].str("run_id")
	stopFederation(t, agg, edges...)

	st := readAggState(t, agg.state)
	if st.phase != "finished" || st.coordRnd != rounds {
		t.Fatalf("the new run's state: phase %s round %d", st.phase, st.coordRnd)
	}
	for r := uint64(1); r <= rounds; r++ {
		if got := st.contributors(r); !slices.Equal(got, siteIDs(sites)) {
			t.Errorf("new run, round %d: stored updates from %v, want every site", r, got)
		}
	}
	for _, e := range edges {
		resets := e.lines(msgIs("the aggregator started a new run: this site's round state starts over"))
		if len(resets) != 1 || resets[0].str("run_id") != runID {
			t.Errorf("%s: %d new-run resets logged (%v), want one to run %s", e.id, len(resets), resets, runID)
		}
		checkSiteCopy(t, e, st, rounds)
	}
}

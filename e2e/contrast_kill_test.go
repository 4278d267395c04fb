package e2e

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/node/storage"
)

// TestContrastSiteKilledAfterCommit: a MOON federation, and a FedSiam-DA
// one (local SGD: its copy of the global model steps alternately with the
// local model), of three sites over an MLP (real broker-agg and edge-agent
// processes on the embedded broker) is run twice from the same
// configuration: once undisturbed, once with site-1 killed with SIGKILL as
// it logs the commit of round 2 and restarted at once. The killed site's
// state file holds its round-2 local model (the contrastive objective's
// previous model), and every update the aggregator stored, the killed
// site's later ones included, carries the same vector in both runs, bit
// for bit: the restarted site solved round 3 against the previous model it
// had committed (and, for FedSiam-DA, from a fresh copy of the global
// model, which is not stored).
func TestContrastSiteKilledAfterCommit(t *testing.T) {
	e2eTest(t)
	for _, algo := range []string{"moon", "fedsiam-da"} {
		t.Run(algo, func(t *testing.T) { testContrastSiteKilledAfterCommit(t, algo) })
	}
}

func testContrastSiteKilledAfterCommit(t *testing.T, algo string) {
	const (
		sites  = 3
		rounds = 4
		victim = "site-1"
	)
	conf := func(federation string) kv {
		c := kv{
			{"algorithm", algo}, {"model", "mlp"}, {"hidden", "6"}, {"init", "model"},
			{"mu", "1"}, {"per_round", fmt.Sprint(sites)}, {"rounds", fmt.Sprint(rounds)},
			{"max_epochs", "2"}, {"max_seconds", "0"},
		}
		if algo == "moon" {
			c = append(c, [2]string{"tau", "0.5"})
		}
		return aggDefaults(federation).with(c)
	}
	run := func(kill bool) aggState {
		dir := t.TempDir()
		agg, edges := startFederation(t, dir, "contrastkill", conf("contrastkill"), sites, 60)
		if kill {
			v := edges[0]
			v.p.waitLine(60*time.Second, "round 2 solved", msgIs("round solved", "round", 2))
			v.p.kill()
			es := readEdgeState(t, v.state)
			// Rounds are drawn back to back: the kill may land after the
			// site applied round 3 too, which is a kill after a commit
			// all the same.
			if es.applied != 2 && es.applied != 3 {
				t.Fatalf("killed on round 2's commit line, the site had applied round %d", es.applied)
			}
			s, err := edgestore.OpenEdge(copyState(t, v.state), storage.Options{LockTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			local, err := s.Residual(edgestore.ResidualLocal)
			s.Close()
			if err != nil || len(local) == 0 {
				t.Fatalf("the killed site's state file has no previous local model: %v", err)
			}
			v.start()
		}
		agg.waitFinished(90 * time.Second)
		waitReceipted(t, edges)
		stopFederation(t, agg, edges...)
		return readAggState(t, agg.state)
	}
	want := run(false)
	got := run(true)
	if got.finalR != want.finalR || !slices.EqualFunc(got.final, want.final, func(a, b float64) bool { return math.Float64bits(a) == math.Float64bits(b) }) {
		t.Errorf("final model of round %d differs from the undisturbed run's (round %d)", got.finalR, want.finalR)
	}
	for r := uint64(1); r <= rounds; r++ {
		for _, id := range siteIDs(sites) {
			a, okA := want.updates[r][id]
			b, okB := got.updates[r][id]
			if !okA || !okB {
				t.Errorf("round %d, %s: stored in the undisturbed run %v, in the killed one %v", r, id, okA, okB)
				continue
			}
			_, va := decodeStored(t, a)
			_, vb := decodeStored(t, b)
			if !slices.Equal(va, vb) {
				t.Errorf("round %d, %s: the stored update differs from the undisturbed run's", r, id)
			}
		}
	}
	if len(got.updates[rounds]) == 0 {
		t.Fatal(errors.New("no update of the last round: the comparison proves nothing"))
	}
}

package e2e

import (
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgefl/edgefl/learn/serveropt"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/storage"
)

// TestServerOptKilled: broker-agg runs FedAdam (--server-opt adam) over a
// lossy uplink codec and is killed with SIGKILL twice, once with some of a
// round's updates in and once right after a round closed, and restarted
// on its state file. The optimiser's state is stored with each round's
// checkpoint and continues across the kills: round r's stored state has
// taken r-1 steps (a state lost in a kill would start again from 0), every
// checkpoint is exactly the Adam step of its stored state from the
// previous checkpoint (bit for bit, after the fp32 downlink), and the
// moments chain from round to round as Adam's rules say.
func TestServerOptKilled(t *testing.T) {
	e2eTest(t)
	const (
		sites  = 4
		rounds = 7
		kills  = 2
	)
	dir := t.TempDir()
	federation := "optkill"
	passwd := filepath.Join(dir, "passwd")
	setPasswords(t, dir, passwd, siteIDs(sites)...)
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	brokerURL := "tcp://" + listen
	opt := serveropt.Params{Kind: serveropt.Adam, LR: 0.05, Beta1: 0.9, Beta2: 0.99, Tau: 1e-3}
	c := aggDefaults(federation).with(kv{
		{"per_round", fmt.Sprint(sites)}, {"rounds", fmt.Sprint(rounds)},
		{"algorithm", "fedavg"}, {"server_opt", "adam"}, {"server_lr", "0.05"},
		{"max_epochs", "0"}, {"max_seconds", "1"},
		{"codec", "topk:0.3+q8"}, {"downlink", "fp32"},
		{"listen", listen}, {"password_file", passwd},
	})
	agg := newAggregator(t, dir, c)
	var edges []*edge
	for i, id := range siteIDs(sites) {
		ec := agentConf(federation, brokerURL, id, passwordFile(dir, id), i, sites, 60).set("max_seconds", fmt.Sprintf("%.2f", 0.15*float64(i+1)))
		edges = append(edges, newEdge(t, dir, id, ec))
	}
	rng := rand.New(rand.NewPCG(3, 0xdead))
	for i := range kills {
		now := agg.mustScrape()
		var trigger string
		var at metrics
		if i%2 == 0 {
			j := float64(1 + rng.IntN(sites-1))
			after := now.round()
			trigger = fmt.Sprintf("with %v of the updates of a round after round %d in", j, after)
			at = agg.waitMetrics(30*time.Second, trigger, func(m metrics) bool {
				return m.round() > after && m.phase() == "collecting" && m["edgefl_aggregator_round_received"] == j
			})
		} else {
			target := now["edgefl_aggregator_rounds_closed_total"] + 1
			trigger = fmt.Sprintf("after round close #%v", target)
			at = agg.waitMetrics(30*time.Second, trigger, func(m metrics) bool {
				return m["edgefl_aggregator_rounds_closed_total"] >= target
			})
		}
		if at["edgefl_aggregator_finished"] == 1 {
			t.Fatalf("kill %d (%s): the federation finished before the kill", i+1, trigger)
		}
		agg.p.kill()
		agg.start()
		agg.p.waitLine(20*time.Second, "the restarted aggregator's announcement", msgIs("round announced"))
		t.Logf("kill %d %s (round %d, phase %s)", i+1, trigger, at.round(), at.phase())
	}
	if final := agg.waitFinished(60 * time.Second); final.round() != rounds {
		t.Fatalf("finished at round %d, want %d", final.round(), rounds)
	}
	stopFederation(t, agg, edges...)

	s, err := aggstore.OpenAgg(copyState(t, agg.state), storage.Options{LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var prev serveropt.State
	for r := uint64(1); r <= rounds; r++ {
		rd, err := s.Round(r)
		if err != nil {
			t.Fatal(err)
		}
		st, err := serveropt.Unmarshal(rd.Opt, dim)
		if err != nil {
			t.Fatalf("round %d: optimiser state: %v", r, err)
		}
		if st.T != r-1 {
			t.Fatalf("round %d opened with an optimiser of %d steps, want %d: the state did not survive", r, st.T, r-1)
		}
		if r == 1 {
			continue
		}
		x, err := s.Checkpoint(r - 1)
		if err != nil {
			t.Fatal(err)
		}
		next, err := s.Checkpoint(r)
		if err != nil {
			t.Fatal(err)
		}
		moved := 0.0
		for i := range next {
			want := float64(float32(x[i] + opt.LR*st.M[i]/(math.Sqrt(st.V[i])+opt.Tau)))
			if math.Float64bits(next[i]) != math.Float64bits(want) {
				t.Fatalf("round %d: checkpoint[%d] = %v, the Adam step of its stored state gives %v", r-1, i, next[i], want)
			}
			moved = max(moved, math.Abs(next[i]-x[i]))
			// Adam's moments: m = b1 m' + (1-b1) Delta, v = b2 v' + (1-b2) Delta^2
			// (v' = tau^2 before the first step).
			mPrev, vPrev := 0.0, opt.Tau*opt.Tau
			if prev.T > 0 {
				mPrev, vPrev = prev.M[i], prev.V[i]
			}
			delta := (st.M[i] - opt.Beta1*mPrev) / (1 - opt.Beta1)
			if v := opt.Beta2*vPrev + (1-opt.Beta2)*delta*delta; math.Abs(v-st.V[i]) > 1e-9*max(v, 1e-12) {
				t.Fatalf("round %d: v[%d] = %v, Adam's rule from the previous state gives %v", r, i, st.V[i], v)
			}
		}
		if moved == 0 {
			t.Fatalf("round %d: the model did not move", r-1)
		}
		prev = st
	}
	t.Logf("%d rounds, %d kills: every round's optimiser state chained, every checkpoint its Adam step", rounds, kills)
}

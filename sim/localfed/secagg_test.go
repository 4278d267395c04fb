package localfed

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgefl/edgefl/node/agent"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/secagg"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"

	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/node/aggregator"
)

// TestSecAggFederationRuns: K agents and the aggregator with --secagg over
// the embedded broker finish a run; every round's model comes from the
// unmasked sum.
func TestSecAggFederationRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a federation over MQTT")
	}
	for _, k := range []int{2, 3, 5} {
		t.Run(string(rune('0'+k)), func(t *testing.T) {
			fed, sites, log, _ := syntheticSites(t, k, 1)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			rounds := 0
			lf, err := Start(ctx, Config{Dir: t.TempDir(), Sites: sites, Seed: 1, Logger: log,
				Server: aggregator.ServerConfig{K: k, QuorumFraction: 1, RoundTimeout: time.Minute, Settle: 50 * time.Millisecond,
					MaxReselections: -1, Rounds: 2, Seed: 1, Algorithm: aggregator.AlgoFedProx,
					Params:  aggregator.Params{Mu: 1, Solver: "lbfgs", Gamma: 1e-3, MaxEpochs: 2},
					Model:   model.Spec{Kind: model.KindLogReg, Inputs: fed.D, Classes: fed.Classes, L2: 0.01},
					SecAgg:  &aggregator.SecAggConfig{Clip: 1, Timeout: 20 * time.Second},
					OnRound: func(rr aggregator.RoundReport) { rounds++ }}})
			if err != nil {
				t.Fatal(err)
			}
			finished := lf.Wait(ctx)
			if err := lf.Stop(); err != nil {
				t.Errorf("Stop: %v", err)
			}
			if !finished || rounds != 2 {
				t.Fatalf("finished %v after %d rounds", finished, rounds)
			}
		})
	}
}

// TestSecAggDropouts is the daemon-level exactness test over MQTT: with K
// sites and one of them stopped after the aggregator stored its message of
// each phase in turn (or none), the round's model is exactly the uniform
// mean of the plain ring sum of the contributors' inputs (as the sites
// stored them), and the contributors are the sites whose masked input the
// sum holds: a site gone after its advertisement or its key shares is not
// among them, one gone after its masked input is (its self mask is
// reconstructed from the others' shares).
func TestSecAggDropouts(t *testing.T) {
	if testing.Short() {
		t.Skip("runs federations over MQTT")
	}
	for _, k := range []int{3, 5} {
		for _, drop := range []uint32{0, wire.SecAggKindAdvertiseKeys, wire.SecAggKindShareKeys, wire.SecAggKindMaskedInput} {
			t.Run(fmt.Sprintf("K=%d/drop-after-kind-%d", k, drop), func(t *testing.T) { testSecAggDropout(t, k, drop) })
		}
	}
}

func testSecAggDropout(t *testing.T, k int, drop uint32) {
	fed, sites, log, _ := syntheticSites(t, k, 2)
	ids := SiteIDs(k, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	victim := ids[k-1]
	var running atomic.Pointer[Federation]
	var mu sync.Mutex
	var report aggregator.RoundReport
	dir := t.TempDir()
	const clip = 0.5
	lf, err := Start(ctx, Config{Dir: dir, Sites: sites, Seed: 1, Logger: log,
		Observe: func(site string, ev agent.Event) {
			if drop != 0 && site == victim && ev.Kind == agent.EventReceipt && ev.Subject == wire.ReceiptSubject_RECEIPT_SUBJECT_SECAGG &&
				ev.Accepted && ev.SecAggKind == drop {
				// At once, in the receipt's handler: the next phase's
				// message to this site (the ShareList, the announcement)
				// comes after the receipt and finds the agent stopping.
				// (Stopping it from another goroutine raced with the
				// aggregator, which closes the phase in a millisecond
				// once the message is stored.)
				if f := running.Load(); f != nil {
					f.StopSite(site)
				}
			}
		},
		Server: aggregator.ServerConfig{K: k, QuorumFraction: 1, RoundTimeout: 30 * time.Second, Settle: 50 * time.Millisecond,
			MaxReselections: -1, Rounds: 1, Seed: 1, Algorithm: aggregator.AlgoFedProx,
			Params: aggregator.Params{Mu: 1, Solver: "lbfgs", Gamma: 1e-3, MaxEpochs: 2},
			Model:  model.Spec{Kind: model.KindLogReg, Inputs: fed.D, Classes: fed.Classes, L2: 0.01},
			SecAgg: &aggregator.SecAggConfig{Clip: clip, Timeout: 1500 * time.Millisecond},
			OnRound: func(rr aggregator.RoundReport) {
				mu.Lock()
				defer mu.Unlock()
				report = rr
			}}})
	if err != nil {
		t.Fatal(err)
	}
	running.Store(lf)
	finished := lf.Wait(ctx)
	if err := lf.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if !finished {
		t.Fatal("the round did not finish")
	}
	mu.Lock()
	rr := report
	mu.Unlock()
	want := slices.Clone(ids)
	if drop == wire.SecAggKindAdvertiseKeys || drop == wire.SecAggKindShareKeys {
		want = ids[:k-1]
	}
	if !slices.Equal(rr.Contributors, want) {
		t.Fatalf("contributors %v, want %v", rr.Contributors, want)
	}
	var inputs [][]uint32
	for _, id := range rr.Contributors {
		es, err := edgestore.OpenEdge(filepath.Join(dir, id+".db"), storage.Options{})
		if err != nil {
			t.Fatal(err)
		}
		r, _, in, err := agent.SecAggSession(es)
		es.Close()
		if err != nil || r != 1 {
			t.Fatalf("site %s: session of round %d: %v", id, r, err)
		}
		inputs = append(inputs, in)
	}
	sb, err := uplink.SecAggScaleBits(clip, k)
	if err != nil {
		t.Fatal(err)
	}
	q, err := secagg.NewQuantizer(clip, sb, k)
	if err != nil {
		t.Fatal(err)
	}
	dim := len(rr.Global)
	wantModel, err := uplink.SecAggMean(q, make([]float64, dim), uplink.SecAggPlainSum(inputs, dim), len(inputs))
	if err != nil {
		t.Fatal(err)
	}
	for i := range wantModel {
		if math.Float64bits(float64(float32(wantModel[i]))) != math.Float64bits(rr.Global[i]) {
			t.Fatalf("coordinate %d: the model is %v, the mean of the plain sum %v (as fp32 %v)", i, rr.Global[i], wantModel[i], float32(wantModel[i]))
		}
	}
}

// TestSecAggAbortVisible: a session that loses a site below the threshold
// aborts without a sum (no round is aggregated), a new session is drawn,
// and the operator sees why: a log line, the abort counter in /metrics and
// the last abort in the status.
func TestSecAggAbortVisible(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a federation over MQTT")
	}
	const k = 3
	fed, sites, log, logs := syntheticSites(t, k, 1)
	ids := SiteIDs(k, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stopIt := make(chan string, 1)
	var aggregated atomic.Int32
	lf, err := Start(ctx, Config{Dir: t.TempDir(), Sites: sites, Seed: 1, Logger: log,
		Observe: func(site string, ev agent.Event) {
			if site == ids[0] && ev.Kind == agent.EventReceipt && ev.Accepted && ev.SecAggKind == wire.SecAggKindAdvertiseKeys {
				select {
				case stopIt <- site:
				default:
				}
			}
		},
		Server: aggregator.ServerConfig{K: k, QuorumFraction: 1, RoundTimeout: 30 * time.Second, Settle: 50 * time.Millisecond,
			MaxReselections: -1, Rounds: 1, Seed: 1, Algorithm: aggregator.AlgoFedAvg,
			Params: aggregator.Params{Solver: "lbfgs", Gamma: 1e-3, MaxEpochs: 2},
			Model:  model.Spec{Kind: model.KindLogReg, Inputs: fed.D, Classes: fed.Classes, L2: 0.01},
			// t = K: one site fewer aborts the session.
			SecAgg:  &aggregator.SecAggConfig{Clip: 1, Threshold: k, Timeout: time.Second},
			OnRound: func(aggregator.RoundReport) { aggregated.Add(1) }}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := lf.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	}()
	go func() {
		select {
		case id := <-stopIt:
			lf.StopSite(id)
		case <-ctx.Done():
		}
	}()
	for {
		v, ch := lf.Server.Watch()
		if v.SecAgg != nil && v.SecAgg.Aborts > 0 {
			if !strings.Contains(v.SecAgg.LastAbort, "threshold") || v.SecAgg.Attempt != 1 || v.LastRound != 0 {
				t.Fatalf("after the abort: %+v, last round %d", *v.SecAgg, v.LastRound)
			}
			break
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatal("no abort")
		}
	}
	rec := httptest.NewRecorder()
	lf.Server.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if body := rec.Body.String(); !strings.Contains(body, "edgefl_aggregator_secagg_aborts_total 1") ||
		!strings.Contains(body, "edgefl_aggregator_secagg_attempt 1") {
		t.Fatalf("/metrics does not show the abort:\n%s", body)
	}
	if !strings.Contains(logs.String(), "secure aggregation aborted") {
		t.Fatal("no log line says the session aborted")
	}
	if n := aggregated.Load(); n != 0 {
		t.Fatalf("%d rounds aggregated from an aborted session", n)
	}
	// `broker-agg status` reads the same from the state file.
	rec = httptest.NewRecorder()
	lf.Server.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/status", nil))
	var st aggregator.Status
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
		t.Fatal(err)
	}
	if sa := st.SecAgg; sa == nil || sa.Aborts < 1 || !strings.Contains(sa.LastAbort, "threshold") || sa.Threshold != k {
		t.Fatalf("/status: secagg %+v", st.SecAgg)
	}
	// Password-only sites sign nothing: the honest-but-curious model.
	if sa := st.SecAgg; sa.Model != aggregator.SecAggModelHBC || sa.SignedKeys != 0 || sa.ListedKeys != k {
		t.Fatalf("/status: secagg model %q, %d of %d keys signed; want honest-but-curious, 0 of %d", sa.Model, sa.SignedKeys, sa.ListedKeys, k)
	}
}

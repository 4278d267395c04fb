package e2e

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/edgefl/edgefl/node/agent"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/secagg"
	"github.com/edgefl/edgefl/proto/uplink"
)

// The secure-aggregation kills (docs/privacy.md, "Persistence"):
// broker-agg, or one site, is killed with SIGKILL in each phase of a
// session (advertise, share keys, masked input, unmask), one phase per
// round, and restarted at once on its state file. The run completes every
// round; no site's message is ever refused as a conflicting second copy
// (a restarted party re-sends what it stored, byte for byte; a site whose
// last will closed a phase without it is a dropout, and its late re-send
// is answered stale); nothing is
// applied twice (each round is aggregated from one session's sum); and the
// last round's model is exactly the uniform mean of the plain ring sum of
// its contributors' inputs as the sites stored them: a round resumes or
// aborts, never closes with a wrong sum.

const secAggRounds = 5

// secAggAlgos are the runs the kills are made in: FedProx (the uniform
// mean of the sum) and FedProx:FedSplit in sum mode (docs/privacy.md,
// "FedSplit under secure aggregation": S and m, each site's record c_j
// advanced on its round's UPDATE receipt).
var secAggAlgos = []struct{ algorithm, aggregator string }{{"fedprox", "mean"}, {"fedproxsplit", "fedsplit-mean"}}

func secAggConf(federation, algorithm, aggregator string) kv {
	return aggDefaults(federation).with(kv{
		{"algorithm", algorithm}, {"aggregator", aggregator},
		{"per_round", "4"}, {"rounds", fmt.Sprint(secAggRounds)},
		{"secagg", "true"}, {"secagg_clip", "0.5"}, {"secagg_timeout", "5s"},
	})
}

// secAggPhases are the log lines at which each phase is entered: the
// aggregator's (after the state that opens the phase is stored, when its
// broadcast goes out) and a site's (after it committed its message).
var secAggPhases = []struct {
	name       string
	aggregator func(round int) func(logLine) bool
	site       func(round int) func(logLine) bool
}{
	{"advertise",
		func(r int) func(logLine) bool {
			return msgIs("secagg message stored", "round", r, "kind", "AdvertiseKeys")
		},
		func(r int) func(logLine) bool {
			return msgIs("round solved; secure aggregation: keys advertised (the update stays on this site)", "round", r)
		}},
	{"share-keys",
		func(r int) func(logLine) bool {
			return msgIs("secagg phase announced", "round", r, "phase", "share-keys")
		},
		func(r int) func(logLine) bool { return msgIs("secure aggregation: ShareKeys sent", "round", r) }},
	{"masked-input",
		func(r int) func(logLine) bool {
			return msgIs("secagg phase announced", "round", r, "phase", "masked-input")
		},
		func(r int) func(logLine) bool { return msgIs("secure aggregation: masked input sent", "round", r) }},
	{"unmask",
		func(r int) func(logLine) bool { return msgIs("secagg phase announced", "round", r, "phase", "unmask") },
		func(r int) func(logLine) bool { return msgIs("secure aggregation: UnmaskResponse sent", "round", r) }},
}

func TestSecAggAggregatorKilledInEveryPhase(t *testing.T) {
	e2eTest(t)
	for _, al := range secAggAlgos {
		t.Run(al.algorithm, func(t *testing.T) { testSecAggAggregatorKilled(t, al.algorithm, al.aggregator) })
	}
}

func testSecAggAggregatorKilled(t *testing.T, algorithm, aggregator string) {
	dir := t.TempDir()
	const federation = "sakillagg"
	agg, edges := startFederation(t, dir, federation, secAggConf(federation, algorithm, aggregator), 4, 60)
	for i, ph := range secAggPhases {
		r := i + 1
		agg.p.waitLine(30*time.Second, fmt.Sprintf("round %d in phase %s", r, ph.name), ph.aggregator(r))
		agg.p.kill()
		agg.start()
		t.Logf("aggregator killed in round %d, phase %s, and restarted", r, ph.name)
	}
	checkSecAggRun(t, agg, edges, algorithm == "fedproxsplit")
}

func TestSecAggSiteKilledInEveryPhase(t *testing.T) {
	e2eTest(t)
	for _, al := range secAggAlgos {
		t.Run(al.algorithm, func(t *testing.T) { testSecAggSiteKilled(t, al.algorithm, al.aggregator) })
	}
}

func testSecAggSiteKilled(t *testing.T, algorithm, aggregator string) {
	dir := t.TempDir()
	const federation = "sakillsite"
	agg, edges := startFederation(t, dir, federation, secAggConf(federation, algorithm, aggregator), 4, 60)
	v := edges[0]
	for i, ph := range secAggPhases {
		r := i + 1
		v.p.waitLine(30*time.Second, fmt.Sprintf("%s's round %d in phase %s", v.id, r, ph.name), ph.site(r))
		v.p.kill()
		es := readEdgeState(t, v.state)
		// Rounds are drawn back to back: between the log line and the
		// SIGKILL landing, a site may finish round r and apply round r+1
		// (the kill then lands early in round r+1, which is a kill too).
		switch {
		case es.applied < uint64(r) || es.applied > uint64(r+1):
			t.Fatalf("killed in round %d after its %s message: applied round %d", r, ph.name, es.applied)
		case es.applied == uint64(r+1):
			t.Logf("%s had applied round %d by the time the kill after round %d's %s message landed", v.id, r+1, r, ph.name)
		}
		for _, e := range es.outbox {
			// An earlier round's ShareKeys may wait for its ShareList
			// (until a re-send is answered stale), in sum mode an earlier
			// round's entry for its UPDATE receipt; nothing of a later
			// round than the one applied.
			if e.Round > es.applied {
				t.Fatalf("killed in round %d: an outbox entry of round %d", es.applied, e.Round)
			}
		}
		v.start()
		t.Logf("%s killed in round %d after committing its %s message (outbox: %d entry), restarted", v.id, r, ph.name, len(es.outbox))
	}
	checkSecAggRun(t, agg, edges, algorithm == "fedproxsplit")
}

// checkSecAggRun waits for the run's end, stops the federation and checks
// it (see the comment above).
func checkSecAggRun(t *testing.T, agg *aggregator, edges []*edge, sumMode bool) {
	t.Helper()
	final := agg.waitFinished(90 * time.Second)
	if final.round() != secAggRounds {
		t.Fatalf("finished at round %d, want %d", final.round(), secAggRounds)
	}
	stopFederation(t, agg, edges...)
	if n := len(agg.lines(msgIs("secagg message refused"))); n > 0 {
		t.Errorf("%d secagg messages refused as conflicting copies", n)
	}
	stale := 0
	for _, e := range edges {
		// A site whose last will closed a phase without it (a dropout)
		// may see its re-sent message of that phase refused as stale;
		// never as a bad or conflicting one.
		rejected := func(l logLine) bool {
			return msgIs("secagg message rejected by the aggregator; dropped")(l) ||
				msgIs("secagg message rejected by the aggregator; the round's contribution is kept until its update receipt")(l)
		}
		for _, l := range e.lines(rejected) {
			if l.str("code") != "RECEIPT_CODE_STALE_ROUND" {
				t.Errorf("%s: a secagg message rejected: %s", e.id, l.raw)
			}
			stale++
		}
	}
	t.Logf("%d re-sent messages of a phase closed without their site answered stale", stale)
	aborts := len(agg.lines(msgIs("secure aggregation aborted: the round's session has no sum; a new session is drawn (the round closes without these sites' updates, never with a wrong sum)")))
	t.Logf("%d aborted sessions, %d runs of broker-agg", aborts, len(agg.runs))

	// The last round: its model is the uniform mean of the plain sum of
	// the contributors' stored inputs, exactly (through the fp32 downlink).
	s, err := aggstore.OpenAgg(copyState(t, agg.state), storage.Options{LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	x, err := s.Checkpoint(secAggRounds)
	if err != nil {
		t.Fatal(err)
	}
	next, err := s.Checkpoint(secAggRounds + 1)
	if err != nil {
		t.Fatal(err)
	}
	r, attempt, st, err := s.SecAggServer()
	if err != nil || r != secAggRounds {
		t.Fatalf("the secagg server state of round %d: %v", r, err)
	}
	srv, err := secagg.UnmarshalServer(st)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := srv.Sum()
	if err != nil {
		t.Fatalf("the last round's session (attempt %d): %v", attempt, err)
	}
	u3 := srv.Survivors()
	var inputs [][]uint32
	for _, e := range edges {
		if !slices.Contains(u3, e.id) {
			continue
		}
		es, err := edgestore.OpenEdge(copyState(t, e.state), storage.Options{LockTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		er, ea, in, err := agent.SecAggSession(es)
		es.Close()
		if err != nil || er != secAggRounds || ea != attempt {
			t.Fatalf("%s: session of round %d attempt %d (%v), want round %d attempt %d", e.id, er, ea, err, secAggRounds, attempt)
		}
		inputs = append(inputs, in)
	}
	if len(inputs) < 3 || !slices.Equal(sum, uplink.SecAggPlainSum(inputs, dim)) {
		t.Fatalf("the unmasked sum over %v is not the plain sum of their stored inputs", u3)
	}
	sb, err := uplink.SecAggScaleBits(0.5, 4)
	if err != nil {
		t.Fatal(err)
	}
	q, err := secagg.NewQuantizer(0.5, sb, 4)
	if err != nil {
		t.Fatal(err)
	}
	if sumMode {
		checkSecAggSum(t, s, edges, u3, q, x, sum, next)
		return
	}
	want, err := uplink.SecAggMean(q, x, sum, len(inputs))
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if math.Float64bits(float64(float32(want[i]))) != math.Float64bits(next[i]) {
			t.Fatalf("coordinate %d of the final model: %v, the mean of the sum is %v", i, next[i], want[i])
		}
	}
}

// checkSecAggSum checks a sum-mode run's accounting after the kills, in
// integers of 2^-f: S after the last round (the S stored with the last
// round, plus the last round's unmasked sum; every site joined in round 1)
// is exactly the sum of the four sites' records c_j (each advanced by its
// rounds' UPDATE receipts; the last-round entry of a site of U3 still
// waiting for its receipt counts with its pending contribution), and the
// final model is
// S/4 through the fp32 downlink, bit for bit.
func checkSecAggSum(t *testing.T, s *aggstore.AggStore, edges []*edge, u3 []string, q secagg.Quantizer, x []float64, sum []uint32, next []float64) {
	t.Helper()
	last, err := s.Round(secAggRounds)
	if err != nil {
		t.Fatal(err)
	}
	var st uplink.SumState
	if err := st.UnmarshalBinary(last.Sum); err != nil || st.M != uint64(len(edges)) {
		t.Fatalf("the sum stored with round %d: m %d (%v), want %d", secAggRounds, st.M, err, len(edges))
	}
	want, err := uplink.SecAggSumClose(q, &st, secAggRounds, x, sum, nil)
	if err != nil {
		t.Fatal(err)
	}
	records := make([]float64, dim)
	for _, e := range edges {
		es, err := edgestore.OpenEdge(copyState(t, e.state), storage.Options{LockTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		cr, c, err := es.Contribution()
		if err != nil {
			t.Fatalf("%s: no record: %v", e.id, err)
		}
		p, ok, err := es.Pending(secAggRounds)
		es.Close()
		if err != nil {
			t.Fatal(err)
		}
		if ok && slices.Contains(u3, e.id) {
			c2, err := uplink.Advance(&uplink.Record{Round: cr, C: c}, secAggRounds, uplink.Pending{Join: p.Join, V: p.V})
			if err != nil {
				t.Fatal(err)
			}
			c = c2.C
		}
		t.Logf("%s: record of round %d, the last round's receipt pending: %v", e.id, cr, ok)
		for i, v := range c {
			records[i] += v
		}
	}
	if !slices.Equal(records, st.S) {
		t.Fatalf("S after the last round is not the sum of the sites' records (max |diff| %g)", maxAbsDiff(records, st.S))
	}
	for i := range want {
		if math.Float64bits(float64(float32(want[i]))) != math.Float64bits(next[i]) {
			t.Fatalf("coordinate %d of the final model: %v, S/m is %v", i, next[i], want[i])
		}
	}
}

func maxAbsDiff(a, b []float64) float64 {
	var d float64
	for i := range a {
		d = max(d, math.Abs(a[i]-b[i]))
	}
	return d
}

package e2e

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/edgefl/edgefl/agent"
	"github.com/edgefl/edgefl/secagg"
	"github.com/edgefl/edgefl/storage"
	"github.com/edgefl/edgefl/uplink"
)

// The secure-aggregation kills (issue 13, docs/secagg.md "Persistence"):
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

func secAggConf(federation string) kv {
	return aggDefaults(federation).with(kv{
		{"algorithm", "fedprox"}, {"aggregator", "mean"},
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
	dir := t.TempDir()
	const federation = "sakillagg"
	passwd := filepath.Join(dir, "passwd")
	setPasswords(t, dir, passwd, siteIDs(4)...)
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	agg := newAggregator(t, dir, secAggConf(federation).with(kv{{"listen", listen}, {"password_file", passwd}}))
	edges := startEdges(t, dir, federation, "tcp://"+listen, 4, 60, nil)
	for i, ph := range secAggPhases {
		r := i + 1
		agg.p.waitLine(30*time.Second, fmt.Sprintf("round %d in phase %s", r, ph.name), ph.aggregator(r))
		agg.p.kill()
		agg.start()
		t.Logf("aggregator killed in round %d, phase %s, and restarted", r, ph.name)
	}
	checkSecAggRun(t, agg, edges)
}

func TestSecAggSiteKilledInEveryPhase(t *testing.T) {
	e2eTest(t)
	dir := t.TempDir()
	const federation = "sakillsite"
	passwd := filepath.Join(dir, "passwd")
	setPasswords(t, dir, passwd, siteIDs(4)...)
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	agg := newAggregator(t, dir, secAggConf(federation).with(kv{{"listen", listen}, {"password_file", passwd}}))
	edges := startEdges(t, dir, federation, "tcp://"+listen, 4, 60, nil)
	v := edges[0]
	for i, ph := range secAggPhases {
		r := i + 1
		v.p.waitLine(30*time.Second, fmt.Sprintf("%s's round %d in phase %s", v.id, r, ph.name), ph.site(r))
		v.p.kill()
		es := readEdgeState(t, v.state)
		if es.applied != uint64(r) {
			t.Fatalf("killed in round %d after its %s message: applied round %d", r, ph.name, es.applied)
		}
		for _, e := range es.outbox {
			// An earlier round's ShareKeys may wait for its ShareList
			// (until a re-send is answered stale); nothing of a later round.
			if e.Round > uint64(r) {
				t.Fatalf("killed in round %d: an outbox entry of round %d", r, e.Round)
			}
		}
		v.start()
		t.Logf("%s killed in round %d after committing its %s message (outbox: %d entry), restarted", v.id, r, ph.name, len(es.outbox))
	}
	checkSecAggRun(t, agg, edges)
}

// checkSecAggRun waits for the run's end, stops the federation and checks
// it (see the comment above).
func checkSecAggRun(t *testing.T, agg *aggregator, edges []*edge) {
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
		for _, l := range e.lines(msgIs("secagg message rejected by the aggregator; dropped")) {
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
	s, err := storage.OpenAgg(copyState(t, agg.state), storage.Options{LockTimeout: time.Second})
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
		es, err := storage.OpenEdge(copyState(t, e.state), storage.Options{LockTimeout: time.Second})
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

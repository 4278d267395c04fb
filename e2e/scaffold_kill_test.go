package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/uplink"
)

// TestScaffoldKills: SCAFFOLD (proto/uplink/scaffold.go) with a lossy
// uplink codec, as TestSumModeKills kills: one site with SIGKILL on its
// commit's log line every round from round 2 (its c_i committed with the
// update, the receipt not yet handled), the aggregator once with a round's
// first update in, both restarted at once. The run completes, and the
// control variates are exact, bit for bit, from the round log alone:
// every round's stored c is the previous round's c plus the mean over the
// sites of that round's decoded control deltas (in id order, through the
// fp32 downlink), and every site's stored c_i is the sum of its own
// decoded deltas, round by round: no delta lost or counted twice on
// either side, whatever the kills interrupted.
func TestScaffoldKills(t *testing.T) {
	e2eTest(t)
	const (
		sites  = 3
		rounds = 6
		victim = "site-1"
	)
	dir := t.TempDir()
	federation := "scafkill"
	agg, edges := startFederation(t, dir, federation, aggDefaults(federation).with(kv{
		{"per_round", fmt.Sprint(sites)}, {"rounds", fmt.Sprint(rounds)},
		{"algorithm", "scaffold"}, {"codec", "topk:0.3+q8"},
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
	s, err := aggstore.OpenAgg(copyState(t, agg.state), storage.Options{LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	codec, err := quant.Parse("topk:0.3+q8")
	if err != nil {
		t.Fatal(err)
	}
	down, err := quant.Parse("fp32")
	if err != nil {
		t.Fatal(err)
	}
	var c []float64
	ci := map[string][]float64{}
	for r := uint64(1); r <= rounds; r++ {
		rec, err := s.Round(r)
		if err != nil {
			t.Fatal(err)
		}
		if r == 1 {
			if len(rec.Control) != 0 {
				t.Fatalf("round 1 stores a control variate: %d bytes", len(rec.Control))
			}
		} else if !bytes.Equal(rec.Control, storage.EncodeFloats(c)) {
			t.Fatalf("round %d: the stored c is not the round log's, bit for bit", r)
		}
		ids := make([]string, 0, len(st.updates[r]))
		for id := range st.updates[r] {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		if len(ids) != sites {
			t.Fatalf("round %d: updates of %v, want every site", r, ids)
		}
		_, c = replayControl(t, r, st.updates[r], ids, codec, down, c, ci, sites)
	}
	for _, e := range edges {
		es, err := edgestore.OpenEdge(copyState(t, e.state), storage.Options{LockTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		got, err := es.Residual(edgestore.ResidualControl)
		es.Close()
		if errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("%s: no c_i stored", e.id)
		}
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, ci[e.id]) {
			t.Fatalf("%s: its c_i is not the sum of its counted control deltas, bit for bit", e.id)
		}
	}
	t.Logf("c and every c_i exact from the round log after %d kills of %s and one of the aggregator; duplicates answered: %d",
		rounds-2, victim, len(v.lines(msgIs("update receipted", "code", "RECEIPT_CODE_DUPLICATE"))))
}

// TestScaffoldRollback: SCAFFOLD rolled back (`broker-agg run --rollback
// 3`) after round 4 opened with an update in, so that round 3 is reopened
// with the stored updates of the run rolled back; the aggregator is killed
// with SIGKILL before the rollback and once more after it, a site once
// after its commit of the new run's round 4. Every site clears its c_i with
// the new run id; the control epoch makes the aggregator announce c = 0
// for round 3, count none of round 3's control deltas and the sites keep
// c_i = 0 through it. Then, from the state files: round 4's stored c is 0,
// every later round's is the previous plus the mean of that round's
// decoded deltas, each site's c_i is the sum of its own deltas of rounds
// 4 and later, bit for bit, and c after the last round is the mean of the
// sites' c_i (the invariant SCAFFOLD's correction needs).
func TestScaffoldRollback(t *testing.T) {
	e2eTest(t)
	const (
		sites  = 3
		rounds = 7
		epoch  = 3
		victim = "site-1"
	)
	dir := t.TempDir()
	federation := "scafroll"
	agg, edges := startFederation(t, dir, federation, aggDefaults(federation).with(kv{
		{"per_round", fmt.Sprint(sites)}, {"rounds", fmt.Sprint(rounds)},
		{"algorithm", "scaffold"}, {"codec", "fp32"},
	}), sites, 80)
	agg.p.waitLine(60*time.Second, "round 4 announced", msgIs("round announced", "round", 4))
	agg.p.waitLine(60*time.Second, "an update of round 4", msgIs("update accepted", "round", 4))
	agg.p.kill()
	agg.p = startProc(t, dir, "aggregator", nil, aggBin, "run", "--config", agg.conf, "--rollback", fmt.Sprint(epoch))
	agg.runs = append(agg.runs, agg.p)
	agg.p.waitLine(20*time.Second, "the rollback", msgIs("state file rolled back: the federation resumes from this round as a new run"))

	v := edges[0]
	newRun, solved4 := msgIs("the aggregator started a new run: this site's round state starts over"), msgIs("round solved", "round", 4)
	waitFor(t, 60*time.Second, victim+"'s round 4 of the new run", func() (bool, error) {
		seen := false
		for _, l := range v.lines(func(logLine) bool { return true }) {
			seen = seen || newRun(l)
			if seen && solved4(l) {
				return true, nil
			}
		}
		return false, nil
	})
	v.p.kill()
	v.start()
	agg.p.waitLine(60*time.Second, "round 5 announced", msgIs("round announced", "round", 5))
	agg.p.kill()
	agg.start()
	agg.waitFinished(90 * time.Second)
	waitReceipted(t, edges)
	stopFederation(t, agg, edges...)

	st := readAggState(t, agg.state)
	if st.phase != "finished" || st.coordRnd != rounds {
		t.Fatalf("aggregator state: phase %s round %d", st.phase, st.coordRnd)
	}
	s, err := aggstore.OpenAgg(copyState(t, agg.state), storage.Options{LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	down, err := quant.Parse("fp32")
	if err != nil {
		t.Fatal(err)
	}
	var c []float64
	ci := map[string][]float64{}
	for r := uint64(epoch + 1); r <= rounds; r++ {
		rec, err := s.Round(r)
		if err != nil {
			t.Fatal(err)
		}
		ids := slices.Sorted(maps.Keys(st.updates[r]))
		if len(ids) != sites {
			t.Fatalf("round %d: updates of %v, want every site", r, ids)
		}
		var nc []float64
		c, nc = replayControl(t, r, st.updates[r], ids, down, down, c, ci, sites)
		if !bytes.Equal(rec.Control, storage.EncodeFloats(c)) {
			got, _ := storage.DecodeFloats(rec.Control, "control")
			t.Fatalf("round %d: the stored c is not the round log's since the rollback (round %d: zero), bit for bit: max |c| %g", r, epoch+1, maxAbs(got))
		}
		c = nc
	}
	mean := make([]float64, len(c))
	for _, e := range edges {
		es, err := edgestore.OpenEdge(copyState(t, e.state), storage.Options{LockTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		got, err := es.Residual(edgestore.ResidualControl)
		es.Close()
		if err != nil {
			t.Fatalf("%s: c_i: %v", e.id, err)
		}
		if !slices.Equal(got, ci[e.id]) {
			t.Fatalf("%s: its c_i is not the sum of its control deltas since the rollback, bit for bit", e.id)
		}
		for k, v := range got {
			mean[k] += v / sites
		}
	}
	var off float64
	for k := range c {
		off = max(off, math.Abs(c[k]-mean[k]))
	}
	if off > 1e-6*max(1, maxAbs(c)) {
		t.Fatalf("after the last round c is off the mean of the sites' c_i by %g (max |c| %g)", off, maxAbs(c))
	}
	t.Logf("after the rollback to round %d, c is the mean of the sites' c_i (off by %.1e, fp32 downlink; max |c| %.3g); updates of the old run ignored: %d",
		epoch, off, maxAbs(c), len(agg.lines(msgIs("update of another run ignored (a rollback started this one; the site clears it when it sees this run)"))))
}

func maxAbs(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = max(m, math.Abs(x))
	}
	return m
}

// replayControl replays one round of SCAFFOLD's control variates from the
// round log: each of ids' decoded control deltas (codec, in ids' order) is
// added to that site's c_i in ci, and c steps to uplink.NextControl's value
// through the downlink codec down, as the aggregator announces it. It
// returns c as the round started (zeros of the model's size when c is nil)
// and c after it.
func replayControl(t *testing.T, r uint64, updates map[string]aggstore.Update, ids []string, codec, down *quant.Codec,
	c []float64, ci map[string][]float64, sites int) (before, after []float64) {
	t.Helper()
	var ds [][]float64
	for _, id := range ids {
		m, x := decodeStored(t, updates[id])
		if c == nil {
			c = make([]float64, len(x))
		}
		if m.ControlDelta == nil {
			t.Fatalf("round %d, %s: no control delta", r, id)
		}
		d, err := codec.Decode(m.ControlDelta.Payload, nil)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
		next := slices.Clone(d)
		if old := ci[id]; old != nil {
			for k := range next {
				next[k] = old[k] + d[k]
			}
		}
		ci[id] = next
	}
	nc, err := uplink.NextControl(c, ds, sites)
	if err != nil {
		t.Fatal(err)
	}
	f, err := down.Encode(nil, nc, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if after, err = down.Decode(f, nil); err != nil {
		t.Fatal(err)
	}
	return c, after
}

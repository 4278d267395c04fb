package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestThirdOfSitesOffline: two of six sites (a third) lose power (SIGKILL)
// right after a round selecting them is announced, stay away for several
// rounds and then start again on their state files. K = 6, quorum 4.
//
// The round they were selected for closes at its deadline on the quorum of
// the four others, with the two as stragglers; once the broker has noticed
// them gone (keepalive, last will) `broker-agg status` shows them offline
// and the next rounds run on the four; when they come back they are
// selected again and contribute, and the run completes with every site's z
// equal to the aggregator's copy.
func TestThirdOfSitesOffline(t *testing.T) {
	needMosquitto(t)
	const (
		sites   = 6
		rounds  = 9
		timeout = 2500 * time.Millisecond
	)
	dir := t.TempDir()
	federation := "offline"
	setPasswords(t, dir, filepath.Join(dir, "passwd"), append(siteIDs(sites), "aggregator")...)
	m := newMosquitto(t, dir, federation)
	agg := newAggregator(t, dir, aggDefaults(federation).with(kv{
		{"broker", m.url()}, {"username", "aggregator"}, {"broker_password_file", passwordFile(dir, "aggregator")},
		{"per_round", fmt.Sprint(sites)}, {"quorum_fraction", "0.6"}, {"rounds", fmt.Sprint(rounds)},
		{"max_epochs", "0"}, {"max_seconds", "0.2"},
		{"round_timeout", timeout.String()}, {"extension", timeout.String()},
		{"codec", "qsgd:16"}, // stochastic deltas, late ones among them
	}))
	// A 2 s keepalive: the broker notices a dead site within 3 s.
	edges := startEdges(t, dir, federation, m.url(), sites, 60, kv{{"keepalive", "2s"}})
	away := edges[4:]
	awayIDs := []string{away[0].id, away[1].id}

	// Steady state first, then the outage at the next full selection.
	agg.waitMetrics(30*time.Second, "round 2 to close", func(m metrics) bool { return m["edgefl_aggregator_rounds_closed_total"] >= 2 })
	ann := agg.p.waitLine(30*time.Second, "a round selecting every site", func(l logLine) bool {
		sel, _ := l.kv["selected"].([]any)
		return msgIs("round announced")(l) && l.num("round") >= 3 && len(sel) == sites
	})
	r0 := int(ann.num("round"))
	for _, e := range away {
		e.p.kill()
	}
	t.Logf("round %d announced with every site selected; %v killed", r0, awayIDs)

	// The broker delivers their last will: the aggregator marks them offline.
	waitFor(t, 20*time.Second, "broker-agg status to show the killed sites offline", func() (bool, error) {
		st, err := statusJSON(agg.metrics)
		if err != nil {
			return false, err
		}
		off := 0
		for _, c := range st.Clients {
			if slices.Contains(awayIDs, c.ID) && !c.Online {
				off++
			}
		}
		return off == len(away), nil
	})
	// Rounds announced from here on cannot select them (the aggregator has
	// their last will).
	rOff := agg.mustScrape().round()
	agg.waitMetrics(60*time.Second, fmt.Sprintf("round %d to close", r0+2), func(m metrics) bool {
		return m["edgefl_aggregator_rounds_closed_total"] >= float64(r0+2)
	})
	back := agg.mustScrape().round()
	for _, e := range away {
		e.start()
	}
	t.Logf("restarted %v during round %d", awayIDs, back)
	agg.waitFinished(60 * time.Second)
	waitReceipted(t, edges)
	stopFederation(t, agg, edges...)

	st := readAggState(t, agg.state)
	if st.phase != "finished" || st.coordRnd != rounds {
		t.Fatalf("aggregator state: phase %s round %d", st.phase, st.coordRnd)
	}
	// The outage closes a round on quorum at its deadline: a round that
	// selected the killed sites gets no update from at least one of them
	// (a site may still have published the update of the round it was
	// solving in the milliseconds before SIGKILL landed), closes with the
	// quorum of four and only killed sites as stragglers, after its deadline.
	quorumClose := false
	for r := r0; r <= rOff && !quorumClose; r++ {
		agr, ok := agg.p.find(msgIs("round aggregated", "round", r))
		if !ok {
			t.Fatalf("no aggregation of round %d", r)
		}
		an, ok := agg.p.find(func(l logLine) bool { return msgIs("round announced")(l) && int(l.num("round")) == r })
		if !ok {
			t.Fatalf("no announcement of round %d", r)
		}
		strag, _ := agr.kv["stragglers"].([]any)
		onlyAway := len(strag) > 0
		for _, id := range strag {
			onlyAway = onlyAway && slices.Contains(awayIDs, fmt.Sprint(id))
		}
		late := logTime(t, agr).Sub(logTime(t, an)) >= timeout-50*time.Millisecond
		quorumClose = onlyAway && agr.num("contributors") >= 4 && late
		t.Logf("round %d: contributors %v, stragglers %v, closed at the deadline %v", r, agr.num("contributors"), strag, late)
	}
	if !quorumClose {
		t.Errorf("no round in %d..%d closed on quorum at its deadline with only the killed sites missing", r0, rOff)
	}
	// Rounds announced after the aggregator marked them offline run
	// without them.
	for r := rOff + 1; r < back; r++ {
		got := st.contributors(uint64(r))
		if len(got) < 4 || slices.ContainsFunc(got, func(id string) bool { return slices.Contains(awayIDs, id) }) {
			t.Errorf("outage round %d: contributors %v", r, got)
		}
	}
	// They rejoin: selected and contributing after the restart.
	for _, id := range awayIDs {
		var after []int
		for r := back; r <= rounds; r++ {
			if _, ok := st.updates[uint64(r)][id]; ok {
				after = append(after, r)
			}
		}
		if len(after) == 0 {
			t.Errorf("%s contributed to no round after its restart in round %d", id, back)
		}
		t.Logf("%s contributed again to rounds %v", id, after)
	}
	for _, e := range edges {
		checkSiteCopy(t, e, st, 0)
	}
	t.Logf("stragglers over the run %d, rounds closed %d", st.stragglrs, st.closed)
}

// statusJSON runs `broker-agg status --addr ADDR --json` against a running
// aggregator.
func statusJSON(addr string) (struct {
	Round   int `json:"round"`
	Clients []struct {
		ID     string `json:"id"`
		Online bool   `json:"online"`
	} `json:"clients"`
}, error) {
	var st struct {
		Round   int `json:"round"`
		Clients []struct {
			ID     string `json:"id"`
			Online bool   `json:"online"`
		} `json:"clients"`
	}
	out, err := exec.Command(aggBin, "status", "--addr", addr, "--json").Output()
	if err != nil {
		return st, fmt.Errorf("broker-agg status: %w", err)
	}
	return st, json.Unmarshal(out, &st)
}

func logTime(t *testing.T, l logLine) time.Time {
	t.Helper()
	ts, err := time.Parse(time.RFC3339Nano, l.str("time"))
	if err != nil {
		t.Fatalf("log time of %q: %v", l.raw, err)
	}
	return ts
}

package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMosquittoRestartMidRound: Mosquitto, the federation's external
// broker, is restarted twice mid-round on the same port and persistence
// directory: once with SIGTERM (it saves its persistence file: retained
// announcement, sessions, queued messages) and once with SIGKILL (it comes
// back with the file of the previous shutdown: a stale retained
// announcement and none of the messages in flight). broker-agg and every
// edge-agent reconnect by themselves and the run completes: every round
// aggregates every site, every receipted update is in the round log, and
// every site's z equals the aggregator's.
func TestMosquittoRestartMidRound(t *testing.T) {
	needMosquitto(t)
	const (
		sites  = 4
		rounds = 7
	)
	dir := t.TempDir()
	federation := "brokerrestart"
	pw := setPasswords(t, dir, filepath.Join(dir, "passwd"), append(siteIDs(sites), "aggregator", "observer")...)
	m := newMosquitto(t, dir, federation)
	obs := newObserver(t, m.url(), federation, pw["observer"])
	agg := newAggregator(t, dir, aggDefaults(federation).with(kv{
		{"broker", m.url()}, {"username", "aggregator"}, {"broker_password_file", passwordFile(dir, "aggregator")},
		{"per_round", fmt.Sprint(sites)}, {"rounds", fmt.Sprint(rounds)},
		{"max_epochs", "0"}, {"max_seconds", "0.3"},
		// A round whose announcement the broker lost is re-announced at
		// its deadline (the extension), so keep deadlines short.
		{"round_timeout", "3s"}, {"extension", "3s"},
	}))
	edges := startEdges(t, dir, federation, m.url(), sites, 60, nil)

	rng := rand.New(rand.NewPCG(5, 0xb0b))
	for i, how := range []string{"SIGTERM", "SIGKILL"} {
		now := agg.mustScrape()
		target := now["edgefl_aggregator_updates_accepted_total"] + float64(1+rng.IntN(sites+2))
		at := agg.waitMetrics(30*time.Second, fmt.Sprintf("update #%v", target), func(m metrics) bool {
			return m["edgefl_aggregator_updates_accepted_total"] >= target
		})
		if at["edgefl_aggregator_finished"] == 1 {
			t.Fatal("finished before the broker restart")
		}
		if how == "SIGTERM" {
			m.term()
		} else {
			m.p.kill()
		}
		m.start()
		restarted := m.p.started
		// Work flows again: an update accepted after the restart.
		var acc logLine
		waitFor(t, 30*time.Second, "an update accepted after the broker restart", func() (bool, error) {
			for _, l := range agg.lines(msgIs("update accepted")) {
				if l.at.After(restarted) {
					acc = l
					return true, nil
				}
			}
			if !agg.p.alive() {
				t.Fatalf("the aggregator exited:\n%s", agg.p.tail(20))
			}
			return false, nil
		})
		t.Logf("restart %d (%s) after update #%v (round %d, phase %s): next update accepted %v after Mosquitto started again",
			i+1, how, target, at.round(), at.phase(), acc.at.Sub(restarted).Round(time.Millisecond))
	}
	agg.waitFinished(60 * time.Second)
	for _, e := range edges {
		waitFor(t, 20*time.Second, e.id+"'s last receipt", func() (bool, error) {
			return len(e.lines(msgIs("update receipted", "round", rounds))) > 0, nil
		})
	}
	stopFederation(t, agg, edges...)

	if n := len(agg.lines(msgIs("subscribed"))); n < 3 {
		t.Errorf("the aggregator subscribed %d times, want once per broker run (3)", n)
	}
	st := readAggState(t, agg.state)
	if st.phase != "finished" || st.coordRnd != rounds || !allFinite(st.final) {
		t.Fatalf("aggregator state: phase %s round %d", st.phase, st.coordRnd)
	}
	for r := uint64(1); r <= rounds; r++ {
		if got := st.contributors(r); !slices.Equal(got, siteIDs(sites)) {
			t.Errorf("round %d: stored updates from %v, want every site", r, got)
		}
	}
	receipted := obs.accepted()
	for _, e := range edges {
		if n := len(e.lines(msgIs("connected"))); n < 3 {
			t.Errorf("%s connected %d times, want once per broker run (3)", e.id, n)
		}
		for _, l := range e.lines(msgIs("update receipted")) {
			receipted[key{uint64(l.num("round")), e.id}] = 0
		}
		checkSiteCopy(t, e, st, rounds)
	}
	for k := range receipted {
		if _, ok := st.updates[k.round][k.client]; !ok {
			t.Errorf("update %v was receipted but is not in the round log", k)
		}
	}
	t.Logf("%d receipted updates in the round log; deadline extensions %d; duplicate re-sends ignored %d",
		len(receipted), st.extended, len(agg.lines(msgIs("duplicate update ignored"))))
}

// TestMosquittoRestoresLeftRun: Mosquitto killed (SIGKILL) comes back with
// its last persistence file, which holds the retained announcement of the
// previous aggregator run (run A, finished; the aggregator's state was
// since replaced and run B started). The agents, in run B, must not go
// back to run A (resetting their round state and abandoning B's work, then
// forward again): each resets its round state exactly once, into run B,
// logs the stale announcement as one of a run it has left, and run B
// completes with every site in every round and every site's z equal to the
// aggregator's.
func TestMosquittoRestoresLeftRun(t *testing.T) {
	needMosquitto(t)
	const (
		sites  = 3
		rounds = 4
	)
	dir := t.TempDir()
	federation := "leftrun"
	setPasswords(t, dir, filepath.Join(dir, "passwd"), append(siteIDs(sites), "aggregator")...)
	m := newMosquitto(t, dir, federation)
	// No autosave while the test runs: the file written at the SIGTERM
	// below (run A's retained announcement) is the one the SIGKILL'd
	// broker comes back with, however slow the machine.
	conf, err := os.ReadFile(m.conf)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.conf, []byte(strings.Replace(string(conf), "autosave_interval 60\n", "autosave_interval 3600\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	agg := newAggregator(t, dir, aggDefaults(federation).with(kv{
		{"broker", m.url()}, {"username", "aggregator"}, {"broker_password_file", passwordFile(dir, "aggregator")},
		{"per_round", fmt.Sprint(sites)}, {"rounds", fmt.Sprint(rounds)},
		{"max_epochs", "0"}, {"max_seconds", "0.3"},
		{"round_timeout", "6s"}, {"extension", "3s"},
	}))
	edges := startEdges(t, dir, federation, m.url(), sites, 60, nil)

	// Run A to its end; Mosquitto saves its retained FINISHED announcement.
	agg.waitFinished(60 * time.Second)
	runA := agg.lines(msgIs("new round log"))[0].str("run_id")
	for _, e := range edges {
		waitFor(t, 20*time.Second, e.id+"'s end of run A", func() (bool, error) {
			return len(e.lines(msgIs("update receipted", "round", rounds))) >= 1, nil
		})
	}
	m.term()
	m.start()
	// The hospital starts the federation over: run B.
	if err := agg.p.stop(); err != nil {
		t.Fatalf("aggregator: %v", err)
	}
	if err := os.Remove(agg.state); err != nil {
		t.Fatal(err)
	}
	agg.start()
	waitFor(t, 30*time.Second, "run B's first accepted update", func() (bool, error) {
		return len(agg.lines(msgIs("new round log"))) == 2 && len(agg.lines(msgIs("update accepted"))) > 0, nil
	})
	runB := agg.lines(msgIs("new round log"))[1].str("run_id")
	for _, e := range edges {
		waitFor(t, 30*time.Second, e.id+" in run B", func() (bool, error) {
			return len(e.lines(msgIs("the aggregator started a new run: this site's round state starts over", "run_id", runB))) == 1, nil
		})
	}
	// kill -9: Mosquitto comes back with run A's retained announcement.
	m.p.kill()
	m.start()
	agg.waitFinished(90 * time.Second)
	for _, e := range edges {
		waitFor(t, 20*time.Second, e.id+"'s last receipt of run B", func() (bool, error) {
			return len(e.lines(msgIs("update receipted", "round", rounds))) >= 2, nil
		})
	}
	stopFederation(t, agg, edges...)

	st := readAggState(t, agg.state)
	if st.phase != "finished" || st.coordRnd != rounds {
		t.Fatalf("run B's state: phase %s round %d", st.phase, st.coordRnd)
	}
	for r := uint64(1); r <= rounds; r++ {
		if got := st.contributors(r); !slices.Equal(got, siteIDs(sites)) {
			t.Errorf("run B, round %d: stored updates from %v, want every site", r, got)
		}
	}
	left := 0
	for _, e := range edges {
		resets := e.lines(msgIs("the aggregator started a new run: this site's round state starts over"))
		if len(resets) != 1 || resets[0].str("run_id") != runB {
			var to []string
			for _, l := range resets {
				to = append(to, l.str("run_id"))
			}
			t.Errorf("%s reset its round state %d times, to runs %v; want once, to run B %s (run A is %s)", e.id, len(resets), to, runB, runA)
		}
		if n := len(e.lines(msgIs("round of the previous run abandoned"))); n > 0 {
			t.Errorf("%s abandoned %d rounds for another run", e.id, n)
		}
		left += len(e.lines(msgIs("announcement of a run this site has left ignored", "run_id", runA)))
		checkSiteCopy(t, e, st, rounds)
	}
	if left == 0 {
		t.Errorf("no site logged run A's stale announcement as ignored: did Mosquitto come back with it?")
	}
}

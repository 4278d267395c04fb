package e2e

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestAgentKilledMidSolveAndAtCommit: one site (site-1) of a FedProx-split
// federation on the embedded broker is killed with SIGKILL once per round
// and restarted at once: mid-solve (after a seeded random share of its
// solve's CPU time), right after it logs the commit of its round, and at
// seeded random points around the end of its solve. What the kill
// interrupted is read from a copy of its state file (nothing committed;
// committed with the update still in the outbox; committed and receipted).
//
// Then: the run completes; the aggregator stores every (round, site) once,
// and a re-sent update is byte for byte the committed one; a round that was
// committed before the kill is never solved again (one FedSplit step per
// round), one that was not is solved exactly once after the restart; an
// update the aggregator already held is never stored again (the re-send is
// answered DUPLICATE, or the original's queued receipt arrives first);
// every site's z equals the aggregator's latest z for it, bit for bit.
func TestAgentKilledMidSolveAndAtCommit(t *testing.T) {
	e2eTest(t)
	const (
		sites  = 3
		rounds = 8
		victim = "site-1"
	)
	dir := t.TempDir()
	federation := "edgecrash"
	agg, edges := startFederation(t, dir, federation, aggDefaults(federation).with(kv{
		{"per_round", fmt.Sprint(sites)}, {"rounds", fmt.Sprint(rounds)},
		// Solves long enough to kill one in the middle, bound by work (not
		// by wall time: on a loaded machine a time-bound solve gets less
		// CPU, and the kill instants below are fractions of a solve's CPU).
		{"max_epochs", "4000"}, {"max_seconds", "0"},
		{"codec", "q8"}, // the site's copy of z is state a kill must not lose
	}), sites, 80)
	v := edges[0]

	announced := func(r int) logLine {
		return agg.p.waitLine(30*time.Second, fmt.Sprintf("round %d announced", r), msgIs("round announced", "round", r))
	}
	// Round 1 calibrates the CPU time of one solve.
	announced(1)
	cpu0 := cpuTime(t, v.p.pid())
	v.p.waitLine(30*time.Second, "round 1 solved", msgIs("round solved", "round", 1))
	solveCPU := cpuTime(t, v.p.pid()) - cpu0
	t.Logf("a solve takes %v of CPU", solveCPU)
	if solveCPU < 50*time.Millisecond {
		t.Fatalf("a solve took %v of CPU: too short to kill it in the middle", solveCPU)
	}

	type trial struct {
		round          int
		how            string
		class          string // what the kill interrupted
		applied        uint64
		outbox         []byte // the committed, unreceipted update of the round
		zRound         uint64 // the round of the site's z
		copyRound      uint64 // the round of its copy of the aggregator's z
		acceptedBefore bool   // the aggregator logged accepting it before the kill
		run            int    // index of the killed run in v.runs
	}
	rng := rand.New(rand.NewPCG(3, 0xbeef))
	var trials []trial
	var applied uint64 // the victim's applied round when its last kill landed
	for r := 2; r <= rounds; r++ {
		if applied >= uint64(r) {
			// Rounds are drawn back to back: the last kill landed after
			// this round's commit too. Its run is gone; this round's
			// kill is the one that happened.
			t.Logf("round %d: applied before the last kill landed; not killed again in it", r)
			continue
		}
		announced(r)
		start := cpuTime(t, v.p.pid())
		tr := trial{round: r, run: len(v.runs) - 1}
		switch (r - 2) % 3 {
		case 0:
			frac := 0.15 + 0.5*rng.Float64()
			tr.how = fmt.Sprintf("mid-solve, after %.0f%% of a solve's CPU", 100*frac)
			waitCPU(t, v.p, start+time.Duration(frac*float64(solveCPU)), msgIs("round solved", "round", r))
		case 1:
			tr.how = "on the commit's log line"
			v.p.waitLine(30*time.Second, fmt.Sprintf("round %d solved", r), msgIs("round solved", "round", r))
		case 2:
			frac := 0.85 + 0.3*rng.Float64()
			tr.how = fmt.Sprintf("around the commit, after %.0f%% of a solve's CPU (or its receipt)", 100*frac)
			waitCPU(t, v.p, start+time.Duration(frac*float64(solveCPU)), msgIs("update receipted", "round", r))
		}
		killedAt := time.Now()
		v.p.kill()
		for _, l := range agg.lines(msgIs("update accepted", "client", victim, "round", r)) {
			tr.acceptedBefore = tr.acceptedBefore || l.at.Before(killedAt)
		}
		es := readEdgeState(t, v.state)
		tr.applied, tr.zRound, tr.copyRound = es.applied, es.zRound, es.copyRound
		for _, e := range es.outbox {
			if e.Round == uint64(r) {
				tr.outbox = e.Msg
			}
		}
		switch {
		case es.applied < uint64(r):
			tr.class = "nothing committed"
		case tr.outbox != nil:
			tr.class = "committed, update in the outbox"
		default:
			tr.class = "committed and receipted"
		}
		// Between the line (or the CPU reading) and the SIGKILL landing,
		// the site may have finished round r and applied round r+1 (the
		// rounds are drawn back to back): a kill after a commit too.
		if es.applied > uint64(r+1) {
			t.Fatalf("round %d: the killed site had applied round %d already", r, es.applied)
		}
		applied = es.applied
		t.Logf("round %d: killed %s: %s (aggregator had it: %v)", r, tr.how, tr.class, tr.acceptedBefore)
		trials = append(trials, tr)
		v.start()
		agg.waitMetrics(30*time.Second, fmt.Sprintf("round %d to close", r), func(m metrics) bool {
			return m["edgefl_aggregator_rounds_closed_total"] >= float64(r)
		})
	}
	agg.waitFinished(30 * time.Second)
	// Every solved update answered (the last round's receipt too), also
	// one whose receipt line a kill cut off.
	waitReceipted(t, edges)
	stopFederation(t, agg, edges...)

	st := readAggState(t, agg.state)
	if st.phase != "finished" || st.coordRnd != rounds {
		t.Fatalf("aggregator state: phase %s round %d", st.phase, st.coordRnd)
	}
	for r := uint64(1); r <= rounds; r++ {
		if got := st.contributors(r); !slices.Equal(got, siteIDs(sites)) {
			t.Errorf("round %d: stored updates from %v, want every site", r, got)
		}
	}
	classes := map[string]int{}
	for _, tr := range trials {
		classes[tr.class]++
		stored, ok := st.updates[uint64(tr.round)][victim]
		if !ok {
			t.Errorf("round %d: the aggregator never stored %s's update", tr.round, victim)
			continue
		}
		// Solves of the round after the kill (by the later runs).
		var later int
		for _, p := range v.runs[tr.run+1:] {
			later += p.count(msgIs("round solved", "round", tr.round))
		}
		killedRun := v.runs[tr.run].count(msgIs("round solved", "round", tr.round))
		if tr.class == "nothing committed" {
			if killedRun != 0 || later != 1 {
				t.Errorf("round %d (killed before its commit): solved %d times before and %d after the restart, want 0 and 1", tr.round, killedRun, later)
			}
		} else {
			if later != 0 {
				t.Errorf("round %d (committed before the kill): solved again %d times after the restart", tr.round, later)
			}
			// z is the last applied round's (round r's, or r+1's when the
			// kill landed after that commit too).
			if tr.zRound != tr.applied {
				t.Errorf("round %d: committed up to round %d, but the site's z is of round %d", tr.round, tr.applied, tr.zRound)
			}
			// The copy and z were committed with the update; the copies are
			// compared bit for bit with the aggregator's at the end.
			if tr.copyRound != tr.applied {
				t.Errorf("round %d: committed up to round %d, but the site's copy of the aggregator's z is of round %d", tr.round, tr.applied, tr.copyRound)
			}
		}
		if tr.outbox != nil {
			if !bytes.Equal(tr.outbox, stored.Msg) {
				t.Errorf("round %d: the aggregator stored other bytes than the update the site had committed", tr.round)
			}
			codes := v.lines(msgIs("update receipted", "round", tr.round))
			if len(codes) == 0 {
				t.Errorf("round %d: the re-sent update was never receipted", tr.round)
			} else if tr.acceptedBefore {
				// The aggregator held the update before the kill: it must
				// never store it again. The restarted site learns that
				// either from the DUPLICATE answer to its re-send or, when
				// the aggregator's STORED receipt for the original was
				// published as the site died, from that receipt, which the
				// broker kept for the site's persistent session and
				// delivers on reconnect, before the re-send is answered.
				dup := slices.ContainsFunc(codes, func(l logLine) bool { return l.str("code") == "RECEIPT_CODE_DUPLICATE" })
				if !dup && codes[0].str("code") != "RECEIPT_CODE_STORED" {
					t.Errorf("round %d: the aggregator held the update before the kill, but the site's receipt was %v", tr.round, codes[0].str("code"))
				}
				if n := len(agg.lines(msgIs("update accepted", "client", victim, "round", tr.round))); n != 1 {
					t.Errorf("round %d: the aggregator accepted %s's update %d times, want once", tr.round, victim, n)
				}
			}
		}
	}
	for r := 1; r <= rounds; r++ {
		if n := len(v.lines(msgIs("round solved", "round", r))); n > 1 {
			t.Errorf("round %d was solved %d times by %s", r, n, victim)
		}
	}
	if classes["nothing committed"] == 0 || classes["nothing committed"] == len(trials) {
		t.Errorf("kills by class %v: want kills both before and after a commit", classes)
	}
	for _, e := range edges {
		checkSiteCopy(t, e, st, rounds)
	}
	t.Logf("kills by what they interrupted: %v; duplicates answered: %d", classes,
		len(v.lines(msgIs("update receipted", "code", "RECEIPT_CODE_DUPLICATE"))))
}

// cpuTime is a process's user + system CPU time (/proc/PID/stat).
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatalf("cpu time of %d: %v", pid, err)
	}
	s := string(b)
	// Fields after the command name (which may hold spaces) in parentheses.
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// waitCPU waits until p has used cpu of CPU time, or (when or is set) a
// line matching or appears.
func waitCPU(t *testing.T, p *proc, cpu time.Duration, or func(logLine) bool) {
	t.Helper()
	waitFor(t, 30*time.Second, fmt.Sprintf("%s to use %v of CPU", p.name, cpu), func() (bool, error) {
		if !p.alive() {
			t.Fatalf("%s exited:\n%s", p.name, p.tail(20))
		}
		if or != nil {
			if _, ok := p.find(or); ok {
				return true, nil
			}
		}
		return cpuTime(t, p.pid()) >= cpu, nil
	})
}

package e2e

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/storage"
)

// TestDamagedAgentState is the agent's damaged-state recovery on real processes: a site's
// state file truncated while the site is down (before the fix, edge-agent
// logged "connected" and hung forever in a bbolt panic). The agent must
// exit non-zero at once with a one-line error that names the file and the
// way out; `edge-agent run --reset-state` then moves the file aside and the
// site takes part in the rest of the run.
func TestDamagedAgentState(t *testing.T) {
	e2eTest(t)
	const (
		sites  = 3
		rounds = 6
	)
	dir := t.TempDir()
	federation := "damaged"
	agg, edges := startFederation(t, dir, federation, aggDefaults(federation).with(kv{
		{"per_round", fmt.Sprint(sites)}, {"rounds", fmt.Sprint(rounds)}, {"quorum_fraction", "0.6"},
	}), sites, 60)
	victim := edges[0]
	victim.p.waitLine(60*time.Second, "site-1's receipt of round 2", msgIs("update receipted", "round", 2))
	victim.p.kill()

	// Cut the file to its two meta pages and one more: whatever the last
	// commit wrote lies past the new end.
	if err := os.Truncate(victim.state, 3*4096); err != nil {
		t.Fatal(err)
	}
	victim.start()
	victim.p.waitExit(15 * time.Second)
	out := victim.p.tail(5)
	if victim.p.exitError() == nil || !strings.Contains(out, "is truncated") || !strings.Contains(out, "--reset-state") ||
		!strings.Contains(out, victim.state) {
		t.Fatalf("edge-agent on a truncated state file: exit %v, output:\n%s", victim.p.exitError(), out)
	}

	victim.p = startProc(t, dir, victim.id, nil, agentBin, "run", "--config", victim.conf, "--reset-state")
	victim.runs = append(victim.runs, victim.p)
	victim.p.waitLine(10*time.Second, "the reset", msgIs("state file moved aside; this site starts over from the aggregator"))
	agg.waitFinished(90 * time.Second)
	if got := victim.p.count(msgIs("update receipted")); got == 0 {
		t.Fatalf("site-1 took no part after --reset-state:\n%s", victim.p.tail(20))
	}
	if aside, _ := filepath.Glob(victim.state + ".damaged-*"); len(aside) != 1 {
		t.Fatalf("damaged file kept as %v, want one copy", aside)
	}
	stopFederation(t, agg, edges...)
}

// TestDamagedAggregatorState: one flipped bit in the aggregator's newest
// checkpoint while it is down. broker-agg must refuse to start with a
// one-line error naming the file, the last intact round and the command;
// `broker-agg run --rollback N` then resumes the federation from round N
// as a new run, and it finishes with every site.
func TestDamagedAggregatorState(t *testing.T) {
	e2eTest(t)
	const (
		sites  = 3
		rounds = 8
	)
	dir := t.TempDir()
	federation := "damagedagg"
	agg, edges := startFederation(t, dir, federation, aggDefaults(federation).with(kv{
		{"per_round", fmt.Sprint(sites)}, {"rounds", fmt.Sprint(rounds)},
	}), sites, 60)
	agg.waitMetrics(60*time.Second, "round 4", func(m metrics) bool { return m.round() >= 4 })
	agg.p.kill()

	// Flip one mantissa bit of the newest checkpoint, found by its bytes.
	s, err := aggstore.OpenAgg(copyState(t, agg.state), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	last, x, err := s.LatestCheckpoint()
	s.Close()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(agg.state)
	if err != nil {
		t.Fatal(err)
	}
	enc := make([]byte, 0, 8*len(x))
	for _, v := range x {
		enc = binary.LittleEndian.AppendUint64(enc, math.Float64bits(v))
	}
	at := strings.Index(string(b), string(enc))
	if at < 0 {
		t.Fatalf("checkpoint %d not found in the file", last)
	}
	b[at+5] ^= 0x10
	if err := os.WriteFile(agg.state, b, 0o600); err != nil {
		t.Fatal(err)
	}

	p := startProc(t, dir, "aggregator", nil, aggBin, "run", "--config", agg.conf)
	p.waitExit(15 * time.Second)
	out := p.tail(5)
	m := regexp.MustCompile("broker-agg run --rollback ([0-9]+)").FindStringSubmatch(out)
	if p.exitError() == nil || m == nil || !strings.Contains(out, "checksum") || !strings.Contains(out, agg.state) {
		t.Fatalf("broker-agg on a damaged state file: exit %v, output:\n%s", p.exitError(), out)
	}
	if m[1] != fmt.Sprint(last-1) {
		t.Fatalf("suggested rollback to round %s, want %d (checkpoint %d is the damaged one)", m[1], last-1, last)
	}

	agg.p = startProc(t, dir, "aggregator", nil, aggBin, "run", "--config", agg.conf, "--rollback", m[1])
	agg.runs = append(agg.runs, agg.p)
	agg.waitHealthy(20 * time.Second)
	agg.p.waitLine(5*time.Second, "the rollback", msgIs("state file rolled back: the federation resumes from this round as a new run"))
	agg.waitFinished(120 * time.Second)
	if kept, _ := filepath.Glob(agg.state + ".before-rollback-*"); len(kept) != 1 {
		t.Fatalf("copies before the rollback: %v", kept)
	}
	waitReceipted(t, edges)
	for _, e := range edges {
		if len(e.lines(msgIs("the aggregator started a new run: this site's round state starts over"))) == 0 {
			t.Errorf("%s did not start over after the rollback", e.id)
		}
	}
	stopFederation(t, agg, edges...)
	st := readAggState(t, agg.state)
	if st.phase != "finished" || st.coordRnd != rounds {
		t.Fatalf("after the rollback the run ended in phase %s round %d", st.phase, st.coordRnd)
	}
}

// TestMissingAgentState: a site whose state file is gone after its run
// (the data partition not mounted, state_file pointing elsewhere) while
// its model_out remains must not silently start over under a new identity:
// edge-agent exits non-zero at once with a one-line error naming the state
// file, the trace and --fresh-state, and creates nothing; with
// --fresh-state it starts over, says so, and draws a new instance id.
func TestMissingAgentState(t *testing.T) {
	e2eTest(t)
	dir := t.TempDir()
	federation := "missingstate"
	schemaPath, files := clinicalFederation(t, dir, clinicalSchema)
	files = files[:2]
	passwd := filepath.Join(dir, "passwd")
	setPasswords(t, dir, passwd, "site-1", "site-2")
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	agg := newAggregator(t, dir, aggDefaults(federation).with(kv{
		{"listen", listen}, {"password_file", passwd}, {"schema", schemaPath},
		{"per_round", "2"}, {"rounds", "2"}, {"max_epochs", "2"}, {"lr", "0.1"},
	}).drop("features", "classes"))
	edges := clinicalEdges(t, dir, federation, listen, files, nil)
	agg.waitFinished(120 * time.Second)
	victim := edges[0]
	modelOut := filepath.Join(dir, victim.id+".bundle.json")
	victim.p.waitLine(60*time.Second, "site-1's final model", msgIs("federation finished; final model written"))
	first := victim.lines(msgIs("this installation"))
	victim.p.kill()
	if err := os.Remove(victim.state); err != nil {
		t.Fatal(err)
	}

	victim.start()
	victim.p.waitExit(15 * time.Second)
	out := victim.p.tail(5)
	if victim.p.exitError() == nil || !strings.Contains(out, "is missing but this site has run here before") ||
		!strings.Contains(out, victim.state) || !strings.Contains(out, modelOut) || !strings.Contains(out, "--fresh-state") {
		t.Fatalf("edge-agent with its state file gone: exit %v, output:\n%s", victim.p.exitError(), out)
	}
	if _, err := os.Stat(victim.state); err == nil {
		t.Fatal("the refused start created a state file")
	}

	victim.p = startProc(t, dir, victim.id, nil, agentBin, "run", "--config", victim.conf, "--fresh-state")
	victim.runs = append(victim.runs, victim.p)
	victim.p.waitLine(10*time.Second, "the fresh start", msgIs("state file missing; starting this site over with a new one as asked (--fresh-state)"))
	again := victim.p.waitLine(10*time.Second, "the new installation", msgIs("this installation"))
	if len(first) != 1 || again.str("instance") == "" || again.str("instance") == first[0].str("instance") {
		t.Fatalf("instance ids: before %v, after %q: want a new one", first, again.str("instance"))
	}
	stopFederation(t, agg, edges...)
}

// TestZeroedMetaPage: a zeroed bbolt meta page, in a site's state file and
// in the aggregator's, while they are down. Each daemon must refuse to
// start with the damaged-file refusal the other damage gets (one line
// naming the file and the page, and the way out), never with bbolt's
// "panic: assertion failed", which reads like a crash.
func TestZeroedMetaPage(t *testing.T) {
	e2eTest(t)
	const sites = 2
	dir := t.TempDir()
	federation := "zerometa"
	agg, edges := startFederation(t, dir, federation, aggDefaults(federation).with(kv{
		{"per_round", fmt.Sprint(sites)}, {"rounds", "2"},
	}), sites, 40)
	agg.waitFinished(60 * time.Second)
	waitReceipted(t, edges)
	stopFederation(t, agg, edges...)

	zero := func(path string, page int) {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		clear(b[page*4096 : (page+1)*4096])
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(p *proc, who, path, page, wayOut string) {
		t.Helper()
		p.waitExit(15 * time.Second)
		out := p.tail(5)
		if p.exitError() == nil || !strings.Contains(out, path+" is damaged: meta page "+page+" is zeroed") || !strings.Contains(out, wayOut) ||
			strings.Contains(out, "panic") || strings.Contains(out, "assertion") {
			t.Fatalf("%s on a state file with meta page %s zeroed: exit %v, output:\n%s", who, page, p.exitError(), out)
		}
	}
	victim := edges[0]
	zero(victim.state, 0)
	victim.start()
	refused(victim.p, "edge-agent", victim.state, "0", "--reset-state")

	zero(agg.state, 1)
	p := startProc(t, dir, "aggregator", nil, aggBin, "run", "--config", agg.conf)
	// Its page tree is not sound, so it cannot be rolled back.
	refused(p, "broker-agg run", agg.state, "1", "restore it from a copy")
	p = startProc(t, dir, "status", nil, aggBin, "status", "--state", agg.state)
	refused(p, "broker-agg status", agg.state, "1", agg.state)
}

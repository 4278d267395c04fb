package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSecAggSignedKilledInConsistency: signed secure aggregation through
// Mosquitto with the shipped configuration (mutual TLS, the ACL) and the
// certificates `broker-agg pki` makes, so that every site signs its keys
// and the consistency round (the signed survivor set) runs in every
// session. Real processes are killed with SIGKILL in that round and
// restarted at once on their state files: broker-agg once the round is
// announced (round 1) and once a survivor's signed survivor set is stored
// (round 3), one site once it committed its signed survivor set (round 2).
// The run completes every round, no message is refused as a conflicting
// copy, and the last round's model is exactly the uniform mean of the
// plain ring sum of its contributors' stored inputs (checkSecAggRun).
func TestSecAggSignedKilledInConsistency(t *testing.T) {
	e2eTest(t)
	needMosquitto(t)
	const sites = 4
	dir := t.TempDir()
	federation := "sasigned"
	pk := filepath.Join(dir, "pki")
	ids := siteIDs(sites)
	if out, err := exec.Command(aggBin, "pki", "--dir", pk, "--clients", strings.Join(ids, ","), "--hosts", "127.0.0.1").CombinedOutput(); err != nil {
		t.Fatalf("broker-agg pki: %v\n%s", err, out)
	}
	m := newMosquittoShipped(t, dir, federation)
	url := fmt.Sprintf("ssl://127.0.0.1:%d", m.port)
	tlsOf := func(id string) kv {
		return kv{{"tls_ca", filepath.Join(pk, "ca.crt")}, {"tls_cert", filepath.Join(pk, "clients", id+".crt")}, {"tls_key", filepath.Join(pk, "clients", id+".key")}}
	}
	agg := newAggregator(t, dir, secAggConf(federation, "fedprox", "mean").with(kv{{"broker", url}}).with(tlsOf("aggregator")))
	var edges []*edge
	for i, id := range ids {
		c := agentConf(federation, url, id, "", i, sites, 60).with(tlsOf(id))
		c = slices.DeleteFunc(c, func(p [2]string) bool { return p[0] == "username" || p[0] == "password_file" })
		edges = append(edges, newEdge(t, dir, id, c))
	}
	agg.p.waitLine(60*time.Second, "round 1's consistency round", msgIs("secagg phase announced", "round", 1, "phase", "consistency"))
	agg.p.kill()
	agg.start()
	v := edges[0]
	v.p.waitLine(60*time.Second, v.id+"'s signed survivor set of round 2", msgIs("secure aggregation: SurvivorsSigned sent", "round", 2))
	v.p.kill()
	v.start()
	agg.p.waitLine(60*time.Second, "a signed survivor set of round 3", msgIs("secagg message stored", "round", 3, "kind", "SurvivorsSigned"))
	agg.p.kill()
	agg.start()
	checkSecAggRun(t, agg, edges, false)
	for r := 1; r <= secAggRounds; r++ {
		if len(agg.lines(msgIs("secagg phase announced", "round", r, "phase", "consistency"))) == 0 {
			t.Errorf("round %d had no consistency round", r)
		}
	}
	for _, e := range edges {
		if l := e.lines(msgIs("this site cannot take part; the aggregator is told")); len(l) > 0 {
			t.Errorf("%s refused a session: %s", e.id, l[0].raw)
		}
	}
}

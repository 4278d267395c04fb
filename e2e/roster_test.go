package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestRosterShowsRefusedSites: broker-agg run with its embedded broker
// over mutual TLS and --sites site-1,site-2,site-3. site-1 takes part;
// site-2 presents a certificate of another CA (its tls_ca trusts both, so
// it passes its own start check and tries); site-3 never starts; a
// "stranger" with a valid certificate of the federation's CA is not on the
// roster. /status (the console's data), the console's page and /metrics
// show every roster site: site-2 never connected with the broker's reason,
// site-3 never connected, the stranger refused apart.
func TestRosterShowsRefusedSites(t *testing.T) {
	e2eTest(t)
	dir := t.TempDir()
	federation := "roster"
	pk, other := filepath.Join(dir, "pki"), filepath.Join(dir, "other-pki")
	for _, p := range []struct{ dir, clients string }{{pk, "site-1,site-2,site-3,stranger"}, {other, "site-2"}} {
		if out, err := exec.Command(aggBin, "pki", "--dir", p.dir, "--clients", p.clients, "--hosts", "127.0.0.1").CombinedOutput(); err != nil {
			t.Fatalf("broker-agg pki: %v\n%s", err, out)
		}
	}
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	agg := newAggregator(t, dir, aggDefaults(federation).with(kv{
		{"listen", listen}, {"per_round", "1"}, {"rounds", "0"}, {"sites", "site-1,site-2,site-3"},
		{"tls_cert", filepath.Join(pk, "server.crt")}, {"tls_key", filepath.Join(pk, "server.key")}, {"tls_client_ca", filepath.Join(pk, "ca.crt")},
	}))
	both := filepath.Join(dir, "both-ca.crt")
	caA, _ := os.ReadFile(filepath.Join(pk, "ca.crt"))
	caB, _ := os.ReadFile(filepath.Join(other, "ca.crt"))
	if err := os.WriteFile(both, append(caA, caB...), 0o644); err != nil {
		t.Fatal(err)
	}
	site := func(id, certDir, ca string) *edge {
		c := agentConf(federation, "ssl://"+listen, id, "", 0, 1, 40).with(kv{{"tls_ca", ca},
			{"tls_cert", filepath.Join(certDir, "clients", id+".crt")}, {"tls_key", filepath.Join(certDir, "clients", id+".key")}})
		c = slices.DeleteFunc(c, func(p [2]string) bool { return p[0] == "username" || p[0] == "password_file" })
		return newEdge(t, dir, id, c)
	}
	edges := []*edge{site("site-1", pk, filepath.Join(pk, "ca.crt")), site("site-2", other, both), site("stranger", pk, filepath.Join(pk, "ca.crt"))}

	agg.waitMetrics(30*time.Second, "site-1 online, site-2 and the stranger refused", func(m metrics) bool {
		return m[`edgefl_aggregator_roster_sites{state="online"}`] == 1 && m[`edgefl_aggregator_roster_sites{state="never_connected"}`] == 2 &&
			m[`edgefl_aggregator_site_refusals_total{site="site-2"}`] >= 1 && m[`edgefl_aggregator_site_refusals_total{site="(not a site)"}`] >= 1
	})
	code, body, err := httpGet(agg.metrics, "/status")
	if err != nil || code != http.StatusOK {
		t.Fatalf("/status: %d %v", code, err)
	}
	for _, want := range []string{
		`"id":"site-2"`, `"never_connected":true`, `"reason":"client certificate not signed by the site CA"`,
		`"id":"site-3"`, `"id":"stranger","reason":"identity not on the roster (--sites)"`,
	} {
		if !strings.Contains(strings.ReplaceAll(strings.ReplaceAll(body, "\n", ""), " ", ""), strings.ReplaceAll(want, " ", "")) {
			t.Errorf("/status lacks %s:\n%s", want, body)
		}
	}
	code, page, err := httpGet(agg.metrics, "/")
	if err != nil || code != http.StatusOK {
		t.Fatalf("the console: %d %v", code, err)
	}
	for _, want := range []string{`data-site="site-2"`, `data-site="site-3"`, "never connected", "refused by the broker", "1 of 3"} {
		if !strings.Contains(page, want) {
			t.Errorf("the console's page lacks %q", want)
		}
	}
	if l := edges[1].lines(func(l logLine) bool { return strings.Contains(l.str("hint"), "the broker refused this site") }); len(l) == 0 {
		t.Errorf("site-2's refused attempts do not say why:\n%s", edges[1].p.tail(5))
	}
	stopFederation(t, agg, edges...)
}

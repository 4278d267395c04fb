package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// newMosquittoShipped starts Mosquitto with deploy/mosquitto/mosquitto.conf
// as shipped (mutual TLS, certificate CN = username = client id), only its
// paths moved into dir, its listener on a loopback port, and certificates
// from `broker-agg pki` in dir/pki.
func newMosquittoShipped(t *testing.T, dir, federation string) *mosquitto {
	t.Helper()
	m := &mosquitto{t: t, dir: dir, port: freePort(t), conf: filepath.Join(dir, "mosquitto.conf")}
	shipped, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "mosquitto", "mosquitto.conf"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"edgefl.acl":    shippedACL(t, federation),
		"edgefl.passwd": "",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "mosquitto-data"), 0o755); err != nil {
		t.Fatal(err)
	}
	conf := strings.NewReplacer(
		"/etc/mosquitto/certs/", filepath.Join(dir, "pki")+"/",
		"/etc/mosquitto/", dir+"/",
		"/var/lib/mosquitto/", filepath.Join(dir, "mosquitto-data")+"/",
		"\nlistener 8883\n", fmt.Sprintf("\nlistener %d 127.0.0.1\n", m.port),
	).Replace(string(shipped))
	if !strings.Contains(conf, fmt.Sprintf("listener %d 127.0.0.1", m.port)) {
		t.Fatal("deploy/mosquitto/mosquitto.conf has no \"listener 8883\" line to move")
	}
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	// Run as root, Mosquitto drops privileges to "mosquitto", who cannot
	// read the test's files: stay the current user.
	conf = "user " + me.Username + "\nlog_dest stderr\nlog_type all\nconnection_messages true\n" + conf
	if err := os.WriteFile(m.conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	m.start()
	return m
}

// TestMosquittoMutualTLS: the federation runs through Mosquitto configured
// by the shipped deploy/mosquitto files (mutual TLS, the ACL), with the
// certificates `broker-agg pki` makes: broker-agg and every edge-agent
// authenticate by certificate alone, and every round aggregates every site.
// A site with a certificate from another CA never gets in: with the
// federation's ca.crt as tls_ca it refuses to start, in one line naming
// the other PKI; with a tls_ca that also holds its own CA it tries, and
// every refused attempt says why.
func TestMosquittoMutualTLS(t *testing.T) {
	needMosquitto(t)
	const (
		sites  = 3
		rounds = 3
	)
	dir := t.TempDir()
	federation := "mtls"
	pk := filepath.Join(dir, "pki")
	ids := siteIDs(sites)
	if out, err := exec.Command(aggBin, "pki", "--dir", pk, "--clients", strings.Join(ids, ","), "--hosts", "127.0.0.1").CombinedOutput(); err != nil {
		t.Fatalf("broker-agg pki: %v\n%s", err, out)
	}
	other := filepath.Join(dir, "other-pki")
	if out, err := exec.Command(aggBin, "pki", "--dir", other, "--clients", "site-9,site-8", "--hosts", "127.0.0.1").CombinedOutput(); err != nil {
		t.Fatalf("broker-agg pki: %v\n%s", err, out)
	}
	m := newMosquittoShipped(t, dir, federation)
	url := fmt.Sprintf("ssl://127.0.0.1:%d", m.port)
	tlsOf := func(p, id string) kv {
		return kv{{"tls_ca", filepath.Join(pk, "ca.crt")}, {"tls_cert", filepath.Join(p, "clients", id+".crt")}, {"tls_key", filepath.Join(p, "clients", id+".key")}}
	}
	agg := newAggregator(t, dir, aggDefaults(federation).with(kv{
		{"broker", url}, {"per_round", fmt.Sprint(sites)}, {"rounds", fmt.Sprint(rounds)}, {"codec", "q8"},
	}).with(tlsOf(pk, "aggregator")))
	var edges []*edge
	for i, id := range ids {
		c := agentConf(federation, url, id, "", i, sites, 60).with(tlsOf(pk, id))
		c = slices.DeleteFunc(c, func(p [2]string) bool { return p[0] == "username" || p[0] == "password_file" })
		edges = append(edges, newEdge(t, dir, id, c))
	}
	// site-9 trusts both CAs (its own too), so it passes its start check
	// and Mosquitto refuses it; site-8 has the federation's ca.crt and
	// stops at start.
	both := filepath.Join(dir, "both-ca.crt")
	caA, _ := os.ReadFile(filepath.Join(pk, "ca.crt"))
	caB, _ := os.ReadFile(filepath.Join(other, "ca.crt"))
	if err := os.WriteFile(both, append(caA, caB...), 0o644); err != nil {
		t.Fatal(err)
	}
	intruder := agentConf(federation, url, "site-9", "", 0, sites, 60).with(tlsOf(other, "site-9")).set("tls_ca", both)
	intruder = slices.DeleteFunc(intruder, func(p [2]string) bool { return p[0] == "username" || p[0] == "password_file" })
	bad := newEdge(t, dir, "site-9", intruder)
	stranger := agentConf(federation, url, "site-8", "", 0, sites, 60).with(tlsOf(other, "site-8"))
	stranger = slices.DeleteFunc(stranger, func(p [2]string) bool { return p[0] == "username" || p[0] == "password_file" })
	refused := newEdge(t, dir, "site-8", stranger)

	agg.waitFinished(60 * time.Second)
	for _, e := range edges {
		waitFor(t, 20*time.Second, e.id+"'s last receipt", func() (bool, error) {
			return len(e.lines(msgIs("update receipted", "round", rounds))) > 0, nil
		})
	}
	if n := len(bad.lines(msgIs("connected"))); n != 0 {
		t.Errorf("the site with another CA's certificate connected %d times", n)
	}
	if n := len(bad.lines(msgIs("connection attempt failed"))); n == 0 {
		t.Errorf("the site with another CA's certificate logged no failed connection attempt:\n%s", bad.p.tail(10))
	}
	if l := bad.lines(func(l logLine) bool { return strings.Contains(l.str("hint"), "the broker refused this site") }); len(l) == 0 {
		t.Errorf("the refused attempts do not say why:\n%s", bad.p.tail(10))
	}
	refused.p.waitExit(20 * time.Second)
	if err := refused.p.exitError(); err == nil || !strings.Contains(refused.p.tail(3), "the certificate comes from another PKI") ||
		len(refused.lines(msgIs("connection attempt failed"))) != 0 {
		t.Errorf("site-8, with another PKI's certificate, did not stop at start with one line (exit %v):\n%s", err, refused.p.tail(5))
	}
	refused.noPanics()
	stopFederation(t, agg, append(edges, bad)...)
	st := readAggState(t, agg.state)
	for r := uint64(1); r <= rounds; r++ {
		if got := st.contributors(r); !slices.Equal(got, ids) {
			t.Errorf("round %d: stored updates from %v, want every site", r, got)
		}
	}
	if _, ok := st.z["site-9"]; ok {
		t.Error("the intruder has a z at the aggregator")
	}
}

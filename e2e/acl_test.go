package e2e

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/proto/wire"
)

// TestUpdateTopicNeedsTheSitesIdentity: without credentials, with wrong
// ones, or with another site's, a client cannot put a message on a site's
// update topic (nor forge its status): mosquitto_pub tries against
// `broker-agg run`'s embedded broker (password file from
// `broker-agg pki passwd`, and mutual TLS with certificates from
// `broker-agg pki`) and against Mosquitto with the shipped ACL. The
// aggregator never sees any of it: its received-message counters stay at
// zero until the same update is published by the site itself, which it
// does see (and rejects: the site never announced itself).
func TestUpdateTopicNeedsTheSitesIdentity(t *testing.T) {
	t.Run("embedded/password", func(t *testing.T) { e2eTest(t); needPub(t); testACL(t, "password") })
	t.Run("embedded/mutual-tls", func(t *testing.T) { e2eTest(t); needPub(t); testACL(t, "mtls") })
	t.Run("mosquitto", func(t *testing.T) { needMosquitto(t); testACL(t, "mosquitto") })
}

func needPub(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath(mosquittoPubBin); err != nil {
		t.Fatalf("this test needs %s (apt-get install mosquitto-clients): %v", mosquittoPubBin, err)
	}
}

func testACL(t *testing.T, mode string) {
	dir := t.TempDir()
	federation := "acl"
	pw := setPasswords(t, dir, filepath.Join(dir, "passwd"), "site-1", "site-2", "aggregator")
	c := aggDefaults(federation).with(kv{{"per_round", "2"}, {"rounds", "1"}})
	var (
		port int
		// credentials of id for mosquitto_pub, and a wrong set
		as    func(id string) []string
		wrong []string
	)
	switch mode {
	case "password", "mtls":
		port = freePort(t)
		c = c.set("listen", fmt.Sprintf("127.0.0.1:%d", port))
		if mode == "password" {
			c = c.set("password_file", filepath.Join(dir, "passwd"))
			as = func(id string) []string { return []string{"-i", id, "-u", id, "-P", pw[id]} }
			wrong = []string{"-i", "site-1", "-u", "site-1", "-P", "not-" + pw["site-1"]}
		} else {
			pk := filepath.Join(dir, "pki")
			out, err := exec.Command(aggBin, "pki", "--dir", pk, "--clients", "site-1,site-2", "--hosts", "127.0.0.1").CombinedOutput()
			if err != nil {
				t.Fatalf("broker-agg pki: %v\n%s", err, out)
			}
			c = c.with(kv{{"tls_cert", filepath.Join(pk, "server.crt")}, {"tls_key", filepath.Join(pk, "server.key")}, {"tls_client_ca", filepath.Join(pk, "ca.crt")}})
			as = func(id string) []string {
				return []string{"-i", id, "--cafile", filepath.Join(pk, "ca.crt"),
					"--cert", filepath.Join(pk, "clients", id+".crt"), "--key", filepath.Join(pk, "clients", id+".key")}
			}
			// A certificate for site-1 from another CA.
			other := filepath.Join(dir, "other-pki")
			if out, err := exec.Command(aggBin, "pki", "--dir", other, "--clients", "site-1", "--hosts", "127.0.0.1").CombinedOutput(); err != nil {
				t.Fatalf("broker-agg pki: %v\n%s", err, out)
			}
			wrong = []string{"-i", "site-1", "--cafile", filepath.Join(pk, "ca.crt"),
				"--cert", filepath.Join(other, "clients", "site-1.crt"), "--key", filepath.Join(other, "clients", "site-1.key")}
		}
	case "mosquitto":
		m := newMosquitto(t, dir, federation)
		port = m.port
		c = c.with(kv{{"broker", m.url()}, {"username", "aggregator"}, {"broker_password_file", passwordFile(dir, "aggregator")}})
		as = func(id string) []string { return []string{"-i", id + "-pub", "-u", id, "-P", pw[id]} }
		wrong = []string{"-i", "site-1-pub", "-u", "site-1", "-P", "not-" + pw["site-1"]}
	}
	agg := newAggregator(t, dir, c)

	update := func(client string) []byte {
		b, err := encodeUpdate(validUpdate(t, client, 1, constVec(dim, 0.5)))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	topic := func(kind, id string) string {
		if kind == "status" {
			return "edgefl/acl/clients/" + id + "/status"
		}
		return "edgefl/acl/updates/" + id
	}
	noCreds := []string{"-i", "site-1"}
	if mode == "mtls" {
		noCreds = []string{"-i", "site-1", "--cafile", filepath.Join(dir, "pki", "ca.crt")} // TLS without a client certificate
	}
	site2AsSite1 := append(as("site-2"), "-i", "site-1") // the last -i wins
	attempts := []struct {
		name string
		args []string
		kind string
	}{
		{"no credentials", noCreds, "update"},
		{"wrong credentials", wrong, "update"},
		{"another site's credentials (MQTT 3.1.1)", as("site-2"), "update"},
		{"another site's credentials (MQTT 5)", append(as("site-2"), "-V", "mqttv5"), "update"},
		{"another site's credentials, forged status", as("site-2"), "status"},
	}
	if mode != "mosquitto" { // Mosquitto lets a client choose its id; the embedded broker ties it to the identity
		attempts = append(attempts, struct {
			name string
			args []string
			kind string
		}{"another site's credentials under its client id", site2AsSite1, "update"})
	}
	for _, a := range attempts {
		payload := update("site-1")
		if a.kind == "status" {
			b, err := encodeStatus("site-1")
			if err != nil {
				t.Fatal(err)
			}
			payload = b
		}
		out, err := mosquittoPub(t, port, "", "", "", topic(a.kind, "site-1"), payload, a.args...)
		t.Logf("%-50s mosquitto_pub: %v %s", a.name, err, strings.TrimSpace(out))
	}
	// The positive control, after every attempt: site-1 itself, twice.
	for range 2 {
		if out, err := mosquittoPub(t, port, "", "", "", topic("update", "site-1"), update("site-1"), as("site-1")...); err != nil {
			t.Fatalf("site-1 publishing its own update: %v\n%s", err, out)
		}
	}
	got := agg.waitMetrics(20*time.Second, "site-1's own updates", func(m metrics) bool {
		return m[`edgefl_aggregator_received_messages_total{kind="update"}`] >= 2 && m.rejected("unknown_client") >= 2
	})
	if n := got[`edgefl_aggregator_received_messages_total{kind="update"}`]; n != 2 {
		t.Errorf("the aggregator received %v updates, want only site-1's own 2", n)
	}
	if n := got[`edgefl_aggregator_received_messages_total{kind="status"}`]; n != 0 {
		t.Errorf("the aggregator received %v status messages, want 0 (the forged one must not pass)", n)
	}
	if n := got[`edgefl_aggregator_clients{state="known"}`]; n != 0 {
		t.Errorf("%v clients known, want 0", n)
	}
	if n := got.rejected("unknown_client"); n != 2 {
		t.Errorf("rejected{unknown_client} = %v, want 2 (site-1's own updates)", n)
	}
	for reason := range reasonsIn(got) {
		if reason != "unknown_client" && got.rejected(reason) != 0 {
			t.Errorf("rejected{reason=%q} = %v", reason, got.rejected(reason))
		}
	}
	if mode != "mosquitto" {
		refused := agg.p.count(func(l logLine) bool { return strings.HasPrefix(l.msg(), "mqtt connection refused") })
		denied := agg.p.count(func(l logLine) bool { return strings.HasSuffix(l.msg(), "denied by ACL") })
		// A TLS handshake without a valid client certificate fails before
		// MQTT: only the identity mismatch is an MQTT refusal then.
		wantRefused := 3
		if mode == "mtls" {
			wantRefused = 1
		}
		if refused < wantRefused || denied < 3 {
			t.Errorf("broker log: %d refused connections, %d ACL denials; want >= %d and >= 3", refused, denied, wantRefused)
		}
		t.Logf("embedded broker logged %d refused connections and %d ACL denials", refused, denied)
	}
	stopFederation(t, agg)
	st := readAggState(t, agg.state)
	if len(st.updates) != 0 || len(st.z) != 0 {
		t.Errorf("the state file holds updates %v", st.updates)
	}
}

func encodeUpdate(u *wire.ClientUpdate) ([]byte, error) { return wire.Encode(u) }

func encodeStatus(id string) ([]byte, error) {
	return wire.Encode(&wire.ClientStatus{ClientId: id, Online: true, SampleCount: 50})
}

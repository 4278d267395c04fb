package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// refusedMsg is the aggregator's log line for a failed broker connection.
const refusedMsg = "the broker refused or failed the aggregator's connection; retrying"

// TestMosquittoRefusesTheAggregator: the federation runs over Mosquitto
// (the real binary) with two sites online; then the aggregator's password
// in Mosquitto's password file changes and Mosquitto restarts, so it
// refuses the aggregator's reconnection ("not Authorized"). The aggregator
// says so in its log (WARN, with the broker's reason), in /status (the
// console's data: broker.connected false, the last error; every site's
// liveness unknown, none online) and in /metrics
// (edgefl_aggregator_broker_connected 0, the failures counted, no client
// online): it no longer reports sites online from statuses it heard before
// the outage.
func TestMosquittoRefusesTheAggregator(t *testing.T) {
	needMosquitto(t)
	dir := t.TempDir()
	federation := "refusedagg"
	passwd := filepath.Join(dir, "passwd")
	setPasswords(t, dir, passwd, "site-1", "site-2", "aggregator")
	m := newMosquitto(t, dir, federation)
	// The aggregator keeps the password it read at start.
	aggPw := filepath.Join(dir, "aggregator-own.password")
	copyFile(t, passwordFile(dir, "aggregator"), aggPw)
	agg := newAggregator(t, dir, aggDefaults(federation).with(kv{
		{"broker", m.url()}, {"username", "aggregator"}, {"broker_password_file", aggPw},
		{"per_round", "2"}, {"rounds", "0"}, {"sites", "site-1,site-2,site-3"},
	}))
	edges := startEdges(t, dir, federation, m.url(), 2, 40, nil)
	agg.waitMetrics(30*time.Second, "both sites online", func(m metrics) bool {
		return m[`edgefl_aggregator_clients{state="online"}`] == 2 && m["edgefl_aggregator_broker_connected"] == 1
	})
	if l := agg.lines(msgIs(refusedMsg)); len(l) != 0 {
		t.Fatalf("refusals logged before the password changed: %v", l[0].raw)
	}
	st := readStatus(t, agg.metrics)
	if len(st.Clients) != 3 || !st.client("site-3").NeverConnected || !st.client("site-3").Expected {
		t.Fatalf("the roster's site-3 is not shown as never connected: %+v", st.Clients)
	}

	// Adding a site rewrote the password file with a new aggregator
	// password (the accident of a password file re-made): Mosquitto
	// refuses the aggregator after its restart.
	setPasswords(t, dir, passwd, "aggregator")
	m.term()
	m.start()

	// (While Mosquitto restarts, the attempts fail as refused TCP
	// connections, a line of their own.)
	line := agg.p.waitLine(30*time.Second, "the refused login logged", func(l logLine) bool {
		return msgIs(refusedMsg)(l) && strings.Contains(l.str("err"), "not Authorized")
	})
	if line.str("level") != "WARN" {
		t.Fatalf("the refusal's line: %s", line.raw)
	}
	at := agg.waitMetrics(20*time.Second, "the broker connection shown down", func(m metrics) bool {
		return m["edgefl_aggregator_broker_connected"] == 0 && m["edgefl_aggregator_broker_connect_failures_total"] >= 1
	})
	if n := at[`edgefl_aggregator_clients{state="online"}`]; n != 0 {
		t.Errorf("%v clients online while the aggregator cannot reach the broker", n)
	}
	st = readStatus(t, agg.metrics)
	if st.Broker == nil || st.Broker.Connected || !strings.Contains(st.Broker.LastError, "not Authorized") || st.Broker.ConnectFailures < 1 {
		t.Fatalf("/status's broker: %+v", st.Broker)
	}
	for _, c := range st.Clients {
		if c.Online || !c.LivenessUnknown {
			t.Errorf("%s shown online %v (liveness unknown %v) during the outage", c.ID, c.Online, c.LivenessUnknown)
		}
	}
	// The console's page says it too.
	code, page, err := httpGet(agg.metrics, "/")
	if err != nil || code != http.StatusOK || !strings.Contains(page, "NOT connected") || !strings.Contains(page, "not Authorized") {
		t.Fatalf("the console's page (HTTP %d, %v) does not show the refused connection", code, err)
	}
	t.Logf("refused: %s; %v failed attempts", st.Broker.LastError, st.Broker.ConnectFailures)

	for _, e := range edges {
		e.p.kill()
	}
	agg.p.kill()
	checkNoPanics(t, agg.runs)
}

type e2eStatus struct {
	Broker *struct {
		Connected       bool   `json:"connected"`
		LastError       string `json:"last_error"`
		ConnectFailures uint64 `json:"connect_failures"`
	} `json:"broker"`
	Clients []e2eClient `json:"clients"`
}

type e2eClient struct {
	ID              string `json:"id"`
	Online          bool   `json:"online"`
	Expected        bool   `json:"expected"`
	NeverConnected  bool   `json:"never_connected"`
	LivenessUnknown bool   `json:"liveness_unknown"`
}

func (s e2eStatus) client(id string) e2eClient {
	for _, x := range s.Clients {
		if x.ID == id {
			return x
		}
	}
	return e2eClient{}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func readStatus(t *testing.T, addr string) e2eStatus {
	t.Helper()
	var st e2eStatus
	code, body, err := httpGet(addr, "/status")
	if err != nil || code != http.StatusOK {
		t.Fatalf("/status: HTTP %d %v", code, err)
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(fmt.Errorf("/status: %w", err))
	}
	return st
}

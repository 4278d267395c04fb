package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

const natsBin = "nats-server"

func needNATS(t *testing.T) string {
	t.Helper()
	e2eTest(t)
	p, err := exec.LookPath(natsBin)
	if err != nil {
		t.Fatalf("this test needs nats-server (apt-get install nats-server; scripts/test.sh does it): %v", err)
	}
	return p
}

// natsNode is one node of a loopback NATS cluster.
type natsNode struct {
	name                string
	client, route, mqtt int
	conf                string
	p                   *proc
}

// natsCluster is three nats-server nodes on loopback, each configured by
// the shipped deploy/nats/node.conf (only its paths, ports and node name
// changed) and deploy/nats/users.sh's users, with the certificates of
// `broker-agg pki` in pk.
type natsCluster struct {
	t     *testing.T
	dir   string
	bin   string
	nodes []*natsNode
}

func newNATSCluster(t *testing.T, dir, federation, pk string, sites []string) *natsCluster {
	t.Helper()
	c := &natsCluster{t: t, dir: dir, bin: needNATS(t)}
	shipped, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "nats", "node.conf"))
	if err != nil {
		t.Fatal(err)
	}
	users, err := exec.Command("sh", append([]string{filepath.Join(repoRoot, "deploy", "nats", "users.sh"), federation}, sites...)...).Output()
	if err != nil {
		t.Fatalf("deploy/nats/users.sh: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "edgefl-users.conf"), users, 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		c.nodes = append(c.nodes, &natsNode{name: fmt.Sprintf("nats-%d", i+1), client: freePort(t), route: freePort(t), mqtt: freePort(t)})
	}
	for i, n := range c.nodes {
		r := []string{
			"$EDGEFL_NATS_NODE", n.name,
			"/var/lib/nats/jetstream", filepath.Join(dir, n.name+"-jetstream"),
			"/etc/nats/certs/", pk + "/",
			"127.0.0.1:4222", fmt.Sprintf("127.0.0.1:%d", n.client),
			"0.0.0.0:6222", fmt.Sprintf("127.0.0.1:%d", n.route),
			"0.0.0.0:8883", fmt.Sprintf("127.0.0.1:%d", n.mqtt),
		}
		for _, o := range c.nodes {
			r = append(r, "nats-route://"+o.name+":6222", fmt.Sprintf("nats-route://127.0.0.1:%d", o.route))
		}
		conf := strings.NewReplacer(r...).Replace(string(shipped))
		for _, must := range []string{n.name, fmt.Sprintf("127.0.0.1:%d", n.mqtt), fmt.Sprintf("127.0.0.1:%d", c.nodes[(i+1)%3].route)} {
			if !strings.Contains(conf, must) {
				t.Fatalf("deploy/nats/node.conf: the test could not set %s (a line it moves has changed)", must)
			}
		}
		n.conf = filepath.Join(dir, n.name+".conf")
		if err := os.WriteFile(n.conf, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.nodes {
		c.start(n)
	}
	for _, n := range c.nodes {
		c.waitMQTT(n)
	}
	return c
}

func (c *natsCluster) start(n *natsNode) {
	c.t.Helper()
	n.p = startProc(c.t, c.dir, n.name, nil, c.bin, "-c", n.conf)
}

// waitMQTT waits until n's MQTT listener accepts TCP connections.
func (c *natsCluster) waitMQTT(n *natsNode) {
	c.t.Helper()
	waitFor(c.t, 30*time.Second, n.name+"'s MQTT listener", func() (bool, error) {
		if !n.p.alive() {
			c.t.Fatalf("%s exited: %v\n%s", n.name, n.p.exitError(), n.p.tail(20))
		}
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", n.mqtt), time.Second)
		if err != nil {
			return false, err
		}
		conn.Close()
		return true, nil
	})
}

func (n *natsNode) url() string { return fmt.Sprintf("ssl://127.0.0.1:%d", n.mqtt) }

// TestNATSClusterNodeKilled: the federation runs over a three-node NATS
// cluster configured by the shipped deploy/nats files (mutual TLS, the
// per-site users of users.sh, MQTT state in JetStream with three
// replicas). The aggregator connects to nats-1; the six sites are spread
// over the three nodes (each lists its own node first, the others for
// fail-over). nats-2 is killed with SIGKILL mid-round and restarted on its
// JetStream directory. The run completes, every receipted update is in the
// round log, and every site's z equals the aggregator's. Then the ACL is
// probed as TestMosquittoACLDenials probes Mosquitto's.
func TestNATSClusterNodeKilled(t *testing.T) {
	const (
		sites  = 6
		rounds = 8
	)
	dir := t.TempDir()
	federation := "natsfed"
	pk := filepath.Join(dir, "pki")
	ids := siteIDs(sites)
	if out, err := exec.Command(aggBin, "pki", "--dir", pk, "--clients", strings.Join(ids, ","), "--hosts", "127.0.0.1").CombinedOutput(); err != nil {
		t.Fatalf("broker-agg pki: %v\n%s", err, out)
	}
	nc := newNATSCluster(t, dir, federation, pk, ids)
	tlsOf := func(id string) kv {
		return kv{{"tls_ca", filepath.Join(pk, "ca.crt")}, {"tls_cert", filepath.Join(pk, "clients", id+".crt")}, {"tls_key", filepath.Join(pk, "clients", id+".key")}}
	}
	agg := newAggregator(t, dir, aggDefaults(federation).with(kv{
		{"broker", nc.nodes[0].url()}, {"per_round", fmt.Sprint(sites)}, {"rounds", fmt.Sprint(rounds)},
		{"max_epochs", "0"}, {"max_seconds", "0.3"}, {"round_timeout", "5s"}, {"extension", "5s"},
	}).with(tlsOf("aggregator")))
	var edges []*edge
	for i, id := range ids {
		var urls []string
		for j := range 3 {
			urls = append(urls, nc.nodes[(i+j)%3].url())
		}
		c := agentConf(federation, strings.Join(urls, ","), id, "", i, sites, 60).with(tlsOf(id))
		c = slices.DeleteFunc(c, func(p [2]string) bool { return p[0] == "username" || p[0] == "password_file" })
		edges = append(edges, newEdge(t, dir, id, c))
	}

	// Kill nats-2 (site-2's and site-5's first node) in the middle of the
	// run, after a few updates of a round are in.
	now := agg.mustScrape()
	target := now["edgefl_aggregator_updates_accepted_total"] + float64(2*sites+3)
	at := agg.waitMetrics(60*time.Second, fmt.Sprintf("update #%v", target), func(m metrics) bool {
		return m["edgefl_aggregator_updates_accepted_total"] >= target
	})
	if at["edgefl_aggregator_finished"] == 1 {
		t.Fatal("finished before the node was killed")
	}
	killed := nc.nodes[1]
	killed.p.kill()
	t.Logf("killed %s after update #%v (round %d, phase %s)", killed.name, target, at.round(), at.phase())
	// Work flows on through the other two nodes while nats-2 is down.
	down := time.Now()
	waitFor(t, 60*time.Second, "an update accepted with nats-2 down", func() (bool, error) {
		for _, l := range agg.lines(msgIs("update accepted")) {
			if l.at.After(down) {
				return true, nil
			}
		}
		return false, nil
	})
	nc.start(killed)
	nc.waitMQTT(killed)

	agg.waitFinished(120 * time.Second)
	for _, e := range edges {
		waitFor(t, 30*time.Second, e.id+"'s last receipt", func() (bool, error) {
			return len(e.lines(msgIs("update receipted", "round", rounds))) > 0, nil
		})
	}
	stopFederation(t, agg, edges...)
	probeNATSACL(t, nc, pk, federation)

	st := readAggState(t, agg.state)
	if st.phase != "finished" || st.coordRnd != rounds || !allFinite(st.final) {
		t.Fatalf("aggregator state: phase %s round %d", st.phase, st.coordRnd)
	}
	for r := uint64(1); r <= rounds; r++ {
		if got := st.contributors(r); len(got) == 0 {
			t.Errorf("round %d: no stored updates", r)
		} else if len(got) < sites {
			t.Logf("round %d: stored updates from %v", r, got)
		}
	}
	receipted := 0
	for _, e := range edges {
		for _, l := range e.lines(msgIs("update receipted")) {
			r := uint64(l.num("round"))
			if _, ok := st.updates[r][e.id]; !ok {
				t.Errorf("%s's update of round %d was receipted but is not in the round log", e.id, r)
			}
			receipted++
		}
		checkSiteCopy(t, e, st, rounds)
	}
	moved := 0
	for _, i := range []int{1, 4} { // site-2 and site-5 start on nats-2
		if n := len(edges[i].lines(msgIs("connected"))); n >= 2 {
			moved++
		}
	}
	if moved == 0 {
		t.Errorf("neither site on nats-2 connected again after its node was killed")
	}
	t.Logf("%d receipted updates, all in the round log; deadline extensions %d", receipted, st.extended)
}

// probeNATSACL checks what the users of deploy/nats/users.sh may do, the
// probes of TestMosquittoACLDenials and the embedded broker's ACL tests:
// a site cannot subscribe to another site's receipts, nor to everything,
// nor read the nodes' own delivery subjects; a publish on another site's
// update topic and a will on another site's status never reach the
// aggregator.
func probeNATSACL(t *testing.T, nc *natsCluster, pk, federation string) {
	t.Helper()
	prefix := "edgefl/" + federation + "/"
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(filepath.Join(pk, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(ca)
	var mu sync.Mutex
	got := map[string][]string{}
	connect := func(id, clientID, url, will string) mqtt.Client {
		cert, err := tls.LoadX509KeyPair(filepath.Join(pk, "clients", id+".crt"), filepath.Join(pk, "clients", id+".key"))
		if err != nil {
			t.Fatal(err)
		}
		o := mqtt.NewClientOptions().AddBroker(url).SetClientID(clientID).SetCleanSession(true).
			SetConnectTimeout(10 * time.Second).SetAutoReconnect(false).
			SetTLSConfig(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}).
			SetDefaultPublishHandler(func(_ mqtt.Client, m mqtt.Message) {
				mu.Lock()
				got[clientID] = append(got[clientID], m.Topic()+" "+string(m.Payload()))
				mu.Unlock()
			})
		if will != "" {
			o.SetWill(will, "forged will", 1, false)
		}
		c := mqtt.NewClient(o)
		if tok := c.Connect(); !tok.WaitTimeout(15*time.Second) || tok.Error() != nil {
			t.Fatalf("%s connect: %v", clientID, tok.Error())
		}
		return c
	}
	subscribe := func(c mqtt.Client, who, filter string) byte {
		tok := c.Subscribe(filter, 1, nil)
		if !tok.WaitTimeout(15*time.Second) || tok.Error() != nil {
			t.Fatalf("%s subscribe %s: %v", who, filter, tok.Error())
		}
		return tok.(*mqtt.SubscribeToken).Result()[filter]
	}
	// The watcher is the aggregator's identity (every topic of the
	// federation) under another client id, on the node the sites' probes
	// do not use.
	watch := connect("aggregator", "aggregator-probe", nc.nodes[0].url(), "")
	defer watch.Disconnect(100)
	for _, f := range []string{prefix + "updates/+", prefix + "clients/+/status", prefix + "receipts/+"} {
		if code := subscribe(watch, "the aggregator's identity", f); code >= 0x80 {
			t.Fatalf("the aggregator's identity was refused %s (code %#x)", f, code)
		}
	}
	spy := connect("site-1", "site-1-probe", nc.nodes[2].url(), "")
	defer spy.Disconnect(100)
	for _, f := range []string{prefix + "receipts/site-2", prefix + "#", "#", "$MQTT/sub/#", prefix + "updates/+"} {
		if code := subscribe(spy, "site-1", f); code < 0x80 {
			t.Errorf("site-1 was granted a subscription to %s (code %#x); the ACL gives a site its own receipts only", f, code)
		}
	}
	if code := subscribe(spy, "site-1", prefix+"receipts/site-1"); code >= 0x80 {
		t.Errorf("site-1 was refused its own receipts (code %#x)", code)
	}
	// A publish on another site's update topic, and a will on another
	// site's status (the connection is then dropped so the will fires).
	if p := spy.Publish(prefix+"updates/site-2", 1, false, "forged update"); !p.WaitTimeout(10 * time.Second) {
		t.Log("the forged publish was not acknowledged")
	}
	// A will fires when its connection ends without a DISCONNECT: each
	// is sent in a raw CONNECT over TLS whose socket is then closed. The
	// will on site-1's own status must fire, or the probe proves nothing.
	cert, err := tls.LoadX509KeyPair(filepath.Join(pk, "clients", "site-1.crt"), filepath.Join(pk, "clients", "site-1.key"))
	if err != nil {
		t.Fatal(err)
	}
	tc := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	for _, w := range []struct{ id, topic string }{{"site-1-will", prefix + "clients/site-2/status"}, {"site-1-own-will", prefix + "clients/site-1/status"}} {
		if err := connectWithWillAndDrop(fmt.Sprintf("127.0.0.1:%d", nc.nodes[2].mqtt), tc, w.id, w.topic, "forged will"); err != nil {
			t.Fatalf("raw CONNECT with a will on %s: %v", w.topic, err)
		}
	}
	waitFor(t, 20*time.Second, "site-1's will on its own status at the aggregator's identity", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(got["aggregator-probe"], prefix+"clients/site-1/status forged will"), nil
	})
	if p := watch.Publish(prefix+"receipts/site-2", 1, false, "for site-2 only"); !p.WaitTimeout(10*time.Second) || p.Error() != nil {
		t.Fatalf("publish a receipt for site-2: %v", p.Error())
	}
	if p := watch.Publish(prefix+"receipts/site-1", 1, false, "for site-1"); !p.WaitTimeout(10*time.Second) || p.Error() != nil {
		t.Fatalf("publish a receipt for site-1: %v", p.Error())
	}
	// The spy's own receipt arrives: everything published before it has
	// been routed by then.
	waitFor(t, 20*time.Second, "site-1's own receipt at the probe", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(got["site-1-probe"], prefix+"receipts/site-1 for site-1"), nil
	})
	mu.Lock()
	defer mu.Unlock()
	if slices.Contains(got["site-1-probe"], prefix+"receipts/site-2 for site-2 only") {
		t.Errorf("site-1 received site-2's receipt")
	}
	if slices.Contains(got["aggregator-probe"], prefix+"updates/site-2 forged update") {
		t.Errorf("site-1's publish on site-2's update topic reached the aggregator")
	}
	if slices.Contains(got["aggregator-probe"], prefix+"clients/site-2/status forged will") {
		t.Errorf("site-1's will on site-2's status reached the aggregator")
	}
}

// connectWithWillAndDrop sends an MQTT 3.1.1 CONNECT with a QoS 1 will
// over TLS, waits for the CONNACK and closes the socket without a
// DISCONNECT, so the broker publishes the will if it accepted it.
func connectWithWillAndDrop(addr string, tc *tls.Config, clientID, willTopic, will string) error {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, tc)
	if err != nil {
		return err
	}
	defer conn.Close()
	str := func(s string) []byte { return append([]byte{byte(len(s) >> 8), byte(len(s))}, s...) }
	body := append(str("MQTT"), 4, 0x02|0x04|0x08, 0, 30) // level 4; clean session, will, will QoS 1; keep-alive 30 s
	body = append(body, str(clientID)...)
	body = append(body, str(willTopic)...)
	body = append(body, str(will)...)
	pkt := []byte{0x10}
	for n := len(body); ; {
		b := byte(n % 128)
		if n /= 128; n > 0 {
			b |= 0x80
		}
		pkt = append(pkt, b)
		if n == 0 {
			break
		}
	}
	if _, err := conn.Write(append(pkt, body...)); err != nil {
		return err
	}
	if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	ack := make([]byte, 4)
	if _, err := io.ReadFull(conn, ack); err != nil {
		return fmt.Errorf("no CONNACK: %w", err)
	}
	if ack[0] != 0x20 || ack[3] != 0 {
		return fmt.Errorf("CONNACK % x", ack)
	}
	return nil
}

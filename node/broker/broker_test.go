package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/proto/pki"
	"github.com/edgefl/edgefl/testkit"
)

const (
	prefix  = "edgefl/fed1/"
	waitFor = 20 * time.Second
	testIt  = 1000 // PBKDF2 iterations in tests
)

func TestPasswordHash(t *testing.T) {
	h, err := HashPassword("s3cret", testIt)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(h, "$7$1000$") {
		t.Fatalf("hash %q", h)
	}
	for _, tt := range []struct {
		pw   string
		want bool
	}{{"s3cret", true}, {"s3cret ", false}, {"", false}} {
		ok, err := VerifyPassword(h, tt.pw)
		if err != nil || ok != tt.want {
			t.Errorf("VerifyPassword(%q) = %v, %v; want %v", tt.pw, ok, err, tt.want)
		}
	}
	// A known Mosquitto-format vector: PBKDF2-HMAC-SHA512("password",
	// salt = 12 zero bytes, 101 iterations), computed independently with
	// Python's hashlib.pbkdf2_hmac.
	const vector = "$7$101$AAAAAAAAAAAAAAAA$" + mosquittoVectorHash
	if ok, err := VerifyPassword(vector, "password"); err != nil || !ok {
		t.Errorf("Mosquitto vector: %v %v", ok, err)
	}
}

func TestPasswordFile(t *testing.T) {
	h, _ := HashPassword("pw", testIt)
	tests := []struct {
		name    string
		content string
		want    []string // users
		wantErr string
	}{
		{"ok", "# comment\n\nsite-a:" + h + "\nsite-b:" + h + "\r\n", []string{"site-a", "site-b"}, ""},
		{"plain", "site-a:pw\n", nil, "plain-text"},
		{"legacy", "site-a:$6$c2FsdA==$aGFzaA==\n", nil, "legacy"},
		{"no colon", "site-a\n", nil, "username:hash"},
		{"bad user", "site/a:" + h + "\n", nil, "username"},
		{"dup", "a:" + h + "\na:" + h + "\n", nil, "twice"},
		{"bad iterations", "a:$7$0$AAAAAAAAAAAAAAAA$" + mosquittoVectorHash + "\n", nil, "iteration"},
		{"short salt", "a:$7$10$AAAA$" + mosquittoVectorHash + "\n", nil, "salt"},
		{"short hash", "a:$7$10$AAAAAAAAAAAAAAAA$AAAA\n", nil, "hash"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "passwd")
			testkit.WriteFile(t, p, tt.content)
			users, err := ReadPasswordFile(p)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrPasswordFile) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(users) != len(tt.want) {
				t.Fatalf("users %v", users)
			}
			for _, u := range tt.want {
				if ok, _ := VerifyPassword(users[u], "pw"); !ok {
					t.Errorf("user %s does not verify", u)
				}
			}
		})
	}
}

func TestSetPassword(t *testing.T) {
	p := filepath.Join(t.TempDir(), "passwd")
	if err := SetPassword(p, "site-a", "one", testIt); err != nil {
		t.Fatal(err)
	}
	if err := SetPassword(p, "site-b", "two", testIt); err != nil {
		t.Fatal(err)
	}
	if err := SetPassword(p, "site-a", "three", testIt); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(p)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", st.Mode().Perm())
	}
	users, err := ReadPasswordFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := VerifyPassword(users["site-a"], "three"); !ok || len(users) != 2 {
		t.Errorf("users %v", users)
	}
	if err := SetPassword(p, "bad id", "x", testIt); err == nil {
		t.Error("bad id accepted")
	}
}

// ---- live broker tests ----

type client struct {
	c    paho.Client
	lost chan error
	msgs chan paho.Message
}

type opts struct {
	id, user, pass string
	tls            *tls.Config
	will           string
}

func dial(t *testing.T, url string, o opts) (*client, error) {
	t.Helper()
	cl := &client{lost: make(chan error, 1), msgs: make(chan paho.Message, 100)}
	po := paho.NewClientOptions().AddBroker(url).SetClientID(o.id).SetCleanSession(false).
		SetProtocolVersion(4).SetAutoReconnect(false).SetConnectRetry(false).SetConnectTimeout(waitFor).
		SetConnectionLostHandler(func(_ paho.Client, err error) { cl.lost <- err }).
		SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) { cl.msgs <- m })
	if o.user != "" {
		po.SetUsername(o.user).SetPassword(o.pass)
	}
	if o.tls != nil {
		po.SetTLSConfig(o.tls)
	}
	if o.will != "" {
		po.SetWill(o.will, "bye", 1, true)
	}
	cl.c = paho.NewClient(po)
	tok := cl.c.Connect()
	if !tok.WaitTimeout(waitFor) {
		return nil, errors.New("connect timed out")
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	t.Cleanup(func() { cl.c.Disconnect(0) })
	return cl, nil
}

func mustDial(t *testing.T, url string, o opts) *client {
	t.Helper()
	c, err := dial(t, url, o)
	if err != nil {
		t.Fatalf("connect %s: %v", o.id, err)
	}
	return c
}

func (c *client) subscribe(t *testing.T, filter string) byte {
	t.Helper()
	tok := c.c.Subscribe(filter, 1, func(_ paho.Client, m paho.Message) { c.msgs <- m })
	if !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("subscribe %s: %v", filter, tok.Error())
	}
	return tok.(*paho.SubscribeToken).Result()[filter]
}

func (c *client) publish(t *testing.T, topic string, qos byte, payload string) {
	t.Helper()
	tok := c.c.Publish(topic, qos, false, payload)
	if qos == 0 && (!tok.WaitTimeout(waitFor) || tok.Error() != nil) {
		t.Fatalf("publish %s: %v", topic, tok.Error())
	}
}

// next returns the next message, failing after waitFor.
func (c *client) next(t *testing.T) paho.Message {
	t.Helper()
	select {
	case m := <-c.msgs:
		return m
	case <-time.After(waitFor):
		t.Fatal("no message")
		return nil
	}
}

func startBroker(t *testing.T, cfg Config) *Broker {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	cfg.Prefix = prefix
	cfg.Logger = testkit.Logger(t)
	b, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func passwordBroker(t *testing.T) *Broker {
	t.Helper()
	p := filepath.Join(t.TempDir(), "passwd")
	for _, u := range []string{"site-a", "site-b"} {
		if err := SetPassword(p, u, u+"-pw", testIt); err != nil {
			t.Fatal(err)
		}
	}
	return startBroker(t, Config{PasswordFile: p, Users: map[string]string{"aggregator": "agg-pw"}, Superusers: []string{"aggregator"}, MaxPacketSize: 4096})
}

func TestAuthentication(t *testing.T) {
	b := passwordBroker(t)
	tests := []struct {
		name string
		o    opts
		ok   bool
	}{
		{"site with its password", opts{id: "site-a", user: "site-a", pass: "site-a-pw"}, true},
		{"aggregator in-memory user", opts{id: "aggregator", user: "aggregator", pass: "agg-pw"}, true},
		{"no credentials", opts{id: "site-a"}, false},
		{"wrong password", opts{id: "site-a", user: "site-a", pass: "nope"}, false},
		{"unknown user", opts{id: "site-c", user: "site-c", pass: "x"}, false},
		{"another site's credentials under its id", opts{id: "site-a", user: "site-b", pass: "site-b-pw"}, false},
		{"own credentials, other client id", opts{id: "site-b", user: "site-a", pass: "site-a-pw"}, false},
		{"will on another site's status", opts{id: "site-a", user: "site-a", pass: "site-a-pw", will: prefix + "clients/site-b/status"}, false},
		{"will on own status", opts{id: "site-a", user: "site-a", pass: "site-a-pw", will: prefix + "clients/site-a/status"}, true},
	}
	before := b.Stats().AuthFailures
	fails := uint64(0)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := dial(t, b.URL(), tt.o)
			if (err == nil) != tt.ok {
				t.Fatalf("connect error %v, want ok=%v", err, tt.ok)
			}
			if c != nil {
				c.c.Disconnect(0)
			}
			if !tt.ok {
				fails++
			}
		})
	}
	if got := b.Stats().AuthFailures - before; got != fails {
		t.Errorf("auth failures counted %d, want %d", got, fails)
	}
}

// A site cannot publish to another site's update or status topic, nor to
// the round topic: the message never reaches the aggregator. Each forbidden
// publish is followed, on the same connection, by an allowed one; mochi
// handles one connection's packets in order and delivers them to a
// subscriber in order, so when the allowed marker arrives, a forwarded
// forbidden message would already have arrived.
func TestACLPublish(t *testing.T) {
	b := passwordBroker(t)
	agg := mustDial(t, b.URL(), opts{id: "aggregator", user: "aggregator", pass: "agg-pw"})
	agg.subscribe(t, prefix+"#")
	siteB := mustDial(t, b.URL(), opts{id: "site-b", user: "site-b", pass: "site-b-pw"})
	for _, topic := range []string{
		prefix + "updates/site-a",
		prefix + "clients/site-a/status",
		prefix + "round",
		prefix + "run",
		prefix + "receipts/site-b",
		prefix + "updates/site-b/extra",
		"edgefl/other/updates/site-b",
	} {
		siteB.publish(t, topic, 0, "forged")
		siteB.publish(t, prefix+"updates/site-b", 0, "marker "+topic)
		m := agg.next(t)
		if m.Topic() != prefix+"updates/site-b" || string(m.Payload()) != "marker "+topic {
			t.Fatalf("after a forbidden publish on %s the aggregator got %q on %s", topic, m.Payload(), m.Topic())
		}
	}
	// QoS 1 to a forbidden topic disconnects an MQTT 3.1.1 client.
	siteB.c.Publish(prefix+"updates/site-a", 1, false, "forged qos1")
	select {
	case <-siteB.lost:
	case <-time.After(waitFor):
		t.Fatal("a forbidden QoS 1 publish did not disconnect the client")
	}
	// The legitimate owner's publish does arrive.
	siteA := mustDial(t, b.URL(), opts{id: "site-a", user: "site-a", pass: "site-a-pw"})
	siteA.publish(t, prefix+"updates/site-a", 0, "real")
	if m := agg.next(t); string(m.Payload()) != "real" || m.Topic() != prefix+"updates/site-a" {
		t.Fatalf("aggregator got %q on %s", m.Payload(), m.Topic())
	}
	if b.Stats().ACLDenied < 8 {
		t.Errorf("ACL denials %d, want >= 8", b.Stats().ACLDenied)
	}
}

func TestACLSubscribe(t *testing.T) {
	b := passwordBroker(t)
	siteA := mustDial(t, b.URL(), opts{id: "site-a", user: "site-a", pass: "site-a-pw"})
	tests := []struct {
		filter string
		ok     bool
	}{
		{prefix + "round", true},
		{prefix + "run", true},
		{prefix + "run/x", false},
		{prefix + "receipts/site-a", true},
		{prefix + "receipts/site-b", false},
		{prefix + "receipts/+", false},
		{prefix + "updates/+", false},
		{prefix + "#", false},
		{"#", false},
		{"$SYS/#", false},
	}
	for _, tt := range tests {
		code := siteA.subscribe(t, tt.filter)
		if ok := code < 0x80; ok != tt.ok {
			t.Errorf("subscribe %s: code %#x, want ok=%v", tt.filter, code, tt.ok)
		}
	}
	agg := mustDial(t, b.URL(), opts{id: "aggregator", user: "aggregator", pass: "agg-pw"})
	for _, f := range []string{prefix + "updates/+", "$share/aggs/" + prefix + "updates/+", prefix + "#"} {
		if code := agg.subscribe(t, f); code >= 0x80 {
			t.Errorf("aggregator subscribe %s: code %#x", f, code)
		}
	}
	if code := agg.subscribe(t, "edgefl/other/#"); code < 0x80 {
		t.Error("aggregator may subscribe outside its prefix")
	}
}

// Receipts reach only their site, and a site's retained update is stored
// unretained.
func TestReceiptsAndRetain(t *testing.T) {
	b := passwordBroker(t)
	agg := mustDial(t, b.URL(), opts{id: "aggregator", user: "aggregator", pass: "agg-pw"})
	siteA := mustDial(t, b.URL(), opts{id: "site-a", user: "site-a", pass: "site-a-pw"})
	siteA.subscribe(t, prefix+"receipts/site-a")
	agg.publish(t, prefix+"receipts/site-a", 0, "r1")
	if m := siteA.next(t); string(m.Payload()) != "r1" {
		t.Fatalf("receipt %q", m.Payload())
	}
	tok := siteA.c.Publish(prefix+"updates/site-a", 1, true, "retained?")
	if !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	// mochi acknowledges a QoS 1 publish before it routes it: a second
	// publish of the same client, acknowledged, means the first has been
	// routed (one client's packets are handled in order). Without it the
	// subscription below could see the first one live (a flaky test).
	tok = siteA.c.Publish(prefix+"clients/site-a/status", 1, false, "sync")
	if !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	agg.subscribe(t, prefix+"updates/+")
	agg.publish(t, prefix+"updates/marker", 0, "marker")
	if m := agg.next(t); string(m.Payload()) != "marker" {
		t.Fatalf("a site's retained update was kept retained: got %q", m.Payload())
	}
}

func TestPacketSizeCap(t *testing.T) {
	b := passwordBroker(t) // MaxPacketSize 4096
	agg := mustDial(t, b.URL(), opts{id: "aggregator", user: "aggregator", pass: "agg-pw"})
	agg.subscribe(t, prefix+"updates/+")
	siteA := mustDial(t, b.URL(), opts{id: "site-a", user: "site-a", pass: "site-a-pw"})
	siteA.c.Publish(prefix+"updates/site-a", 0, false, strings.Repeat("x", 5000))
	select {
	case <-siteA.lost:
	case <-time.After(waitFor):
		t.Fatal("an oversized packet did not disconnect the client")
	}
	siteA = mustDial(t, b.URL(), opts{id: "site-a", user: "site-a", pass: "site-a-pw"})
	siteA.publish(t, prefix+"updates/site-a", 0, "small")
	if m := agg.next(t); string(m.Payload()) != "small" {
		t.Fatalf("got %d bytes: the oversized message went through", len(m.Payload()))
	}
}

func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	if _, err := pki.MakeSite(pki.SiteOptions{Dir: dir, Clients: []string{"aggregator", "site-a", "site-b"}}); err != nil {
		t.Fatal(err)
	}
	scfg, err := pki.ServerTLSConfig(filepath.Join(dir, pki.ServerCertFile), filepath.Join(dir, pki.ServerKeyFile), filepath.Join(dir, pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	b := startBroker(t, Config{TLS: scfg, Superusers: []string{"aggregator"}})
	if !strings.HasPrefix(b.URL(), "ssl://") {
		t.Fatalf("URL %s", b.URL())
	}
	tlsFor := func(id string) *tls.Config {
		cf, kf := pki.ClientFiles(dir, id)
		c, err := pki.ClientTLSConfig(filepath.Join(dir, pki.CACertFile), cf, kf)
		if err != nil {
			t.Fatal(err)
		}
		c.ServerName = "localhost"
		return c
	}
	agg := mustDial(t, b.URL(), opts{id: "aggregator", tls: tlsFor("aggregator")})
	agg.subscribe(t, prefix+"updates/+")
	tests := []struct {
		name string
		o    opts
		ok   bool
	}{
		{"own cert", opts{id: "site-a", tls: tlsFor("site-a")}, true},
		{"cert CN as username", opts{id: "site-a", user: "site-a", tls: tlsFor("site-a")}, true},
		{"another site's cert", opts{id: "site-a", tls: tlsFor("site-b")}, false},
		{"username differs from CN", opts{id: "site-a", user: "site-a", pass: "x", tls: tlsFor("site-b")}, false},
		{"no client cert", opts{id: "site-a", tls: func() *tls.Config { c := tlsFor("site-a"); c.Certificates = nil; return c }()}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := dial(t, b.URL(), tt.o)
			if (err == nil) != tt.ok {
				t.Fatalf("connect: %v, want ok=%v", err, tt.ok)
			}
			if c == nil {
				return
			}
			c.publish(t, prefix+"updates/site-b", 0, "forged")
			c.publish(t, prefix+"updates/site-a", 0, tt.name)
			if m := agg.next(t); string(m.Payload()) != tt.name {
				t.Fatalf("aggregator got %q on %s", m.Payload(), m.Topic())
			}
			c.c.Disconnect(0)
		})
	}
}

func TestStartBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no auth", Config{Addr: "127.0.0.1:0", Prefix: prefix}},
		{"bad prefix", Config{Addr: "127.0.0.1:0", Prefix: "edgefl/#/", AllowAnonymous: true}},
		{"no addr", Config{Prefix: prefix, AllowAnonymous: true}},
		{"missing password file", Config{Addr: "127.0.0.1:0", Prefix: prefix, PasswordFile: "/nonexistent/passwd"}},
		{"bad superuser", Config{Addr: "127.0.0.1:0", Prefix: prefix, AllowAnonymous: true, Superusers: []string{"a/b"}}},
		{"empty in-memory password", Config{Addr: "127.0.0.1:0", Prefix: prefix, Users: map[string]string{"a": ""}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := Start(tt.cfg)
			if err == nil {
				b.Close()
				t.Fatal("started")
			}
		})
	}
}

func TestAnonymousDev(t *testing.T) {
	b := startBroker(t, Config{AllowAnonymous: true, Superusers: []string{"aggregator"}})
	agg := mustDial(t, b.URL(), opts{id: "aggregator"})
	agg.subscribe(t, prefix+"updates/+")
	c := mustDial(t, b.URL(), opts{id: "site-a"})
	c.publish(t, prefix+"updates/site-b", 0, "forged")
	c.publish(t, prefix+"updates/site-a", 0, "ok")
	if m := agg.next(t); string(m.Payload()) != "ok" {
		t.Fatalf("got %q", m.Payload())
	}
}

// mosquittoVectorHash is base64(PBKDF2-HMAC-SHA512("password", 12 zero
// bytes, 101 iterations, 64 bytes)), from Python's hashlib.
const mosquittoVectorHash = "Sy+8NFTq/5ylpLX6PDLqwPRRP+miLnpi60txFtXSoh6ASWB1MDrXEcOz7mhEJcD8f8RApPO2f6ANVgva683w5w=="

// An in-process client (the aggregator) connects through Dial without a
// password; its client id is its identity and the ACL applies.
func TestDialInProcess(t *testing.T) {
	b := passwordBroker(t)
	dialer := func(id string) paho.Client {
		o := paho.NewClientOptions().AddBroker("tcp://in-process").SetClientID(id).SetProtocolVersion(4).
			SetAutoReconnect(false).SetCleanSession(false).SetConnectTimeout(waitFor).
			SetCustomOpenConnectionFn(func(*url.URL, paho.ClientOptions) (net.Conn, error) { return b.Dial() })
		c := paho.NewClient(o)
		tok := c.Connect()
		if !tok.WaitTimeout(waitFor) || tok.Error() != nil {
			t.Fatalf("in-process connect: %v", tok.Error())
		}
		return c
	}
	agg := dialer("aggregator")
	msgs := make(chan paho.Message, 10)
	tok := agg.Subscribe(prefix+"updates/+", 1, func(_ paho.Client, m paho.Message) { msgs <- m })
	if !tok.WaitTimeout(waitFor) || tok.Error() != nil || tok.(*paho.SubscribeToken).Result()[prefix+"updates/+"] >= 0x80 {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	site := mustDial(t, b.URL(), opts{id: "site-a", user: "site-a", pass: "site-a-pw"})
	site.publish(t, prefix+"updates/site-a", 0, "hello")
	select {
	case m := <-msgs:
		if string(m.Payload()) != "hello" {
			t.Fatalf("got %q", m.Payload())
		}
	case <-time.After(waitFor):
		t.Fatal("no message over the in-process connection")
	}
	// A non-superuser in-process identity is held to the site ACL.
	other := dialer("site-b")
	if tok := other.Subscribe(prefix+"updates/+", 1, nil); !tok.WaitTimeout(waitFor) || tok.(*paho.SubscribeToken).Result()[prefix+"updates/+"] < 0x80 {
		t.Error("in-process site-b may read every update")
	}
	// Close does not wait for the in-process clients.
	done := make(chan error, 1)
	go func() { done <- b.Close() }()
	select {
	case <-done:
	case <-time.After(waitFor):
		t.Fatal("Close hangs with an in-process client connected")
	}
	if _, err := b.Dial(); err == nil {
		t.Error("Dial after Close")
	}
	agg.Disconnect(0)
	other.Disconnect(0)
}

// Drain waits for the in-process client (the aggregator) to leave and for
// every connected client to acknowledge what it was sent: a site that
// holds the last announcement unacknowledged is named; once it
// acknowledges, Drain returns nil.
func TestDrain(t *testing.T) {
	b := passwordBroker(t)
	o := paho.NewClientOptions().AddBroker("tcp://in-process").SetClientID("aggregator").SetProtocolVersion(4).
		SetAutoReconnect(false).SetConnectTimeout(waitFor).
		SetCustomOpenConnectionFn(func(*url.URL, paho.ClientOptions) (net.Conn, error) { return b.Dial() })
	agg := paho.NewClient(o)
	if tok := agg.Connect(); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("in-process connect: %v", tok.Error())
	}
	got := make(chan paho.Message, 1)
	so := paho.NewClientOptions().AddBroker(b.URL()).SetClientID("site-a").SetUsername("site-a").SetPassword("site-a-pw").
		SetProtocolVersion(4).SetAutoReconnect(false).SetConnectTimeout(waitFor).SetAutoAckDisabled(true)
	site := paho.NewClient(so)
	if tok := site.Connect(); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("site connect: %v", tok.Error())
	}
	t.Cleanup(func() { site.Disconnect(0) })
	if tok := site.Subscribe(prefix+"round", 1, func(_ paho.Client, m paho.Message) { got <- m }); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	short := func() []string {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		return b.Drain(ctx)
	}
	// The aggregator is still connected: Drain waits for it.
	if w := short(); len(w) != 1 || w[0] != "aggregator" {
		t.Fatalf("Drain with the aggregator connected: %v", w)
	}
	if tok := agg.Publish(prefix+"round", 1, true, "the end"); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	agg.Disconnect(100)
	var m paho.Message
	select {
	case m = <-got:
	case <-time.After(waitFor):
		t.Fatal("the site got nothing")
	}
	if w := short(); len(w) != 1 || w[0] != "site-a" {
		t.Fatalf("Drain with the site's message unacknowledged: %v", w)
	}
	m.Ack()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if w := b.Drain(ctx); w != nil {
		t.Fatalf("Drain after the acknowledgement: %v", w)
	}
}

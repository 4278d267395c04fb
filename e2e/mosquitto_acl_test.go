package e2e

import (
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// TestMosquittoACLDenials checks what deploy/mosquitto/edgefl.acl's comments
// say Mosquitto does with what the ACL denies (they used
// to say a forbidden subscription and a will on a forbidden topic are
// refused; Mosquitto 2.0 grants and accepts them, and delivers nothing): a
// site subscribing to another site's receipts gets a granted SUBACK but no
// message; a site connecting with a last will on another site's status is
// let in, and the will is never published. A site reads the run topic.
func TestMosquittoACLDenials(t *testing.T) {
	needMosquitto(t)
	dir := t.TempDir()
	federation := "acldeny"
	pw := setPasswords(t, dir, filepath.Join(dir, "passwd"), "site-1", "site-2", "aggregator")
	m := newMosquitto(t, dir, federation)
	prefix := "edgefl/" + federation + "/"

	var mu sync.Mutex
	var got []string
	record := func(_ mqtt.Client, msg mqtt.Message) {
		mu.Lock()
		got = append(got, msg.Topic())
		mu.Unlock()
	}
	connect := func(id string, will string) mqtt.Client {
		o := mqtt.NewClientOptions().AddBroker(m.url()).SetClientID(id + "-acltest").SetUsername(id).SetPassword(pw[id]).
			SetCleanSession(true).SetConnectTimeout(5 * time.Second).SetDefaultPublishHandler(record)
		if will != "" {
			o.SetWill(will, "forged will", 1, false)
		}
		c := mqtt.NewClient(o)
		if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("%s connect (will %q): %v", id, will, tok.Error())
		}
		return c
	}
	agg := connect("aggregator", "")
	defer agg.Disconnect(100)
	if tok := agg.Subscribe(prefix+"clients/+/status", 1, record); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("aggregator subscribe: %v", tok.Error())
	}

	// A subscription to another site's receipts: granted, never fed.
	spy := connect("site-1", "")
	defer spy.Disconnect(100)
	tok := spy.Subscribe(prefix+"receipts/site-2", 1, record)
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("site-1 subscribe: %v", tok.Error())
	}
	if code := tok.(*mqtt.SubscribeToken).Result()[prefix+"receipts/site-2"]; code >= 0x80 {
		t.Fatalf("Mosquitto refused the subscription (code %#x): the ACL's comment says it grants it", code)
	}
	if p := agg.Publish(prefix+"receipts/site-2", 1, false, "for site-2 only"); !p.WaitTimeout(10*time.Second) || p.Error() != nil {
		t.Fatal(p.Error())
	}

	// The run topic (the retained run spec: the schema and transform the
	// announcements name by digest) is readable by every site.
	reader := connect("site-2", "")
	defer reader.Disconnect(100)
	if p := agg.Publish(prefix+"run", 1, true, "run spec"); !p.WaitTimeout(10*time.Second) || p.Error() != nil {
		t.Fatal(p.Error())
	}
	if tok := reader.Subscribe(prefix+"run", 1, record); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("site-2 subscribe to run: %v", tok.Error())
	}
	waitFor(t, 10*time.Second, "the retained run spec at a site", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(got, prefix+"run"), nil
	})

	// A will on another site's status: the connection is accepted; when it
	// drops, nothing is published.
	forger2 := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(m.url()).SetClientID("site-1-forger").SetUsername("site-1").
		SetPassword(pw["site-1"]).SetCleanSession(true).SetWill(prefix+"clients/site-2/status", "forged will", 1, false).
		SetKeepAlive(1 * time.Second).SetPingTimeout(500 * time.Millisecond))
	if tok := forger2.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("a will on another site's topic was refused at connect: %v", tok.Error())
	}
	// Take the client id over: Mosquitto closes the old connection
	// without a DISCONNECT, which is when a will is sent.
	takeover := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(m.url()).SetClientID("site-1-forger").SetUsername("site-1").
		SetPassword(pw["site-1"]).SetCleanSession(true))
	if tok := takeover.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("takeover connect: %v", tok.Error())
	}
	defer takeover.Disconnect(100)
	m.p.waitLine(10*time.Second, "Mosquitto closing the taken-over connection", func(l logLine) bool {
		return strings.Contains(l.raw, "site-1-forger") && strings.Contains(l.raw, "already connected")
	})
	// A marker after both: once it arrives, anything sent before it has too.
	if p := agg.Publish(prefix+"clients/marker/status", 1, false, "marker"); !p.WaitTimeout(10*time.Second) || p.Error() != nil {
		t.Fatal(p.Error())
	}
	waitFor(t, 10*time.Second, "the marker", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, g := range got {
			if g == prefix+"clients/marker/status" {
				return true, nil
			}
		}
		return false, nil
	})
	mu.Lock()
	defer mu.Unlock()
	for _, g := range got {
		if g == prefix+"receipts/site-2" || g == prefix+"clients/site-2/status" {
			t.Errorf("denied by the ACL, but delivered: %s (all: %v)", g, got)
		}
	}
}

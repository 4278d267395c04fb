package broker

import (
	"fmt"
	"path/filepath"
	"sort"
	"testing"
	"time"
)

// A site offline with a persistent session: the broker holds at most
// SiteQueue of the QoS 1 messages sent to it (counted in its in-flight
// store), forgets the oldest (counted), and delivers the newest when the
// site is back. The aggregator is not bounded.
func TestSiteQueueBounded(t *testing.T) {
	const (
		queue = 5
		sent  = 20
	)
	p := filepath.Join(t.TempDir(), "passwd")
	if err := SetPassword(p, "site-a", "site-a-pw", testIt); err != nil {
		t.Fatal(err)
	}
	b := startBroker(t, Config{PasswordFile: p, Users: map[string]string{"aggregator": "agg-pw", "injector": "inj-pw"},
		Superusers: []string{"aggregator", "injector"}, SiteQueue: queue})
	site := mustDial(t, b.URL(), opts{id: "site-a", user: "site-a", pass: "site-a-pw"})
	site.subscribe(t, prefix+"receipts/site-a")
	site.c.Disconnect(100)

	// The aggregator, offline too, with the same subscription; another
	// superuser publishes.
	agg := mustDial(t, b.URL(), opts{id: "aggregator", user: "aggregator", pass: "agg-pw"})
	agg.subscribe(t, prefix+"receipts/site-a")
	agg.c.Disconnect(100)
	pub := mustDial(t, b.URL(), opts{id: "injector", user: "injector", pass: "inj-pw"})
	for i := range sent {
		tok := pub.c.Publish(prefix+"receipts/site-a", 1, false, fmt.Sprintf("r %02d", i))
		if !tok.WaitTimeout(waitFor) || tok.Error() != nil {
			t.Fatalf("publish %d: %v", i, tok.Error())
		}
	}
	// mochi acknowledges a QoS 1 publish before it routes it, and handles
	// one connection's packets in order: once a further publish is
	// acknowledged, every receipt has been routed.
	if tok := pub.c.Publish(prefix+"round", 1, false, "sync"); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
		t.Fatalf("sync publish: %v", tok.Error())
	}
	cl, ok := b.srv.Clients.Get("site-a")
	if !ok {
		t.Fatal("site-a's session is gone")
	}
	if n := cl.State.Inflight.Len(); n != queue {
		t.Errorf("the broker holds %d messages for the offline site, want %d", n, queue)
	}
	if n := b.Forgotten()["site-a"]; n != sent-queue {
		t.Errorf("forgot %d, want %d", n, sent-queue)
	}
	if a, ok := b.srv.Clients.Get("aggregator"); !ok || a.State.Inflight.Len() != sent || b.Forgotten()["aggregator"] != 0 {
		t.Errorf("the aggregator's held messages were bounded (forgot %d)", b.Forgotten()["aggregator"])
	}

	site = mustDial(t, b.URL(), opts{id: "site-a", user: "site-a", pass: "site-a-pw"})
	var got []string
	for range queue {
		got = append(got, string(site.next(t).Payload()))
	}
	sort.Strings(got)
	want := []string{"r 15", "r 16", "r 17", "r 18", "r 19"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the site got %v after reconnecting, want the newest %v", got, want)
	}
	select {
	case m := <-site.msgs:
		t.Errorf("an extra message %q", m.Payload())
	case <-time.After(100 * time.Millisecond):
	}
}

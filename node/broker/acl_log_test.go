package broker

import (
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/internal/ratelimit"
)

// A site publishing to a forbidden topic in a loop gets every publish
// denied and counted, but its log lines are bounded: aclLogBurst at once,
// then one per aclLogEvery that says how many were suppressed.
func TestACLDenialsLogBounded(t *testing.T) {
	b, fake, logs := limitedBroker(t, ratelimit.Limits{Messages: 1e6, Burst: 1e6})
	c, err := dial(t, b.URL(), opts{id: "site-a", user: "site-a", pass: "site-a-pw"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.c.Disconnect(0)
	const n = 200
	for i := 0; i < n; i++ {
		c.publish(t, prefix+"updates/site-b", 0, "forged") // another site's topic
	}
	// QoS 0 publishes carry no acknowledgement: a publish the broker has
	// read is one counted, so wait for the count.
	deadline := time.Now().Add(waitFor)
	for b.Stats().ACLDenied < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d publishes denied", b.Stats().ACLDenied, n)
		}
		time.Sleep(time.Millisecond)
	}
	lines := func() []string {
		var out []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "denied by ACL") {
				out = append(out, l)
			}
		}
		return out
	}
	if got := lines(); len(got) != aclLogBurst {
		t.Fatalf("%d ACL denial lines for %d denials on a frozen clock, want %d:\n%s", len(got), n, aclLogBurst, strings.Join(got, "\n"))
	}
	fake.Advance(aclLogEvery)
	c.publish(t, prefix+"updates/site-b", 0, "forged")
	deadline = time.Now().Add(waitFor)
	for len(lines()) < aclLogBurst+1 {
		if time.Now().After(deadline) {
			t.Fatalf("no line after %v: %d lines", aclLogEvery, len(lines()))
		}
		time.Sleep(time.Millisecond)
	}
	got := lines()
	if last := got[len(got)-1]; !strings.Contains(last, `"suppressed":195`) {
		t.Errorf("the line after the pause does not count the %d suppressed denials: %s", n-aclLogBurst, last)
	}
	// A denial is counted after its line is written (OnACLCheck): wait
	// for the count, then check that it is exactly one more.
	deadline = time.Now().Add(waitFor)
	for b.Stats().ACLDenied < n+1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if d := b.Stats().ACLDenied; d != n+1 {
		t.Errorf("ACLDenied %d, want %d: every denial is counted", d, n+1)
	}
}

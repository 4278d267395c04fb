package aggregator

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/proto/wire"
)

// A site over its rate limit: messages past the burst are dropped and
// counted for that site only, before anything is decoded; the bucket
// refills with the (injected) clock; another site is not affected, and a
// duplicate of a receipted update is answered from memory.
func TestIngestRateLimitPerSite(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.K = 2
	cfg.RateMessages, cfg.RateBurst = 1, 5
	r := f.start(cfg)
	a, b := f.agent("site-a", 10), f.agent("site-b", 10)
	a.nextRound(t, 1)
	limited := func(id string) uint64 { return r.s.rateLimited.Snapshot()[id] }

	// site-a's connection already spent part of its burst (its online
	// status); the rest of the burst passes, then everything is dropped.
	a.send(t, update(t, "site-a", 1, vec(1), 10))
	wantReceipt(t, a.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	for range 20 {
		a.send(t, update(t, "site-a", 1, vec(1), 10))
	}
	// Each copy is either dropped or, as a duplicate, answered from memory.
	v := waitView(t, r.s, "all 20 copies handled", func(v ServerView) bool {
		return limited("site-a")+v.Rejected["duplicate"] == 20
	})
	if limited("site-a") < 15 {
		t.Fatalf("only %d of 20 copies past a burst of 5 were limited", limited("site-a"))
	}
	for range v.Rejected["duplicate"] {
		wantReceipt(t, a.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_DUPLICATE)
	}
	if n := limited("site-b"); n != 0 {
		t.Fatalf("site-b limited %d times by site-a's flood", n)
	}
	// site-b is unaffected; after a second site-a has one token again.
	b.send(t, update(t, "site-b", 1, vec(3), 10))
	wantReceipt(t, b.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	before := limited("site-a")
	f.clock.Advance(time.Second)
	a.send(t, update(t, "site-a", 1, vec(1), 10))
	wantReceipt(t, a.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_DUPLICATE)
	if limited("site-a") != before {
		t.Fatalf("site-a still limited after its bucket refilled")
	}
	rec := httptest.NewRecorder()
	r.s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if want := `edgefl_aggregator_rate_limited_total{client="site-a"}`; !strings.Contains(rec.Body.String(), want) {
		t.Fatalf("/metrics lacks %s", want)
	}
}

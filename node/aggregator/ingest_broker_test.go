package aggregator

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// The embedded broker's drops (ServerConfig.BrokerRateLimited) show in
// /metrics and in the site's row of the status, also for a site the
// aggregator has never heard from (its every message was dropped).
func TestBrokerRateLimitedShown(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.K = 1
	cfg.BrokerRateLimited = func() map[string]uint64 { return map[string]uint64{"site-a": 7, "flooder": 12345} }
	r := f.start(cfg)
	a := f.agent("site-a", 10)
	a.nextRound(t, 1)
	rec := httptest.NewRecorder()
	r.s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{`edgefl_broker_rate_limited_total{client="flooder"} 12345`, `edgefl_broker_rate_limited_total{client="site-a"} 7`,
		"# TYPE edgefl_broker_rate_limited_total counter"} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	st, err := r.s.LiveStatus(-1, -1)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, c := range st.Clients {
		got[c.ID] = c.Rejections[brokerRateLimitedReason]
	}
	if got["site-a"] != 7 || got["flooder"] != 12345 {
		t.Errorf("the sites' rows show broker drops %v", got)
	}
}

// The embedded broker's undelivered messages (ServerConfig.BrokerDropped:
// a status or an update that never reached the aggregator) show in
// /metrics by reason.
func TestBrokerDroppedShown(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.BrokerDropped = func() map[string]uint64 { return map[string]uint64{"inflight_full": 803, "write_queue_full": 0} }
	r := f.start(cfg)
	rec := httptest.NewRecorder()
	r.s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{`edgefl_broker_dropped_total{reason="inflight_full"} 803`, `edgefl_broker_dropped_total{reason="write_queue_full"} 0`,
		"# TYPE edgefl_broker_dropped_total counter"} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// Without the embedded broker (an external one), there is no such family.
func TestBrokerRateLimitedAbsent(t *testing.T) {
	f := newFixture(t)
	r := f.start(f.config())
	rec := httptest.NewRecorder()
	r.s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if strings.Contains(rec.Body.String(), "edgefl_broker_") {
		t.Error("/metrics shows broker metrics without an embedded broker")
	}
}

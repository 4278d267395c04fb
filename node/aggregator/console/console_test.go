package console

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var ok = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("fine")) })

// A login is verified once and remembered; a wrong one is refused with a
// challenge; /healthz needs none.
func TestBasicAuth(t *testing.T) {
	var checks atomic.Int32
	h := BasicAuth(ok, func(user, pw string) bool { checks.Add(1); return user == "operator" && pw == "s3cret" }, time.Now)
	do := func(path, user, pw string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", path, nil)
		if user != "" {
			req.SetBasicAuth(user, pw)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	if rec := do("/status", "", ""); rec.Code != 401 || !strings.Contains(rec.Header().Get("WWW-Authenticate"), "Basic") {
		t.Fatalf("no credentials: %d %v", rec.Code, rec.Header())
	}
	if rec := do("/status", "operator", "wrong"); rec.Code != 401 {
		t.Fatalf("wrong password: %d", rec.Code)
	}
	if rec := do("/healthz", "", ""); rec.Code != 200 {
		t.Fatalf("/healthz: %d", rec.Code)
	}
	for range 5 {
		if rec := do("/", "operator", "s3cret"); rec.Code != 200 {
			t.Fatalf("good login: %d", rec.Code)
		}
	}
	if n := checks.Load(); n != 2 {
		t.Errorf("%d verifications, want 2 (the wrong one, then the good one once)", n)
	}
}

// Only the named certificates are let in; a request without a verified
// certificate is refused.
func TestClientNames(t *testing.T) {
	h := ClientNames(ok, []string{"operator"})
	do := func(cn string) int {
		req := httptest.NewRequest("GET", "/", nil)
		if cn != "" {
			req.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{{Subject: pkix.Name{CommonName: cn}}}}}
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	if c := do("operator"); c != 200 {
		t.Errorf("operator: %d", c)
	}
	if c := do("site-a"); c != 403 {
		t.Errorf("a site's certificate: %d", c)
	}
	if c := do(""); c != 403 {
		t.Errorf("no certificate: %d", c)
	}
}

// The page escapes what it shows (a site id or error is text, never
// markup), and embeds the status as inert JSON.
func TestPageEscapes(t *testing.T) {
	type status struct {
		Federation, Phase, Algorithm, Aggregator, Codec, Downlink, RunID, Schema, StopReason string
		Round, FedSplitDiverging, FedSplitNonFinite                                          int
		RoundOpenedAt, Deadline                                                              *time.Time
		Live, Model, FinalBundle, Privacy, Broker, StatisticsOverdue                         *struct{}
		Refused                                                                              []struct{}
		Clients                                                                              []struct{}
		// A finding quotes a level a site sent.
		StatisticsReview *struct {
			Findings []string
			Stopped  bool
		}
	}
	h := Handler(func() (any, error) {
		st := status{Federation: "</script><b>x</b>", Phase: "collecting", Round: 3}
		st.StatisticsReview = &struct {
			Findings []string
			Stopped  bool
		}{Findings: []string{`feature "k": levels seen only at site a: "<b>x</b>"`}, Stopped: true}
		return st, nil
	}, time.Now)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	body := rec.Body.String()
	if rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, body)
	}
	if strings.Contains(body, "<b>x</b>") || strings.Count(body, "</script>") != 2 {
		t.Errorf("markup from the status reached the page:\n%s", body)
	}
}

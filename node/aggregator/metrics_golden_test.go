package aggregator

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/edgefl/edgefl/proto/wire"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/metrics.golden from the running code")

// metricsGolden is the whole /metrics body of the state TestMetricsGolden
// drives, in the Prometheus text format: every family's HELP and TYPE, every
// sample, in order. A change to a metric's name, help, type, labels or
// order shows up as a diff of this file; regenerate it with
//
//	go test ./node/aggregator/ -run TestMetricsGolden -update
//
// and read the diff before committing (node_exporter's collector fixtures
// are checked the same way).
const metricsGolden = "testdata/metrics.golden"

// What is normalised, deliberately and only there:
//   - how long the aggregation took (aggregation_seconds_sum,
//     aggregation_last_seconds) is wall time read in the shell: replaced
//     by WALL_TIME;
//   - the status messages received (received_messages_total and
//     received_bytes_total of kind "status"): statuses are QoS 1, delivered
//     at least once, and the broker does deliver one twice now and then
//     (seen under -race about once in 20 runs): replaced by AT_LEAST_ONCE.
//     The site errors and clients those statuses set are compared.
//
// Everything else, the round deadline included, comes from the
// fake clock and the messages the test sends, and is compared as it is.
var (
	wallTime    = regexp.MustCompile(`(?m)^(edgefl_aggregator_aggregation_(?:seconds_sum|last_seconds)) \S+$`)
	atLeastOnce = regexp.MustCompile(`(?m)^(edgefl_aggregator_received_(?:messages|bytes)_total\{kind="status"\}) \S+$`)
)

func normaliseMetrics(body []byte) []byte {
	body = wallTime.ReplaceAll(body, []byte("$1 WALL_TIME"))
	return atLeastOnce.ReplaceAll(body, []byte("$1 AT_LEAST_ONCE"))
}

// TestMetricsGolden drives a small deterministic federation (FedAvg, two
// sites, the fake clock): round 1 aggregated from both, then in round 2
// one update accepted, one rejected for its dimension, a duplicate of round
// 1 and a site error in a status; /metrics is then compared with testdata/metrics.golden byte for
// byte (after normaliseMetrics).
func TestMetricsGolden(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.K = 2
	r := f.start(cfg)
	a, b := f.agent("site-a", 10), f.agent("site-b", 30)
	a.nextRound(t, 1)
	a.send(t, update(t, "site-a", 1, vec(1), 10))
	wantReceipt(t, a.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	b.send(t, update(t, "site-b", 1, vec(5), 30))
	wantReceipt(t, b.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	r.round(t)
	a.nextRound(t, 2)
	a.send(t, update(t, "site-a", 2, vec(2), 10))
	wantReceipt(t, a.receipt(t), 2, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	b.send(t, update(t, "site-b", 2, []float64{1, 2, 3}, 30))
	wantReceipt(t, b.receipt(t), 2, false, wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE)
	b.send(t, update(t, "site-b", 1, vec(5), 30))
	wantReceipt(t, b.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_DUPLICATE)
	// site-b then reports a site error (a newer connection's status).
	topic, _ := b.topics.Status("site-b")
	st, err := wire.Encode(&wire.ClientStatus{ClientId: "site-b", Online: true, SampleCount: 30, Connection: 1,
		ErrorReason: wire.SiteErrBadValue, ErrorMessage: `b.csv: line 7, column "age": expected a number`})
	if err != nil {
		t.Fatal(err)
	}
	b.pub(t, topic, true, st)
	waitView(t, r.s, "round 2 with one update, two rejections, a site error", func(v ServerView) bool {
		return v.Round == 2 && len(v.Received) == 1 && v.Rejected["wrong_dimension"] == 1 && v.Rejected["duplicate"] == 1 &&
			v.SiteErrors["site-b/bad_value"] == 1
	})

	got := normaliseMetrics([]byte(metricsText(t, r.s)))
	if *updateGolden {
		if err := os.WriteFile(metricsGolden, got, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", metricsGolden)
		return
	}
	want, err := os.ReadFile(metricsGolden)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if !bytes.Equal(got, want) {
		out := filepath.Join(t.TempDir(), "metrics.got")
		if err := os.WriteFile(out, got, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Errorf("/metrics differs from %s; got (also in %s):\n%s\nrun `diff %s %s`, and regenerate with -update if the change is meant",
			metricsGolden, out, got, metricsGolden, out)
	}
}

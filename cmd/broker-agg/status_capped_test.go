package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/node/aggregator"
)

// `status` names the sites whose updates were weighted below the sample
// count they reported (FedAvg's cap), and says nothing when there are none.
func TestPrintStatusSamplesCapped(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name      string
		clients   []aggregator.ClientInfo
		want, not string
	}{
		{"a liar", []aggregator.ClientInfo{{ID: "site-1"}, {ID: "site-4", SamplesCapped: 12}},
			"sample counts capped (updates weighted below the count they reported): site-4 12", "site-1 0"},
		{"none", []aggregator.ClientInfo{{ID: "site-1"}}, "site-1", "sample counts capped"},
	} {
		st := aggregator.Status{Federation: "f", Phase: aggregator.PhaseCollecting, Round: 3, Clients: tc.clients,
			Live: &aggregator.LiveStatus{Now: at}}
		var b bytes.Buffer
		if err := printStatus(&b, st, at); err != nil {
			t.Fatal(err)
		}
		if out := b.String(); !strings.Contains(out, tc.want) || strings.Contains(out, tc.not) {
			t.Errorf("%s: want %q and not %q in:\n%s", tc.name, tc.want, tc.not, out)
		}
	}
}

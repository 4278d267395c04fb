package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/aggregator"
)

// `status` lists a site used by a second installation, with the holder and
// the installation set aside.
func TestPrintStatusDuplicateInstances(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	st := aggregator.Status{Federation: "f", Phase: aggregator.PhaseCollecting, Round: 3,
		DuplicateInstances: []aggregator.DuplicateInstance{{Site: "site-a", Instance: "INSTA",
			Others: []aggregator.OtherInstance{{ID: "INSTB", LastSeen: at}}, SetAside: 7}}}
	var b bytes.Buffer
	if err := printStatus(&b, st, at); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"second installations with one site id",
		"site-a: held by instance INSTA; set aside: INSTB (last seen 2026-03-01T12:00:00Z), 7 messages"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status output lacks %q:\n%s", want, b.String())
		}
	}
}

// `status` says whether a central-DP run's round timing is covered
// (--dp-fixed-rounds); the distributed mode, whose selection is public,
// says nothing of it.
func TestPrintStatusRoundTiming(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		p         aggregator.PrivacyStatus
		want, not string
	}{
		{aggregator.PrivacyStatus{Mode: "central", FixedRounds: true, Amplified: true}, "rounds close at their deadline (--dp-fixed-rounds)", "not covered"},
		{aggregator.PrivacyStatus{Mode: "central", FixedRounds: true, Amplified: true}, "epsilon amplified by Poisson sampling", "q = 1"},
		{aggregator.PrivacyStatus{Mode: "central"}, "(--dp-fixed-rounds=false): their timing tells the draw's size", "close at their deadline"},
		{aggregator.PrivacyStatus{Mode: "central"}, "epsilon charged at q = 1 every round (no amplification)", "amplified by"},
		{aggregator.PrivacyStatus{Mode: "distributed"}, "differential privacy (distributed)", "timing"},
		{aggregator.PrivacyStatus{Mode: "distributed"}, "charged at q = 1", "amplified by"},
	} {
		st := aggregator.Status{Federation: "f", Phase: aggregator.PhaseCollecting, Round: 3, Privacy: &tc.p}
		var b bytes.Buffer
		if err := printStatus(&b, st, at); err != nil {
			t.Fatal(err)
		}
		if out := b.String(); !strings.Contains(out, tc.want) || strings.Contains(out, tc.not) {
			t.Errorf("%s mode, fixed %v: want %q and not %q in:\n%s", tc.p.Mode, tc.p.FixedRounds, tc.want, tc.not, out)
		}
	}
}

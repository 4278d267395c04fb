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
		{aggregator.PrivacyStatus{Mode: "central", FixedRounds: true}, "rounds close at their deadline (--dp-fixed-rounds)", "not covered"},
		{aggregator.PrivacyStatus{Mode: "central"}, "round timing not covered", "close at their deadline"},
		{aggregator.PrivacyStatus{Mode: "distributed"}, "differential privacy (distributed)", "timing"},
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

// `status` lists the statistics review's findings, and says when the run
// stopped before round 1 for them (--stats-review).
func TestPrintStatusStatisticsReview(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	finding := `feature "chol": per-site ranges disagree (site switzerland's mean lies outside site cleveland's range): cleveland [131, 564], switzerland [0, 0]`
	for _, stopped := range []bool{false, true} {
		st := aggregator.Status{Federation: "f", Phase: aggregator.PhaseFitting, Round: 1, Schema: "abc",
			StatisticsSites:  []string{"cleveland", "switzerland"},
			StatisticsReview: &aggregator.StatsReview{Findings: []string{finding}, Stopped: stopped}}
		var b bytes.Buffer
		if err := printStatus(&b, st, at); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		if !strings.Contains(out, "statistics review: 1 findings") || !strings.Contains(out, "  "+finding+"\n") ||
			strings.Contains(out, "--stats-review") != stopped {
			t.Errorf("stopped %v: status output:\n%s", stopped, out)
		}
	}
}

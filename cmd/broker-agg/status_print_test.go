package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/learn/evaluate"
	"github.com/edgefl/edgefl/node/aggregator"
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

// `status` explains every absent site (a roster site never connected, one
// refused by the broker, an identity that is not a site, the statistics
// phase past its deadline, the aggregator's own refused connection) and
// puts the balanced accuracy and the majority-class baseline next to each
// accuracy, marking a model that does not beat it.
func TestPrintStatusAbsentSitesAndBaselines(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ev := func(c [][]int64) evaluate.Report {
		r := evaluate.Report{N: 0, Confusion: c}
		for t, row := range c {
			for p, n := range row {
				r.N += n
				if t == p {
					r.Accuracy += float64(n)
				}
			}
		}
		r.Accuracy /= float64(r.N)
		return r
	}
	st := aggregator.Status{Federation: "f", Phase: aggregator.PhaseStatistics, Schema: "abc",
		Clients: []aggregator.ClientInfo{
			{ID: "site-a", Online: true, Expected: true},
			{ID: "site-b", Expected: true, NeverConnected: true, LastRefusal: &aggregator.SiteRefusal{ID: "site-b", Reason: "client certificate expired or not yet valid", At: at.Add(-time.Minute), Count: 3}},
			{ID: "site-c", Expected: true, NeverConnected: true},
			{ID: "site-d", Online: true, NotInPreprocessing: true},
		},
		Refused:           []aggregator.SiteRefusal{{ID: "stranger", Reason: "identity not on the roster (--sites)", At: at, Count: 1}},
		Broker:            &aggregator.BrokerStatus{URL: "ssl://mq:8883", LastError: "not Authorized", ConnectFailures: 4},
		StatisticsOverdue: &aggregator.StatisticsOverdue{Deadline: at.Add(-7 * time.Second), Quorum: 3, Received: []string{"site-a"}, Missing: []aggregator.MissingSite{{ID: "site-b", Why: "refused by the broker: expired"}}},
		Evaluation: &aggregator.EvalStatus{Round: 2, Federation: ev([][]int64{{0, 22}, {0, 78}}),
			Sites: map[string]evaluate.Report{"site-a": ev([][]int64{{0, 22}, {0, 78}})}},
	}
	var b bytes.Buffer
	if err := printStatus(&b, st, at); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, re := range []string{
		`site-b\s+never connected`, `site-c\s+never connected`,
		`the aggregator is NOT connected to the broker ssl://mq:8883: not Authorized \(4 failed attempts\); the sites' liveness is unknown`,
		`site-b: client certificate expired or not yet valid \(1m0s ago, 3 times\)`,
		`stranger \(not a site\): identity not on the roster`,
		`statistics phase past its deadline \(7s ago\) below quorum: 1 of 3 sites sent theirs; missing:\n  site-b: refused by the broker: expired`,
		`SITE\s+N\s+LOSS\s+ACCURACY\s+BALANCED\s+BASELINE\s+AUC`,
		`site-a\s+100\s+0\s+0\.7800\s+0\.0000\s+0\.7800\s+-\s+below baseline`,
		`below baseline: the accuracy does not beat always predicting the rows' majority class`,
		`not in the preprocessing \(joined after the statistics phase; trained with the others' preprocessing\): site-d`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("status output lacks %s:\n%s", re, out)
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

// `status` of a FedSplit run that ended while its iterate was diverging
// says it was not a normal finish; a run still going says only that it
// diverges.
func TestPrintStatusDivergedFinish(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		phase aggregator.Phase
		ended bool
	}{{aggregator.PhaseFinished, true}, {aggregator.PhaseCollecting, false}} {
		st := aggregator.Status{Federation: "f", Phase: tt.phase, Round: 40, FedSplitDiverging: 31}
		var b bytes.Buffer
		if err := printStatus(&b, st, at); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		if !strings.Contains(out, "diverging since round 31") {
			t.Errorf("%s: no divergence warning:\n%s", tt.phase, out)
		}
		if got := strings.Contains(out, "the run ended while the model was diverging: not a normal finish"); got != tt.ended {
			t.Errorf("%s: says not a normal finish: %v, want %v:\n%s", tt.phase, got, tt.ended, out)
		}
	}
}

// `status` names the run's server optimiser next to its aggregator, and
// says nothing of one when there is none.
func TestPrintStatusServerOpt(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct{ opt, want string }{
		{"adam:lr=0.01:beta1=0.9:beta2=0.99:tau=0.001", "aggregator fedavg  server-opt adam:lr=0.01:beta1=0.9:beta2=0.99:tau=0.001"},
		{"", ""},
	} {
		st := aggregator.Status{Federation: "f", Phase: aggregator.PhaseCollecting, Round: 3, RunID: "RUN", Aggregator: "fedavg", ServerOpt: tc.opt}
		var b bytes.Buffer
		if err := printStatus(&b, st, at); err != nil {
			t.Fatal(err)
		}
		if tc.want != "" && !strings.Contains(b.String(), tc.want) || tc.want == "" && strings.Contains(b.String(), "server-opt") {
			t.Errorf("server optimiser %q: status output\n%s", tc.opt, b.String())
		}
	}
}

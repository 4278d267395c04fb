package e2e

import (
	"encoding/json"
	"testing"
)

// line makes a logLine from a JSON log record.
func line(t *testing.T, raw string) logLine {
	t.Helper()
	l := logLine{raw: raw}
	if err := json.Unmarshal([]byte(raw), &l.kv); err != nil {
		t.Fatal(err)
	}
	return l
}

// TestUnansweredRound: the rule waitReceipted reads a site's runs by. A
// receipt's log line comes after its commit, so a SIGKILL can cut it off;
// the next run's outbox (its start line lists the rounds) then shows the
// update acknowledged. TestScaffoldKills failed on exactly that: round 2
// receipted and acknowledged within 3 ms of its solve, killed before the
// line, the next run starting with an empty outbox.
func TestUnansweredRound(t *testing.T) {
	const (
		solved2   = `{"msg":"round solved","round":2}`
		solved3   = `{"msg":"round solved","round":3}`
		receipt2  = `{"msg":"update receipted","round":2}`
		rejected2 = `{"msg":"update rejected by the aggregator; dropped","round":2}`
		outbox2   = `{"msg":"unreceipted updates in the outbox; re-sending on connect","count":1,"rounds":[2]}`
		outbox3   = `{"msg":"unreceipted updates in the outbox; re-sending on connect","count":1,"rounds":[3]}`
		connect   = `{"msg":"connecting"}`
	)
	for _, tc := range []struct {
		name string
		runs [][]string
		want float64 // -1: none unanswered
	}{
		{"receipted in the same run", [][]string{{connect, solved2, receipt2}}, -1},
		{"rejected in a later run", [][]string{{connect, solved2}, {outbox2, connect, rejected2}}, -1},
		{"no answer, one run", [][]string{{connect, solved2}}, 2},
		{"acknowledged before the kill, its line cut off", [][]string{{connect, solved2}, {connect}}, -1},
		{"still in the next run's outbox", [][]string{{connect, solved2}, {outbox2, connect}}, 2},
		{"acknowledged by the run after", [][]string{{connect, solved2}, {outbox2, connect, solved3}, {outbox3, connect}}, 3},
		{"the next run has not read its outbox yet", [][]string{{connect, solved2}, {}}, 2},
		{"committed, its solved line cut off, answered later", [][]string{{connect}, {outbox3, connect, receipt2}}, 3},
		{"committed, its solved line cut off, acknowledged before the next kill", [][]string{{connect}, {outbox3, connect}, {connect}}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs := make([][]logLine, len(tc.runs))
			for i, r := range tc.runs {
				for _, raw := range r {
					runs[i] = append(runs[i], line(t, raw))
				}
			}
			got, ok := unansweredRound(runs)
			if !ok {
				got = -1
			}
			if got != tc.want {
				t.Fatalf("unansweredRound = %v, want %v", got, tc.want)
			}
		})
	}
}

package agent

import (
	"testing"

	"github.com/edgefl/edgefl/proto/wire"
)

// Private selection (docs/privacy.md, "Sampling rate"): an announcement
// with private_selection is solved as selecting this site only with an
// invitation for its round and run, which may come before or after it,
// again and again (re-announcement, reconnection), or from another run.

func privAnn(run string, round uint64) *wire.RoundAnnouncement {
	a := ann(run, round)
	a.PrivateSelection = true
	return a
}

func inviteRcpt(run string, round uint64) receiptArrived {
	return receiptArrived{r: &wire.Receipt{ClientId: testSite, Round: round, RunId: run,
		Subject: wire.ReceiptSubject_RECEIPT_SUBJECT_INVITATION}}
}

func TestSessionInvitations(t *testing.T) {
	tests := []struct {
		name  string
		steps []sessionStep
	}{
		{name: "invitation after the announcement: handled again, invited", steps: []sessionStep{
			{ev: announced{privAnn("A", 1)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/1"}},
			{ev: handled(privAnn("A", 1), ActionNotSelected, true), want: []string{"done 1 not-selected"}},
			{ev: inviteRcpt("A", 1), want: []string{"invited A/1", "wake"}},
			{ev: idle{}, want: []string{"start A/1 invited"}},
			{ev: solved(privAnn("A", 1), "u1"), want: []string{"done 1 solved", "publish update/1 u1 first", "arm update/1 100ms"}},
		}},
		{name: "invitation before the announcement", steps: []sessionStep{
			{ev: inviteRcpt("A", 2), want: []string{"invited A/2"}},
			{ev: announced{privAnn("A", 2)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/2 invited"}},
		}},
		{name: "invitation while the announcement is being handled", steps: []sessionStep{
			{ev: announced{privAnn("A", 3)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/3"}},
			{ev: inviteRcpt("A", 3), want: []string{"invited A/3", "wake"}},
			{ev: handled(privAnn("A", 3), ActionNotSelected, true), want: []string{"done 3 not-selected"}},
			{ev: idle{}, want: []string{"start A/3 invited"}},
		}},
		{name: "a repeated invitation re-handles the round (re-send if unreceipted)", steps: []sessionStep{
			{ev: inviteRcpt("A", 4), want: []string{"invited A/4"}},
			{ev: announced{privAnn("A", 4)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/4 invited"}},
			{ev: solved(privAnn("A", 4), "u4"), want: []string{"done 4 solved", "publish update/4 u4 first", "arm update/4 100ms"}},
			{ev: inviteRcpt("A", 4), want: []string{"invited A/4 again", "wake"}},
			{ev: idle{}, want: []string{"start A/4 invited"}},
			{ev: solveDone{ann: privAnn("A", 4), res: Result{Round: 4, Action: ActionResend, Msg: []byte("u4")}},
				want: []string{"done 4 resend", "publish update/4 u4 again", "arm update/4 200ms"}},
		}},
		{name: "an invitation for another round or run does not select", steps: []sessionStep{
			{ev: inviteRcpt("A", 5), want: []string{"invited A/5"}},
			{ev: announced{privAnn("A", 6)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/6"}},
			{ev: inviteRcpt("B", 6), want: []string{"invited B/6"}}, // queued from another run: not this one's round 6
			{ev: inviteRcpt("A", 5), want: []string{"invited A/5"}}, // older: kept as the newest of run A
			{ev: handled(privAnn("A", 6), ActionNotSelected, true), want: []string{"done 6 not-selected"}},
			{ev: idle{}, want: nil},
			{ev: announced{privAnn("A", 7)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/7"}},
		}},
		{name: "an invitation does not select a public announcement", steps: []sessionStep{
			{ev: inviteRcpt("A", 8), want: []string{"invited A/8"}},
			{ev: announced{ann("A", 8)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/8"}},
		}},
		{name: "after closing an invitation wakes nothing", steps: []sessionStep{
			{ev: announced{privAnn("A", 9)}, want: []string{"wake"}},
			{ev: closed{}, want: nil},
			{ev: inviteRcpt("A", 9), want: []string{"invited A/9"}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newSessionHarness()
			h.run(t, tc.steps)
		})
	}
}

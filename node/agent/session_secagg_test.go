package agent

import (
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/edgefl/edgefl/proto/wire"
)

// sam is an encoded secagg message of kind k for round (what the outbox
// holds under secure aggregation; the session matches receipts by kind).
func sam(t testing.TB, round uint64, kind uint32) []byte {
	b, err := wire.Encode(&wire.SecAggMessage{ClientId: testSite, RunId: "A", Round: round, Kind: kind, Payload: []byte{1}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func saRcpt(round uint64, kind uint32, code wire.ReceiptCode) receiptArrived {
	ok := code == wire.ReceiptCode_RECEIPT_CODE_STORED || code == wire.ReceiptCode_RECEIPT_CODE_DUPLICATE
	return receiptArrived{r: &wire.Receipt{ClientId: testSite, Round: round, Subject: wire.ReceiptSubject_RECEIPT_SUBJECT_SECAGG,
		SecaggKind: kind, Code: code, Accepted: ok}}
}

func shareList(round uint64) *wire.SecAggMessage {
	return &wire.SecAggMessage{ClientId: testSite, RunId: "A", Round: round, Kind: wire.SecAggKindShareList, Payload: []byte{1}}
}

func outboxIs(want map[uint64]string) func(*testing.T, *sessionHarness) {
	return func(t *testing.T, h *sessionHarness) {
		t.Helper()
		got := map[uint64]string{}
		for r, m := range h.store.outbox {
			got[r] = fmt.Sprintf("sa%d", secAggKindOf(m))
		}
		if len(want) == 0 && len(got) == 0 {
			return
		}
		if !maps.Equal(got, want) {
			t.Errorf("outbox %v, want %v", got, want)
		}
	}
}

// TestSessionSecAgg walks the session rules of secure aggregation
// (node/agent/secagg.go): a ShareList waits for the solver like an announcement
// and its answer is published; a receipt removes the round's outbox entry
// only when it answers the message the entry holds; INTERNAL re-sends the
// entry (whatever message of the session it holds now) after the update
// backoff; a rejection drops it; closing drops a waiting ShareList.
func TestSessionSecAgg(t *testing.T) {
	secAggAnn := func(round uint64) *wire.RoundAnnouncement {
		a := ann("A", round)
		a.Secagg = &wire.SecAggSpec{Threshold: 2, Clip: 1, ScaleBits: 20, MaxSites: 3}
		return a
	}
	adv, share, masked := sam(t, 3, 1), sam(t, 3, 3), sam(t, 3, 5)
	upd := func(round uint64, code wire.ReceiptCode) receiptArrived {
		return rcpt(wire.ReceiptSubject_RECEIPT_SUBJECT_UPDATE, round, code)
	}
	tests := []struct {
		name    string
		outbox  map[uint64][]byte
		pending map[uint64]bool // FedSplit's sum mode
		steps   []sessionStep
	}{
		{name: "sum mode: secagg receipts keep the entry, the round's UPDATE receipt ends it", outbox: map[uint64][]byte{3: masked},
			pending: map[uint64]bool{3: true}, steps: []sessionStep{
				{ev: saRcpt(3, 5, codeOK), want: []string{"receipt secagg/3 accepted"}, check: outboxIs(map[uint64]string{3: "sa5"})},
				{ev: saRcpt(3, 5, codeStale), want: []string{"receipt secagg/3 rejected-kept"}, check: outboxIs(map[uint64]string{3: "sa5"})},
				{ev: connected{}, want: []string{"publish update/3 sa5 reconnect"}},
				{ev: upd(3, codeOK), want: []string{"receipt update/3 accepted had"}, check: outboxIs(nil)},
			}},
		{name: "sum mode: a rejected UPDATE receipt drops the entry", outbox: map[uint64][]byte{3: masked},
			pending: map[uint64]bool{3: true}, steps: []sessionStep{
				{ev: upd(3, codeStale), want: []string{"receipt update/3 rejected"}, check: outboxIs(nil)},
			}},
		{name: "sum mode: a round waiting for an earlier secagg round re-sends its entry, and goes on after its receipt",
			outbox: map[uint64][]byte{3: masked}, pending: map[uint64]bool{3: true}, steps: []sessionStep{
				{ev: announced{secAggAnn(4)}, want: []string{"wake"}},
				{ev: idle{}, want: []string{"start A/4"}},
				{ev: solveDone{ann: secAggAnn(4), res: Result{Round: 4, Action: ActionWaiting, Waiting: 3, Msg: masked}},
					want: []string{"done 4 waiting", "publish update/3 sa5 again"}},
				{ev: idle{}, want: nil},
				{ev: upd(3, codeOK), want: []string{"receipt update/3 accepted had", "wake"}},
				{ev: idle{}, want: []string{"start A/4"}},
			}},
		{name: "the advertisement of a solved round is published", steps: []sessionStep{
			{ev: announced{secAggAnn(3)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/3"}},
			{ev: solveDone{ann: secAggAnn(3), res: Result{Round: 3, Action: ActionSecAgg, Msg: adv, SecAggKind: 1, Healthy: true}},
				want: []string{"done 3 secagg", "publish update/3 sa1 first"}},
		}},
		{name: "a share list waits for the solver and its answer is published", steps: []sessionStep{
			{ev: announced{secAggAnn(3)}, want: []string{"wake"}},
			{ev: shareListArrived{shareList(3)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start A/3"}}, // the announcement first
			{ev: handled(secAggAnn(3), ActionDone, false), want: []string{"done 3 done"}},
			{ev: idle{}, want: []string{"start share-list 3"}},
			{ev: idle{}, want: nil},
			{ev: shareListDone{msg: shareList(3), res: Result{Round: 3, Action: ActionSecAgg, Msg: masked, SecAggKind: 5}},
				want: []string{"share-list 3 secagg", "publish update/3 sa5 first"}},
			{ev: shareListArrived{shareList(3)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start share-list 3"}},
			{ev: shareListDone{msg: shareList(3), res: Result{Round: 3, Action: ActionDone}},
				want: []string{"share-list 3 done"}},
			{ev: shareListArrived{shareList(3)}, want: []string{"wake"}},
			{ev: idle{}, want: []string{"start share-list 3"}},
			{ev: shareListDone{msg: shareList(3), err: errors.New("tampered")}, want: []string{"share-list 3 failed"}},
		}},
		{name: "a receipt of an earlier message keeps the next one's entry", outbox: map[uint64][]byte{3: masked}, steps: []sessionStep{
			{ev: saRcpt(3, 3, codeOK), want: []string{"receipt secagg/3 accepted"}, check: outboxIs(map[uint64]string{3: "sa5"})},
			{ev: saRcpt(3, 5, wire.ReceiptCode_RECEIPT_CODE_DUPLICATE), want: []string{"receipt secagg/3 accepted had"},
				check: outboxIs(nil)},
			{ev: connected{}, want: nil},
		}},
		{name: "a stored ShareKeys stays until its ShareList comes, re-sent on each connection", outbox: map[uint64][]byte{3: share}, steps: []sessionStep{
			{ev: saRcpt(3, 3, codeOK), want: []string{"receipt secagg/3 accepted"}, check: outboxIs(map[uint64]string{3: "sa3"})},
			{ev: connected{}, want: []string{"publish update/3 sa3 reconnect"}},
			{ev: saRcpt(3, 3, codeStale), want: []string{"receipt secagg/3 rejected had"}, check: outboxIs(nil)},
		}},
		{name: "INTERNAL re-sends the round's entry after the backoff", outbox: map[uint64][]byte{3: masked}, steps: []sessionStep{
			{ev: saRcpt(3, 5, codeRetry), want: []string{"arm update/3 100ms", "receipt secagg/3 retry"}},
			{advance: 100 * time.Millisecond, want: []string{"publish update/3 sa5 retry"}},
			{ev: connected{}, want: []string{"publish update/3 sa5 reconnect"}},
			{ev: saRcpt(3, 5, codeOK), want: []string{"stop update/3", "receipt secagg/3 accepted had"}},
			{advance: time.Second, want: nil},
		}},
		{name: "a rejection drops the entry it answers", outbox: map[uint64][]byte{3: adv}, steps: []sessionStep{
			{ev: saRcpt(3, 3, codeStale), want: []string{"receipt secagg/3 rejected"}, check: outboxIs(map[uint64]string{3: "sa1"})},
			{ev: saRcpt(3, 1, codeStale), want: []string{"receipt secagg/3 rejected had"}, check: outboxIs(nil)},
		}},
		{name: "closing drops a waiting share list", steps: []sessionStep{
			{ev: shareListArrived{shareList(3)}, want: []string{"wake"}},
			{ev: closed{}, want: nil},
			{ev: idle{}, want: nil},
			{ev: shareListArrived{shareList(3)}, want: nil},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newSessionHarness()
			maps.Copy(h.store.outbox, tc.outbox)
			h.store.pending = maps.Clone(tc.pending)
			h.run(t, tc.steps)
		})
	}
}

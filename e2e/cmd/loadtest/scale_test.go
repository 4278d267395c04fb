package main

import (
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/proto/wire"
)

// pubRecorder is an MQTT client that records what is published.
type pubRecorder struct {
	mqtt.Client // the other methods are not used
	pubs        [][]byte
}

func (p *pubRecorder) Publish(_ string, _ byte, _ bool, payload any) mqtt.Token {
	p.pubs = append(p.pubs, payload.([]byte))
	return nil
}

// TestSessionRetriesUnreceiptedUpdate: a scale session re-sends an update
// still without a receipt as the agent does (after --resend-min, the wait
// doubling up to --resend-max, counted), and stops once a receipt comes,
// DUPLICATE included (the aggregator's answer to a copy it stored).
func TestSessionRetriesUnreceiptedUpdate(t *testing.T) {
	f := &fleet{o: scaleOptions{resendMin: 2 * time.Second, resendMax: 5 * time.Second}}
	c := &pubRecorder{}
	s := &session{f: f, c: c, receipts: map[uint64]wire.ReceiptCode{}}
	t0 := time.Unix(1000, 0)
	s.sent, s.last, s.backoff, s.retryAt = 3, []byte("update of round 3"), f.o.resendMin, t0.Add(f.o.resendMin)

	steps := []struct {
		at      time.Duration
		receipt bool // a DUPLICATE receipt arrives before this step
		pubs    int  // publishes so far
	}{
		{1 * time.Second, false, 0},
		{2 * time.Second, false, 1},  // first re-send; next after 4 s
		{5 * time.Second, false, 1},  // not yet
		{6 * time.Second, false, 2},  // second; next after 5 s (the maximum)
		{11 * time.Second, false, 3}, // third
		{30 * time.Second, true, 3},  // answered: no more re-sends
		{90 * time.Second, false, 3},
	}
	for _, st := range steps {
		if st.receipt {
			s.receipts[3] = wire.ReceiptCode_RECEIPT_CODE_DUPLICATE
		}
		s.retry(t0.Add(st.at))
		if len(c.pubs) != st.pubs {
			t.Fatalf("at %v: %d publishes, want %d", st.at, len(c.pubs), st.pubs)
		}
	}
	for _, p := range c.pubs {
		if string(p) != "update of round 3" {
			t.Fatalf("re-sent %q, want the update as published", p)
		}
	}
	if got := f.retried.Load(); got != 3 {
		t.Fatalf("%d re-sends counted, want 3", got)
	}
}

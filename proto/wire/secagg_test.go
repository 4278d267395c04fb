package wire

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

// TestValidateSecAggRound checks the rules of RoundAnnouncement's secure
// aggregation fields (docs/privacy.md, "Wire").
func TestValidateSecAggRound(t *testing.T) {
	seed := bytes.Repeat([]byte{1}, 32)
	tests := []struct {
		name   string
		mutate func(*RoundAnnouncement)
		ok     bool
	}{
		{"advertise", func(r *RoundAnnouncement) {}, true},
		{"share keys with the key list", func(r *RoundAnnouncement) {
			r.SecaggPhase, r.SecaggBroadcast = SecAggPhase_SECAGG_PHASE_SHARE_KEYS, []byte("k")
		}, true},
		{"masked", func(r *RoundAnnouncement) { r.SecaggPhase = SecAggPhase_SECAGG_PHASE_MASKED }, true},
		{"unmask with the request", func(r *RoundAnnouncement) {
			r.SecaggPhase, r.SecaggBroadcast = SecAggPhase_SECAGG_PHASE_UNMASK, []byte("u")
		}, true},
		{"sparse graph", func(r *RoundAnnouncement) { r.Secagg.Degree, r.Secagg.GraphSeed = 4, seed }, true},
		{"absent", func(r *RoundAnnouncement) { r.Secagg = nil }, true},
		{"phase without spec", func(r *RoundAnnouncement) { r.Secagg, r.SecaggPhase = nil, SecAggPhase_SECAGG_PHASE_MASKED }, false},
		{"broadcast without spec", func(r *RoundAnnouncement) { r.Secagg, r.SecaggBroadcast = nil, []byte("x") }, false},
		{"unknown phase", func(r *RoundAnnouncement) { r.SecaggPhase = 9 }, false},
		{"share keys without key list", func(r *RoundAnnouncement) { r.SecaggPhase = SecAggPhase_SECAGG_PHASE_SHARE_KEYS }, false},
		{"unmask without request", func(r *RoundAnnouncement) { r.SecaggPhase = SecAggPhase_SECAGG_PHASE_UNMASK }, false},
		{"broadcast in advertise", func(r *RoundAnnouncement) { r.SecaggBroadcast = []byte("x") }, false},
		{"signed keys with the key list", func(r *RoundAnnouncement) {
			r.SecaggPhase, r.SecaggBroadcast, r.SecaggSignedKeys = SecAggPhase_SECAGG_PHASE_SHARE_KEYS, []byte("k"), []byte("s")
		}, true},
		{"signed keys in unmask", func(r *RoundAnnouncement) {
			r.SecaggPhase, r.SecaggBroadcast, r.SecaggSignedKeys = SecAggPhase_SECAGG_PHASE_UNMASK, []byte("u"), []byte("s")
		}, false},
		{"view signatures with the request", func(r *RoundAnnouncement) {
			r.SecaggPhase, r.SecaggBroadcast, r.SecaggViewSignatures = SecAggPhase_SECAGG_PHASE_UNMASK, []byte("u"), []byte("v")
		}, true},
		{"the consistency round's survivor set", func(r *RoundAnnouncement) {
			r.SecaggPhase, r.SecaggBroadcast = SecAggPhase_SECAGG_PHASE_CONSISTENCY, []byte("u")
		}, true},
		{"the consistency round without its survivor set", func(r *RoundAnnouncement) {
			r.SecaggPhase = SecAggPhase_SECAGG_PHASE_CONSISTENCY
		}, false},
		{"survivor signatures with the unmask", func(r *RoundAnnouncement) {
			r.SecaggPhase, r.SecaggBroadcast, r.SecaggSurvivorSignatures = SecAggPhase_SECAGG_PHASE_UNMASK, []byte("u"), []byte("s")
		}, true},
		{"survivor signatures in the consistency round", func(r *RoundAnnouncement) {
			r.SecaggPhase, r.SecaggBroadcast, r.SecaggSurvivorSignatures = SecAggPhase_SECAGG_PHASE_CONSISTENCY, []byte("u"), []byte("s")
		}, false},
		{"view signatures in the consistency round", func(r *RoundAnnouncement) {
			r.SecaggPhase, r.SecaggBroadcast, r.SecaggViewSignatures = SecAggPhase_SECAGG_PHASE_CONSISTENCY, []byte("u"), []byte("v")
		}, false},
		{"view signatures in share keys", func(r *RoundAnnouncement) {
			r.SecaggPhase, r.SecaggBroadcast, r.SecaggViewSignatures = SecAggPhase_SECAGG_PHASE_SHARE_KEYS, []byte("k"), []byte("v")
		}, false},
		{"threshold 1", func(r *RoundAnnouncement) { r.Secagg.Threshold = 1 }, false},
		{"max sites below threshold", func(r *RoundAnnouncement) { r.Secagg.MaxSites = 2 }, false},
		{"max sites too many", func(r *RoundAnnouncement) { r.Secagg.MaxSites = MaxSecAggSites + 1 }, false},
		{"odd degree", func(r *RoundAnnouncement) { r.Secagg.Degree, r.Secagg.GraphSeed = 3, seed }, false},
		{"degree without seed", func(r *RoundAnnouncement) { r.Secagg.Degree = 4 }, false},
		{"seed without degree", func(r *RoundAnnouncement) { r.Secagg.GraphSeed = seed }, false},
		{"short seed", func(r *RoundAnnouncement) { r.Secagg.Degree, r.Secagg.GraphSeed = 4, seed[:31] }, false},
		{"clip 0", func(r *RoundAnnouncement) { r.Secagg.Clip = 0 }, false},
		{"clip NaN", func(r *RoundAnnouncement) { r.Secagg.Clip = math.NaN() }, false},
		{"clip inf", func(r *RoundAnnouncement) { r.Secagg.Clip = math.Inf(1) }, false},
		{"scale bits 41", func(r *RoundAnnouncement) { r.Secagg.ScaleBits = 41 }, false},
		{"finished phase", func(r *RoundAnnouncement) { r.Phase = Phase_PHASE_FINISHED }, false},
		{"masked phase without the global model", func(r *RoundAnnouncement) {
			r.SecaggPhase, r.Global = SecAggPhase_SECAGG_PHASE_MASKED, nil
		}, true},
		{"advertise phase without the global model", func(r *RoundAnnouncement) { r.Global = nil }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := sampleRound()
			r.Secagg = &SecAggSpec{Threshold: 3, Clip: 1, ScaleBits: 24, MaxSites: 4, Attempt: 1}
			tt.mutate(r)
			checkValidity(t, r, tt.ok, Limits{})
		})
	}
}

// TestValidateSecAggMessage checks SecAggMessage and the SECAGG receipt.
func TestValidateSecAggMessage(t *testing.T) {
	msgs := []struct {
		name string
		m    *SecAggMessage
		ok   bool
	}{
		{"masked input", &SecAggMessage{ClientId: "s1", RunId: "R", Round: 2, Kind: SecAggKindMaskedInput, Payload: []byte{1}}, true},
		{"share list", &SecAggMessage{ClientId: "s1", Round: 2, Kind: SecAggKindShareList, Payload: []byte{1}}, true},
		{"round 0", &SecAggMessage{ClientId: "s1", Kind: 1, Payload: []byte{1}}, false},
		{"kind 2 (a broadcast)", &SecAggMessage{ClientId: "s1", Round: 1, Kind: 2, Payload: []byte{1}}, false},
		{"kind 8", &SecAggMessage{ClientId: "s1", Round: 1, Kind: 8, Payload: []byte{1}}, false},
		{"sum-mode advertise against round 2", &SecAggMessage{ClientId: "s1", Round: 3, Kind: 1, Payload: []byte{1}, BaseRound: 2, InstanceId: "ABCDEFGH"}, true},
		{"base round of a later kind", &SecAggMessage{ClientId: "s1", Round: 3, Kind: 5, Payload: []byte{1}, BaseRound: 2}, false},
		{"base round not before the round", &SecAggMessage{ClientId: "s1", Round: 3, Kind: 1, Payload: []byte{1}, BaseRound: 3}, false},
		{"bad instance id", &SecAggMessage{ClientId: "s1", Round: 3, Kind: 1, Payload: []byte{1}, InstanceId: "a/b"}, false},
		{"empty payload", &SecAggMessage{ClientId: "s1", Round: 1, Kind: 1}, false},
		{"signed advertise", &SecAggMessage{ClientId: "s1", Round: 1, Kind: 1, Payload: []byte{1}, Certificate: []byte{2}, Signature: []byte{3}}, true},
		{"certificate without signature", &SecAggMessage{ClientId: "s1", Round: 1, Kind: 1, Payload: []byte{1}, Certificate: []byte{2}}, false},
		{"signature of a share keys", &SecAggMessage{ClientId: "s1", Round: 1, Kind: 3, Payload: []byte{1}, Certificate: []byte{2}, Signature: []byte{3}}, false},
		{"certificate too long", &SecAggMessage{ClientId: "s1", Round: 1, Kind: 1, Payload: []byte{1}, Certificate: make([]byte, MaxSecAggCert+1), Signature: []byte{3}}, false},
		{"signed masked input", &SecAggMessage{ClientId: "s1", Round: 1, Kind: SecAggKindMaskedInput, Payload: []byte{1}, ViewSignature: []byte{4}}, true},
		{"view signature of an advertise", &SecAggMessage{ClientId: "s1", Round: 1, Kind: 1, Payload: []byte{1}, ViewSignature: []byte{4}}, false},
		{"signed survivor set", &SecAggMessage{ClientId: "s1", Round: 1, Kind: SecAggKindSurvivors, Payload: []byte{1}, SurvivorsSignature: []byte{4}}, true},
		{"survivors signature of a masked input", &SecAggMessage{ClientId: "s1", Round: 1, Kind: SecAggKindMaskedInput, Payload: []byte{1}, SurvivorsSignature: []byte{4}}, false},
		{"survivors signature too long", &SecAggMessage{ClientId: "s1", Round: 1, Kind: SecAggKindSurvivors, Payload: []byte{1}, SurvivorsSignature: make([]byte, MaxSecAggSig+1)}, false},
		{"view signature too long", &SecAggMessage{ClientId: "s1", Round: 1, Kind: SecAggKindMaskedInput, Payload: []byte{1}, ViewSignature: make([]byte, MaxSecAggSig+1)}, false},
		{"bad id", &SecAggMessage{ClientId: "a b", Round: 1, Kind: 1, Payload: []byte{1}}, false},
		{"negative time", &SecAggMessage{ClientId: "s1", Round: 1, Kind: 1, Payload: []byte{1}, SentAtUnixMs: -1}, false},
	}
	for _, tt := range msgs {
		t.Run(tt.name, func(t *testing.T) { checkValidity(t, tt.m, tt.ok, Limits{}) })
	}
	receipts := []struct {
		name string
		r    *Receipt
		ok   bool
	}{
		{"stored", &Receipt{ClientId: "s1", Round: 2, Accepted: true, StoredAtUnixMs: 1, Code: ReceiptCode_RECEIPT_CODE_STORED,
			Subject: ReceiptSubject_RECEIPT_SUBJECT_SECAGG, SecaggKind: SecAggKindShareKeys}, true},
		{"no kind", &Receipt{ClientId: "s1", Round: 2, Subject: ReceiptSubject_RECEIPT_SUBJECT_SECAGG, Code: ReceiptCode_RECEIPT_CODE_BAD_UPDATE}, false},
		{"share list kind", &Receipt{ClientId: "s1", Round: 2, Subject: ReceiptSubject_RECEIPT_SUBJECT_SECAGG, SecaggKind: SecAggKindShareList}, false},
		{"round 0", &Receipt{ClientId: "s1", Subject: ReceiptSubject_RECEIPT_SUBJECT_SECAGG, SecaggKind: 1}, false},
		{"kind on an update receipt", &Receipt{ClientId: "s1", Round: 2, SecaggKind: 1}, false},
	}
	for _, tt := range receipts {
		t.Run(tt.name, func(t *testing.T) { checkValidity(t, tt.r, tt.ok, Limits{}) })
	}
}

// TestSecAggTopics checks which secagg messages each topic carries: a site's
// kinds on its update topic, only a ShareList on its receipts topic.
func TestSecAggTopics(t *testing.T) {
	tp, err := ForFederation("fed1")
	if err != nil {
		t.Fatal(err)
	}
	enc := func(kind uint32) []byte {
		return mustEncode(t, &SecAggMessage{ClientId: "site-1", Round: 1, Kind: kind, Payload: []byte{1}})
	}
	for _, tt := range []struct {
		topic string
		kind  uint32
		ok    bool
	}{
		{"edgefl/fed1/updates/site-1", SecAggKindAdvertiseKeys, true},
		{"edgefl/fed1/updates/site-1", SecAggKindUnmaskResponse, true},
		{"edgefl/fed1/updates/site-1", SecAggKindShareList, false},
		{"edgefl/fed1/updates/site-2", SecAggKindAdvertiseKeys, false},
		{"edgefl/fed1/receipts/site-1", SecAggKindShareList, true},
		{"edgefl/fed1/receipts/site-1", SecAggKindShareKeys, false},
		{"edgefl/fed1/receipts/site-2", SecAggKindShareList, false},
	} {
		_, m, err := tp.Decode(tt.topic, enc(tt.kind), Limits{})
		if (err == nil) != tt.ok {
			t.Errorf("%s kind %d: err %v, want ok %v", tt.topic, tt.kind, err, tt.ok)
		}
		if err != nil && m != nil {
			t.Errorf("%s: a message with an error", tt.topic)
		}
		if tt.ok && !errors.Is(err, nil) {
			t.Errorf("%s: %v", tt.topic, err)
		}
	}
}

package wire

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// fuzzLimits are small so that the fuzzer also reaches the limit checks.
var fuzzLimits = Limits{MaxMessageBytes: 1 << 16, MaxDimension: 1 << 20, MaxClients: 16, MaxAnchorGrad: 64}

// seeds are the hand-made inputs every decoder fuzz target starts from: valid
// messages of each type plus edge cases. They are also written to
// testdata/fuzz/<target>/ by `go test -run TestFuzzSeeds -update`.
func seeds(t testing.TB) map[string][]byte {
	s := map[string][]byte{
		"round":    mustEncode(t, sampleRound()),
		"status":   mustEncode(t, sampleStatus()),
		"update":   mustEncode(t, sampleUpdate()),
		"receipt":  mustEncode(t, sampleReceipt()),
		"empty":    {},
		"version2": rawEnvelope(t, &Envelope{Version: 2, Body: &Envelope_Update{Update: sampleUpdate()}}),
		"nobody":   rawEnvelope(t, &Envelope{Version: Version}),
		// Schema runs.
		"statistics":    mustEncode(t, sampleStatistics()),
		"evaluation":    mustEncode(t, sampleEvaluation()),
		"run-spec":      mustEncode(t, &RunSpec{Federation: "fed1", RunId: "R1", Schema: schemaJSON, Transform: []byte(`{"outputs":1}`)}),
		"stats-round":   mustEncode(t, &RoundAnnouncement{Federation: "fed1", Phase: Phase_PHASE_STATISTICS, Schema: schemaJSON, RunId: "R1"}),
		"error-status":  mustEncode(t, &ClientStatus{ClientId: "site-1", Online: true, ErrorReason: SiteErrBadValue, ErrorMessage: "site.csv line 3 column \"age\": expected a number"}),
		"stats-receipt": mustEncode(t, &Receipt{ClientId: "site-1", Accepted: true, StoredAtUnixMs: 1, Code: ReceiptCode_RECEIPT_CODE_STORED, Subject: ReceiptSubject_RECEIPT_SUBJECT_STATISTICS}),
		// One installation per site id.
		"instance-status": mustEncode(t, &ClientStatus{ClientId: "site-1", Online: true, Connection: 3, InstanceId: "INSTANCE234567ABCDEFGHIJKL"}),
		// Secure aggregation.
		"secagg":           mustEncode(t, &SecAggMessage{ClientId: "site-1", RunId: "R1", Round: 3, Kind: SecAggKindShareKeys, Payload: []byte("EFSA\x01"), Attempt: 1}),
		"secagg-sharelist": mustEncode(t, &SecAggMessage{ClientId: "site-1", RunId: "R1", Round: 3, Kind: SecAggKindShareList, Payload: []byte("EFSA\x01")}),
		"secagg-receipt":   mustEncode(t, &Receipt{ClientId: "site-1", Round: 3, Accepted: true, StoredAtUnixMs: 1, Code: ReceiptCode_RECEIPT_CODE_STORED, Subject: ReceiptSubject_RECEIPT_SUBJECT_SECAGG, SecaggKind: SecAggKindMaskedInput}),
	}
	sr := sampleRound()
	sr.Secagg = &SecAggSpec{Threshold: 2, Clip: 1, ScaleBits: 20, MaxSites: 3}
	sr.SecaggPhase, sr.SecaggBroadcast = SecAggPhase_SECAGG_PHASE_SHARE_KEYS, []byte("EFSA\x01 key list")
	s["secagg-round"] = mustEncode(t, sr)
	// Private selection (docs/privacy.md "Sampling rate").
	s["invitation"] = mustEncode(t, &Receipt{ClientId: "site-1", Round: 4, Subject: ReceiptSubject_RECEIPT_SUBJECT_INVITATION, RunId: "R1"})
	priv := sampleRound()
	priv.Selected, priv.PrivateSelection = nil, true
	s["private-round"] = mustEncode(t, priv)
	fin := sampleRound()
	fin.Phase, fin.Schema, fin.Transform, fin.Evaluate, fin.EvalRound, fin.Bundle = Phase_PHASE_FINISHED, schemaJSON, transformJSON, true, 7, bundleJSON
	s["finished-round"] = mustEncode(t, fin)
	u := sampleUpdate()
	u.Report.LocalLoss = 0
	u.AnchorGrad = nil
	u.Kind = UpdateKind_UPDATE_KIND_FULL
	u.BaseRound = 0
	s["update-full"] = mustEncode(t, u)
	b := mustEncode(t, sampleUpdate())
	s["update-truncated"] = b[:len(b)/2]
	// Nested length prefix claiming far more than there is.
	hdr := protowire.AppendVarint([]byte{0x08}, 1)
	hdr = protowire.AppendTag(hdr, fieldUpdate, protowire.BytesType)
	s["update-huge-len"] = protowire.AppendVarint(hdr, 1<<40)
	return s
}

func TestFuzzSeeds(t *testing.T) {
	if !*update {
		t.Skip("run with -update to rewrite testdata/fuzz")
	}
	for _, target := range []string{"FuzzDecodeUpdate", "FuzzDecodeRound", "FuzzDecodeStatus", "FuzzDecodeReceipt", "FuzzDecode",
		"FuzzDecodeStatistics", "FuzzDecodeEvaluation", "FuzzDecodeSiteMessage", "FuzzTopicsDecodeUpdate",
		"FuzzDecodeSecAgg", "FuzzDecodeSiteInbox"} {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, b := range seeds(t) {
			content := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
			if err := os.WriteFile(filepath.Join(dir, "seed-"+name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// checkDecoded is the property every decoder must have: an error and a nil
// message, or a message that validates under the limits and survives an
// encode/decode round trip unchanged.
func checkDecoded(t *testing.T, in []byte, m Message, err error) {
	t.Helper()
	if err != nil {
		if m != nil && !reflect.ValueOf(m).IsNil() {
			t.Fatalf("error %v with a non-nil message", err)
		}
		return
	}
	if len(in) > fuzzLimits.MaxMessageBytes {
		t.Fatalf("accepted %d bytes over the limit", len(in))
	}
	if verr := m.Validate(fuzzLimits); verr != nil {
		t.Fatalf("decoded message does not validate: %v", verr)
	}
	b, err := Encode(m)
	if err != nil {
		t.Fatalf("re-encode: %v", err)
	}
	back, err := Decode(b, Limits{})
	if err != nil {
		t.Fatalf("decode of re-encoded message: %v", err)
	}
	if !msgEqual(back, m) {
		t.Fatalf("re-encode round trip changed the message")
	}
}

func addSeeds(f *testing.F) {
	for _, b := range seeds(f) {
		f.Add(b)
	}
	for _, b := range goldenSeeds(f) {
		f.Add(b)
	}
}

func FuzzDecodeUpdate(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeUpdate(b, fuzzLimits)
		checkDecoded(t, b, m, err)
	})
}

func FuzzDecodeRound(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeRound(b, fuzzLimits)
		checkDecoded(t, b, m, err)
	})
}

func FuzzDecodeStatus(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeStatus(b, fuzzLimits)
		checkDecoded(t, b, m, err)
	})
}

func FuzzDecodeReceipt(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeReceipt(b, fuzzLimits)
		checkDecoded(t, b, m, err)
	})
}

func FuzzDecode(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b, fuzzLimits)
		if err != nil && m != nil {
			t.Fatalf("error %v with a non-nil message", err)
		}
		if err == nil {
			checkDecoded(t, b, m, nil)
		}
	})
}

func FuzzDecodeStatistics(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeStatistics(b, fuzzLimits)
		checkDecoded(t, b, m, err)
	})
}

func FuzzDecodeEvaluation(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeEvaluation(b, fuzzLimits)
		checkDecoded(t, b, m, err)
	})
}

func FuzzDecodeSecAgg(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeSecAgg(b, fuzzLimits)
		checkDecoded(t, b, m, err)
	})
}

func FuzzDecodeSiteInbox(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeSiteInbox(b, fuzzLimits)
		if err != nil && m != nil {
			t.Fatalf("error %v with a non-nil message", err)
		}
		if err != nil {
			return
		}
		switch m := m.(type) {
		case *Receipt:
		case *SecAggMessage:
			if m.Kind != SecAggKindShareList {
				t.Fatalf("DecodeSiteInbox gives a secagg kind %d", m.Kind)
			}
		default:
			t.Fatalf("DecodeSiteInbox gives a %T", m)
		}
		checkDecoded(t, b, m, nil)
	})
}

func FuzzDecodeSiteMessage(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeSiteMessage(b, fuzzLimits)
		if err != nil && m != nil {
			t.Fatalf("error %v with a non-nil message", err)
		}
		if err != nil {
			return
		}
		switch m.(type) {
		case *ClientUpdate, *SiteStatistics, *EvalReport, *SecAggMessage:
		default:
			t.Fatalf("DecodeSiteMessage gives a %T", m)
		}
		checkDecoded(t, b, m, nil)
	})
}

// FuzzTopicsDecodeUpdate checks the update topic: whatever it accepts is
// one of its three bodies, of the topic's client.
func FuzzTopicsDecodeUpdate(f *testing.F) {
	addSeeds(f)
	tp, err := ForFederation("fed1")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		kind, m, err := tp.Decode("edgefl/fed1/updates/site-1", b, fuzzLimits)
		if kind != KindUpdate {
			t.Fatalf("kind %v", kind)
		}
		if err != nil {
			if m != nil {
				t.Fatalf("error %v with a non-nil message", err)
			}
			return
		}
		var id string
		switch m := m.(type) {
		case *ClientUpdate:
			id = m.ClientId
		case *SiteStatistics:
			id = m.ClientId
		case *EvalReport:
			id = m.ClientId
		case *SecAggMessage:
			if m.Kind == SecAggKindShareList {
				t.Fatalf("update topic gives a ShareList")
			}
			id = m.ClientId
		default:
			t.Fatalf("update topic gives a %T", m)
		}
		if id != "site-1" {
			t.Fatalf("update topic of site-1 gives a message of %q", id)
		}
		checkDecoded(t, b, m, nil)
	})
}

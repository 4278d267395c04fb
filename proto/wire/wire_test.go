package wire

import (
	"bytes"
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

var update = flag.Bool("update", false, "write missing proto/wire/testdata/golden files and rewrite the fuzz seeds")

func sampleRound() *RoundAnnouncement {
	return &RoundAnnouncement{
		Federation: "fed1",
		Round:      7,
		Algorithm:  "fedproxsplit",
		Aggregator: "fedsplit-mean",
		Params:     &Params{Mu: 0.1, Step: 0.5, Relax: 1, Solver: "lbfgs", Gamma: 0.1, Lr: 0.01, Batch: 32},
		Model:      &ModelSpec{Kind: "mlp", Inputs: 784, Classes: 10, Hidden: []uint32{64}, Activation: "relu", L2: 1e-4},
		Budget:     &WorkBudget{MaxEpochs: 5, MaxSeconds: 30, MaxGradEvals: 1000},
		// 2024-01-01T00:00:00Z and one minute later.
		DeadlineUnixMs:  1704067260000,
		Selected:        []string{"site-1", "site-2", "site-3"},
		Global:          &Vector{Codec: "f32+zstd", Dimension: 50890, Payload: []byte{0x28, 0xb5, 0x2f, 0xfd, 1, 2, 3}},
		UplinkCodec:     "topk:0.1+qsgd:8+zstd",
		CreatedAtUnixMs: 1704067200000,
		AnchorSketch:    &SketchSpec{Dimension: 64, Seed: 42},
	}
}

func sampleStatus() *ClientStatus {
	return &ClientStatus{
		ClientId:        "site-1",
		Online:          true,
		SampleCount:     1234,
		Capabilities:    []string{"sgd", "lbfgs"},
		SoftwareVersion: "edge-agent v0.1.0",
		TimestampUnixMs: 1704067201000,
	}
}

func sampleUpdate() *ClientUpdate {
	return &ClientUpdate{
		ClientId:    "site-1",
		Round:       7,
		Kind:        UpdateKind_UPDATE_KIND_Z_DELTA,
		Vector:      &Vector{Codec: "topk:0.1+qsgd:8+zstd", Dimension: 50890, Payload: []byte{9, 8, 7, 6, 5}},
		SampleCount: 1234,
		Report: &WorkReport{
			AchievedGamma: 0.09, Epochs: 3, GradEvals: 42, Seconds: 1.5,
			LocalLoss: 0.31, AnchorLoss: 0.45, StopReason: StopReason_STOP_REASON_GAMMA_REACHED,
		},
		AnchorGrad:   []float64{0.1, -0.2, 0.3},
		BaseRound:    6,
		SentAtUnixMs: 1704067230000,
		Seq:          19,
	}
}

func sampleReceipt() *Receipt {
	return &Receipt{
		ClientId: "site-1", Round: 7, Accepted: true, Reason: "stored",
		StoredAtUnixMs: 1704067231000, Code: ReceiptCode_RECEIPT_CODE_STORED, UpdateSeq: 19,
	}
}

func mustEncode(t testing.TB, m Message) []byte {
	t.Helper()
	b, err := Encode(m)
	if err != nil {
		t.Fatalf("Encode(%T): %v", m, err)
	}
	return b
}

// rawEnvelope marshals an envelope without Encode's validation, to build
// hostile input.
func rawEnvelope(t testing.TB, env *Envelope) []byte {
	t.Helper()
	return marshal(env)
}

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name   string
		msg    Message
		decode func([]byte, Limits) (Message, error)
	}{
		{"round", sampleRound(), func(b []byte, l Limits) (Message, error) { return DecodeRound(b, l) }},
		{"status", sampleStatus(), func(b []byte, l Limits) (Message, error) { return DecodeStatus(b, l) }},
		{"update", sampleUpdate(), func(b []byte, l Limits) (Message, error) { return DecodeUpdate(b, l) }},
		{"receipt", sampleReceipt(), func(b []byte, l Limits) (Message, error) { return DecodeReceipt(b, l) }},
		{"offline will", &ClientStatus{ClientId: "site-9"}, func(b []byte, l Limits) (Message, error) { return DecodeStatus(b, l) }},
		{"rejected receipt", &Receipt{ClientId: "s", Round: 1, Reason: "stale round", Code: ReceiptCode_RECEIPT_CODE_STALE_ROUND}, func(b []byte, l Limits) (Message, error) { return DecodeReceipt(b, l) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustEncode(t, tt.msg)
			got, err := tt.decode(b, Limits{})
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !msgEqual(got, tt.msg) {
				t.Fatalf("round trip mismatch:\n got %v\nwant %v", got, tt.msg)
			}
			any, err := Decode(b, Limits{})
			if err != nil || !msgEqual(any, tt.msg) {
				t.Fatalf("Decode = %v, %v", any, err)
			}
			if again := mustEncode(t, got); !bytes.Equal(again, b) {
				t.Fatalf("re-encoding is not deterministic")
			}
		})
	}
}

// TestGolden decodes the committed fixtures: a change to the schema that
// breaks what a deployed agent sends fails here.
//
// These four, like testdata/golden/ (golden_test.go), were written by the
// protoc-gen-go code wire used before its own codec (now generated), so
// -update no longer rewrites them; Encode must still produce their bytes.
func TestGolden(t *testing.T) {
	msgs := map[string]Message{
		"round_v1.bin":   sampleRound(),
		"status_v1.bin":  sampleStatus(),
		"update_v1.bin":  sampleUpdate(),
		"receipt_v1.bin": sampleReceipt(),
	}
	for name, m := range msgs {
		path := filepath.Join("testdata", name)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if enc := mustEncode(t, m); !bytes.Equal(enc, b) {
			t.Errorf("%s: Encode gives\n%x\nwant\n%x", name, enc, b)
		}
		got, err := Decode(b, Limits{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !msgEqual(got, m) {
			t.Errorf("%s decodes to\n%v\nwant\n%v", name, got, m)
		}
	}
}

func TestVersion(t *testing.T) {
	body := &Envelope_Update{Update: sampleUpdate()}
	tests := []struct {
		name    string
		version uint32
	}{
		{"missing", 0},
		{"future", 2},
		{"far future", math.MaxUint32},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := rawEnvelope(t, &Envelope{Version: tt.version, Body: body})
			_, err := DecodeUpdate(b, Limits{})
			if !errors.Is(err, ErrUnsupportedVersion) {
				t.Fatalf("err = %v, want ErrUnsupportedVersion", err)
			}
			var ve *VersionError
			if !errors.As(err, &ve) || ve.Version != tt.version {
				t.Fatalf("err = %#v, want *VersionError{%d}", err, tt.version)
			}
			if !strings.Contains(err.Error(), "version") {
				t.Fatalf("unclear error %q", err)
			}
		})
	}
	// A future version is rejected even when its body is of an unknown type.
	b := protowire.AppendTag(nil, fieldVersion, protowire.VarintType)
	b = protowire.AppendVarint(b, 3)
	b = protowire.AppendTag(b, 9, protowire.BytesType)
	b = protowire.AppendBytes(b, []byte("whatever v3 carries"))
	if _, err := Decode(b, Limits{}); !errors.Is(err, ErrUnsupportedVersion) {
		t.Fatalf("v3 with unknown body: %v", err)
	}
	// The last version field wins, as in protobuf.
	b = protowire.AppendTag(nil, fieldVersion, protowire.VarintType)
	b = protowire.AppendVarint(b, 2)
	b = append(b, mustEncode(t, sampleUpdate())...)
	if _, err := DecodeUpdate(b, Limits{}); err != nil {
		t.Fatalf("version 2 then 1: %v", err)
	}
}

func TestWrongType(t *testing.T) {
	b := mustEncode(t, sampleStatus())
	if _, err := DecodeUpdate(b, Limits{}); !errors.Is(err, ErrWrongType) {
		t.Fatalf("DecodeUpdate(status) = %v, want ErrWrongType", err)
	}
	if _, err := DecodeRound(mustEncode(t, sampleReceipt()), Limits{}); !errors.Is(err, ErrWrongType) {
		t.Fatalf("DecodeRound(receipt) = %v, want ErrWrongType", err)
	}
	noBody := rawEnvelope(t, &Envelope{Version: Version})
	if _, err := Decode(noBody, Limits{}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("Decode(no body) = %v, want ErrMalformed", err)
	}
}

func TestLimits(t *testing.T) {
	u := sampleUpdate()
	b := mustEncode(t, u)
	if _, err := DecodeUpdate(b, Limits{MaxMessageBytes: len(b) - 1}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("MaxMessageBytes: %v, want ErrTooLarge", err)
	}
	if _, err := DecodeUpdate(b, Limits{MaxMessageBytes: len(b)}); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	if _, err := DecodeUpdate(b, Limits{MaxDimension: int(u.Vector.Dimension) - 1}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("MaxDimension: %v, want ErrInvalid", err)
	}
	if _, err := DecodeUpdate(b, Limits{MaxAnchorGrad: 2}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("MaxAnchorGrad: %v, want ErrInvalid", err)
	}
	r := mustEncode(t, sampleRound())
	if _, err := DecodeRound(r, Limits{MaxClients: 2}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("MaxClients: %v, want ErrInvalid", err)
	}
	// The default limits take a large, valid update.
	big := sampleUpdate()
	big.Vector.Dimension = uint32(DefaultLimits.MaxDimension)
	big.Vector.Payload = make([]byte, 1<<20)
	if _, err := DecodeUpdate(mustEncode(t, big), Limits{}); err != nil {
		t.Fatalf("default limits: %v", err)
	}
	big.Vector.Dimension++
	if _, err := DecodeUpdate(mustEncode(t, big), Limits{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("over the default dimension: %v", err)
	}
}

func TestMalformed(t *testing.T) {
	good := mustEncode(t, sampleUpdate())
	inputs := map[string][]byte{
		"empty":          {},
		"truncated":      good[:len(good)-3],
		"bad tag":        {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"group":          {0x0b},
		"body too short": append(protowire.AppendVarint([]byte{0x08}, 1), 0x22, 0x7f, 0x01),
		"garbage body":   append(protowire.AppendVarint([]byte{0x08}, 1), 0x22, 0x03, 0xff, 0xff, 0xff),
	}
	// A status whose client_id string holds the invalid UTF-8 byte 0xff.
	st := protowire.AppendTag(nil, 1, protowire.BytesType)
	st = protowire.AppendBytes(st, []byte{0xff})
	env := protowire.AppendTag(protowire.AppendVarint([]byte{0x08}, 1), fieldStatus, protowire.BytesType)
	inputs["invalid utf8"] = protowire.AppendBytes(env, st)
	for name, b := range inputs {
		if m, err := Decode(b, Limits{}); err == nil {
			t.Errorf("%s: decoded %v", name, m)
		} else if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrUnsupportedVersion) {
			t.Errorf("%s: %v, want ErrMalformed or ErrUnsupportedVersion", name, err)
		}
	}
}

func TestUnknownFieldsIgnored(t *testing.T) {
	b := mustEncode(t, sampleReceipt())
	// A field a later minor revision might add, on the envelope.
	b = protowire.AppendTag(b, 99, protowire.BytesType)
	b = protowire.AppendBytes(b, []byte("future"))
	if _, err := DecodeReceipt(b, Limits{}); err != nil {
		t.Fatalf("unknown field: %v", err)
	}
}

func TestValidateUpdate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*ClientUpdate)
	}{
		{"no client", func(u *ClientUpdate) { u.ClientId = "" }},
		{"client wildcard", func(u *ClientUpdate) { u.ClientId = "a+" }},
		{"client slash", func(u *ClientUpdate) { u.ClientId = "a/b" }},
		{"round 0", func(u *ClientUpdate) { u.Round = 0 }},
		{"kind unspecified", func(u *ClientUpdate) { u.Kind = UpdateKind_UPDATE_KIND_UNSPECIFIED }},
		{"kind unknown", func(u *ClientUpdate) { u.Kind = 17 }},
		{"base round = round", func(u *ClientUpdate) { u.BaseRound = u.Round }},
		{"base round on delta", func(u *ClientUpdate) { u.Kind = UpdateKind_UPDATE_KIND_DELTA }},
		{"no vector", func(u *ClientUpdate) { u.Vector = nil }},
		{"dimension 0", func(u *ClientUpdate) { u.Vector.Dimension = 0 }},
		{"empty payload", func(u *ClientUpdate) { u.Vector.Payload = nil }},
		{"no codec", func(u *ClientUpdate) { u.Vector.Codec = "" }},
		{"codec control char", func(u *ClientUpdate) { u.Vector.Codec = "f32\n" }},
		{"codec too long", func(u *ClientUpdate) { u.Vector.Codec = strings.Repeat("c", 257) }},
		{"no samples", func(u *ClientUpdate) { u.SampleCount = 0 }},
		{"no report", func(u *ClientUpdate) { u.Report = nil }},
		{"gamma NaN", func(u *ClientUpdate) { u.Report.AchievedGamma = math.NaN() }},
		{"gamma negative", func(u *ClientUpdate) { u.Report.AchievedGamma = -1 }},
		{"seconds Inf", func(u *ClientUpdate) { u.Report.Seconds = math.Inf(1) }},
		{"local loss NaN", func(u *ClientUpdate) { u.Report.LocalLoss = math.NaN() }},
		{"anchor loss -Inf", func(u *ClientUpdate) { u.Report.AnchorLoss = math.Inf(-1) }},
		{"stop reason unknown", func(u *ClientUpdate) { u.Report.StopReason = 99 }},
		{"anchor grad NaN", func(u *ClientUpdate) { u.AnchorGrad[1] = math.NaN() }},
		{"sent at negative", func(u *ClientUpdate) { u.SentAtUnixMs = -1 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := sampleUpdate()
			tt.mutate(u)
			if _, err := Encode(u); !errors.Is(err, ErrInvalid) {
				t.Errorf("Encode = %v, want ErrInvalid", err)
			}
			b := rawEnvelope(t, &Envelope{Version: Version, Body: &Envelope_Update{Update: u}})
			if got, err := DecodeUpdate(b, Limits{}); !errors.Is(err, ErrInvalid) || got != nil {
				t.Errorf("DecodeUpdate = %v, %v, want nil, ErrInvalid", got, err)
			}
		})
	}
}

func TestValidateRound(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*RoundAnnouncement)
		ok     bool
	}{
		{"minimal", func(r *RoundAnnouncement) {
			*r = RoundAnnouncement{Federation: "f", Round: 1, Algorithm: "fedavg", Model: &ModelSpec{Kind: "linreg"},
				Global: &Vector{Codec: "f64", Dimension: 1, Payload: []byte{0}}, UplinkCodec: "f64"}
		}, true},
		{"no federation", func(r *RoundAnnouncement) { r.Federation = "" }, false},
		{"round 0", func(r *RoundAnnouncement) { r.Round = 0 }, false},
		{"no algorithm", func(r *RoundAnnouncement) { r.Algorithm = "" }, false},
		{"algorithm with space", func(r *RoundAnnouncement) { r.Algorithm = "fed avg" }, false},
		{"mu NaN", func(r *RoundAnnouncement) { r.Params.Mu = math.NaN() }, false},
		{"step negative", func(r *RoundAnnouncement) { r.Params.Step = -0.5 }, false},
		{"relax Inf", func(r *RoundAnnouncement) { r.Params.Relax = math.Inf(1) }, false},
		{"lr NaN", func(r *RoundAnnouncement) { r.Params.Lr = math.NaN() }, false},
		{"no model", func(r *RoundAnnouncement) { r.Model = nil }, false},
		{"no model kind", func(r *RoundAnnouncement) { r.Model.Kind = "" }, false},
		{"l2 NaN", func(r *RoundAnnouncement) { r.Model.L2 = math.NaN() }, false},
		{"too many layers", func(r *RoundAnnouncement) { r.Model.Hidden = make([]uint32, 65) }, false},
		{"max seconds negative", func(r *RoundAnnouncement) { r.Budget.MaxSeconds = -1 }, false},
		{"deadline negative", func(r *RoundAnnouncement) { r.DeadlineUnixMs = -5 }, false},
		{"selected duplicate", func(r *RoundAnnouncement) { r.Selected = []string{"a", "b", "a"} }, false},
		{"selected wildcard", func(r *RoundAnnouncement) { r.Selected = []string{"#"} }, false},
		{"no global", func(r *RoundAnnouncement) { r.Global = nil }, false},
		{"global dim 0", func(r *RoundAnnouncement) { r.Global.Dimension = 0 }, false},
		{"no uplink codec", func(r *RoundAnnouncement) { r.UplinkCodec = "" }, false},
		{"aggregator too long", func(r *RoundAnnouncement) { r.Aggregator = strings.Repeat("a", 1025) }, false},
		{"sketch too big", func(r *RoundAnnouncement) { r.AnchorSketch.Dimension = math.MaxUint32 }, false},
		{"run id", func(r *RoundAnnouncement) { r.RunId = "0123456789ABCDEFGHJKMNPQRS" }, true},
		{"run id too long", func(r *RoundAnnouncement) { r.RunId = strings.Repeat("a", 65) }, false},
		{"run id control character", func(r *RoundAnnouncement) { r.RunId = "a\nb" }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := sampleRound()
			tt.mutate(r)
			b := rawEnvelope(t, &Envelope{Version: Version, Body: &Envelope_Round{Round: r}})
			_, err := DecodeRound(b, Limits{})
			if tt.ok && err != nil {
				t.Fatalf("DecodeRound: %v", err)
			}
			if !tt.ok && !errors.Is(err, ErrInvalid) {
				t.Fatalf("DecodeRound = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestValidateStatusAndReceipt(t *testing.T) {
	tests := []struct {
		name string
		msg  Message
	}{
		{"status no id", &ClientStatus{}},
		{"status bad id", &ClientStatus{ClientId: "a b"}},
		{"status empty capability", &ClientStatus{ClientId: "a", Capabilities: []string{""}}},
		{"status many capabilities", &ClientStatus{ClientId: "a", Capabilities: make([]string, 65)}},
		{"status version control char", &ClientStatus{ClientId: "a", SoftwareVersion: "v1\x1b[2J"}},
		{"status negative time", &ClientStatus{ClientId: "a", TimestampUnixMs: -1}},
		{"receipt no id", &Receipt{Round: 1}},
		{"receipt round 0", &Receipt{ClientId: "a"}},
		{"receipt accepted no time", &Receipt{ClientId: "a", Round: 1, Accepted: true}},
		{"receipt accepted reject code", &Receipt{ClientId: "a", Round: 1, Accepted: true, StoredAtUnixMs: 1, Code: ReceiptCode_RECEIPT_CODE_STALE_ROUND}},
		{"receipt rejected stored code", &Receipt{ClientId: "a", Round: 1, Code: ReceiptCode_RECEIPT_CODE_STORED}},
		{"receipt unknown code", &Receipt{ClientId: "a", Round: 1, Code: 1000}},
		{"receipt reason newline", &Receipt{ClientId: "a", Round: 1, Reason: "x\ny"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Encode(tt.msg); !errors.Is(err, ErrInvalid) {
				t.Errorf("Encode = %v, want ErrInvalid", err)
			}
			b := rawEnvelope(t, &Envelope{Version: Version, Body: tt.msg.wrap()})
			if _, err := Decode(b, Limits{}); !errors.Is(err, ErrInvalid) {
				t.Errorf("Decode = %v, want ErrInvalid", err)
			}
		})
	}
	var nilUpdate *ClientUpdate
	if _, err := Encode(nilUpdate); !errors.Is(err, ErrInvalid) {
		t.Errorf("Encode(nil) = %v", err)
	}
	if _, err := Encode(nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("Encode(nil interface) = %v", err)
	}
}

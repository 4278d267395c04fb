package wire

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// field appends one tagged field to b: v is a uint64 (varint), a float64
// (fixed64) or a []byte or string (length-delimited).
func field(b []byte, num protowire.Number, v any) []byte {
	switch v := v.(type) {
	case uint64:
		b = protowire.AppendTag(b, num, protowire.VarintType)
		return protowire.AppendVarint(b, v)
	case float64:
		b = protowire.AppendTag(b, num, protowire.Fixed64Type)
		return protowire.AppendFixed64(b, math.Float64bits(v))
	case []byte:
		b = protowire.AppendTag(b, num, protowire.BytesType)
		return protowire.AppendBytes(b, v)
	case string:
		b = protowire.AppendTag(b, num, protowire.BytesType)
		return protowire.AppendString(b, v)
	}
	panic("field: unexpected type")
}

func envelopeOf(num protowire.Number, body []byte) []byte {
	return field(field(nil, fieldVersion, uint64(Version)), num, body)
}

// TestDecodeProto3Rules checks the decoding rules protobuf-go applied, on
// hand-built input: last scalar wins, sub-messages and the same oneof case
// merge, another oneof case replaces, repeated fields concatenate packed and
// unpacked runs, unknown fields and known fields of another wire type are
// skipped.
func TestDecodeProto3Rules(t *testing.T) {
	var u []byte
	u = field(u, 1, "first")
	u = field(u, 1, "site-1") // last one wins
	u = field(u, 2, uint64(3))
	u = field(u, 2, float64(9)) // round with the wrong wire type: skipped
	u = field(u, 3, uint64(UpdateKind_UPDATE_KIND_FULL))
	u = field(u, 4, field(field(nil, 1, "f64"), 2, uint64(2)))
	u = field(u, 4, field(nil, 3, []byte{1, 2})) // merged into the vector
	u = field(u, 5, uint64(10))
	u = field(u, 6, field(nil, 2, uint64(1)))
	u = field(u, 6, field(nil, 7, uint64(StopReason_STOP_REASON_SIGNAL))) // merged into the report
	u = field(u, 7, float64(1))                                           // unpacked
	u = field(u, 7, protowire.AppendFixed64(protowire.AppendFixed64(nil, math.Float64bits(2)), math.Float64bits(3)))
	u = field(u, 7, []byte{}) // empty packed run
	u = field(u, 99, "unknown")
	u = protowire.AppendTag(u, 98, protowire.StartGroupType)
	u = field(u, 1, uint64(5))
	u = protowire.AppendTag(u, 98, protowire.EndGroupType)
	u = field(u, 100, float64(1))
	u = append(u, protowire.AppendTag(nil, 101, protowire.Fixed32Type)...)
	u = protowire.AppendFixed32(u, 7)

	// A status first: the update replaces it. Then the update again in two
	// parts, which merge.
	env := envelopeOf(fieldStatus, field(nil, 1, "other"))
	env = field(env, fieldUpdate, u)
	env = field(env, fieldUpdate, field(nil, 10, uint64(77)))
	got, err := DecodeUpdate(env, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	want := &ClientUpdate{
		ClientId: "site-1", Round: 3, Kind: UpdateKind_UPDATE_KIND_FULL,
		Vector: &Vector{Codec: "f64", Dimension: 2, Payload: []byte{1, 2}}, SampleCount: 10,
		Report:     &WorkReport{Epochs: 1, StopReason: StopReason_STOP_REASON_SIGNAL},
		AnchorGrad: []float64{1, 2, 3}, Seq: 77,
	}
	if !msgEqual(got, want) {
		t.Fatalf("got  %v\nwant %v", got, want)
	}

	// Hidden layers, packed and unpacked.
	m := &ModelSpec{}
	b := field(field(nil, 4, uint64(300)), 4, protowire.AppendVarint(protowire.AppendVarint(nil, 1), 1<<32+5))
	if err := rawUnmarshal(b, m); err != nil || !msgEqual(m.Hidden, []uint32{300, 1, 5}) {
		t.Fatalf("hidden = %v, %v", m.Hidden, err)
	}
	// Enums and int64 fields are sign-extended; enums truncate to int32.
	r := &Receipt{}
	b = field(field(nil, 6, uint64(math.MaxUint64)), 5, uint64(math.MaxUint64-1))
	if err := rawUnmarshal(b, r); err != nil || r.Code != -1 || r.StoredAtUnixMs != -2 {
		t.Fatalf("receipt = %v, %v", r, err)
	}
	if enc := marshal(r); !bytes.Equal(enc, field(field(nil, 5, uint64(math.MaxUint64-1)), 6, uint64(math.MaxUint64))) {
		t.Fatalf("negative enum and int64 encode as %x", enc)
	}
}

func TestDecodeMalformed(t *testing.T) {
	good := mustEncode(t, sampleUpdate())
	deep := envelopeOf(fieldUpdate, nil)
	for i := 0; i < 20000; i++ {
		deep = protowire.AppendTag(deep, 15, protowire.StartGroupType)
	}
	inputs := map[string][]byte{
		"field number 0":        append(field(nil, 1, uint64(1)), 0x00, 0x00),
		"field number > 2^29-1": protowire.AppendVarint(append(field(nil, 1, uint64(1)), protowire.AppendVarint(nil, uint64(1)<<32)...), 1),
		"end group at top":      append(envelopeOf(fieldUpdate, nil), protowire.AppendTag(nil, 3, protowire.EndGroupType)...),
		"open group":            append(envelopeOf(fieldUpdate, nil), protowire.AppendTag(nil, 3, protowire.StartGroupType)...),
		"deep groups":           deep,
		"reserved wire type":    append(envelopeOf(fieldUpdate, nil), 0x0e),
		"truncated varint":      append(envelopeOf(fieldUpdate, nil), 0x10, 0x80),
		"varint overflow":       append(envelopeOf(fieldUpdate, nil), 0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02),
		"truncated fixed64":     envelopeOf(fieldUpdate, []byte{0x39, 1, 2, 3}),
		"packed doubles % 8":    envelopeOf(fieldUpdate, field(nil, 7, make([]byte, 12))),
		"packed varint cut":     envelopeOf(fieldRound, field(nil, 6, field(nil, 4, []byte{0x80}))),
		"nested length":         envelopeOf(fieldUpdate, []byte{0x22, 0x05, 0x0a, 0x09, 'a'}),
		"huge nested length":    envelopeOf(fieldUpdate, protowire.AppendVarint([]byte{0x22}, math.MaxUint64)),
		"invalid UTF-8 nested":  envelopeOf(fieldUpdate, field(nil, 4, field(nil, 1, []byte{'f', 0xc3}))),
		"invalid UTF-8 list":    envelopeOf(fieldStatus, field(field(nil, 1, "s"), 4, []byte{0xed, 0xa0, 0x80})),
		"truncated body":        good[:len(good)-1],
	}
	for name, b := range inputs {
		m, err := Decode(b, Limits{})
		if !errors.Is(err, ErrMalformed) || m != nil {
			t.Errorf("%s: Decode = %v, %v; want ErrMalformed", name, m, err)
		}
	}
}

// TestRepeatedLimits checks that a repeated field over its limit fails with
// ErrInvalid without growing past the limit, and that a malformed input
// still reports ErrMalformed when it is also over a limit.
func TestRepeatedLimits(t *testing.T) {
	lim := Limits{MaxMessageBytes: 64 << 20, MaxAnchorGrad: 64, MaxClients: 3}
	u := sampleUpdate()
	u.AnchorGrad = make([]float64, 1<<18) // 2 MiB packed
	b := mustEncode(t, u)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := DecodeUpdate(b, lim)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "anchor_grad") {
		t.Fatalf("DecodeUpdate = %v, want ErrInvalid for anchor_grad", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 256<<10 {
		t.Errorf("decoding an over-limit anchor_grad allocated %d bytes", got)
	}
	// The same anchor gradient, unpacked.
	up := envelopeOf(fieldUpdate, nil)
	var body []byte
	for range 65 {
		body = field(body, 7, float64(1))
	}
	up = field(up, fieldUpdate, body)
	if _, err := DecodeUpdate(up, lim); !errors.Is(err, ErrInvalid) {
		t.Fatalf("unpacked anchor_grad: %v, want ErrInvalid", err)
	}
	// Over the limit and then malformed: malformed wins.
	bad := append(append([]byte(nil), b...), 0x0e)
	if _, err := DecodeUpdate(bad, lim); !errors.Is(err, ErrMalformed) {
		t.Fatalf("over the limit then malformed: %v, want ErrMalformed", err)
	}

	r := sampleRound()
	r.Selected = []string{"a", "b", "c", "d"}
	r.Model.Hidden = make([]uint32, maxHiddenLayers)
	if _, err := DecodeRound(mustEncode(t, r), lim); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "selected") {
		t.Fatalf("4 selected, limit 3: %v", err)
	}
	r.Selected = r.Selected[:3]
	if _, err := DecodeRound(mustEncode(t, r), lim); err != nil {
		t.Fatalf("3 selected and %d hidden layers: %v", maxHiddenLayers, err)
	}
	r.Model.Hidden = append(r.Model.Hidden, 1)
	raw := rawEnvelope(t, &Envelope{Version: Version, Body: &Envelope_Round{Round: r}})
	if _, err := DecodeRound(raw, lim); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "hidden") {
		t.Fatalf("%d hidden layers: %v", maxHiddenLayers+1, err)
	}
	s := sampleStatus()
	s.Capabilities = make([]string, maxCapabilities+1)
	for i := range s.Capabilities {
		s.Capabilities[i] = "c"
	}
	raw = rawEnvelope(t, &Envelope{Version: Version, Body: &Envelope_Status{Status: s}})
	if _, err := DecodeStatus(raw, lim); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "capabilities") {
		t.Fatalf("%d capabilities: %v", maxCapabilities+1, err)
	}
}

// TestEveryRepeatedFieldHasLimit checks that repeatedLimit (validate.go) bounds every
// repeated field of edgefl.proto, so that a decoder never grows one beyond
// what Validate accepts.
func TestEveryRepeatedFieldHasLimit(t *testing.T) {
	d := newDecoder(DefaultLimits)
	n := 0
	for _, m := range parseSchema(t).Messages {
		for _, f := range m.Fields {
			if !f.Repeated {
				continue
			}
			n++
			key := m.Name + "." + f.Name
			if msg, name, limit := d.repeatedLimit(key); msg == key || name == key || limit == math.MaxInt {
				t.Errorf("repeated field %s has no limit: add a case to repeatedLimit in proto/wire/validate.go", key)
			}
		}
	}
	if n == 0 {
		t.Fatal("no repeated field found")
	}
}

// TestEncodeRejectsInvalidUTF8 checks that Validate covers every string
// field, so that Encode never writes a string proto3 forbids.
func TestEncodeRejectsInvalidUTF8(t *testing.T) {
	const bad = "a\xff"
	round := []func(*RoundAnnouncement){
		func(r *RoundAnnouncement) { r.Federation = bad },
		func(r *RoundAnnouncement) { r.Algorithm = bad },
		func(r *RoundAnnouncement) { r.Aggregator = bad },
		func(r *RoundAnnouncement) { r.Params.Solver = bad },
		func(r *RoundAnnouncement) { r.Model.Kind = bad },
		func(r *RoundAnnouncement) { r.Model.Activation = bad },
		func(r *RoundAnnouncement) { r.Selected[1] = bad },
		func(r *RoundAnnouncement) { r.Global.Codec = bad },
		func(r *RoundAnnouncement) { r.UplinkCodec = bad },
		func(r *RoundAnnouncement) { r.RunId = bad },
	}
	for i, f := range round {
		r := sampleRound()
		f(r)
		if _, err := Encode(r); !errors.Is(err, ErrInvalid) {
			t.Errorf("round %d: %v", i, err)
		}
	}
	for i, m := range []Message{
		&ClientStatus{ClientId: bad},
		&ClientStatus{ClientId: "a", Capabilities: []string{bad}},
		&ClientStatus{ClientId: "a", SoftwareVersion: bad},
		&Receipt{ClientId: bad, Round: 1},
		&Receipt{ClientId: "a", Round: 1, Reason: bad},
		func() Message { u := sampleUpdate(); u.ClientId = bad; return u }(),
		func() Message { u := sampleUpdate(); u.Vector.Codec = bad; return u }(),
		&ClientStatus{ClientId: "a", ErrorReason: SiteErrData, ErrorMessage: bad},
		&ClientStatus{ClientId: "a", ErrorReason: bad},
		func() Message { s := sampleStatistics(); s.ClientId = bad; return s }(),
		func() Message { s := sampleStatistics(); s.RunId = bad; return s }(),
		func() Message { s := sampleStatistics(); s.SchemaDigest = bad; return s }(),
		func() Message { e := sampleEvaluation(); e.ClientId = bad; return e }(),
		func() Message { e := sampleEvaluation(); e.RunId = bad; return e }(),
	} {
		if _, err := Encode(m); !errors.Is(err, ErrInvalid) {
			t.Errorf("message %d: %v", i, err)
		}
	}
}

func TestEncodeVersion(t *testing.T) {
	b, err := EncodeVersion(sampleReceipt(), 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeReceipt(b, Limits{}); !errors.Is(err, ErrUnsupportedVersion) {
		t.Fatalf("version 2: %v", err)
	}
	v1, _ := EncodeVersion(sampleReceipt(), Version)
	if !bytes.Equal(v1, mustEncode(t, sampleReceipt())) {
		t.Fatal("EncodeVersion(m, Version) differs from Encode(m)")
	}
	if _, err := EncodeVersion(&Receipt{}, 2); !errors.Is(err, ErrInvalid) {
		t.Fatalf("invalid body: %v", err)
	}
	var nilRound *RoundAnnouncement
	if _, err := EncodeVersion(nilRound, 1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("nil body: %v", err)
	}
}

// TestGettersNilSafe calls every Get method on a nil receiver, as the
// generated ones allowed.
func TestGettersNilSafe(t *testing.T) {
	for _, m := range []any{
		(*Envelope)(nil), (*Vector)(nil), (*Params)(nil), (*ModelSpec)(nil), (*WorkBudget)(nil),
		(*SketchSpec)(nil), (*RoundAnnouncement)(nil), (*ClientStatus)(nil), (*WorkReport)(nil),
		(*ClientUpdate)(nil), (*Receipt)(nil), (*SiteStatistics)(nil), (*EvalReport)(nil),
	} {
		v := reflect.ValueOf(m)
		n := 0
		for i := 0; i < v.NumMethod(); i++ {
			name := v.Type().Method(i).Name
			if !strings.HasPrefix(name, "Get") {
				continue
			}
			out := v.Method(i).Call(nil)
			if !out[0].IsZero() {
				t.Errorf("%T.%s() = %v on nil", m, name, out[0])
			}
			n++
		}
		if n == 0 {
			t.Errorf("%T has no getters", m)
		}
		if s := fmtString(m); s != "<nil>" {
			t.Errorf("%T(nil).String() = %q", m, s)
		}
	}
	env := &Envelope{Version: 1, Body: &Envelope_Update{Update: sampleUpdate()}}
	if env.GetUpdate() == nil || env.GetRound() != nil || env.GetStatus() != nil || env.GetReceipt() != nil || env.GetBody() == nil {
		t.Fatal("Envelope getters")
	}
	if env.GetUpdate().GetReport().GetStopReason() != StopReason_STOP_REASON_GAMMA_REACHED {
		t.Fatal("chained getters")
	}
}

func fmtString(m any) string { return m.(interface{ String() string }).String() }

func TestString(t *testing.T) {
	if got := UpdateKind_UPDATE_KIND_Z_DELTA.String(); got != "UPDATE_KIND_Z_DELTA" {
		t.Errorf("UpdateKind: %q", got)
	}
	if got := StopReason(42).String(); got != "42" {
		t.Errorf("unknown StopReason: %q", got)
	}
	if got := ReceiptCode(-3).String(); got != "-3" {
		t.Errorf("unknown ReceiptCode: %q", got)
	}
	if p := ReceiptCode_RECEIPT_CODE_STORED.Enum(); *p != ReceiptCode_RECEIPT_CODE_STORED {
		t.Error("Enum")
	}
	for v, name := range ReceiptCode_name {
		if ReceiptCode_value[name] != v || ReceiptCode(v).String() != name {
			t.Errorf("ReceiptCode %d %s", v, name)
		}
	}
	u := sampleUpdate()
	u.Report.AnchorLoss = negZero
	want := `client_id:"site-1" round:7 kind:UPDATE_KIND_Z_DELTA vector:{codec:"topk:0.1+qsgd:8+zstd" dimension:50890 payload:"\t\b\a\x06\x05"} sample_count:1234 report:{achieved_gamma:0.09 epochs:3 grad_evals:42 seconds:1.5 local_loss:0.31 anchor_loss:-0 stop_reason:STOP_REASON_GAMMA_REACHED} anchor_grad:0.1 anchor_grad:-0.2 anchor_grad:0.3 base_round:6 sent_at_unix_ms:1704067230000 seq:19`
	if got := u.String(); got != want {
		t.Errorf("ClientUpdate.String() =\n%s\nwant\n%s", got, want)
	}
	env := &Envelope{Version: 1, Body: &Envelope_Receipt{Receipt: &Receipt{ClientId: "a", Code: 77}}}
	if got, want := env.String(), `version:1 receipt:{client_id:"a" code:77}`; got != want {
		t.Errorf("Envelope.String() = %s, want %s", got, want)
	}
	if got := (&Params{}).String(); got != "" {
		t.Errorf("empty Params: %q", got)
	}
}

// roundTrip is the codec's round-trip property on arbitrary input: if the
// hand-written decoder accepts b as m, then encoding m and decoding that
// gives m again, and encoding is a fixed point (the second encoding equals
// the first).
func roundTrip(t *testing.T, b []byte, m, m2 codec) {
	t.Helper()
	if err := rawUnmarshal(b, m); err != nil {
		return
	}
	enc := marshal(m)
	if len(enc) != m.size() {
		t.Fatalf("%T: size %d, encoding %d bytes", m, m.size(), len(enc))
	}
	if err := rawUnmarshal(enc, m2); err != nil {
		t.Fatalf("%T: decoding its own encoding: %v", m, err)
	}
	if !msgEqual(m, m2) {
		t.Fatalf("%T: round trip changed\n%v\ninto\n%v", m, m, m2)
	}
	if enc2 := marshal(m2); !bytes.Equal(enc, enc2) {
		t.Fatalf("%T: re-encoding differs:\n%x\n%x", m, enc, enc2)
	}
}

func FuzzRoundTrip(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		roundTrip(t, b, &Envelope{}, &Envelope{})
		roundTrip(t, b, &RoundAnnouncement{}, &RoundAnnouncement{})
		roundTrip(t, b, &ClientUpdate{}, &ClientUpdate{})
		roundTrip(t, b, &ClientStatus{}, &ClientStatus{})
		roundTrip(t, b, &Receipt{}, &Receipt{})
		roundTrip(t, b, &ModelSpec{}, &ModelSpec{})
		roundTrip(t, b, &Params{}, &Params{})
		roundTrip(t, b, &WorkReport{}, &WorkReport{})
		roundTrip(t, b, &Vector{}, &Vector{})
		roundTrip(t, b, &WorkBudget{}, &WorkBudget{})
		roundTrip(t, b, &SketchSpec{}, &SketchSpec{})
		roundTrip(t, b, &SiteStatistics{}, &SiteStatistics{})
		roundTrip(t, b, &EvalReport{}, &EvalReport{})
	})
}

// goldenSeeds are the fixtures, added to every fuzz target's corpus.
func goldenSeeds(f *testing.F) [][]byte {
	paths, err := filepath.Glob(filepath.Join("testdata", "golden", "*.bin"))
	if err != nil {
		f.Fatal(err)
	}
	var out [][]byte
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

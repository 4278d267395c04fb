package wire

import (
	"bytes"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The fixtures in testdata/golden/ were written by the protoc-gen-go code
// (protobuf-go v1.36.12, deterministic marshalling) that this package used
// before its codec was written by hand (now generated); they pin the bytes of every message
// type, with every field set to edge values, so that the generated codec
// stays byte-compatible with edgefl.proto. -update writes missing fixtures
// only: an existing one is never rewritten.

// negZero is -0.0, which proto3 encodes (only +0 is the omitted default).
var negZero = math.Copysign(0, -1)

// allBytes is a payload holding every byte value once.
func allBytes() []byte {
	b := make([]byte, 256)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

// A 64-byte id, the longest ValidID accepts.
var longID = strings.Repeat("Az09._-", 9) + "x"

func maxVector() *Vector {
	return &Vector{Codec: "topk:0.1+qsgd:8+zstd", Dimension: 1 << 22, Payload: allBytes()}
}

func maxParams() *Params {
	return &Params{
		Mu: math.MaxFloat64, Step: math.SmallestNonzeroFloat64, Relax: negZero,
		Solver: "lbfgs-ü", Gamma: 1e-300, Lr: 0.5, Batch: math.MaxUint32,
	}
}

func maxModel() *ModelSpec {
	return &ModelSpec{
		Kind: "mlp", Inputs: math.MaxUint32, Classes: 1,
		Hidden:     []uint32{0, 1, 127, 128, 16383, 16384, 1<<21 - 1, 1 << 21, 1<<28 - 1, 1 << 28, math.MaxUint32},
		Activation: "tanh-σ", L2: negZero,
	}
}

func maxBudget() *WorkBudget {
	return &WorkBudget{MaxEpochs: math.MaxUint32, MaxSeconds: math.MaxFloat64, MaxGradEvals: math.MaxUint64}
}

func maxSketch() *SketchSpec { return &SketchSpec{Dimension: 1 << 22, Seed: math.MaxUint64} }

func maxReport() *WorkReport {
	return &WorkReport{
		AchievedGamma: math.MaxFloat64, Epochs: math.MaxUint64, GradEvals: 1 << 63,
		Seconds: math.SmallestNonzeroFloat64, LocalLoss: -math.MaxFloat64, AnchorLoss: negZero,
		StopReason: StopReason_STOP_REASON_ERROR, Partial: true,
	}
}

func maxRound() *RoundAnnouncement {
	return &RoundAnnouncement{
		Federation:      longID,
		Round:           math.MaxUint64,
		Algorithm:       "fedproxsplit",
		Aggregator:      "fedsplit-mean ✓ 日本語 𝄞 \"quoted\" \\",
		Params:          maxParams(),
		Model:           maxModel(),
		Budget:          maxBudget(),
		DeadlineUnixMs:  math.MaxInt64,
		Selected:        []string{"a", "site-1", longID, "A.b_c-9"},
		Global:          maxVector(),
		UplinkCodec:     "f32+zstd",
		CreatedAtUnixMs: 1,
		AnchorSketch:    maxSketch(),
	}
}

func maxStatus() *ClientStatus {
	return &ClientStatus{
		ClientId: longID, Online: true, SampleCount: math.MaxUint64,
		Capabilities:    []string{"sgd", "lbfgs", "ü-ñ 日本 🙂"},
		SoftwareVersion: "edge-agent v1.2.3 (ßø)",
		TimestampUnixMs: math.MaxInt64,
	}
}

func maxUpdate() *ClientUpdate {
	return &ClientUpdate{
		ClientId:    longID,
		Round:       math.MaxUint64,
		Kind:        UpdateKind_UPDATE_KIND_Z_DELTA,
		Vector:      maxVector(),
		SampleCount: math.MaxUint64,
		Report:      maxReport(),
		AnchorGrad: []float64{negZero, 0, 1, -1, math.MaxFloat64, -math.SmallestNonzeroFloat64,
			math.Pi, -1e-308},
		BaseRound:    math.MaxUint64 - 1,
		SentAtUnixMs: math.MaxInt64,
		Seq:          math.MaxUint64,
	}
}

func maxReceipt() *Receipt {
	return &Receipt{
		ClientId: longID, Round: math.MaxUint64, Accepted: true, Reason: "stored ✓ «ok»",
		StoredAtUnixMs: math.MaxInt64, Code: ReceiptCode_RECEIPT_CODE_DUPLICATE, UpdateSeq: math.MaxUint64,
	}
}

// digest is a valid schema digest (hex SHA-256).
const digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

// schemaJSON, transformJSON and bundleJSON stand for the JSON the receiver
// parses; wire carries them as bytes.
var (
	schemaJSON    = []byte(`{"version":1,"task":"binary","label":{"column":"diagnosis","classes":{"M":1,"B":0}},"features":[{"name":"radius","type":"numeric"}]}`)
	transformJSON = []byte(`{"version":1,"outputs":2,"mean":[14.1,0],"std":[3.5,1]}`)
	bundleJSON    = []byte(`{"format":"edgefl-bundle","version":1,"digest":"sha256:00"}`)
)

// maxStatsRound is a PHASE_STATISTICS announcement with every field it may
// carry.
func maxStatsRound() *RoundAnnouncement {
	r := maxRound()
	r.Round, r.Phase, r.RunId, r.Schema = 0, Phase_PHASE_STATISTICS, "RUNID234567ABCDEFGHIJKLMNO", allBytes()
	return r
}

// maxTrainRound is a training announcement of a run with a schema: schema,
// transform, evaluate and eval_round set.
func maxTrainRound() *RoundAnnouncement {
	r := maxRound()
	r.RunId, r.Schema, r.Transform, r.Evaluate, r.EvalRound = "RUNID234567ABCDEFGHIJKLMNO", schemaJSON, transformJSON, true, math.MaxUint32
	return r
}

// maxFinishedRound is the last announcement of a run, with its bundle.
func maxFinishedRound() *RoundAnnouncement {
	r := maxTrainRound()
	r.Phase, r.Bundle, r.UplinkCodec = Phase_PHASE_FINISHED, allBytes(), ""
	return r
}

func maxStatistics() *SiteStatistics {
	return &SiteStatistics{
		ClientId: longID, RunId: "RUNID234567ABCDEFGHIJKLMNO ✓", SchemaDigest: digest,
		Stats: allBytes(), SentAtUnixMs: math.MaxInt64,
	}
}

func maxEvaluation() *EvalReport {
	return &EvalReport{
		ClientId: longID, RunId: "RUNID234567ABCDEFGHIJKLMNO ✓", Round: math.MaxUint64,
		Report: allBytes(), SentAtUnixMs: math.MaxInt64,
	}
}

func errorStatus() *ClientStatus {
	st := maxStatus()
	st.Connection = math.MaxUint64
	st.ErrorReason = SiteErrSchema
	st.ErrorMessage = `site.csv line 1: column "radius" missing (schema feature, numeric) ✓`
	return st
}

// The smallest valid messages, with present-but-empty sub-messages and empty
// (non-nil) repeated fields.
func minRound() *RoundAnnouncement {
	return &RoundAnnouncement{
		Federation: "f", Round: 1, Algorithm: "a",
		Params: &Params{}, Model: &ModelSpec{Kind: "k", Hidden: []uint32{}}, Budget: &WorkBudget{},
		Selected: []string{}, Global: &Vector{Codec: "c", Dimension: 1, Payload: []byte{0}},
		UplinkCodec: "c", AnchorSketch: &SketchSpec{},
	}
}

func minStatus() *ClientStatus { return &ClientStatus{ClientId: "s", Capabilities: []string{}} }

func minUpdate() *ClientUpdate {
	return &ClientUpdate{
		ClientId: "s", Round: 1, Kind: UpdateKind_UPDATE_KIND_FULL,
		Vector: &Vector{Codec: "c", Dimension: 1, Payload: []byte{0}}, SampleCount: 1,
		Report: &WorkReport{}, AnchorGrad: []float64{},
	}
}

func minReceipt() *Receipt { return &Receipt{ClientId: "s", Round: 1} }

// minStatsRound is the smallest valid PHASE_STATISTICS announcement: no
// model, global, algorithm or uplink codec.
func minStatsRound() *RoundAnnouncement {
	return &RoundAnnouncement{Federation: "f", Phase: Phase_PHASE_STATISTICS, Schema: []byte{'{'}}
}

// minFinishedRound is the smallest valid PHASE_FINISHED announcement.
func minFinishedRound() *RoundAnnouncement {
	return &RoundAnnouncement{
		Federation: "f", Round: 1, Algorithm: "a", Model: &ModelSpec{Kind: "k"},
		Global: &Vector{Codec: "c", Dimension: 1, Payload: []byte{0}}, Phase: Phase_PHASE_FINISHED,
	}
}

func minStatistics() *SiteStatistics {
	return &SiteStatistics{ClientId: "s", SchemaDigest: digest, Stats: []byte{0}}
}

func minEvaluation() *EvalReport { return &EvalReport{ClientId: "s", Report: []byte{0}} }

// validGolden are valid messages: Encode must give the fixture's bytes, and
// Decode must give the message back.
func validGolden() map[string]Message {
	return map[string]Message{
		"max_round.bin":   maxRound(),
		"max_status.bin":  maxStatus(),
		"max_update.bin":  maxUpdate(),
		"max_receipt.bin": maxReceipt(),
		"min_round.bin":   minRound(),
		"min_status.bin":  minStatus(),
		"min_update.bin":  minUpdate(),
		"min_receipt.bin": minReceipt(),
		"delta_update.bin": func() Message {
			u := maxUpdate()
			u.Kind, u.BaseRound = UpdateKind_UPDATE_KIND_DELTA, 0
			u.Report.StopReason = StopReason_STOP_REASON_UNSPECIFIED
			return u
		}(),
		"connection_status.bin": func() Message {
			st := maxStatus()
			st.Connection = math.MaxUint64
			return st
		}(),
		"run_round.bin": func() Message {
			r := maxRound()
			r.RunId = "RUNID234567ABCDEFGHIJKLMNO"
			return r
		}(),
		"will_status.bin": &ClientStatus{ClientId: "site-1", SampleCount: 54, Capabilities: []string{"sgd"}, Connection: 1795246965123},
		"rejected_receipt.bin": &Receipt{ClientId: "s", Round: 2, Reason: "base mismatch",
			StoredAtUnixMs: 0, Code: ReceiptCode_RECEIPT_CODE_BASE_MISMATCH, UpdateSeq: 1},

		// Schema runs: federation schema, statistics, evaluation, bundle, site errors.
		"stats_round.bin":        maxStatsRound(),
		"schema_round.bin":       maxTrainRound(),
		"finished_round.bin":     maxFinishedRound(),
		"min_stats_round.bin":    minStatsRound(),
		"min_finished_round.bin": minFinishedRound(),
		"max_statistics.bin":     maxStatistics(),
		"max_evaluation.bin":     maxEvaluation(),
		"min_statistics.bin":     minStatistics(),
		"min_evaluation.bin":     minEvaluation(),
		"error_status.bin":       errorStatus(),
		"reason_only_status.bin": &ClientStatus{ClientId: "s", ErrorReason: SiteErrData},
		"statistics_receipt.bin": &Receipt{ClientId: longID, Accepted: true, Reason: "stored",
			StoredAtUnixMs: math.MaxInt64, Code: ReceiptCode_RECEIPT_CODE_STORED, UpdateSeq: math.MaxUint64,
			Subject: ReceiptSubject_RECEIPT_SUBJECT_STATISTICS},
		"evaluation_receipt.bin": &Receipt{ClientId: "s", Round: 9, Reason: "bad report: not JSON",
			Code: ReceiptCode_RECEIPT_CODE_BAD_UPDATE, Subject: ReceiptSubject_RECEIPT_SUBJECT_EVALUATION},

		// One installation per site id: the installation's instance id (a cloned gateway).
		"instance_status.bin": func() Message {
			st := maxStatus()
			st.Connection, st.InstanceId = 7, "INSTANCE234567ABCDEFGHIJKL"
			return st
		}(),
		"instance_will_status.bin": &ClientStatus{ClientId: "site-1", Connection: 2, InstanceId: longID},

		// FedSplit's sample weighting (Params fields 8 and 9), which no
		// fixture set before TestGoldenCoversEveryField.
		"weighted_round.bin": func() Message {
			r := maxRound()
			r.Params.Clients, r.Params.TotalSamples = math.MaxUint32, math.MaxUint64
			return r
		}(),
		"instance_update.bin": func() Message {
			u := maxUpdate()
			u.InstanceId = "INSTANCE234567ABCDEFGHIJKL"
			return u
		}(),

		// Secure aggregation (docs/privacy.md).
		"secagg_round.bin": func() Message {
			r := maxRound()
			r.Secagg = &SecAggSpec{Threshold: 7, Degree: 4, GraphSeed: bytes.Repeat([]byte{0xa5}, 32), Clip: 1.5,
				ScaleBits: 24, MaxSites: 10, Attempt: 2}
			r.SecaggPhase, r.SecaggBroadcast = SecAggPhase_SECAGG_PHASE_UNMASK, []byte("EFSA\x01 unmask request")
			return r
		}(),
		"run_spec.bin": &RunSpec{Federation: "fed1", RunId: "RUNID234567ABCDEFGHIJKLMNO",
			Schema: []byte(`{"label":"y"}`), Transform: []byte(`{"outputs":1}`)},
		"digest_round.bin": func() Message {
			r := minRound()
			r.SchemaDigest = BodyDigest([]byte(`{"label":"y"}`))
			r.TransformDigest = BodyDigest([]byte(`{"outputs":1}`))
			return r
		}(),
		"secagg_message.bin": &SecAggMessage{ClientId: longID, RunId: "RUNID234567ABCDEFGHIJKLMNO", Round: math.MaxUint64,
			Kind: SecAggKindMaskedInput, Payload: []byte{0, 1, 2, 0xff}, SentAtUnixMs: math.MaxInt64, Attempt: math.MaxUint32},
		"secagg_receipt.bin": &Receipt{ClientId: "s", Round: 3, Accepted: true, Reason: "stored", StoredAtUnixMs: 1,
			Code: ReceiptCode_RECEIPT_CODE_STORED, Subject: ReceiptSubject_RECEIPT_SUBJECT_SECAGG, SecaggKind: SecAggKindShareKeys},
	}
}

// rawGolden are messages marshalled without validation, to pin the encoding
// of values Validate rejects (negative times, unknown and negative enum
// numbers, infinities, empty and control-character strings, empty bodies)
// and of every sub-message on its own. The raw codec must give the fixture's
// bytes and decode them back.
func rawGolden() map[string]rawEntry {
	type entry = rawEntry
	env := func() rawMsg { return &Envelope{} }
	return map[string]entry{
		"raw_envelope_zero.bin":      {&Envelope{}, env},
		"raw_envelope_nobody.bin":    {&Envelope{Version: math.MaxUint32}, env},
		"raw_envelope_round0.bin":    {&Envelope{Version: Version, Body: &Envelope_Round{Round: &RoundAnnouncement{}}}, env},
		"raw_envelope_status0.bin":   {&Envelope{Version: Version, Body: &Envelope_Status{Status: &ClientStatus{}}}, env},
		"raw_envelope_update0.bin":   {&Envelope{Version: Version, Body: &Envelope_Update{Update: &ClientUpdate{}}}, env},
		"raw_envelope_receipt0.bin":  {&Envelope{Version: Version, Body: &Envelope_Receipt{Receipt: &Receipt{}}}, env},
		"raw_envelope_max_round.bin": {&Envelope{Version: 7, Body: &Envelope_Round{Round: maxRound()}}, env},
		"raw_round_hostile.bin": {&Envelope{Version: Version, Body: &Envelope_Round{Round: &RoundAnnouncement{
			Federation: "not an id/+#", Aggregator: "ctl\x01\n",
			Params:          &Params{Mu: -1, Step: math.Inf(1), Relax: math.Inf(-1), Gamma: -math.MaxFloat64, Lr: -math.SmallestNonzeroFloat64, Solver: "\x00"},
			Model:           &ModelSpec{Hidden: []uint32{math.MaxUint32, 0}, L2: -0.5},
			Budget:          &WorkBudget{MaxSeconds: math.Inf(-1)},
			DeadlineUnixMs:  -1,
			CreatedAtUnixMs: math.MinInt64,
			Selected:        []string{"", "dup", "dup"},
			Global:          &Vector{},
			AnchorSketch:    &SketchSpec{},
		}}}, env},
		"raw_update_hostile.bin": {&Envelope{Version: Version, Body: &Envelope_Update{Update: &ClientUpdate{
			ClientId: "a b", Kind: UpdateKind(-1), Vector: &Vector{Codec: "", Dimension: 0, Payload: nil},
			Report:       &WorkReport{StopReason: StopReason(math.MinInt32), LocalLoss: math.Inf(1), Seconds: -1, Epochs: 1},
			AnchorGrad:   []float64{math.Inf(1), math.Inf(-1), negZero},
			BaseRound:    5,
			SentAtUnixMs: -1,
		}}}, env},
		"raw_receipt_hostile.bin": {&Envelope{Version: Version, Body: &Envelope_Receipt{Receipt: &Receipt{
			ClientId: "x", Code: ReceiptCode(math.MaxInt32), StoredAtUnixMs: -2, Accepted: true,
		}}}, env},
		"raw_receipt_negcode.bin": {&Envelope{Version: Version, Body: &Envelope_Receipt{Receipt: &Receipt{Code: -5}}}, env},
		"raw_status_hostile.bin": {&Envelope{Version: Version, Body: &Envelope_Status{Status: &ClientStatus{
			Capabilities: []string{"", "", "\x7f"}, TimestampUnixMs: math.MinInt64,
		}}}, env},
		"raw_vector.bin": {&Vector{Codec: "f64 ✓", Dimension: math.MaxUint32, Payload: allBytes()},
			func() rawMsg { return &Vector{} }},
		"raw_params.bin":       {maxParams(), func() rawMsg { return &Params{} }},
		"raw_modelspec.bin":    {maxModel(), func() rawMsg { return &ModelSpec{} }},
		"raw_workbudget.bin":   {maxBudget(), func() rawMsg { return &WorkBudget{} }},
		"raw_sketchspec.bin":   {maxSketch(), func() rawMsg { return &SketchSpec{} }},
		"raw_workreport.bin":   {maxReport(), func() rawMsg { return &WorkReport{} }},
		"raw_round.bin":        {maxRound(), func() rawMsg { return &RoundAnnouncement{} }},
		"raw_status.bin":       {maxStatus(), func() rawMsg { return &ClientStatus{} }},
		"raw_update.bin":       {maxUpdate(), func() rawMsg { return &ClientUpdate{} }},
		"raw_receipt.bin":      {maxReceipt(), func() rawMsg { return &Receipt{} }},
		"raw_params_empty.bin": {&Params{}, func() rawMsg { return &Params{} }},

		// Schema runs.
		"raw_envelope_statistics0.bin": {&Envelope{Version: Version, Body: &Envelope_Statistics{Statistics: &SiteStatistics{}}}, env},
		"raw_envelope_evaluation0.bin": {&Envelope{Version: Version, Body: &Envelope_Evaluation{Evaluation: &EvalReport{}}}, env},
		"raw_round_issue11_hostile.bin": {&Envelope{Version: Version, Body: &Envelope_Round{Round: &RoundAnnouncement{
			Round: 3, Phase: Phase(-1), Evaluate: true, EvalRound: math.MaxUint32,
			Bundle: []byte{0}, Transform: []byte("{}"),
		}}}, env},
		"raw_round_phase_unknown.bin": {&Envelope{Version: Version, Body: &Envelope_Round{Round: &RoundAnnouncement{
			Phase: Phase(math.MaxInt32), Schema: []byte{0xff},
		}}}, env},
		"raw_statistics_hostile.bin": {&Envelope{Version: Version, Body: &Envelope_Statistics{Statistics: &SiteStatistics{
			ClientId: "a b", RunId: "x\ny", SchemaDigest: "ZZ", SentAtUnixMs: math.MinInt64,
		}}}, env},
		"raw_evaluation_hostile.bin": {&Envelope{Version: Version, Body: &Envelope_Evaluation{Evaluation: &EvalReport{
			ClientId: "", Round: math.MaxUint64, SentAtUnixMs: -1,
		}}}, env},
		"raw_receipt_subject.bin": {&Envelope{Version: Version, Body: &Envelope_Receipt{Receipt: &Receipt{
			ClientId: "x", Subject: ReceiptSubject(-7),
		}}}, env},
		"raw_status_error_hostile.bin": {&Envelope{Version: Version, Body: &Envelope_Status{Status: &ClientStatus{
			ClientId: "s", ErrorReason: "no such reason", ErrorMessage: "line 1\nline 2",
		}}}, env},
		"raw_round_issue11.bin": {maxFinishedRound(), func() rawMsg { return &RoundAnnouncement{} }},
		"raw_statistics.bin":    {maxStatistics(), func() rawMsg { return &SiteStatistics{} }},
		"raw_evaluation.bin":    {maxEvaluation(), func() rawMsg { return &EvalReport{} }},
		"raw_status_error.bin":  {errorStatus(), func() rawMsg { return &ClientStatus{} }},
		"raw_receipt_issue11.bin": {&Receipt{ClientId: "s", Subject: ReceiptSubject_RECEIPT_SUBJECT_EVALUATION},
			func() rawMsg { return &Receipt{} }},
	}
}

// rawEntry is a message marshalled without validation and the empty
// message its fixture unmarshals into.
type rawEntry = struct {
	msg   rawMsg
	empty func() rawMsg
}

// golden returns the fixture's bytes, writing want first under -update when
// the fixture does not exist yet.
func golden(t *testing.T, name string, want []byte) []byte {
	t.Helper()
	path := filepath.Join("testdata", "golden", name)
	if *update {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("wrote %s", path)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestGoldenValid(t *testing.T) {
	for name, m := range validGolden() {
		t.Run(name, func(t *testing.T) {
			enc := mustEncode(t, m)
			want := golden(t, name, enc)
			if !bytes.Equal(enc, want) {
				t.Fatalf("Encode differs from the fixture:\n got %x\nwant %x", enc, want)
			}
			got, err := Decode(want, Limits{})
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !msgEqual(got, m) {
				t.Fatalf("Decode gives\n%v\nwant\n%v", got, m)
			}
			if again := mustEncode(t, got); !bytes.Equal(again, want) {
				t.Fatalf("re-encoding the decoded message differs")
			}
		})
	}
}

func TestGoldenRaw(t *testing.T) {
	for name, e := range rawGolden() {
		t.Run(name, func(t *testing.T) { checkRawGolden(t, name, e.msg, e.empty) })
	}
}

// checkRawGolden checks that msg marshals to the fixture name (written
// under -update when missing) and that the fixture unmarshals into empty()
// as msg; it returns the fixture's bytes.
func checkRawGolden(t *testing.T, name string, msg rawMsg, empty func() rawMsg) []byte {
	t.Helper()
	enc := rawMarshal(t, msg)
	want := golden(t, name, enc)
	if !bytes.Equal(enc, want) {
		t.Fatalf("marshal differs from the fixture:\n got %x\nwant %x", enc, want)
	}
	got := empty()
	if err := rawUnmarshal(want, got); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	if !msgEqual(got, msg) {
		t.Fatalf("unmarshal gives\n%v\nwant\n%v", got, msg)
	}
	return want
}

// TestGoldenFilesUsed makes sure that every fixture is checked by a test.
func TestGoldenFilesUsed(t *testing.T) {
	names, err := filepath.Glob(filepath.Join("testdata", "golden", "*"))
	if err != nil {
		t.Fatal(err)
	}
	valid, raw := validGolden(), rawGolden()
	names = slices.DeleteFunc(names, func(p string) bool { // fields/: TestGoldenFields
		fi, err := os.Stat(p)
		return err == nil && fi.IsDir()
	})
	for _, p := range names {
		n := filepath.Base(p)
		_, v := valid[n]
		_, r := raw[n]
		if !v && !r {
			t.Errorf("fixture %s is not checked by any test", p)
		}
	}
	if len(names) != len(valid)+len(raw) {
		t.Errorf("%d fixtures for %d golden messages", len(names), len(valid)+len(raw))
	}
}

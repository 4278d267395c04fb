package wire

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

func sampleStatistics() *SiteStatistics {
	return &SiteStatistics{
		ClientId: "site-1", RunId: "0123456789ABCDEFGHJKMNPQRS", SchemaDigest: digest,
		Stats: []byte(`{"n":120}`), SentAtUnixMs: 1704067201000,
	}
}

func sampleEvaluation() *EvalReport {
	return &EvalReport{
		ClientId: "site-1", RunId: "0123456789ABCDEFGHJKMNPQRS", Round: 10,
		Report: []byte(`{"n":30,"loss":0.2}`), SentAtUnixMs: 1704067202000,
	}
}

// checkValidity marshals m without validation and checks what Decode and
// Encode say: both accept it (ok) or both refuse it (Decode says
// ErrMalformed for invalid UTF-8, which proto3 forbids on the wire).
func checkValidity(t *testing.T, m Message, ok bool, lim Limits) {
	t.Helper()
	b := rawEnvelope(t, &Envelope{Version: Version, Body: m.wrap()})
	got, err := Decode(b, lim)
	if ok {
		if err != nil {
			t.Fatalf("Decode: %v", err)
		}
		if !msgEqual(got, m) {
			t.Fatalf("Decode gives %v, want %v", got, m)
		}
		if _, err := Encode(m); err != nil {
			t.Fatalf("Encode: %v", err)
		}
		return
	}
	if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrMalformed) || got != nil {
		t.Fatalf("Decode = %v, %v; want nil, ErrInvalid", got, err)
	}
	if lim == (Limits{}) {
		if _, err := Encode(m); !errors.Is(err, ErrInvalid) {
			t.Fatalf("Encode = %v, want ErrInvalid", err)
		}
	}
}

func TestValidateRoundPhases(t *testing.T) {
	stats := func(r *RoundAnnouncement) {
		*r = RoundAnnouncement{Federation: "fed1", Phase: Phase_PHASE_STATISTICS, Schema: schemaJSON, RunId: "R1"}
	}
	withSchema := func(r *RoundAnnouncement) { r.Schema, r.Transform = schemaJSON, transformJSON }
	finished := func(r *RoundAnnouncement) { withSchema(r); r.Phase = Phase_PHASE_FINISHED }
	tests := []struct {
		name   string
		mutate func(*RoundAnnouncement)
		ok     bool
	}{
		// PHASE_TRAIN, what every announcement was so far.
		{"train legacy", func(r *RoundAnnouncement) {}, true},
		{"train with schema and transform", withSchema, true},
		{"train evaluates", func(r *RoundAnnouncement) { withSchema(r); r.Evaluate, r.EvalRound = true, 6 }, true},
		{"train eval round = round", func(r *RoundAnnouncement) { withSchema(r); r.Evaluate, r.EvalRound = true, 7 }, true},
		{"train eval round beyond round", func(r *RoundAnnouncement) { withSchema(r); r.Evaluate, r.EvalRound = true, 8 }, false},
		{"train round 0", func(r *RoundAnnouncement) { withSchema(r); r.Round = 0 }, false},
		{"train no global", func(r *RoundAnnouncement) { withSchema(r); r.Global = nil }, false},
		{"train no uplink codec", func(r *RoundAnnouncement) { withSchema(r); r.UplinkCodec = "" }, false},
		{"train with bundle", func(r *RoundAnnouncement) { withSchema(r); r.Bundle = bundleJSON }, false},
		{"train schema only", func(r *RoundAnnouncement) { r.Schema = schemaJSON }, true},
		{"transform without schema", func(r *RoundAnnouncement) { r.Transform = transformJSON }, false},
		{"evaluate without schema", func(r *RoundAnnouncement) { r.Evaluate = true }, false},
		{"evaluate without transform", func(r *RoundAnnouncement) { r.Schema, r.Evaluate = schemaJSON, true }, false},
		{"unknown phase", func(r *RoundAnnouncement) { withSchema(r); r.Phase = 3 }, false},
		{"negative phase", func(r *RoundAnnouncement) { r.Phase = -1 }, false},

		// PHASE_STATISTICS.
		{"statistics minimal", stats, true},
		{"statistics with model and algorithm", func(r *RoundAnnouncement) {
			stats(r)
			r.Algorithm, r.Model, r.Params, r.UplinkCodec = "fedavg", &ModelSpec{Kind: "logreg"}, &Params{Mu: 0.1}, "f64"
		}, true},
		{"statistics no run id", func(r *RoundAnnouncement) { stats(r); r.RunId = "" }, true},
		{"statistics round 1", func(r *RoundAnnouncement) { stats(r); r.Round = 1 }, false},
		{"statistics no schema", func(r *RoundAnnouncement) { stats(r); r.Schema = nil }, false},
		{"statistics with transform", func(r *RoundAnnouncement) { stats(r); r.Transform = transformJSON }, false},
		{"statistics with bundle", func(r *RoundAnnouncement) { stats(r); r.Bundle = bundleJSON }, false},
		{"statistics evaluates", func(r *RoundAnnouncement) { stats(r); r.Evaluate = true }, false},
		{"statistics eval round", func(r *RoundAnnouncement) { stats(r); r.EvalRound = 1 }, false},
		{"statistics bad federation", func(r *RoundAnnouncement) { stats(r); r.Federation = "a/b" }, false},
		{"statistics bad algorithm", func(r *RoundAnnouncement) { stats(r); r.Algorithm = "fed avg" }, false},
		{"statistics empty model kind", func(r *RoundAnnouncement) { stats(r); r.Model = &ModelSpec{} }, false},
		{"statistics bad global", func(r *RoundAnnouncement) { stats(r); r.Global = &Vector{Codec: "f64"} }, false},
		{"statistics valid global", func(r *RoundAnnouncement) {
			stats(r)
			r.Global = &Vector{Codec: "f64", Dimension: 1, Payload: []byte{0}}
		}, true},

		// PHASE_FINISHED.
		{"finished", finished, true},
		{"finished with bundle", func(r *RoundAnnouncement) { finished(r); r.Bundle = bundleJSON }, true},
		{"finished final evaluation", func(r *RoundAnnouncement) { finished(r); r.Evaluate, r.EvalRound = true, 7 }, true},
		{"finished without schema", func(r *RoundAnnouncement) { r.Phase = Phase_PHASE_FINISHED }, true},
		{"finished legacy with bundle", func(r *RoundAnnouncement) { r.Phase, r.Bundle = Phase_PHASE_FINISHED, bundleJSON }, true},
		{"finished no uplink codec", func(r *RoundAnnouncement) { finished(r); r.UplinkCodec = "" }, true},
		{"finished round 0", func(r *RoundAnnouncement) { finished(r); r.Round = 0 }, false},
		{"finished no global", func(r *RoundAnnouncement) { finished(r); r.Global = nil }, false},
		{"finished no model", func(r *RoundAnnouncement) { finished(r); r.Model = nil }, false},
		{"finished no algorithm", func(r *RoundAnnouncement) { finished(r); r.Algorithm = "" }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := sampleRound()
			tt.mutate(r)
			checkValidity(t, r, tt.ok, Limits{})
		})
	}
}

// TestRoundPayloadLimits checks that schema, transform and bundle are
// bounded by MaxMessageBytes (the receiver's limit).
func TestRoundPayloadLimits(t *testing.T) {
	r := sampleRound()
	r.Phase, r.Schema, r.Transform, r.Bundle = Phase_PHASE_FINISHED, []byte("{}"), []byte("{}"), make([]byte, 4096)
	if err := r.Validate(Limits{MaxMessageBytes: 4096}); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	for _, f := range []func(*RoundAnnouncement){
		func(r *RoundAnnouncement) { r.Bundle = make([]byte, 4097) },
		func(r *RoundAnnouncement) { r.Schema = make([]byte, 4097) },
		func(r *RoundAnnouncement) { r.Transform = make([]byte, 4097) },
	} {
		c := *r
		f(&c)
		if err := c.Validate(Limits{MaxMessageBytes: 4096}); !errors.Is(err, ErrInvalid) {
			t.Errorf("over the limit: %v", err)
		}
	}
}

func TestValidateStatistics(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*SiteStatistics)
		ok     bool
	}{
		{"sample", func(*SiteStatistics) {}, true},
		{"no run id", func(s *SiteStatistics) { s.RunId = "" }, true},
		{"no time", func(s *SiteStatistics) { s.SentAtUnixMs = 0 }, true},
		{"no client", func(s *SiteStatistics) { s.ClientId = "" }, false},
		{"client wildcard", func(s *SiteStatistics) { s.ClientId = "site+" }, false},
		{"run id too long", func(s *SiteStatistics) { s.RunId = strings.Repeat("r", 65) }, false},
		{"run id control character", func(s *SiteStatistics) { s.RunId = "a\tb" }, false},
		{"no digest", func(s *SiteStatistics) { s.SchemaDigest = "" }, false},
		{"short digest", func(s *SiteStatistics) { s.SchemaDigest = digest[:63] }, false},
		{"uppercase digest", func(s *SiteStatistics) { s.SchemaDigest = strings.ToUpper(digest) }, false},
		{"digest not hex", func(s *SiteStatistics) { s.SchemaDigest = "g" + digest[1:] }, false},
		{"no stats", func(s *SiteStatistics) { s.Stats = nil }, false},
		{"empty stats", func(s *SiteStatistics) { s.Stats = []byte{} }, false},
		{"negative time", func(s *SiteStatistics) { s.SentAtUnixMs = -1 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := sampleStatistics()
			tt.mutate(s)
			checkValidity(t, s, tt.ok, Limits{})
		})
	}
	s := sampleStatistics()
	s.Stats = make([]byte, 100)
	checkValidity(t, s, true, Limits{MaxMessageBytes: 300})
	s.Stats = make([]byte, 301)
	if err := s.Validate(Limits{MaxMessageBytes: 300}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("stats over the limit: %v", err)
	}
}

func TestValidateEvaluation(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*EvalReport)
		ok     bool
	}{
		{"sample", func(*EvalReport) {}, true},
		{"round 0", func(e *EvalReport) { e.Round = 0 }, true},
		{"largest round", func(e *EvalReport) { e.Round = math.MaxUint64 }, true},
		{"no run id", func(e *EvalReport) { e.RunId = "" }, true},
		{"no client", func(e *EvalReport) { e.ClientId = "" }, false},
		{"client slash", func(e *EvalReport) { e.ClientId = "a/b" }, false},
		{"run id invalid UTF-8", func(e *EvalReport) { e.RunId = "a\xff" }, false},
		{"no report", func(e *EvalReport) { e.Report = nil }, false},
		{"negative time", func(e *EvalReport) { e.SentAtUnixMs = -5 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := sampleEvaluation()
			tt.mutate(e)
			checkValidity(t, e, tt.ok, Limits{})
		})
	}
	e := sampleEvaluation()
	e.Report = make([]byte, 301)
	if err := e.Validate(Limits{MaxMessageBytes: 300}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("report over the limit: %v", err)
	}
}

func TestValidateReceiptSubject(t *testing.T) {
	tests := []struct {
		name string
		r    *Receipt
		ok   bool
	}{
		{"update round 0", &Receipt{ClientId: "a"}, false},
		{"statistics round 0 stored", &Receipt{ClientId: "a", Accepted: true, StoredAtUnixMs: 1,
			Code: ReceiptCode_RECEIPT_CODE_STORED, Subject: ReceiptSubject_RECEIPT_SUBJECT_STATISTICS}, true},
		{"statistics round 0 rejected", &Receipt{ClientId: "a", Reason: "schema digest differs",
			Code: ReceiptCode_RECEIPT_CODE_BAD_UPDATE, Subject: ReceiptSubject_RECEIPT_SUBJECT_STATISTICS}, true},
		{"statistics duplicate", &Receipt{ClientId: "a", Accepted: true, StoredAtUnixMs: 1,
			Code: ReceiptCode_RECEIPT_CODE_DUPLICATE, Subject: ReceiptSubject_RECEIPT_SUBJECT_STATISTICS}, true},
		{"evaluation round 4", &Receipt{ClientId: "a", Round: 4, Accepted: true, StoredAtUnixMs: 1,
			Code: ReceiptCode_RECEIPT_CODE_STORED, Subject: ReceiptSubject_RECEIPT_SUBJECT_EVALUATION}, true},
		{"evaluation round 0", &Receipt{ClientId: "a", Subject: ReceiptSubject_RECEIPT_SUBJECT_EVALUATION,
			Code: ReceiptCode_RECEIPT_CODE_STALE_ROUND}, true},
		{"statistics accepted without time", &Receipt{ClientId: "a", Accepted: true,
			Subject: ReceiptSubject_RECEIPT_SUBJECT_STATISTICS}, false},
		{"statistics rejected with stored code", &Receipt{ClientId: "a", Code: ReceiptCode_RECEIPT_CODE_STORED,
			Subject: ReceiptSubject_RECEIPT_SUBJECT_STATISTICS}, false},
		{"unknown subject", &Receipt{ClientId: "a", Round: 1, Subject: 3}, false},
		{"negative subject", &Receipt{ClientId: "a", Round: 1, Subject: -1}, false},
		{"statistics bad client", &Receipt{ClientId: "", Subject: ReceiptSubject_RECEIPT_SUBJECT_STATISTICS}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkValidity(t, tt.r, tt.ok, Limits{}) })
	}
}

func TestValidateStatusError(t *testing.T) {
	msg := func(n int) string { return strings.Repeat("m", n) }
	tests := []struct {
		name           string
		reason, detail string
		ok             bool
	}{
		{"no error", "", "", true},
		{"reason only", SiteErrTooFewRows, "", true},
		{"reason and message", SiteErrBadValue, `site.csv line 12 column "radius": expected a number or a missing token`, true},
		{"message of 512 bytes", SiteErrData, msg(512), true},
		{"message of 512 bytes of UTF-8", SiteErrData, strings.Repeat("é", 256), true},
		{"message of 513 bytes", SiteErrData, msg(513), false},
		{"message without reason", "", "something", false},
		{"unknown reason", "disk_full", "", false},
		{"reason in upper case", "DISK", "", false},
		{"message invalid UTF-8", SiteErrDisk, "write \xff", false},
		{"message on two lines", SiteErrDisk, "a\nb", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := sampleStatus()
			st.ErrorReason, st.ErrorMessage = tt.reason, tt.detail
			checkValidity(t, st, tt.ok, Limits{})
		})
	}
	for _, r := range SiteErrReasons() {
		st := sampleStatus()
		st.Online, st.ErrorReason, st.ErrorMessage = true, r, "x"
		checkValidity(t, st, true, Limits{})
	}
}

func TestSiteErrReasons(t *testing.T) {
	want := []string{"schema_mismatch", "bad_value", "unknown_label", "too_few_rows", "bad_transform", "solve_failed", "disk", "data", "secagg_refused"}
	got := SiteErrReasons()
	if !slices.Equal(got, want) {
		t.Fatalf("SiteErrReasons() = %v, want %v", got, want)
	}
	got[0] = "changed"
	if SiteErrReasons()[0] != SiteErrSchema {
		t.Fatal("SiteErrReasons returns the package's slice")
	}
	for _, c := range []string{SiteErrSchema, SiteErrBadValue, SiteErrUnknownLabel, SiteErrTooFewRows, SiteErrBadTransform, SiteErrSolve, SiteErrDisk, SiteErrData, SiteErrSecAgg} {
		if !slices.Contains(want, c) {
			t.Errorf("constant %q not listed", c)
		}
	}
}

func TestTopicsDecodeSiteMessages(t *testing.T) {
	tp, err := ForFederation("fed1")
	if err != nil {
		t.Fatal(err)
	}
	const topic = "edgefl/fed1/updates/site-1"
	for _, m := range []Message{sampleUpdate(), sampleStatistics(), sampleEvaluation()} {
		kind, got, err := tp.Decode(topic, mustEncode(t, m), Limits{})
		if err != nil || kind != KindUpdate {
			t.Fatalf("%T: Decode = %v, %v, %v", m, kind, got, err)
		}
		if !msgEqual(got, m) {
			t.Fatalf("%T: decoded %v", m, got)
		}
		if BodyKind(got) != BodyKind(m) {
			t.Fatalf("BodyKind(%T) = %q", got, BodyKind(got))
		}
		_, got, err = tp.Decode("edgefl/fed1/updates/site-2", mustEncode(t, m), Limits{})
		if !errors.Is(err, ErrTopicMismatch) || got != nil {
			t.Fatalf("%T as another client: %v, %v", m, got, err)
		}
		if !strings.Contains(err.Error(), BodyKind(m)) {
			t.Errorf("mismatch error %q does not name the body %q", err, BodyKind(m))
		}
	}
	// Neither statistics nor an evaluation report is anything but an
	// update-topic message.
	for _, topic := range []string{"edgefl/fed1/round", "edgefl/fed1/clients/site-1/status", "edgefl/fed1/receipts/site-1"} {
		for _, m := range []Message{sampleStatistics(), sampleEvaluation()} {
			if _, got, err := tp.Decode(topic, mustEncode(t, m), Limits{}); !errors.Is(err, ErrWrongType) || got != nil {
				t.Errorf("%T on %s: %v, %v", m, topic, got, err)
			}
		}
	}
	for _, m := range []Message{sampleRound(), sampleStatus(), sampleReceipt()} {
		if _, got, err := tp.Decode(topic, mustEncode(t, m), Limits{}); !errors.Is(err, ErrWrongType) || got != nil {
			t.Errorf("%T on the update topic: %v, %v", m, got, err)
		}
	}
	// An invalid statistics message fails validation on the topic too.
	bad := sampleStatistics()
	bad.Stats = nil
	b := rawEnvelope(t, &Envelope{Version: Version, Body: bad.wrap()})
	if _, got, err := tp.Decode(topic, b, Limits{}); !errors.Is(err, ErrInvalid) || got != nil {
		t.Errorf("statistics without stats: %v, %v", got, err)
	}
}

func TestTypedDecoders(t *testing.T) {
	s, err := DecodeStatistics(mustEncode(t, sampleStatistics()), Limits{})
	if err != nil || !msgEqual(s, sampleStatistics()) {
		t.Fatalf("DecodeStatistics = %v, %v", s, err)
	}
	e, err := DecodeEvaluation(mustEncode(t, sampleEvaluation()), Limits{})
	if err != nil || !msgEqual(e, sampleEvaluation()) {
		t.Fatalf("DecodeEvaluation = %v, %v", e, err)
	}
	if _, err := DecodeStatistics(mustEncode(t, sampleEvaluation()), Limits{}); !errors.Is(err, ErrWrongType) {
		t.Fatalf("DecodeStatistics(evaluation) = %v", err)
	}
	if _, err := DecodeUpdate(mustEncode(t, sampleStatistics()), Limits{}); !errors.Is(err, ErrWrongType) {
		t.Fatalf("DecodeUpdate(statistics) = %v", err)
	}
	if _, err := DecodeSiteMessage(mustEncode(t, sampleReceipt()), Limits{}); !errors.Is(err, ErrWrongType) ||
		!strings.Contains(err.Error(), "ClientUpdate or SiteStatistics or EvalReport") {
		t.Fatalf("DecodeSiteMessage(receipt) = %v", err)
	}
	for _, m := range []Message{sampleUpdate(), sampleStatistics(), sampleEvaluation()} {
		got, err := DecodeSiteMessage(mustEncode(t, m), Limits{})
		if err != nil || !msgEqual(got, m) {
			t.Fatalf("DecodeSiteMessage(%T) = %v, %v", m, got, err)
		}
	}
	env := &Envelope{Version: Version, Body: sampleStatistics().wrap()}
	if env.GetStatistics() == nil || env.GetEvaluation() != nil || env.GetUpdate() != nil {
		t.Fatal("Envelope getters for statistics")
	}
	env.Body = sampleEvaluation().wrap()
	if env.GetEvaluation().GetReport() == nil || env.GetStatistics() != nil {
		t.Fatal("Envelope getters for evaluation")
	}
}

func TestBodyKind(t *testing.T) {
	for m, want := range map[any]string{
		sampleRound(): "round", sampleStatus(): "status", sampleUpdate(): "update", sampleReceipt(): "receipt",
		sampleStatistics(): "statistics", sampleEvaluation(): "evaluation",
		(*EvalReport)(nil): "", nil: "", "x": "", &Vector{}: "",
	} {
		if got := BodyKind(m); got != want {
			t.Errorf("BodyKind(%T) = %q, want %q", m, got, want)
		}
	}
}

func TestStringIssue11(t *testing.T) {
	r := &RoundAnnouncement{Federation: "f", RunId: "R", Schema: []byte(`{"a":1}`), Transform: []byte("{}"),
		Phase: Phase_PHASE_FINISHED, Evaluate: true, Bundle: []byte("B"), EvalRound: 3}
	if got, want := r.String(), `federation:"f" run_id:"R" schema:"{\"a\":1}" transform:"{}" phase:PHASE_FINISHED evaluate:true bundle:"B" eval_round:3`; got != want {
		t.Errorf("RoundAnnouncement.String() =\n%s\nwant\n%s", got, want)
	}
	if got, want := sampleStatistics().String(), `client_id:"site-1" run_id:"0123456789ABCDEFGHJKMNPQRS" schema_digest:"`+digest+`" stats:"{\"n\":120}" sent_at_unix_ms:1704067201000`; got != want {
		t.Errorf("SiteStatistics.String() =\n%s\nwant\n%s", got, want)
	}
	env := &Envelope{Version: 1, Body: sampleEvaluation().wrap()}
	if got, want := env.String(), `version:1 evaluation:{client_id:"site-1" run_id:"0123456789ABCDEFGHJKMNPQRS" round:10 report:"{\"n\":30,\"loss\":0.2}" sent_at_unix_ms:1704067202000}`; got != want {
		t.Errorf("Envelope.String() =\n%s\nwant\n%s", got, want)
	}
	st := &ClientStatus{ClientId: "s", ErrorReason: SiteErrDisk, ErrorMessage: "disk full"}
	if got, want := st.String(), `client_id:"s" error_reason:"disk" error_message:"disk full"`; got != want {
		t.Errorf("ClientStatus.String() = %s", got)
	}
	rc := &Receipt{ClientId: "s", Subject: ReceiptSubject_RECEIPT_SUBJECT_STATISTICS}
	if got, want := rc.String(), `client_id:"s" subject:RECEIPT_SUBJECT_STATISTICS`; got != want {
		t.Errorf("Receipt.String() = %s", got)
	}
	if Phase(9).String() != "9" || Phase_PHASE_STATISTICS.String() != "PHASE_STATISTICS" || *Phase_PHASE_FINISHED.Enum() != Phase_PHASE_FINISHED {
		t.Error("Phase String/Enum")
	}
	if ReceiptSubject_RECEIPT_SUBJECT_EVALUATION.String() != "RECEIPT_SUBJECT_EVALUATION" || *ReceiptSubject_RECEIPT_SUBJECT_UPDATE.Enum() != 0 {
		t.Error("ReceiptSubject String/Enum")
	}
	for v, name := range Phase_name {
		if Phase_value[name] != v {
			t.Errorf("Phase %d %s", v, name)
		}
	}
	for v, name := range ReceiptSubject_name {
		if ReceiptSubject_value[name] != v {
			t.Errorf("ReceiptSubject %d %s", v, name)
		}
	}
}

// TestOldReceiverReadsNewFields checks the compatibility promise of adding
// fields: the bytes of a legacy message are unchanged when the new fields
// are at their defaults, and a message with the new fields set still
// decodes for a receiver that ignores them (they are skipped as unknown by
// the old code; here: unknown fields of a future revision are skipped by
// the new types).
func TestOldReceiverReadsNewFields(t *testing.T) {
	for _, m := range []Message{sampleRound(), sampleStatus(), sampleReceipt()} {
		b := mustEncode(t, m)
		b = field(b, 99, "future")
		if _, err := Decode(b, Limits{}); err != nil {
			t.Errorf("%T with an unknown field: %v", m, err)
		}
	}
	for _, m := range []Message{sampleStatistics(), sampleEvaluation()} {
		b := mustEncode(t, m)
		body := field(marshal(m), 42, uint64(7))
		body = field(body, 43, "x")
		if got, err := Decode(envelopeOf(fieldOf(t, m), body), Limits{}); err != nil || !msgEqual(got, m) {
			t.Errorf("%T with unknown fields: %v, %v", m, got, err)
		}
		if got, err := Decode(b, Limits{}); err != nil || !msgEqual(got, m) {
			t.Errorf("%T: %v, %v", m, got, err)
		}
	}
}

func fieldOf(t *testing.T, m Message) protowire.Number {
	t.Helper()
	_, n := (&Envelope{Body: m.wrap()}).message()
	return n
}

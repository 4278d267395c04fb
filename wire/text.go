package wire

// String methods of the messages: a one-line form in the style of the
// protobuf text format (field:value, sub-messages in braces, fields at their
// default value left out), for logs and test failures. Like protobuf-go's,
// it is not meant to be parsed and may change.

import (
	"math"
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
)

type textWriter struct{ b []byte }

func (w *textWriter) name(n string) {
	if len(w.b) > 0 && w.b[len(w.b)-1] != '{' {
		w.b = append(w.b, ' ')
	}
	w.b = append(w.b, n...)
	w.b = append(w.b, ':')
}

func (w *textWriter) str(n, v string) {
	if v != "" {
		w.name(n)
		w.b = strconv.AppendQuote(w.b, v)
	}
}

func (w *textWriter) strs(n string, vs []string) {
	for _, v := range vs {
		w.name(n)
		w.b = strconv.AppendQuote(w.b, v)
	}
}

func (w *textWriter) bytes(n string, v []byte) {
	if len(v) > 0 {
		w.name(n)
		w.b = strconv.AppendQuote(w.b, string(v))
	}
}

func (w *textWriter) uint(n string, v uint64) {
	if v != 0 {
		w.name(n)
		w.b = strconv.AppendUint(w.b, v, 10)
	}
}

func (w *textWriter) int(n string, v int64) {
	if v != 0 {
		w.name(n)
		w.b = strconv.AppendInt(w.b, v, 10)
	}
}

func (w *textWriter) boolean(n string, v bool) {
	if v {
		w.name(n)
		w.b = append(w.b, "true"...)
	}
}

func (w *textWriter) appendFloat(v float64) {
	switch {
	case math.IsInf(v, 1):
		w.b = append(w.b, "inf"...)
	case math.IsInf(v, -1):
		w.b = append(w.b, "-inf"...)
	case math.IsNaN(v):
		w.b = append(w.b, "nan"...)
	default:
		w.b = strconv.AppendFloat(w.b, v, 'g', -1, 64)
	}
}

func (w *textWriter) float(n string, v float64) {
	if !isZeroDouble(v) {
		w.name(n)
		w.appendFloat(v)
	}
}

func (w *textWriter) floats(n string, vs []float64) {
	for _, v := range vs {
		w.name(n)
		w.appendFloat(v)
	}
}

func (w *textWriter) uints(n string, vs []uint32) {
	for _, v := range vs {
		w.name(n)
		w.b = strconv.AppendUint(w.b, uint64(v), 10)
	}
}

// enum writes a non-zero enum value by name (by number if unknown).
func (w *textWriter) enum(n string, v int32, names map[int32]string) {
	if v != 0 {
		w.name(n)
		w.b = append(w.b, enumString(names, v)...)
	}
}

type texter interface{ appendText(w *textWriter) }

// msg writes a present sub-message in braces.
func (w *textWriter) msg(n string, present bool, m texter) {
	if present {
		w.name(n)
		w.b = append(w.b, '{')
		m.appendText(w)
		w.b = append(w.b, '}')
	}
}

func text(present bool, m texter) string {
	if !present {
		return "<nil>"
	}
	var w textWriter
	m.appendText(&w)
	return string(w.b)
}

func (x *Envelope) String() string          { return text(x != nil, x) }
func (x *Vector) String() string            { return text(x != nil, x) }
func (x *Params) String() string            { return text(x != nil, x) }
func (x *ModelSpec) String() string         { return text(x != nil, x) }
func (x *WorkBudget) String() string        { return text(x != nil, x) }
func (x *SketchSpec) String() string        { return text(x != nil, x) }
func (x *RoundAnnouncement) String() string { return text(x != nil, x) }
func (x *ClientStatus) String() string      { return text(x != nil, x) }
func (x *WorkReport) String() string        { return text(x != nil, x) }
func (x *ClientUpdate) String() string      { return text(x != nil, x) }
func (x *Receipt) String() string           { return text(x != nil, x) }
func (x *SiteStatistics) String() string    { return text(x != nil, x) }
func (x *EvalReport) String() string        { return text(x != nil, x) }

func (x *Envelope) appendText(w *textWriter) {
	w.uint("version", uint64(x.Version))
	if m, num := x.message(); m != nil {
		w.msg(bodyFieldNames[num], true, m)
	}
}

var bodyFieldNames = map[protowire.Number]string{
	fieldRound: "round", fieldStatus: "status", fieldUpdate: "update", fieldReceipt: "receipt",
	fieldStatistics: "statistics", fieldEvaluation: "evaluation",
}

func (x *Vector) appendText(w *textWriter) {
	w.str("codec", x.Codec)
	w.uint("dimension", uint64(x.Dimension))
	w.bytes("payload", x.Payload)
}

func (x *Params) appendText(w *textWriter) {
	w.float("mu", x.Mu)
	w.float("step", x.Step)
	w.float("relax", x.Relax)
	w.str("solver", x.Solver)
	w.float("gamma", x.Gamma)
	w.float("lr", x.Lr)
	w.uint("batch", uint64(x.Batch))
	w.uint("clients", uint64(x.Clients))
	w.uint("total_samples", x.TotalSamples)
}

func (x *ModelSpec) appendText(w *textWriter) {
	w.str("kind", x.Kind)
	w.uint("inputs", uint64(x.Inputs))
	w.uint("classes", uint64(x.Classes))
	w.uints("hidden", x.Hidden)
	w.str("activation", x.Activation)
	w.float("l2", x.L2)
}

func (x *WorkBudget) appendText(w *textWriter) {
	w.uint("max_epochs", uint64(x.MaxEpochs))
	w.float("max_seconds", x.MaxSeconds)
	w.uint("max_grad_evals", x.MaxGradEvals)
}

func (x *SketchSpec) appendText(w *textWriter) {
	w.uint("dimension", uint64(x.Dimension))
	w.uint("seed", x.Seed)
}

func (x *RoundAnnouncement) appendText(w *textWriter) {
	w.str("federation", x.Federation)
	w.uint("round", x.Round)
	w.str("algorithm", x.Algorithm)
	w.str("aggregator", x.Aggregator)
	w.msg("params", x.Params != nil, x.Params)
	w.msg("model", x.Model != nil, x.Model)
	w.msg("budget", x.Budget != nil, x.Budget)
	w.int("deadline_unix_ms", x.DeadlineUnixMs)
	w.strs("selected", x.Selected)
	w.msg("global", x.Global != nil, x.Global)
	w.str("uplink_codec", x.UplinkCodec)
	w.int("created_at_unix_ms", x.CreatedAtUnixMs)
	w.msg("anchor_sketch", x.AnchorSketch != nil, x.AnchorSketch)
	w.str("run_id", x.RunId)
	w.bytes("schema", x.Schema)
	w.bytes("transform", x.Transform)
	w.enum("phase", int32(x.Phase), Phase_name)
	w.boolean("evaluate", x.Evaluate)
	w.bytes("bundle", x.Bundle)
	w.uint("eval_round", uint64(x.EvalRound))
}

func (x *ClientStatus) appendText(w *textWriter) {
	w.str("client_id", x.ClientId)
	w.boolean("online", x.Online)
	w.uint("sample_count", x.SampleCount)
	w.strs("capabilities", x.Capabilities)
	w.str("software_version", x.SoftwareVersion)
	w.int("timestamp_unix_ms", x.TimestampUnixMs)
	w.uint("connection", x.Connection)
	w.str("error_reason", x.ErrorReason)
	w.str("error_message", x.ErrorMessage)
	w.str("instance_id", x.InstanceId)
}

func (x *WorkReport) appendText(w *textWriter) {
	w.float("achieved_gamma", x.AchievedGamma)
	w.uint("epochs", x.Epochs)
	w.uint("grad_evals", x.GradEvals)
	w.float("seconds", x.Seconds)
	w.float("local_loss", x.LocalLoss)
	w.float("anchor_loss", x.AnchorLoss)
	w.enum("stop_reason", int32(x.StopReason), StopReason_name)
	w.boolean("partial", x.Partial)
}

func (x *ClientUpdate) appendText(w *textWriter) {
	w.str("client_id", x.ClientId)
	w.uint("round", x.Round)
	w.enum("kind", int32(x.Kind), UpdateKind_name)
	w.msg("vector", x.Vector != nil, x.Vector)
	w.uint("sample_count", x.SampleCount)
	w.msg("report", x.Report != nil, x.Report)
	w.floats("anchor_grad", x.AnchorGrad)
	w.uint("base_round", x.BaseRound)
	w.int("sent_at_unix_ms", x.SentAtUnixMs)
	w.uint("seq", x.Seq)
	w.str("instance_id", x.InstanceId)
}

func (x *Receipt) appendText(w *textWriter) {
	w.str("client_id", x.ClientId)
	w.uint("round", x.Round)
	w.boolean("accepted", x.Accepted)
	w.str("reason", x.Reason)
	w.int("stored_at_unix_ms", x.StoredAtUnixMs)
	w.enum("code", int32(x.Code), ReceiptCode_name)
	w.uint("update_seq", x.UpdateSeq)
	w.enum("subject", int32(x.Subject), ReceiptSubject_name)
}

func (x *SiteStatistics) appendText(w *textWriter) {
	w.str("client_id", x.ClientId)
	w.str("run_id", x.RunId)
	w.str("schema_digest", x.SchemaDigest)
	w.bytes("stats", x.Stats)
	w.int("sent_at_unix_ms", x.SentAtUnixMs)
}

func (x *EvalReport) appendText(w *textWriter) {
	w.str("client_id", x.ClientId)
	w.str("run_id", x.RunId)
	w.uint("round", x.Round)
	w.bytes("report", x.Report)
	w.int("sent_at_unix_ms", x.SentAtUnixMs)
}

package wire

// The Go types of edgefl.proto, written by hand (see gen.go): the same
// names, fields and accessors protoc-gen-go generated, without the protobuf
// reflection runtime. The encoding is in codec.go, the text form in text.go.
// A field added to edgefl.proto must be added here, to the message's size,
// appendTo, unmarshal and appendText methods, to a golden fixture and to the
// test descriptor in protobufgo_test.go (see gen.go).

import "strconv"

// UpdateKind says what an update's vector holds.
type UpdateKind int32

const (
	UpdateKind_UPDATE_KIND_UNSPECIFIED UpdateKind = 0
	UpdateKind_UPDATE_KIND_FULL        UpdateKind = 1 // the full local model w_k
	UpdateKind_UPDATE_KIND_DELTA       UpdateKind = 2 // w_k - x^t, against the round's global model
	UpdateKind_UPDATE_KIND_Z_DELTA     UpdateKind = 3 // FedSplit: z_j minus the server's copy of z_j
)

// Enum value maps for UpdateKind.
var (
	UpdateKind_name = map[int32]string{
		0: "UPDATE_KIND_UNSPECIFIED",
		1: "UPDATE_KIND_FULL",
		2: "UPDATE_KIND_DELTA",
		3: "UPDATE_KIND_Z_DELTA",
	}
	UpdateKind_value = map[string]int32{
		"UPDATE_KIND_UNSPECIFIED": 0,
		"UPDATE_KIND_FULL":        1,
		"UPDATE_KIND_DELTA":       2,
		"UPDATE_KIND_Z_DELTA":     3,
	}
)

// Enum returns a pointer to a copy of x.
func (x UpdateKind) Enum() *UpdateKind {
	p := new(UpdateKind)
	*p = x
	return p
}

// String returns the value's name, or its number for an unknown value.
func (x UpdateKind) String() string { return enumString(UpdateKind_name, int32(x)) }

// StopReason says why the local solve stopped.
type StopReason int32

const (
	StopReason_STOP_REASON_UNSPECIFIED    StopReason = 0
	StopReason_STOP_REASON_GAMMA_REACHED  StopReason = 1
	StopReason_STOP_REASON_MAX_EPOCHS     StopReason = 2
	StopReason_STOP_REASON_MAX_GRAD_EVALS StopReason = 3
	StopReason_STOP_REASON_DEADLINE       StopReason = 4 // wall-clock budget or round deadline
	StopReason_STOP_REASON_SIGNAL         StopReason = 5 // told to stop early
	StopReason_STOP_REASON_ERROR          StopReason = 6 // solver failed; the last iterate is sent
)

// Enum value maps for StopReason.
var (
	StopReason_name = map[int32]string{
		0: "STOP_REASON_UNSPECIFIED",
		1: "STOP_REASON_GAMMA_REACHED",
		2: "STOP_REASON_MAX_EPOCHS",
		3: "STOP_REASON_MAX_GRAD_EVALS",
		4: "STOP_REASON_DEADLINE",
		5: "STOP_REASON_SIGNAL",
		6: "STOP_REASON_ERROR",
	}
	StopReason_value = map[string]int32{
		"STOP_REASON_UNSPECIFIED":    0,
		"STOP_REASON_GAMMA_REACHED":  1,
		"STOP_REASON_MAX_EPOCHS":     2,
		"STOP_REASON_MAX_GRAD_EVALS": 3,
		"STOP_REASON_DEADLINE":       4,
		"STOP_REASON_SIGNAL":         5,
		"STOP_REASON_ERROR":          6,
	}
)

// Enum returns a pointer to a copy of x.
func (x StopReason) Enum() *StopReason {
	p := new(StopReason)
	*p = x
	return p
}

// String returns the value's name, or its number for an unknown value.
func (x StopReason) String() string { return enumString(StopReason_name, int32(x)) }

// ReceiptCode says what the aggregator did with an update.
type ReceiptCode int32

const (
	ReceiptCode_RECEIPT_CODE_UNSPECIFIED    ReceiptCode = 0
	ReceiptCode_RECEIPT_CODE_STORED         ReceiptCode = 1 // accepted and durably stored
	ReceiptCode_RECEIPT_CODE_DUPLICATE      ReceiptCode = 2 // accepted earlier; this copy ignored
	ReceiptCode_RECEIPT_CODE_STALE_ROUND    ReceiptCode = 3
	ReceiptCode_RECEIPT_CODE_FUTURE_ROUND   ReceiptCode = 4
	ReceiptCode_RECEIPT_CODE_NOT_SELECTED   ReceiptCode = 5
	ReceiptCode_RECEIPT_CODE_UNKNOWN_CLIENT ReceiptCode = 6
	ReceiptCode_RECEIPT_CODE_BAD_UPDATE     ReceiptCode = 7 // wrong dimension, non-finite, bad frame...
	ReceiptCode_RECEIPT_CODE_BASE_MISMATCH  ReceiptCode = 8 // Z_DELTA base_round differs from the server's copy
	ReceiptCode_RECEIPT_CODE_INTERNAL       ReceiptCode = 9 // server-side failure; the client may retry
)

// Enum value maps for ReceiptCode.
var (
	ReceiptCode_name = map[int32]string{
		0: "RECEIPT_CODE_UNSPECIFIED",
		1: "RECEIPT_CODE_STORED",
		2: "RECEIPT_CODE_DUPLICATE",
		3: "RECEIPT_CODE_STALE_ROUND",
		4: "RECEIPT_CODE_FUTURE_ROUND",
		5: "RECEIPT_CODE_NOT_SELECTED",
		6: "RECEIPT_CODE_UNKNOWN_CLIENT",
		7: "RECEIPT_CODE_BAD_UPDATE",
		8: "RECEIPT_CODE_BASE_MISMATCH",
		9: "RECEIPT_CODE_INTERNAL",
	}
	ReceiptCode_value = map[string]int32{
		"RECEIPT_CODE_UNSPECIFIED":    0,
		"RECEIPT_CODE_STORED":         1,
		"RECEIPT_CODE_DUPLICATE":      2,
		"RECEIPT_CODE_STALE_ROUND":    3,
		"RECEIPT_CODE_FUTURE_ROUND":   4,
		"RECEIPT_CODE_NOT_SELECTED":   5,
		"RECEIPT_CODE_UNKNOWN_CLIENT": 6,
		"RECEIPT_CODE_BAD_UPDATE":     7,
		"RECEIPT_CODE_BASE_MISMATCH":  8,
		"RECEIPT_CODE_INTERNAL":       9,
	}
)

// Enum returns a pointer to a copy of x.
func (x ReceiptCode) Enum() *ReceiptCode {
	p := new(ReceiptCode)
	*p = x
	return p
}

// String returns the value's name, or its number for an unknown value.
func (x ReceiptCode) String() string { return enumString(ReceiptCode_name, int32(x)) }

// Phase says what a round announcement asks of the sites.
type Phase int32

const (
	Phase_PHASE_TRAIN      Phase = 0 // a training round (what every announcement was so far)
	Phase_PHASE_STATISTICS Phase = 1 // before round 1: sites send SiteStatistics of their training rows
	Phase_PHASE_FINISHED   Phase = 2 // the run has ended: global is the final model
)

// Enum value maps for Phase.
var (
	Phase_name = map[int32]string{
		0: "PHASE_TRAIN",
		1: "PHASE_STATISTICS",
		2: "PHASE_FINISHED",
	}
	Phase_value = map[string]int32{
		"PHASE_TRAIN":      0,
		"PHASE_STATISTICS": 1,
		"PHASE_FINISHED":   2,
	}
)

// Enum returns a pointer to a copy of x.
func (x Phase) Enum() *Phase {
	p := new(Phase)
	*p = x
	return p
}

// String returns the value's name, or its number for an unknown value.
func (x Phase) String() string { return enumString(Phase_name, int32(x)) }

// ReceiptSubject says what a receipt answers.
type ReceiptSubject int32

const (
	ReceiptSubject_RECEIPT_SUBJECT_UPDATE     ReceiptSubject = 0 // a ClientUpdate
	ReceiptSubject_RECEIPT_SUBJECT_STATISTICS ReceiptSubject = 1 // a SiteStatistics
	ReceiptSubject_RECEIPT_SUBJECT_EVALUATION ReceiptSubject = 2 // an EvalReport
)

// Enum value maps for ReceiptSubject.
var (
	ReceiptSubject_name = map[int32]string{
		0: "RECEIPT_SUBJECT_UPDATE",
		1: "RECEIPT_SUBJECT_STATISTICS",
		2: "RECEIPT_SUBJECT_EVALUATION",
	}
	ReceiptSubject_value = map[string]int32{
		"RECEIPT_SUBJECT_UPDATE":     0,
		"RECEIPT_SUBJECT_STATISTICS": 1,
		"RECEIPT_SUBJECT_EVALUATION": 2,
	}
)

// Enum returns a pointer to a copy of x.
func (x ReceiptSubject) Enum() *ReceiptSubject {
	p := new(ReceiptSubject)
	*p = x
	return p
}

// String returns the value's name, or its number for an unknown value.
func (x ReceiptSubject) String() string { return enumString(ReceiptSubject_name, int32(x)) }

// enumString is what protobuf-go printed for an enum value: its name, or
// its number in decimal when the value is not in the schema.
func enumString(names map[int32]string, v int32) string {
	if s, ok := names[v]; ok {
		return s
	}
	return strconv.FormatInt(int64(v), 10)
}

// Envelope is every MQTT payload: a schema version and exactly one body.
type Envelope struct {
	// Schema version of the body; this schema is version 1. Required.
	Version uint32 `json:"version,omitempty"`
	// Types that are valid to be assigned to Body:
	//
	//	*Envelope_Round
	//	*Envelope_Status
	//	*Envelope_Update
	//	*Envelope_Receipt
	//	*Envelope_Statistics
	//	*Envelope_Evaluation
	Body isEnvelope_Body
}

// Reset sets x to its zero value.
func (x *Envelope) Reset() { *x = Envelope{} }

func (x *Envelope) GetVersion() uint32 {
	if x != nil {
		return x.Version
	}
	return 0
}

func (x *Envelope) GetBody() isEnvelope_Body {
	if x != nil {
		return x.Body
	}
	return nil
}

func (x *Envelope) GetRound() *RoundAnnouncement {
	if x != nil {
		if w, ok := x.Body.(*Envelope_Round); ok && w != nil {
			return w.Round
		}
	}
	return nil
}

func (x *Envelope) GetStatus() *ClientStatus {
	if x != nil {
		if w, ok := x.Body.(*Envelope_Status); ok && w != nil {
			return w.Status
		}
	}
	return nil
}

func (x *Envelope) GetUpdate() *ClientUpdate {
	if x != nil {
		if w, ok := x.Body.(*Envelope_Update); ok && w != nil {
			return w.Update
		}
	}
	return nil
}

func (x *Envelope) GetReceipt() *Receipt {
	if x != nil {
		if w, ok := x.Body.(*Envelope_Receipt); ok && w != nil {
			return w.Receipt
		}
	}
	return nil
}

func (x *Envelope) GetStatistics() *SiteStatistics {
	if x != nil {
		if w, ok := x.Body.(*Envelope_Statistics); ok && w != nil {
			return w.Statistics
		}
	}
	return nil
}

func (x *Envelope) GetEvaluation() *EvalReport {
	if x != nil {
		if w, ok := x.Body.(*Envelope_Evaluation); ok && w != nil {
			return w.Evaluation
		}
	}
	return nil
}

type isEnvelope_Body interface {
	isEnvelope_Body()
}

type Envelope_Round struct {
	Round *RoundAnnouncement
}

type Envelope_Status struct {
	Status *ClientStatus
}

type Envelope_Update struct {
	Update *ClientUpdate
}

type Envelope_Receipt struct {
	Receipt *Receipt
}

type Envelope_Statistics struct {
	Statistics *SiteStatistics
}

type Envelope_Evaluation struct {
	Evaluation *EvalReport
}

func (*Envelope_Round) isEnvelope_Body() {}

func (*Envelope_Status) isEnvelope_Body() {}

func (*Envelope_Update) isEnvelope_Body() {}

func (*Envelope_Receipt) isEnvelope_Body() {}

func (*Envelope_Statistics) isEnvelope_Body() {}

func (*Envelope_Evaluation) isEnvelope_Body() {}

// Vector is a model vector carried as a codec frame.
type Vector struct {
	Codec     string `json:"codec,omitempty"`     // codec spec string, e.g. "f32+zstd"
	Dimension uint32 `json:"dimension,omitempty"` // number of float64 parameters once decoded; > 0
	Payload   []byte `json:"payload,omitempty"`   // the codec frame; non-empty
}

// Reset sets x to its zero value.
func (x *Vector) Reset() { *x = Vector{} }

func (x *Vector) GetCodec() string {
	if x != nil {
		return x.Codec
	}
	return ""
}

func (x *Vector) GetDimension() uint32 {
	if x != nil {
		return x.Dimension
	}
	return 0
}

func (x *Vector) GetPayload() []byte {
	if x != nil {
		return x.Payload
	}
	return nil
}

// Params are the FedProx / FedSplit / solver parameters of a round.
type Params struct {
	Mu     float64 `json:"mu,omitempty"`     // FedProx proximal weight, >= 0
	Step   float64 `json:"step,omitempty"`   // FedSplit step size s, >= 0 (> 0 for split algorithms)
	Relax  float64 `json:"relax,omitempty"`  // FedSplit relaxation alpha, >= 0
	Solver string  `json:"solver,omitempty"` // local solver name, e.g. "sgd", "lbfgs"
	Gamma  float64 `json:"gamma,omitempty"`  // target inexactness, >= 0
	Lr     float64 `json:"lr,omitempty"`     // SGD learning rate, >= 0
	Batch  uint32  `json:"batch,omitempty"`  // SGD mini-batch size (0 = full batch)
	// FedSplit sample weighting: m clients holding n samples in all; a site
	// with n_j samples uses the prox step s_j = Step * m * n_j / n (0 = Step).
	Clients      uint32 `json:"clients,omitempty"`
	TotalSamples uint64 `json:"total_samples,omitempty"`
}

func (x *Params) GetClients() uint32 {
	if x != nil {
		return x.Clients
	}
	return 0
}

func (x *Params) GetTotalSamples() uint64 {
	if x != nil {
		return x.TotalSamples
	}
	return 0
}

// Reset sets x to its zero value.
func (x *Params) Reset() { *x = Params{} }

func (x *Params) GetMu() float64 {
	if x != nil {
		return x.Mu
	}
	return 0
}

func (x *Params) GetStep() float64 {
	if x != nil {
		return x.Step
	}
	return 0
}

func (x *Params) GetRelax() float64 {
	if x != nil {
		return x.Relax
	}
	return 0
}

func (x *Params) GetSolver() string {
	if x != nil {
		return x.Solver
	}
	return ""
}

func (x *Params) GetGamma() float64 {
	if x != nil {
		return x.Gamma
	}
	return 0
}

func (x *Params) GetLr() float64 {
	if x != nil {
		return x.Lr
	}
	return 0
}

func (x *Params) GetBatch() uint32 {
	if x != nil {
		return x.Batch
	}
	return 0
}

// ModelSpec describes the model a round trains.
type ModelSpec struct {
	Kind       string   `json:"kind,omitempty"` // e.g. "logreg", "binlogreg", "linreg", "mlp"
	Inputs     uint32   `json:"inputs,omitempty"`
	Classes    uint32   `json:"classes,omitempty"`
	Hidden     []uint32 `json:"hidden,omitempty"`     // hidden layer widths (MLP)
	Activation string   `json:"activation,omitempty"` // e.g. "relu", "tanh"
	L2         float64  `json:"l2,omitempty"`         // L2 coefficient lambda, >= 0
}

// Reset sets x to its zero value.
func (x *ModelSpec) Reset() { *x = ModelSpec{} }

func (x *ModelSpec) GetKind() string {
	if x != nil {
		return x.Kind
	}
	return ""
}

func (x *ModelSpec) GetInputs() uint32 {
	if x != nil {
		return x.Inputs
	}
	return 0
}

func (x *ModelSpec) GetClasses() uint32 {
	if x != nil {
		return x.Classes
	}
	return 0
}

func (x *ModelSpec) GetHidden() []uint32 {
	if x != nil {
		return x.Hidden
	}
	return nil
}

func (x *ModelSpec) GetActivation() string {
	if x != nil {
		return x.Activation
	}
	return ""
}

func (x *ModelSpec) GetL2() float64 {
	if x != nil {
		return x.L2
	}
	return 0
}

// WorkBudget is the work budget of the local solve; 0 means "no limit" for
// each field.
type WorkBudget struct {
	MaxEpochs    uint32  `json:"max_epochs,omitempty"`
	MaxSeconds   float64 `json:"max_seconds,omitempty"`
	MaxGradEvals uint64  `json:"max_grad_evals,omitempty"`
}

// Reset sets x to its zero value.
func (x *WorkBudget) Reset() { *x = WorkBudget{} }

func (x *WorkBudget) GetMaxEpochs() uint32 {
	if x != nil {
		return x.MaxEpochs
	}
	return 0
}

func (x *WorkBudget) GetMaxSeconds() float64 {
	if x != nil {
		return x.MaxSeconds
	}
	return 0
}

func (x *WorkBudget) GetMaxGradEvals() uint64 {
	if x != nil {
		return x.MaxGradEvals
	}
	return 0
}

// SketchSpec asks selected clients to send a (random-projection) sketch of
// the gradient at the anchor with their update.
type SketchSpec struct {
	Dimension uint32 `json:"dimension,omitempty"` // sketch length; 0 = send the full gradient
	Seed      uint64 `json:"seed,omitempty"`      // projection seed shared by all clients
}

// Reset sets x to its zero value.
func (x *SketchSpec) Reset() { *x = SketchSpec{} }

func (x *SketchSpec) GetDimension() uint32 {
	if x != nil {
		return x.Dimension
	}
	return 0
}

func (x *SketchSpec) GetSeed() uint64 {
	if x != nil {
		return x.Seed
	}
	return 0
}

// RoundAnnouncement is published retained on <prefix>round.
type RoundAnnouncement struct {
	Federation      string      `json:"federation,omitempty"`
	Round           uint64      `json:"round,omitempty"`      // > 0
	Algorithm       string      `json:"algorithm,omitempty"`  // fedavg|fedprox|fedsplit|fedproxsplit|...
	Aggregator      string      `json:"aggregator,omitempty"` // aggregator spec string
	Params          *Params     `json:"params,omitempty"`
	Model           *ModelSpec  `json:"model,omitempty"`
	Budget          *WorkBudget `json:"budget,omitempty"`
	DeadlineUnixMs  int64       `json:"deadline_unix_ms,omitempty"` // 0 = no deadline
	Selected        []string    `json:"selected,omitempty"`         // selected client ids (unique); empty = every client
	Global          *Vector     `json:"global,omitempty"`           // the global model x^t; required
	UplinkCodec     string      `json:"uplink_codec,omitempty"`     // codec spec clients must use uplink
	CreatedAtUnixMs int64       `json:"created_at_unix_ms,omitempty"`
	AnchorSketch    *SketchSpec `json:"anchor_sketch,omitempty"` // absent = no anchor gradient wanted
	RunId           string      `json:"run_id,omitempty"`        // the aggregator's round log; see edgefl.proto
	// schema.Canonical() JSON; empty = no federation schema (legacy data
	// config). Checked by the receiver (schema.Parse), not by wire.
	Schema []byte `json:"schema,omitempty"`
	// prep.Transform JSON; empty in PHASE_STATISTICS and without a schema.
	// Checked by the receiver, not by wire.
	Transform []byte `json:"transform,omitempty"`
	Phase     Phase  `json:"phase,omitempty"`
	// Every site (selected or not) evaluates Global on its held-out rows and
	// sends an EvalReport naming EvalRound.
	Evaluate bool `json:"evaluate,omitempty"`
	// PHASE_FINISHED only: the final model bundle (bundle.Marshal bytes).
	Bundle []byte `json:"bundle,omitempty"`
	// The round an EvalReport must name: the aggregations Global has had.
	EvalRound uint32 `json:"eval_round,omitempty"`
}

// Reset sets x to its zero value.
func (x *RoundAnnouncement) Reset() { *x = RoundAnnouncement{} }

func (x *RoundAnnouncement) GetFederation() string {
	if x != nil {
		return x.Federation
	}
	return ""
}

func (x *RoundAnnouncement) GetRound() uint64 {
	if x != nil {
		return x.Round
	}
	return 0
}

func (x *RoundAnnouncement) GetAlgorithm() string {
	if x != nil {
		return x.Algorithm
	}
	return ""
}

func (x *RoundAnnouncement) GetAggregator() string {
	if x != nil {
		return x.Aggregator
	}
	return ""
}

func (x *RoundAnnouncement) GetParams() *Params {
	if x != nil {
		return x.Params
	}
	return nil
}

func (x *RoundAnnouncement) GetModel() *ModelSpec {
	if x != nil {
		return x.Model
	}
	return nil
}

func (x *RoundAnnouncement) GetBudget() *WorkBudget {
	if x != nil {
		return x.Budget
	}
	return nil
}

func (x *RoundAnnouncement) GetDeadlineUnixMs() int64 {
	if x != nil {
		return x.DeadlineUnixMs
	}
	return 0
}

func (x *RoundAnnouncement) GetSelected() []string {
	if x != nil {
		return x.Selected
	}
	return nil
}

func (x *RoundAnnouncement) GetGlobal() *Vector {
	if x != nil {
		return x.Global
	}
	return nil
}

func (x *RoundAnnouncement) GetUplinkCodec() string {
	if x != nil {
		return x.UplinkCodec
	}
	return ""
}

func (x *RoundAnnouncement) GetCreatedAtUnixMs() int64 {
	if x != nil {
		return x.CreatedAtUnixMs
	}
	return 0
}

func (x *RoundAnnouncement) GetAnchorSketch() *SketchSpec {
	if x != nil {
		return x.AnchorSketch
	}
	return nil
}

func (x *RoundAnnouncement) GetRunId() string {
	if x != nil {
		return x.RunId
	}
	return ""
}

func (x *RoundAnnouncement) GetSchema() []byte {
	if x != nil {
		return x.Schema
	}
	return nil
}

func (x *RoundAnnouncement) GetTransform() []byte {
	if x != nil {
		return x.Transform
	}
	return nil
}

func (x *RoundAnnouncement) GetPhase() Phase {
	if x != nil {
		return x.Phase
	}
	return Phase_PHASE_TRAIN
}

func (x *RoundAnnouncement) GetEvaluate() bool {
	if x != nil {
		return x.Evaluate
	}
	return false
}

func (x *RoundAnnouncement) GetBundle() []byte {
	if x != nil {
		return x.Bundle
	}
	return nil
}

func (x *RoundAnnouncement) GetEvalRound() uint32 {
	if x != nil {
		return x.EvalRound
	}
	return 0
}

// ClientStatus is published retained on <prefix>clients/<id>/status; the
// MQTT last will is the same message with online = false.
type ClientStatus struct {
	ClientId        string   `json:"client_id,omitempty"`
	Online          bool     `json:"online,omitempty"`
	SampleCount     uint64   `json:"sample_count,omitempty"`
	Capabilities    []string `json:"capabilities,omitempty"` // e.g. solver names "sgd", "lbfgs"
	SoftwareVersion string   `json:"software_version,omitempty"`
	TimestampUnixMs int64    `json:"timestamp_unix_ms,omitempty"`
	Connection      uint64   `json:"connection,omitempty"` // see edgefl.proto: orders a site's statuses
	// A site that cannot take part says why: one of the SiteErr reason codes
	// and a one-line message naming file, line, column and what was
	// expected, never a data value. Empty = no error.
	ErrorReason  string `json:"error_reason,omitempty"`
	ErrorMessage string `json:"error_message,omitempty"`
	// The installation this status comes from (a random id kept in the
	// site's state file); empty = not told.
	InstanceId string `json:"instance_id,omitempty"`
}

// Reset sets x to its zero value.
func (x *ClientStatus) Reset() { *x = ClientStatus{} }

func (x *ClientStatus) GetClientId() string {
	if x != nil {
		return x.ClientId
	}
	return ""
}

func (x *ClientStatus) GetOnline() bool {
	if x != nil {
		return x.Online
	}
	return false
}

func (x *ClientStatus) GetSampleCount() uint64 {
	if x != nil {
		return x.SampleCount
	}
	return 0
}

func (x *ClientStatus) GetCapabilities() []string {
	if x != nil {
		return x.Capabilities
	}
	return nil
}

func (x *ClientStatus) GetSoftwareVersion() string {
	if x != nil {
		return x.SoftwareVersion
	}
	return ""
}

func (x *ClientStatus) GetTimestampUnixMs() int64 {
	if x != nil {
		return x.TimestampUnixMs
	}
	return 0
}

func (x *ClientStatus) GetConnection() uint64 {
	if x != nil {
		return x.Connection
	}
	return 0
}

func (x *ClientStatus) GetErrorReason() string {
	if x != nil {
		return x.ErrorReason
	}
	return ""
}

func (x *ClientStatus) GetErrorMessage() string {
	if x != nil {
		return x.ErrorMessage
	}
	return ""
}

func (x *ClientStatus) GetInstanceId() string {
	if x != nil {
		return x.InstanceId
	}
	return ""
}

// WorkReport is what the local solve did. Floats are finite; gamma,
// seconds >= 0.
type WorkReport struct {
	AchievedGamma float64    `json:"achieved_gamma,omitempty"`
	Epochs        uint64     `json:"epochs,omitempty"`
	GradEvals     uint64     `json:"grad_evals,omitempty"`
	Seconds       float64    `json:"seconds,omitempty"`
	LocalLoss     float64    `json:"local_loss,omitempty"`  // h_k or f_k at the returned point
	AnchorLoss    float64    `json:"anchor_loss,omitempty"` // f_k at the anchor (the received global model)
	StopReason    StopReason `json:"stop_reason,omitempty"`
	Partial       bool       `json:"partial,omitempty"` // stopped by the budget before reaching gamma
}

// Reset sets x to its zero value.
func (x *WorkReport) Reset() { *x = WorkReport{} }

func (x *WorkReport) GetAchievedGamma() float64 {
	if x != nil {
		return x.AchievedGamma
	}
	return 0
}

func (x *WorkReport) GetEpochs() uint64 {
	if x != nil {
		return x.Epochs
	}
	return 0
}

func (x *WorkReport) GetGradEvals() uint64 {
	if x != nil {
		return x.GradEvals
	}
	return 0
}

func (x *WorkReport) GetSeconds() float64 {
	if x != nil {
		return x.Seconds
	}
	return 0
}

func (x *WorkReport) GetLocalLoss() float64 {
	if x != nil {
		return x.LocalLoss
	}
	return 0
}

func (x *WorkReport) GetAnchorLoss() float64 {
	if x != nil {
		return x.AnchorLoss
	}
	return 0
}

func (x *WorkReport) GetStopReason() StopReason {
	if x != nil {
		return x.StopReason
	}
	return StopReason_STOP_REASON_UNSPECIFIED
}

func (x *WorkReport) GetPartial() bool {
	if x != nil {
		return x.Partial
	}
	return false
}

// ClientUpdate is published on <prefix>updates/<id>. The idempotence key is
// (round, client_id).
type ClientUpdate struct {
	ClientId    string      `json:"client_id,omitempty"`
	Round       uint64      `json:"round,omitempty"`        // > 0
	Kind        UpdateKind  `json:"kind,omitempty"`         // required
	Vector      *Vector     `json:"vector,omitempty"`       // required
	SampleCount uint64      `json:"sample_count,omitempty"` // n_k, > 0
	Report      *WorkReport `json:"report,omitempty"`       // required
	// Optional gradient of f_k at the anchor, or its sketch (SketchSpec);
	// finite values.
	AnchorGrad []float64 `json:"anchor_grad,omitempty"`
	// For UPDATE_KIND_Z_DELTA: the round of the update that set the server's
	// copy of z_j the delta is taken against (< round); 0 = against the global
	// model of this update's round (z_j's starting point), which resets the
	// server's copy. Must be 0 for the other kinds.
	BaseRound    uint64 `json:"base_round,omitempty"`
	SentAtUnixMs int64  `json:"sent_at_unix_ms,omitempty"`
	// Client-side sequence number of this update (informational; a re-send of
	// the same update carries the same seq). Deduplication uses (round, client).
	Seq uint64 `json:"seq,omitempty"`
	// The installation that sent this update (ClientStatus.InstanceId);
	// empty = not told.
	InstanceId string `json:"instance_id,omitempty"`
}

// Reset sets x to its zero value.
func (x *ClientUpdate) Reset() { *x = ClientUpdate{} }

func (x *ClientUpdate) GetClientId() string {
	if x != nil {
		return x.ClientId
	}
	return ""
}

func (x *ClientUpdate) GetRound() uint64 {
	if x != nil {
		return x.Round
	}
	return 0
}

func (x *ClientUpdate) GetKind() UpdateKind {
	if x != nil {
		return x.Kind
	}
	return UpdateKind_UPDATE_KIND_UNSPECIFIED
}

func (x *ClientUpdate) GetVector() *Vector {
	if x != nil {
		return x.Vector
	}
	return nil
}

func (x *ClientUpdate) GetSampleCount() uint64 {
	if x != nil {
		return x.SampleCount
	}
	return 0
}

func (x *ClientUpdate) GetReport() *WorkReport {
	if x != nil {
		return x.Report
	}
	return nil
}

func (x *ClientUpdate) GetAnchorGrad() []float64 {
	if x != nil {
		return x.AnchorGrad
	}
	return nil
}

func (x *ClientUpdate) GetBaseRound() uint64 {
	if x != nil {
		return x.BaseRound
	}
	return 0
}

func (x *ClientUpdate) GetSentAtUnixMs() int64 {
	if x != nil {
		return x.SentAtUnixMs
	}
	return 0
}

func (x *ClientUpdate) GetSeq() uint64 {
	if x != nil {
		return x.Seq
	}
	return 0
}

func (x *ClientUpdate) GetInstanceId() string {
	if x != nil {
		return x.InstanceId
	}
	return ""
}

// Receipt is published on <prefix>receipts/<id> after the update is durable
// (accepted) or rejected.
type Receipt struct {
	ClientId       string      `json:"client_id,omitempty"`
	Round          uint64      `json:"round,omitempty"` // > 0
	Accepted       bool        `json:"accepted,omitempty"`
	Reason         string      `json:"reason,omitempty"`            // human-readable detail
	StoredAtUnixMs int64       `json:"stored_at_unix_ms,omitempty"` // when the aggregator stored it (accepted)
	Code           ReceiptCode `json:"code,omitempty"`
	UpdateSeq      uint64      `json:"update_seq,omitempty"` // seq of the update this answers
	// What this receipt answers. For STATISTICS, round 0 is valid; for
	// EVALUATION, round is the report's (which may be 0).
	Subject ReceiptSubject `json:"subject,omitempty"`
}

// Reset sets x to its zero value.
func (x *Receipt) Reset() { *x = Receipt{} }

func (x *Receipt) GetClientId() string {
	if x != nil {
		return x.ClientId
	}
	return ""
}

func (x *Receipt) GetRound() uint64 {
	if x != nil {
		return x.Round
	}
	return 0
}

func (x *Receipt) GetAccepted() bool {
	if x != nil {
		return x.Accepted
	}
	return false
}

func (x *Receipt) GetReason() string {
	if x != nil {
		return x.Reason
	}
	return ""
}

func (x *Receipt) GetStoredAtUnixMs() int64 {
	if x != nil {
		return x.StoredAtUnixMs
	}
	return 0
}

func (x *Receipt) GetCode() ReceiptCode {
	if x != nil {
		return x.Code
	}
	return ReceiptCode_RECEIPT_CODE_UNSPECIFIED
}

func (x *Receipt) GetUpdateSeq() uint64 {
	if x != nil {
		return x.UpdateSeq
	}
	return 0
}

func (x *Receipt) GetSubject() ReceiptSubject {
	if x != nil {
		return x.Subject
	}
	return ReceiptSubject_RECEIPT_SUBJECT_UPDATE
}

// SiteStatistics is published on <prefix>updates/<id> (the site's own update
// topic) in PHASE_STATISTICS, before round 1.
type SiteStatistics struct {
	ClientId     string `json:"client_id,omitempty"`
	RunId        string `json:"run_id,omitempty"`        // the announcement's run_id
	SchemaDigest string `json:"schema_digest,omitempty"` // hex SHA-256 of the schema the site read its data with
	Stats        []byte `json:"stats,omitempty"`         // prep.Stats JSON of the site's training rows (non-empty)
	SentAtUnixMs int64  `json:"sent_at_unix_ms,omitempty"`
}

// Reset sets x to its zero value.
func (x *SiteStatistics) Reset() { *x = SiteStatistics{} }

func (x *SiteStatistics) GetClientId() string {
	if x != nil {
		return x.ClientId
	}
	return ""
}

func (x *SiteStatistics) GetRunId() string {
	if x != nil {
		return x.RunId
	}
	return ""
}

func (x *SiteStatistics) GetSchemaDigest() string {
	if x != nil {
		return x.SchemaDigest
	}
	return ""
}

func (x *SiteStatistics) GetStats() []byte {
	if x != nil {
		return x.Stats
	}
	return nil
}

func (x *SiteStatistics) GetSentAtUnixMs() int64 {
	if x != nil {
		return x.SentAtUnixMs
	}
	return 0
}

// EvalReport is published on <prefix>updates/<id> when an announcement says
// evaluate.
type EvalReport struct {
	ClientId     string `json:"client_id,omitempty"`
	RunId        string `json:"run_id,omitempty"` // the announcement's run_id
	Round        uint64 `json:"round,omitempty"`  // the announcement's eval_round; may be 0
	Report       []byte `json:"report,omitempty"` // evaluate.Report JSON on the site's held-out rows (non-empty)
	SentAtUnixMs int64  `json:"sent_at_unix_ms,omitempty"`
}

// Reset sets x to its zero value.
func (x *EvalReport) Reset() { *x = EvalReport{} }

func (x *EvalReport) GetClientId() string {
	if x != nil {
		return x.ClientId
	}
	return ""
}

func (x *EvalReport) GetRunId() string {
	if x != nil {
		return x.RunId
	}
	return ""
}

func (x *EvalReport) GetRound() uint64 {
	if x != nil {
		return x.Round
	}
	return 0
}

func (x *EvalReport) GetReport() []byte {
	if x != nil {
		return x.Report
	}
	return nil
}

func (x *EvalReport) GetSentAtUnixMs() int64 {
	if x != nil {
		return x.SentAtUnixMs
	}
	return 0
}

package wire

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Length bounds of the free-text and token fields.
const (
	maxSpecLen       = 256  // codec, solver, model kind, activation, algorithm
	maxLongTextLen   = 1024 // aggregator spec, receipt reason
	maxVersionLen    = 128  // software version
	maxCapabilities  = 64
	maxCapabilityLen = 64
	maxHiddenLayers  = 64
)

// repeatedLimit bounds the repeated field named by key ("Message.field" in
// edgefl.proto) while it is decoded: the decoder keeps at most limit
// elements, and more are an ErrInvalid error naming msg and name (the
// message and field as Validate names them). Every repeated field of
// edgefl.proto needs a case (TestRepeatedLimits); the generated decoders
// call it with their key.
func (d *decoder) repeatedLimit(key string) (msg, name string, limit int) {
	switch key {
	case "RoundAnnouncement.selected":
		return "round announcement", "selected", d.lim.MaxClients
	case "RunSpec.statistics_sites":
		return "run spec", "statistics_sites", d.lim.MaxClients
	case "ModelSpec.hidden":
		return "round announcement", "model.hidden", d.maxHidden
	case "ClientStatus.capabilities":
		return "client status", "capabilities", d.maxCapabilities
	case "ClientUpdate.anchor_grad":
		return "client update", "anchor_grad", d.lim.MaxAnchorGrad
	}
	// Unreachable for the fields of edgefl.proto; the message size bounds
	// a field without a case.
	return key, key, math.MaxInt
}

func invalid(msg, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalid, msg, fmt.Sprintf(format, args...))
}

// checkText accepts valid UTF-8 of at most max bytes without control
// characters (so that it can go into a log line as is).
func checkText(msg, field, s string, max int, required bool) error {
	if s == "" {
		if required {
			return invalid(msg, "%s is required", field)
		}
		return nil
	}
	if len(s) > max {
		return invalid(msg, "%s is %d bytes, at most %d", field, len(s), max)
	}
	if !utf8.ValidString(s) {
		return invalid(msg, "%s is not valid UTF-8", field)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return invalid(msg, "%s contains control character %U", field, r)
		}
	}
	return nil
}

func checkID(msg, field, id string) error {
	if err := ValidID(id); err != nil {
		return fmt.Errorf("%w: %s: %s: %w", ErrInvalid, msg, field, err)
	}
	return nil
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// checkNonNeg accepts a finite x >= 0.
func checkNonNeg(msg, field string, x float64) error {
	if !finite(x) || x < 0 {
		return invalid(msg, "%s must be finite and >= 0, got %v", field, x)
	}
	return nil
}

func checkFinite(msg, field string, x float64) error {
	if !finite(x) {
		return invalid(msg, "%s must be finite, got %v", field, x)
	}
	return nil
}

func checkTime(msg, field string, ms int64) error {
	if ms < 0 {
		return invalid(msg, "%s must be >= 0, got %d", field, ms)
	}
	return nil
}

func checkVector(msg, field string, v *Vector, lim Limits) error {
	if v == nil {
		return invalid(msg, "%s is required", field)
	}
	if err := checkText(msg, field+".codec", v.Codec, maxSpecLen, true); err != nil {
		return err
	}
	if v.Dimension == 0 {
		return invalid(msg, "%s.dimension must be > 0", field)
	}
	if uint64(v.Dimension) > uint64(lim.MaxDimension) {
		return invalid(msg, "%s.dimension %d exceeds the limit %d", field, v.Dimension, lim.MaxDimension)
	}
	if len(v.Payload) == 0 {
		return invalid(msg, "%s.payload is empty", field)
	}
	return nil
}

// Validate implements Message. What is required depends on the phase (see
// edgefl.proto): PHASE_TRAIN needs round > 0, model, global, algorithm and
// uplink codec, and no bundle; PHASE_STATISTICS needs round 0 and a schema,
// and no transform or bundle (model, global, algorithm and uplink codec are
// checked when present); PHASE_FINISHED needs round > 0, model, global and
// algorithm (the uplink codec and the bundle are optional). evaluate needs a
// schema and a transform, and eval_round is at most round. The contents of
// schema, transform and bundle are JSON the receiver checks; wire bounds
// their size only.
func (m *RoundAnnouncement) Validate(lim Limits) error {
	const msg = "round announcement"
	if m == nil {
		return invalid(msg, "nil")
	}
	lim = lim.withDefaults()
	if err := checkID(msg, "federation", m.Federation); err != nil {
		return err
	}
	train, stats, err := m.checkPhase(msg)
	if err != nil {
		return err
	}
	if err := m.checkRunSpec(msg, stats); err != nil {
		return err
	}
	if err := checkTime(msg, "deadline_unix_ms", m.DeadlineUnixMs); err != nil {
		return err
	}
	if err := checkTime(msg, "created_at_unix_ms", m.CreatedAtUnixMs); err != nil {
		return err
	}
	if err := checkSelected(msg, m.Selected, lim); err != nil {
		return err
	}
	if m.PrivateSelection && len(m.Selected) > 0 {
		return invalid(msg, "private_selection with %d clients listed in selected", len(m.Selected))
	}
	// A secure-aggregation phase after the advertise phase may leave the
	// global model out: the sites that take part have it.
	laterPhase := m.Secagg != nil && m.SecaggPhase != SecAggPhase_SECAGG_PHASE_ADVERTISE
	if !(stats || laterPhase) || m.Global != nil {
		if err := checkVector(msg, "global", m.Global, lim); err != nil {
			return err
		}
	}
	if err := m.checkStateVectors(msg, lim); err != nil {
		return err
	}
	if err := checkText(msg, "uplink_codec", m.UplinkCodec, maxSpecLen, train); err != nil {
		return err
	}
	if s := m.AnchorSketch; s != nil && uint64(s.Dimension) > uint64(lim.MaxAnchorGrad) {
		return invalid(msg, "anchor_sketch.dimension %d exceeds the limit %d", s.Dimension, lim.MaxAnchorGrad)
	}
	if err := checkText(msg, "run_id", m.RunId, maxRunIDLen, false); err != nil {
		return err
	}
	if err := m.checkLifecycle(msg, stats, lim); err != nil {
		return err
	}
	if err := m.checkSecAgg(msg, train, lim); err != nil {
		return err
	}
	if m.Dp.GetMode() == DPMode_DP_MODE_DISTRIBUTED && m.Secagg == nil && m.Phase == Phase_PHASE_TRAIN {
		return invalid(msg, "dp in the distributed mode needs secagg: the noise shares are only safe inside a secure sum")
	}
	return m.Dp.validate(msg)
}

// checkStateVectors checks the vectors a round carries besides the global
// model: FedSplit sum mode's split_initial (with its roster) and
// SCAFFOLD's control variate (with its epoch).
func (m *RoundAnnouncement) checkStateVectors(msg string, lim Limits) error {
	if (m.SplitRoster > 0) != (m.SplitInitial != nil) || (m.SplitRoster > 0 && !m.SplitSum) {
		return invalid(msg, "split_roster %d and split_initial (set: %v) go together, and only with split_sum", m.SplitRoster, m.SplitInitial != nil)
	}
	if m.Control != nil {
		if err := checkVector(msg, "control", m.Control, lim); err != nil {
			return err
		}
	}
	if m.ControlEpoch > m.Round || (m.ControlEpoch > 0 && m.Control == nil) {
		return invalid(msg, "control_epoch %d: want at most the round (%d), and only with control", m.ControlEpoch, m.Round)
	}
	if m.SplitInitial != nil {
		return checkVector(msg, "split_initial", m.SplitInitial, lim)
	}
	return nil
}

// MaxSecAggCert and MaxSecAggSig bound an AdvertiseKeys' certificate and
// signature (signed secure aggregation).
const (
	MaxSecAggCert = 8 << 10
	MaxSecAggSig  = 1 << 10
)

// MaxSecAggSites bounds SecAggSpec.max_sites (secagg.MaxSites).
const MaxSecAggSites = 1 << 14

// checkSecAgg checks the secure-aggregation fields: the spec in
// PHASE_TRAIN only, a phase and a broadcast only with a spec, and the
// spec's own ranges (the secagg package checks the combination again:
// secagg.Config.Validate, secagg.Quantizer.Validate).
func (m *RoundAnnouncement) checkSecAgg(msg string, train bool, lim Limits) error {
	sp := m.Secagg
	if sp == nil {
		if m.SecaggPhase != SecAggPhase_SECAGG_PHASE_ADVERTISE || len(m.SecaggBroadcast) > 0 {
			return invalid(msg, "secagg_phase or secagg_broadcast without secagg")
		}
		return nil
	}
	if !train {
		return invalid(msg, "secagg is sent in %v only, not in %v", Phase_PHASE_TRAIN, m.Phase)
	}
	if _, ok := SecAggPhase_name[int32(m.SecaggPhase)]; !ok {
		return invalid(msg, "secagg_phase %d is unknown", int32(m.SecaggPhase))
	}
	bcast := m.SecaggPhase == SecAggPhase_SECAGG_PHASE_SHARE_KEYS || m.SecaggPhase == SecAggPhase_SECAGG_PHASE_UNMASK ||
		m.SecaggPhase == SecAggPhase_SECAGG_PHASE_CONSISTENCY
	if err := checkPayload(msg, "secagg_broadcast", m.SecaggBroadcast, lim, bcast); err != nil {
		return err
	}
	if !bcast && len(m.SecaggBroadcast) > 0 {
		return invalid(msg, "secagg_broadcast in %v", m.SecaggPhase)
	}
	if len(m.SecaggSignedKeys) > 0 && m.SecaggPhase != SecAggPhase_SECAGG_PHASE_SHARE_KEYS {
		return invalid(msg, "secagg_signed_keys in %v (the KeyList's phase only)", m.SecaggPhase)
	}
	if err := checkPayload(msg, "secagg_signed_keys", m.SecaggSignedKeys, lim, false); err != nil {
		return err
	}
	if len(m.SecaggViewSignatures) > 0 && m.SecaggPhase != SecAggPhase_SECAGG_PHASE_UNMASK {
		return invalid(msg, "secagg_view_signatures in %v (the unmask phase only)", m.SecaggPhase)
	}
	if len(m.SecaggSurvivorSignatures) > 0 && m.SecaggPhase != SecAggPhase_SECAGG_PHASE_UNMASK {
		return invalid(msg, "secagg_survivor_signatures in %v (the unmask phase only)", m.SecaggPhase)
	}
	if err := checkPayload(msg, "secagg_survivor_signatures", m.SecaggSurvivorSignatures, lim, false); err != nil {
		return err
	}
	if err := checkPayload(msg, "secagg_view_signatures", m.SecaggViewSignatures, lim, false); err != nil {
		return err
	}
	switch {
	case sp.Threshold < 2 || sp.MaxSites < sp.Threshold || sp.MaxSites > MaxSecAggSites:
		return invalid(msg, "secagg threshold %d and max_sites %d: want 2 <= threshold <= max_sites <= %d", sp.Threshold, sp.MaxSites, MaxSecAggSites)
	case sp.Degree%2 != 0 || (sp.Degree > 0) != (len(sp.GraphSeed) == 32) || (sp.Degree == 0 && len(sp.GraphSeed) > 0):
		return invalid(msg, "secagg degree %d with a %d-byte graph seed: want 0 and none, or even and 32 bytes", sp.Degree, len(sp.GraphSeed))
	case !finite(sp.Clip) || !(sp.Clip > 0):
		return invalid(msg, "secagg clip must be finite and > 0, got %v", sp.Clip)
	case sp.ScaleBits > 40:
		return invalid(msg, "secagg scale_bits %d above 40", sp.ScaleBits)
	}
	return nil
}

// checkPhase checks the phase and the round it allows (round 0 in the
// statistics phase only) and tells which phase it is.
func (m *RoundAnnouncement) checkPhase(msg string) (train, stats bool, err error) {
	switch m.Phase {
	case Phase_PHASE_TRAIN:
		train = true
	case Phase_PHASE_STATISTICS:
		stats = true
	case Phase_PHASE_FINISHED:
	default:
		return false, false, invalid(msg, "phase %d is unknown", int32(m.Phase))
	}
	if stats {
		if m.Round != 0 {
			return false, false, invalid(msg, "round must be 0 in %v, got %d", m.Phase, m.Round)
		}
	} else if m.Round == 0 {
		return false, false, invalid(msg, "round must be > 0")
	}
	return train, stats, nil
}

// checkRunSpec checks what the round asks the sites to run: the algorithm,
// the aggregator, the local solver's parameters, the model and the budget
// (the algorithm and the model are optional in the statistics phase).
func (m *RoundAnnouncement) checkRunSpec(msg string, stats bool) error {
	if !stats || m.Algorithm != "" {
		if err := ValidID(m.Algorithm); err != nil {
			return fmt.Errorf("%w: %s: algorithm: %w", ErrInvalid, msg, err)
		}
	}
	if err := checkText(msg, "aggregator", m.Aggregator, maxLongTextLen, false); err != nil {
		return err
	}
	if p := m.Params; p != nil {
		for _, f := range []struct {
			name string
			v    float64
		}{{"params.mu", p.Mu}, {"params.step", p.Step}, {"params.relax", p.Relax}, {"params.gamma", p.Gamma}, {"params.lr", p.Lr}, {"params.tau", p.Tau}} {
			if err := checkNonNeg(msg, f.name, f.v); err != nil {
				return err
			}
		}
		if err := checkText(msg, "params.solver", p.Solver, maxSpecLen, false); err != nil {
			return err
		}
	}
	if m.Model == nil {
		if !stats {
			return invalid(msg, "model is required")
		}
	} else {
		if err := checkText(msg, "model.kind", m.Model.Kind, maxSpecLen, true); err != nil {
			return err
		}
		if err := checkText(msg, "model.activation", m.Model.Activation, maxSpecLen, false); err != nil {
			return err
		}
		if len(m.Model.Hidden) > maxHiddenLayers {
			return invalid(msg, "model.hidden has %d layers, at most %d", len(m.Model.Hidden), maxHiddenLayers)
		}
		if err := checkNonNeg(msg, "model.l2", m.Model.L2); err != nil {
			return err
		}
	}
	if b := m.Budget; b != nil {
		if err := checkNonNeg(msg, "budget.max_seconds", b.MaxSeconds); err != nil {
			return err
		}
	}
	return nil
}

// checkSelected checks the selection: at most lim.MaxClients valid ids,
// none twice.
func checkSelected(msg string, selected []string, lim Limits) error {
	if len(selected) > lim.MaxClients {
		return invalid(msg, "%d selected clients, limit %d", len(selected), lim.MaxClients)
	}
	seen := make(map[string]struct{}, len(selected))
	for i, id := range selected {
		if err := checkID(msg, fmt.Sprintf("selected[%d]", i), id); err != nil {
			return err
		}
		if _, dup := seen[id]; dup {
			return invalid(msg, "selected client %q listed twice", id)
		}
		seen[id] = struct{}{}
	}
	return nil
}

// checkLifecycle checks the model lifecycle's payloads (schema, transform,
// bundle: their sizes; their JSON is the receiver's) and which phase may
// carry which, evaluation and DP included.
func (m *RoundAnnouncement) checkLifecycle(msg string, stats bool, lim Limits) error {
	for _, f := range []struct {
		name string
		v    []byte
	}{{"schema", m.Schema}, {"transform", m.Transform}, {"bundle", m.Bundle}} {
		if err := checkPayload(msg, f.name, f.v, lim, false); err != nil {
			return err
		}
	}
	for _, f := range []struct {
		name, digest string
		body         []byte
	}{{"schema_digest", m.SchemaDigest, m.Schema}, {"transform_digest", m.TransformDigest, m.Transform}} {
		if f.digest == "" {
			continue
		}
		if err := checkDigest(msg, f.name, f.digest); err != nil {
			return err
		}
		if len(f.body) > 0 && BodyDigest(f.body) != f.digest {
			return invalid(msg, "%s %.12s… is not the digest of the body it comes with", f.name, f.digest)
		}
	}
	switch {
	case stats && !m.HasSchema():
		return invalid(msg, "%v needs a schema", m.Phase)
	case stats && m.HasTransform():
		return invalid(msg, "%v carries no transform (it is fitted from the statistics)", m.Phase)
	case m.HasTransform() && !m.HasSchema():
		return invalid(msg, "a transform needs a schema")
	case len(m.Bundle) > 0 && m.Phase != Phase_PHASE_FINISHED:
		return invalid(msg, "a bundle is sent in %v only, not in %v", Phase_PHASE_FINISHED, m.Phase)
	case m.Evaluate && (!m.HasSchema() || !m.HasTransform()):
		return invalid(msg, "evaluate needs a schema and a transform")
	case uint64(m.EvalRound) > m.Round:
		return invalid(msg, "eval_round %d is beyond round %d", m.EvalRound, m.Round)
	case m.Dp != nil && stats:
		return invalid(msg, "dp is not sent in %v", m.Phase)
	}
	return nil
}

// validate checks a round's DP parameters (nil: none).
func (p *DPParams) validate(msg string) error {
	if p == nil {
		return nil
	}
	switch p.Mode {
	case DPMode_DP_MODE_CENTRAL, DPMode_DP_MODE_DISTRIBUTED:
	default:
		return invalid(msg, "dp.mode %d is unknown", int32(p.Mode))
	}
	if !finite(p.ClipNorm) || !(p.ClipNorm > 0) {
		return invalid(msg, "dp.clip_norm must be finite and > 0, got %v", p.ClipNorm)
	}
	if !finite(p.NoiseMultiplier) || !(p.NoiseMultiplier > 0) {
		return invalid(msg, "dp.noise_multiplier must be finite and > 0, got %v", p.NoiseMultiplier)
	}
	if !(p.Delta > 0 && p.Delta < 1) {
		return invalid(msg, "dp.delta must be in (0, 1), got %v", p.Delta)
	}
	if (p.Mode == DPMode_DP_MODE_DISTRIBUTED) != (p.NoiseShares > 0) {
		return invalid(msg, "dp.noise_shares %d in mode %v: want >= 1 in the distributed mode, 0 in the central one", p.NoiseShares, p.Mode)
	}
	if err := checkNonNeg(msg, "dp.epsilon_spent", p.EpsilonSpent); err != nil {
		return err
	}
	if err := checkNonNeg(msg, "dp.epsilon_budget", p.EpsilonBudget); err != nil {
		return err
	}
	if u := p.UpdateNoiseMultiplier; u != 0 && !(finite(u) && u >= p.NoiseMultiplier) {
		return invalid(msg, "dp.update_noise_multiplier must be 0 (= noise_multiplier) or finite and >= noise_multiplier %v, got %v", p.NoiseMultiplier, u)
	}
	a := p.Adaptive
	switch {
	case a == nil:
		return nil
	case !(a.TargetQuantile > 0 && a.TargetQuantile < 1):
		return invalid(msg, "dp.adaptive.target_quantile must be in (0, 1), got %v", a.TargetQuantile)
	case !finite(a.LearningRate) || !(a.LearningRate > 0):
		return invalid(msg, "dp.adaptive.learning_rate must be finite and > 0, got %v", a.LearningRate)
	case !finite(a.BitNoise) || !(a.BitNoise > 0):
		return invalid(msg, "dp.adaptive.bit_noise must be finite and > 0, got %v", a.BitNoise)
	}
	return nil
}

// checkPayload bounds a bytes field by the message size limit; required
// means non-empty.
func checkPayload(msg, field string, v []byte, lim Limits, required bool) error {
	if len(v) == 0 {
		if required {
			return invalid(msg, "%s is empty", field)
		}
		return nil
	}
	if len(v) > lim.MaxMessageBytes {
		return invalid(msg, "%s is %d bytes, limit %d", field, len(v), lim.MaxMessageBytes)
	}
	return nil
}

// maxRunIDLen bounds RoundAnnouncement.RunId (the aggregator writes 26
// characters).
const maxRunIDLen = 64

// Validate implements Message.
func (m *ClientStatus) Validate(lim Limits) error {
	const msg = "client status"
	if m == nil {
		return invalid(msg, "nil")
	}
	if err := checkID(msg, "client_id", m.ClientId); err != nil {
		return err
	}
	if len(m.Capabilities) > maxCapabilities {
		return invalid(msg, "%d capabilities, at most %d", len(m.Capabilities), maxCapabilities)
	}
	for i, c := range m.Capabilities {
		if err := checkText(msg, fmt.Sprintf("capabilities[%d]", i), c, maxCapabilityLen, true); err != nil {
			return err
		}
	}
	if err := checkText(msg, "software_version", m.SoftwareVersion, maxVersionLen, false); err != nil {
		return err
	}
	if err := checkTime(msg, "timestamp_unix_ms", m.TimestampUnixMs); err != nil {
		return err
	}
	if err := checkInstance(msg, m.InstanceId); err != nil {
		return err
	}
	if m.ErrorReason == "" {
		if m.ErrorMessage != "" {
			return invalid(msg, "error_message without error_reason")
		}
		return nil
	}
	if !slices.Contains(siteErrReasons, m.ErrorReason) {
		return invalid(msg, "error_reason %q is not one of %s", m.ErrorReason, strings.Join(siteErrReasons, ", "))
	}
	return checkText(msg, "error_message", m.ErrorMessage, MaxErrorMessageLen, false)
}

// Site error reasons: ClientStatus.ErrorReason says why a site cannot take
// part.
const (
	SiteErrSchema       = "schema_mismatch" // a missing schema column, a duplicate header
	SiteErrBadValue     = "bad_value"       // a cell that does not parse and is not a missing token
	SiteErrUnknownLabel = "unknown_label"   // a label value the schema's mapping does not know
	SiteErrTooFewRows   = "too_few_rows"    // fewer training rows than min_site_samples
	SiteErrBadTransform = "bad_transform"   // the schema or transform from the aggregator refused
	SiteErrSolve        = "solve_failed"    // the local solve failed
	SiteErrDisk         = "disk"            // state file, disk full, cannot write model_out
	SiteErrData         = "data"            // anything else about the data file
	// SiteErrSecAgg: the site refused a secure-aggregation session whose
	// key list it could not verify (signed secure aggregation: a key
	// without a valid signature by its site's certificate).
	SiteErrSecAgg = "secagg_refused"
)

var siteErrReasons = []string{
	SiteErrSchema, SiteErrBadValue, SiteErrUnknownLabel, SiteErrTooFewRows,
	SiteErrBadTransform, SiteErrSolve, SiteErrDisk, SiteErrData, SiteErrSecAgg,
}

// SiteErrReasons returns every site error reason ClientStatus.ErrorReason
// may carry (a new slice; the caller may keep it).
func SiteErrReasons() []string { return slices.Clone(siteErrReasons) }

// MaxErrorMessageLen bounds ClientStatus.ErrorMessage (bytes of UTF-8, one
// line).
const MaxErrorMessageLen = 512

// Validate implements Message.
func (m *ClientUpdate) Validate(lim Limits) error {
	const msg = "client update"
	if m == nil {
		return invalid(msg, "nil")
	}
	lim = lim.withDefaults()
	if err := checkID(msg, "client_id", m.ClientId); err != nil {
		return err
	}
	if m.Round == 0 {
		return invalid(msg, "round must be > 0")
	}
	switch m.Kind {
	case UpdateKind_UPDATE_KIND_FULL, UpdateKind_UPDATE_KIND_DELTA:
		if m.BaseRound != 0 {
			return invalid(msg, "base_round must be 0 for kind %v, got %d", m.Kind, m.BaseRound)
		}
	case UpdateKind_UPDATE_KIND_Z_DELTA, UpdateKind_UPDATE_KIND_SUM_DELTA:
		if m.BaseRound >= m.Round {
			return invalid(msg, "base_round %d must be < round %d", m.BaseRound, m.Round)
		}
	default:
		return invalid(msg, "kind %d is not FULL, DELTA, Z_DELTA or SUM_DELTA", int32(m.Kind))
	}
	if m.ClipBit > 1 {
		return invalid(msg, "clip_bit must be 0 or 1, got %d", m.ClipBit)
	}
	if err := checkVector(msg, "vector", m.Vector, lim); err != nil {
		return err
	}
	if m.ControlDelta != nil {
		if err := checkVector(msg, "control_delta", m.ControlDelta, lim); err != nil {
			return err
		}
	}
	if m.SampleCount == 0 {
		return invalid(msg, "sample_count must be > 0")
	}
	r := m.Report
	if r == nil {
		return invalid(msg, "report is required")
	}
	if err := checkNonNeg(msg, "report.achieved_gamma", r.AchievedGamma); err != nil {
		return err
	}
	if err := checkNonNeg(msg, "report.seconds", r.Seconds); err != nil {
		return err
	}
	if err := checkFinite(msg, "report.local_loss", r.LocalLoss); err != nil {
		return err
	}
	if err := checkFinite(msg, "report.anchor_loss", r.AnchorLoss); err != nil {
		return err
	}
	if _, ok := StopReason_name[int32(r.StopReason)]; !ok {
		return invalid(msg, "report.stop_reason %d is unknown", int32(r.StopReason))
	}
	if len(m.AnchorGrad) > lim.MaxAnchorGrad {
		return invalid(msg, "anchor_grad has %d values, limit %d", len(m.AnchorGrad), lim.MaxAnchorGrad)
	}
	for i, g := range m.AnchorGrad {
		if !finite(g) {
			return invalid(msg, "anchor_grad[%d] is %v", i, g)
		}
	}
	if err := checkInstance(msg, m.InstanceId); err != nil {
		return err
	}
	return checkTime(msg, "sent_at_unix_ms", m.SentAtUnixMs)
}

// checkInstance accepts an empty instance id (not told) or one of an id's
// characters ([A-Za-z0-9._-], at most MaxIDLen bytes).
func checkInstance(msg, id string) error {
	if id == "" {
		return nil
	}
	return checkID(msg, "instance_id", id)
}

// Validate implements Message.
func (m *Receipt) Validate(lim Limits) error {
	const msg = "receipt"
	if m == nil {
		return invalid(msg, "nil")
	}
	if err := checkID(msg, "client_id", m.ClientId); err != nil {
		return err
	}
	switch m.Subject {
	case ReceiptSubject_RECEIPT_SUBJECT_UPDATE:
		if m.Round == 0 {
			return invalid(msg, "round must be > 0")
		}
	case ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, ReceiptSubject_RECEIPT_SUBJECT_EVALUATION:
		// Statistics come before round 1; an evaluation report names the
		// aggregations its model had, which may be 0.
	case ReceiptSubject_RECEIPT_SUBJECT_SECAGG:
		if m.Round == 0 || !siteSecAggKind(m.SecaggKind) {
			return invalid(msg, "a secagg receipt needs round > 0 and the kind of a site's message (1, 3, 5, 7, 9), got round %d kind %d", m.Round, m.SecaggKind)
		}
	case ReceiptSubject_RECEIPT_SUBJECT_INVITATION:
		if m.Round == 0 || m.Accepted {
			return invalid(msg, "an invitation needs round > 0 and accepted false (round %d)", m.Round)
		}
	default:
		return invalid(msg, "subject %d is unknown", int32(m.Subject))
	}
	if m.Subject != ReceiptSubject_RECEIPT_SUBJECT_SECAGG && m.SecaggKind != 0 {
		return invalid(msg, "secagg_kind %d on a receipt of subject %v", m.SecaggKind, m.Subject)
	}
	if m.RunId != "" && m.Subject != ReceiptSubject_RECEIPT_SUBJECT_INVITATION {
		return invalid(msg, "run_id on a receipt of subject %v (invitations only)", m.Subject)
	}
	if err := checkText(msg, "run_id", m.RunId, maxRunIDLen, false); err != nil {
		return err
	}
	if err := checkText(msg, "reason", m.Reason, maxLongTextLen, false); err != nil {
		return err
	}
	if err := checkTime(msg, "stored_at_unix_ms", m.StoredAtUnixMs); err != nil {
		return err
	}
	if _, ok := ReceiptCode_name[int32(m.Code)]; !ok {
		return invalid(msg, "code %d is unknown", int32(m.Code))
	}
	okCode := m.Code == ReceiptCode_RECEIPT_CODE_STORED || m.Code == ReceiptCode_RECEIPT_CODE_DUPLICATE
	if m.Accepted {
		if m.StoredAtUnixMs == 0 {
			return invalid(msg, "an accepted receipt needs stored_at_unix_ms")
		}
		if m.Code != ReceiptCode_RECEIPT_CODE_UNSPECIFIED && !okCode {
			return invalid(msg, "accepted with rejection code %v", m.Code)
		}
	} else if okCode {
		return invalid(msg, "rejected with acceptance code %v", m.Code)
	}
	return nil
}

// checkDigest accepts a hex SHA-256 as schema.Digest writes it: 64
// lowercase hex digits.
func checkDigest(msg, field, s string) error {
	if len(s) != 64 {
		return invalid(msg, "%s must be 64 hex digits (SHA-256), got %d bytes", field, len(s))
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return invalid(msg, "%s must be lowercase hex, byte %d is %q", field, i, c)
		}
	}
	return nil
}

// Validate implements Message.
func (m *SiteStatistics) Validate(lim Limits) error {
	const msg = "site statistics"
	if m == nil {
		return invalid(msg, "nil")
	}
	lim = lim.withDefaults()
	if err := checkID(msg, "client_id", m.ClientId); err != nil {
		return err
	}
	if err := checkText(msg, "run_id", m.RunId, maxRunIDLen, false); err != nil {
		return err
	}
	if err := checkDigest(msg, "schema_digest", m.SchemaDigest); err != nil {
		return err
	}
	if err := checkPayload(msg, "stats", m.Stats, lim, true); err != nil {
		return err
	}
	return checkTime(msg, "sent_at_unix_ms", m.SentAtUnixMs)
}

// Validate implements Message.
func (m *EvalReport) Validate(lim Limits) error {
	const msg = "evaluation report"
	if m == nil {
		return invalid(msg, "nil")
	}
	lim = lim.withDefaults()
	if err := checkID(msg, "client_id", m.ClientId); err != nil {
		return err
	}
	if err := checkText(msg, "run_id", m.RunId, maxRunIDLen, false); err != nil {
		return err
	}
	if err := checkPayload(msg, "report", m.Report, lim, true); err != nil {
		return err
	}
	return checkTime(msg, "sent_at_unix_ms", m.SentAtUnixMs)
}

// The secagg.Kind values (wire does not import secagg): odd kinds go from a
// site to the aggregator, 4 (ShareList) from the aggregator to one site.
const (
	SecAggKindAdvertiseKeys  = 1
	SecAggKindShareKeys      = 3
	SecAggKindShareList      = 4
	SecAggKindMaskedInput    = 5
	SecAggKindUnmaskResponse = 7
	// SecAggKindSurvivors is a site's signature of the survivor set
	// (signed secure aggregation's consistency round; uplink, not secagg).
	SecAggKindSurvivors = 9
)

func siteSecAggKind(k uint32) bool {
	switch k {
	case SecAggKindAdvertiseKeys, SecAggKindShareKeys, SecAggKindMaskedInput, SecAggKindUnmaskResponse, SecAggKindSurvivors:
		return true
	}
	return false
}

// Validate implements Message. kind is a site's message (1, 3, 5, 7, 9) or a
// ShareList (4); the payload's contents are the secagg package's to check
// (secagg.Decode), and the receiver checks that its id and session match.
func (m *SecAggMessage) Validate(lim Limits) error {
	const msg = "secagg message"
	if m == nil {
		return invalid(msg, "nil")
	}
	lim = lim.withDefaults()
	if err := checkID(msg, "client_id", m.ClientId); err != nil {
		return err
	}
	if err := checkText(msg, "run_id", m.RunId, maxRunIDLen, false); err != nil {
		return err
	}
	if m.Round == 0 {
		return invalid(msg, "round must be > 0")
	}
	if !siteSecAggKind(m.Kind) && m.Kind != SecAggKindShareList {
		return invalid(msg, "kind %d is not a secagg message kind this topic carries (1, 3, 4, 5, 7, 9)", m.Kind)
	}
	if err := checkPayload(msg, "payload", m.Payload, lim, true); err != nil {
		return err
	}
	if (len(m.Certificate) > 0 || len(m.Signature) > 0) && (m.Kind != SecAggKindAdvertiseKeys || len(m.Certificate) == 0 || len(m.Signature) == 0) {
		return invalid(msg, "a certificate (%d bytes) and a signature (%d bytes) in a message of kind %d: both or neither, in an AdvertiseKeys only", len(m.Certificate), len(m.Signature), m.Kind)
	}
	if len(m.ViewSignature) > 0 && (m.Kind != SecAggKindMaskedInput || len(m.ViewSignature) > MaxSecAggSig) {
		return invalid(msg, "a view signature of %d bytes in a message of kind %d: in a MaskedInput only, at most %d bytes", len(m.ViewSignature), m.Kind, MaxSecAggSig)
	}
	if len(m.SurvivorsSignature) > 0 && (m.Kind != SecAggKindSurvivors || len(m.SurvivorsSignature) > MaxSecAggSig) {
		return invalid(msg, "a survivors signature of %d bytes in a message of kind %d: in kind 9 only, at most %d bytes", len(m.SurvivorsSignature), m.Kind, MaxSecAggSig)
	}
	if len(m.Certificate) > MaxSecAggCert || len(m.Signature) > MaxSecAggSig {
		return invalid(msg, "a certificate of %d bytes or a signature of %d: want at most %d and %d", len(m.Certificate), len(m.Signature), MaxSecAggCert, MaxSecAggSig)
	}
	if m.BaseRound != 0 && (m.Kind != SecAggKindAdvertiseKeys || m.BaseRound >= m.Round) {
		return invalid(msg, "base_round %d in a message of kind %d of round %d: only an AdvertiseKeys names its base round, and it is < round", m.BaseRound, m.Kind, m.Round)
	}
	if err := checkInstance(msg, m.InstanceId); err != nil {
		return err
	}
	return checkTime(msg, "sent_at_unix_ms", m.SentAtUnixMs)
}

// Validate implements Message.
func (m *RunSpec) Validate(lim Limits) error {
	const msg = "run spec"
	if m == nil {
		return invalid(msg, "nil")
	}
	lim = lim.withDefaults()
	if err := checkID(msg, "federation", m.Federation); err != nil {
		return err
	}
	if err := checkText(msg, "run_id", m.RunId, maxRunIDLen, false); err != nil {
		return err
	}
	if err := checkPayload(msg, "schema", m.Schema, lim, true); err != nil {
		return err
	}
	if len(m.StatisticsSites) > 0 && len(m.Transform) == 0 {
		return invalid(msg, "statistics_sites without a transform")
	}
	if len(m.StatisticsSites) > lim.MaxClients {
		return invalid(msg, "%d statistics sites, limit %d", len(m.StatisticsSites), lim.MaxClients)
	}
	seen := make(map[string]struct{}, len(m.StatisticsSites))
	for i, id := range m.StatisticsSites {
		if err := checkID(msg, fmt.Sprintf("statistics_sites[%d]", i), id); err != nil {
			return err
		}
		if _, dup := seen[id]; dup {
			return invalid(msg, "statistics site %q listed twice", id)
		}
		seen[id] = struct{}{}
	}
	return checkPayload(msg, "transform", m.Transform, lim, false)
}

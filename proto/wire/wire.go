// Package wire owns what edge-agent and broker-agg say to each other over
// MQTT: the topic names (topics.go) and the versioned message envelopes
// (edgefl.proto, the schema of record; Go types in messages_gen.go and their
// protobuf encoding in codec_gen.go, generated from it by proto/wire/internal/gen,
// pinned by testdata/golden/).
//
// Every payload is one Envelope carrying a schema version and exactly one of
// RoundAnnouncement, ClientStatus, ClientUpdate, Receipt, SiteStatistics or
// EvalReport. Encode validates
// and serialises a message; the Decode functions treat their input as
// hostile: they check the size limit first, then the version and the body
// type by scanning the top-level fields without allocating, then unmarshal,
// then validate every field. They return errors, never panic, and never
// return a message that fails validation.
//
// Model vectors travel as codec frames (bytes) with the codec's spec string
// and the dimension; decoding the frame is the quant package's job, and the
// dimension lets the receiver bound that allocation first.
package wire

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
)

// Version is the envelope schema version this package writes and the only
// one it reads.
const Version uint32 = 1

// Errors returned by the decoders and Encode. Every error wraps exactly one
// of these (a version error also is a *VersionError).
var (
	ErrUnsupportedVersion = errors.New("wire: unsupported message version")
	ErrTooLarge           = errors.New("wire: message too large")
	ErrMalformed          = errors.New("wire: malformed message")
	ErrWrongType          = errors.New("wire: unexpected message type")
	ErrInvalid            = errors.New("wire: invalid message")
)

// VersionError reports an envelope whose version this build does not speak.
// errors.Is(err, ErrUnsupportedVersion) holds for it.
type VersionError struct {
	Version uint32 // the version found in the message (0 = missing)
}

func (e *VersionError) Error() string {
	if e.Version == 0 {
		return fmt.Sprintf("wire: message has no version (this build speaks version %d)", Version)
	}
	return fmt.Sprintf("wire: unsupported message version %d (this build speaks version %d)", e.Version, Version)
}

// Is makes errors.Is(err, ErrUnsupportedVersion) true.
func (e *VersionError) Is(target error) bool { return target == ErrUnsupportedVersion }

// Limits bound what a decoder accepts. A zero (or negative) field takes the
// value from DefaultLimits.
type Limits struct {
	// MaxMessageBytes bounds the whole encoded envelope; it is checked before
	// anything is parsed. Keep it at or below the broker's packet size cap.
	MaxMessageBytes int
	// MaxDimension bounds a model vector's dimension (the receiver will
	// allocate 8*dimension bytes to decode it).
	MaxDimension int
	// MaxClients bounds the selected-client list of a round announcement.
	MaxClients int
	// MaxAnchorGrad bounds the length of an update's anchor gradient or its
	// sketch; default MaxDimension.
	MaxAnchorGrad int
}

// DefaultLimits are generous for the models edgefl trains (logistic
// regression, small MLPs) on gateway hardware.
var DefaultLimits = Limits{
	MaxMessageBytes: 32 << 20,
	MaxDimension:    1 << 22,
	MaxClients:      100_000,
	MaxAnchorGrad:   1 << 22,
}

// withDefaults is out of line: it is called from many decoders and
// validators, and a copy at each costs edge-agent text.
//
//go:noinline
func (l Limits) withDefaults() Limits {
	if l.MaxMessageBytes <= 0 {
		l.MaxMessageBytes = DefaultLimits.MaxMessageBytes
	}
	if l.MaxDimension <= 0 {
		l.MaxDimension = DefaultLimits.MaxDimension
	}
	if l.MaxClients <= 0 {
		l.MaxClients = DefaultLimits.MaxClients
	}
	if l.MaxAnchorGrad <= 0 {
		l.MaxAnchorGrad = l.MaxDimension
	}
	return l
}

// noLimits is what Encode validates against: structure only. The receiver
// applies its own Limits.
var noLimits = Limits{
	MaxMessageBytes: math.MaxInt,
	MaxDimension:    math.MaxInt,
	MaxClients:      math.MaxInt,
	MaxAnchorGrad:   math.MaxInt,
}

// Message is one of *RoundAnnouncement, *ClientStatus, *ClientUpdate,
// *Receipt, *SiteStatistics, *EvalReport, *SecAggMessage: what an Envelope
// can carry.
type Message interface {
	// Validate reports the first field that is missing, out of range or
	// non-finite, or a size beyond lim (zero fields take DefaultLimits).
	Validate(lim Limits) error
	// String returns a one-line text form of the message, for logs.
	String() string
	wrap() isEnvelope_Body
	codec
}

// Body kinds returned by BodyKind.
const (
	BodyRound      = "round"
	BodyStatus     = "status"
	BodyUpdate     = "update"
	BodyReceipt    = "receipt"
	BodyStatistics = "statistics"
	BodyEvaluation = "evaluation"
	BodySecAgg     = "secagg"
	BodyRun        = "run"
)

// BodyKind names the envelope body a message is: one of the Body constants
// (the field's name in edgefl.proto's Envelope), or "" for anything else
// (including a nil pointer). It tells apart the three messages the update
// topic carries (ClientUpdate, SiteStatistics, EvalReport), e.g. for a log
// field or a metric label.
func BodyKind(msg any) string {
	switch m := msg.(type) {
	case *RoundAnnouncement:
		if m != nil {
			return BodyRound
		}
	case *ClientStatus:
		if m != nil {
			return BodyStatus
		}
	case *ClientUpdate:
		if m != nil {
			return BodyUpdate
		}
	case *Receipt:
		if m != nil {
			return BodyReceipt
		}
	case *SiteStatistics:
		if m != nil {
			return BodyStatistics
		}
	case *EvalReport:
		if m != nil {
			return BodyEvaluation
		}
	case *SecAggMessage:
		if m != nil {
			return BodySecAgg
		}
	case *RunSpec:
		if m != nil {
			return BodyRun
		}
	}
	return ""
}

// Encode validates m (structure only: the receiver applies its own Limits)
// and returns it wrapped in a current-version Envelope. Encoding is
// deterministic (fields in ascending number order), so re-encoding gives the
// same bytes.
func Encode(m Message) ([]byte, error) {
	return EncodeVersion(m, Version)
}

// EncodeVersion is Encode with the envelope version of your choice. It is
// for tests of receivers (a version this build does not speak must be
// rejected); everything else uses Encode.
func EncodeVersion(m Message, version uint32) ([]byte, error) {
	env := &Envelope{Version: version}
	if m != nil {
		env.Body = m.wrap()
	}
	if body, _ := env.message(); body == nil {
		return nil, fmt.Errorf("%w: nil message", ErrInvalid)
	}
	if err := m.Validate(noLimits); err != nil {
		return nil, err
	}
	return marshal(env), nil
}

// peek scans the envelope's top-level fields without allocating and returns
// the version and the field number of the body (0 if none), with the same
// last-one-wins rule protobuf applies when unmarshalling.
func peek(b []byte) (version uint32, body protowire.Number, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, 0, fmt.Errorf("%w: envelope: %w", ErrMalformed, protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == fieldVersion && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return 0, 0, fmt.Errorf("%w: envelope version: %w", ErrMalformed, protowire.ParseError(m))
			}
			version = uint32(v)
			n = m
		case isBodyField(num) && typ == protowire.BytesType:
			_, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return 0, 0, fmt.Errorf("%w: envelope body: %w", ErrMalformed, protowire.ParseError(m))
			}
			body = num
			n = m
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return 0, 0, fmt.Errorf("%w: envelope field %d: %w", ErrMalformed, num, protowire.ParseError(n))
			}
		}
		b = b[n:]
	}
	return version, body, nil
}

// decode runs the checks shared by every decoder: size, version, body type
// (want empty = any, else one of want), unmarshal. The message is not yet
// validated.
// unmarshalCodec is m.unmarshal through the codec interface, which keeps
// (*Envelope).unmarshal out of decode: inlined there, its field closure
// was compiled a second time (2 kB of edge-agent's text); the method
// itself is linked anyway, for the codec interface.
//
//go:noinline
func unmarshalCodec(m codec, b []byte, d *decoder) error { return m.unmarshal(b, d) }

func decode(b []byte, lim Limits, want ...protowire.Number) (Message, error) {
	if len(b) > lim.MaxMessageBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(b), lim.MaxMessageBytes)
	}
	version, body, err := peek(b)
	if err != nil {
		return nil, err
	}
	if version != Version {
		return nil, &VersionError{Version: version}
	}
	if body == 0 {
		return nil, fmt.Errorf("%w: envelope has no body", ErrMalformed)
	}
	if len(want) > 0 && !slices.Contains(want, body) {
		names := make([]string, len(want))
		for i, w := range want {
			names[i] = fieldName(w)
		}
		return nil, fmt.Errorf("%w: got %s, want %s", ErrWrongType, fieldName(body), strings.Join(names, " or "))
	}
	var env Envelope
	d := newDecoder(lim)
	if err := unmarshalCodec(&env, b, d); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if d.tooMany != nil {
		return nil, d.tooMany
	}
	m, num := env.message()
	if m == nil || num != body {
		// Unreachable after peek, kept so that a mismatch is an error.
		return nil, fmt.Errorf("%w: envelope has no body", ErrMalformed)
	}
	return m, nil
}

// Decode decodes and validates an envelope of any type. Use a type switch on
// the result, or the typed decoders when the topic fixes the type.
func Decode(b []byte, lim Limits) (Message, error) {
	lim = lim.withDefaults()
	m, err := decode(b, lim)
	if err != nil {
		return nil, err
	}
	if err := m.Validate(lim); err != nil {
		return nil, err
	}
	return m, nil
}

func decodeAs[T Message](b []byte, lim Limits, want protowire.Number) (T, error) {
	var zero T
	lim = lim.withDefaults()
	m, err := decode(b, lim, want)
	if err != nil {
		return zero, err
	}
	t, ok := m.(T)
	if !ok { // unreachable: decode checked the body field
		return zero, fmt.Errorf("%w: got %T", ErrWrongType, m)
	}
	if err := t.Validate(lim); err != nil {
		return zero, err
	}
	return t, nil
}

// DecodeRound decodes and validates a RoundAnnouncement envelope.
func DecodeRound(b []byte, lim Limits) (*RoundAnnouncement, error) {
	return decodeAs[*RoundAnnouncement](b, lim, fieldRound)
}

// DecodeStatus decodes and validates a ClientStatus envelope.
func DecodeStatus(b []byte, lim Limits) (*ClientStatus, error) {
	return decodeAs[*ClientStatus](b, lim, fieldStatus)
}

// DecodeUpdate decodes and validates a ClientUpdate envelope.
func DecodeUpdate(b []byte, lim Limits) (*ClientUpdate, error) {
	return decodeAs[*ClientUpdate](b, lim, fieldUpdate)
}

// DecodeReceipt decodes and validates a Receipt envelope.
func DecodeReceipt(b []byte, lim Limits) (*Receipt, error) {
	return decodeAs[*Receipt](b, lim, fieldReceipt)
}

// DecodeStatistics decodes and validates a SiteStatistics envelope.
func DecodeStatistics(b []byte, lim Limits) (*SiteStatistics, error) {
	return decodeAs[*SiteStatistics](b, lim, fieldStatistics)
}

// DecodeEvaluation decodes and validates an EvalReport envelope.
func DecodeEvaluation(b []byte, lim Limits) (*EvalReport, error) {
	return decodeAs[*EvalReport](b, lim, fieldEvaluation)
}

// DecodeSecAgg decodes and validates a SecAggMessage envelope.
func DecodeSecAgg(b []byte, lim Limits) (*SecAggMessage, error) {
	return decodeAs[*SecAggMessage](b, lim, fieldSecagg)
}

// DecodeRun decodes and validates a RunSpec envelope.
func DecodeRun(b []byte, lim Limits) (*RunSpec, error) {
	return decodeAs[*RunSpec](b, lim, fieldRun)
}

// DecodeSiteMessage decodes and validates what a site publishes on its update
// topic: a *ClientUpdate, *SiteStatistics, *EvalReport or *SecAggMessage
// envelope (any other body is ErrWrongType). Tell them apart with a type
// switch or BodyKind.
func DecodeSiteMessage(b []byte, lim Limits) (Message, error) {
	lim = lim.withDefaults()
	m, err := decode(b, lim, fieldUpdate, fieldStatistics, fieldEvaluation, fieldSecagg)
	if err != nil {
		return nil, err
	}
	if err := m.Validate(lim); err != nil {
		return nil, err
	}
	return m, nil
}

// DecodeSiteInbox decodes and validates what the aggregator publishes on a
// site's receipts topic: a *Receipt, or a *SecAggMessage that is a ShareList
// (secagg kind 4; any other kind or body is an error).
func DecodeSiteInbox(b []byte, lim Limits) (Message, error) {
	lim = lim.withDefaults()
	m, err := decode(b, lim, fieldReceipt, fieldSecagg)
	if err != nil {
		return nil, err
	}
	if err := m.Validate(lim); err != nil {
		return nil, err
	}
	if sm, ok := m.(*SecAggMessage); ok && sm.Kind != SecAggKindShareList {
		return nil, fmt.Errorf("%w: secagg message of kind %d on a receipts topic, want %d (ShareList)", ErrInvalid, sm.Kind, SecAggKindShareList)
	}
	return m, nil
}

// PartialMeans is what a work report's "partial" means wherever it is
// shown (the agent's and the aggregator's logs, status, the console,
// /metrics): the local solve stopped at its budget (epochs, gradient
// evaluations, the round's deadline) or was pre-empted by a newer round
// before reaching the round's target gamma. Partial work is normal in the
// FedProx family and is sent and used, not a fault.
const PartialMeans = "stopped at its budget or deadline before reaching the round's target gamma; the work is used (normal for FedProx)"

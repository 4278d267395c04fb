package wire

// The protobuf encoding of the messages of edgefl.proto, written by hand
// with protowire instead of the reflection-based protobuf runtime (which
// would double edge-agent's size). It follows proto3 and what protobuf-go's
// deterministic Marshal and Unmarshal did, so that the bytes are the same
// (testdata/golden/ pins them):
//
//   - Encoding writes the fields in ascending field-number order, omits a
//     scalar that is zero (+0 for doubles: -0 is written), an empty string or
//     bytes, and a nil sub-message (an empty non-nil one is written), and
//     packs repeated scalars (none when empty). Enums are sign-extended
//     varints.
//   - Decoding accepts packed and unpacked repeated scalars, concatenates
//     repeated fields, keeps the last value of a singular scalar, merges
//     repeated occurrences of a sub-message (and of the same oneof case; a
//     different case replaces it), skips unknown fields and known fields of
//     an unexpected wire type, and rejects invalid UTF-8 in strings, field
//     number 0 or above 2^29-1, and lengths beyond the remaining input.
//
// Every length is checked against the remaining input before it is used,
// nothing is allocated beyond what the input holds, and the repeated fields
// stop growing at their limit. Nesting is bounded by the schema (no message
// contains itself: envelope, body, sub-message); unknown groups are skipped
// by protowire, which bounds their nesting.

import (
	"errors"
	"fmt"
	"math"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// codec is implemented by every message type.
type codec interface {
	// size returns the length of the encoding.
	size() int
	// appendTo appends the encoding (without tag or length) to b.
	appendTo(b []byte) []byte
	// unmarshal merges the encoded message b into the receiver.
	unmarshal(b []byte, d *decoder) error
}

// marshal returns the encoding of m in a buffer of exactly its size.
func marshal(m codec) []byte {
	return m.appendTo(make([]byte, 0, m.size()))
}

var errInvalidUTF8 = errors.New("string field is not valid UTF-8")

// decoder carries the limits on repeated fields through one decode.
type decoder struct {
	lim Limits // with defaults applied
	// maxHidden and maxCapabilities are the fixed bounds of Validate
	// (maxHiddenLayers, maxCapabilities).
	maxHidden, maxCapabilities int
	// tooMany is the first repeated field found over its limit: decoding
	// goes on without growing it (the input may still be malformed, which
	// takes precedence), and the decode fails with this ErrInvalid error.
	tooMany error
}

func newDecoder(lim Limits) *decoder {
	return &decoder{lim: lim, maxHidden: maxHiddenLayers, maxCapabilities: maxCapabilities}
}

// over records that a repeated field would exceed its limit.
func (d *decoder) over(msg, field string, limit int) {
	if d.tooMany == nil {
		d.tooMany = invalid(msg, "%s has more than %d values", field, limit)
	}
}

// fieldFunc decodes the value of field num (wire type typ) at the start of
// b. It returns the number of bytes consumed (> 0); 0 for a field it does
// not know, which is skipped; a negative protowire error code; or an error.
type fieldFunc func(num protowire.Number, typ protowire.Type, b []byte) (int, error)

// fields walks the fields of the message msg encoded in b.
func fields(msg string, b []byte, field fieldFunc) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%s: tag: %w", msg, protowire.ParseError(n))
		}
		if num > protowire.MaxValidNumber {
			return fmt.Errorf("%s: field number %d out of range", msg, num)
		}
		b = b[n:]
		m, err := field(num, typ, b)
		if err != nil {
			return fmt.Errorf("%s field %d: %w", msg, num, err)
		}
		if m == 0 {
			m = protowire.ConsumeFieldValue(num, typ, b)
		}
		if m < 0 {
			return fmt.Errorf("%s field %d: %w", msg, num, protowire.ParseError(m))
		}
		b = b[m:]
	}
	return nil
}

// Field decoders: each returns the bytes consumed or a negative protowire
// error code, as fieldFunc does.

func consumeString(dst *string, b []byte) (int, error) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return n, nil
	}
	if !utf8.Valid(v) {
		return 0, errInvalidUTF8
	}
	*dst = string(v)
	return n, nil
}

func consumeBytes(dst *[]byte, b []byte) int {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return n
	}
	if len(v) == 0 {
		*dst = nil
	} else {
		*dst = append([]byte(nil), v...)
	}
	return n
}

func consumeUint64(dst *uint64, b []byte) int {
	v, n := protowire.ConsumeVarint(b)
	if n >= 0 {
		*dst = v
	}
	return n
}

func consumeUint32(dst *uint32, b []byte) int {
	v, n := protowire.ConsumeVarint(b)
	if n >= 0 {
		*dst = uint32(v)
	}
	return n
}

func consumeInt64(dst *int64, b []byte) int {
	v, n := protowire.ConsumeVarint(b)
	if n >= 0 {
		*dst = int64(v)
	}
	return n
}

// consumeEnum decodes an enum's varint, truncated to int32 like protobuf-go.
func consumeEnum(dst *int32, b []byte) int {
	v, n := protowire.ConsumeVarint(b)
	if n >= 0 {
		*dst = int32(v)
	}
	return n
}

func consumeBool(dst *bool, b []byte) int {
	v, n := protowire.ConsumeVarint(b)
	if n >= 0 {
		*dst = protowire.DecodeBool(v)
	}
	return n
}

func consumeDouble(dst *float64, b []byte) int {
	v, n := protowire.ConsumeFixed64(b)
	if n >= 0 {
		*dst = math.Float64frombits(v)
	}
	return n
}

// consumeMessage merges the sub-message at the start of b into m.
func consumeMessage(m codec, b []byte, d *decoder) (int, error) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return n, nil
	}
	return n, m.unmarshal(v, d)
}

// consumeRepeatedString appends one element to a repeated string field, up to limit
// elements.
func consumeRepeatedString(dst *[]string, b []byte, d *decoder, msg, field string, limit int) (int, error) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return n, nil
	}
	if !utf8.Valid(v) {
		return 0, errInvalidUTF8
	}
	if len(*dst) >= limit {
		d.over(msg, field, limit)
		return n, nil
	}
	*dst = append(*dst, string(v))
	return n, nil
}

// consumeRepeatedUint32 decodes one element (VarintType) or a packed run
// (BytesType) of a repeated uint32 field, up to limit elements.
func consumeRepeatedUint32(dst *[]uint32, typ protowire.Type, b []byte, d *decoder, msg, field string, limit int) int {
	switch typ {
	case protowire.VarintType:
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return n
		}
		if len(*dst) >= limit {
			d.over(msg, field, limit)
		} else {
			*dst = append(*dst, uint32(v))
		}
		return n
	case protowire.BytesType:
		p, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return n
		}
		count := 0 // varints in the run, if it is well formed
		for _, c := range p {
			if c < 0x80 {
				count++
			}
		}
		keep := len(*dst)+count <= limit
		if !keep {
			d.over(msg, field, limit)
		} else if count > 0 {
			*dst = growUint32(*dst, count)
		}
		for len(p) > 0 {
			v, m := protowire.ConsumeVarint(p)
			if m < 0 {
				return m
			}
			if keep {
				*dst = append(*dst, uint32(v))
			}
			p = p[m:]
		}
		return n
	}
	return 0
}

// consumeRepeatedDouble decodes one element (Fixed64Type) or a packed run
// (BytesType) of a repeated double field, up to limit elements.
func consumeRepeatedDouble(dst *[]float64, typ protowire.Type, b []byte, d *decoder, msg, field string, limit int) int {
	switch typ {
	case protowire.Fixed64Type:
		v, n := protowire.ConsumeFixed64(b)
		if n < 0 {
			return n
		}
		if len(*dst) >= limit {
			d.over(msg, field, limit)
		} else {
			*dst = append(*dst, math.Float64frombits(v))
		}
		return n
	case protowire.BytesType:
		p, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return n
		}
		if len(p)%8 != 0 {
			return -1 // protowire's code for a truncated value
		}
		count := len(p) / 8
		if len(*dst)+count > limit {
			d.over(msg, field, limit)
			return n
		}
		if count > 0 {
			s := growFloat64(*dst, count)
			for ; len(p) > 0; p = p[8:] {
				v, _ := protowire.ConsumeFixed64(p)
				s = append(s, math.Float64frombits(v))
			}
			*dst = s
		}
		return n
	}
	return 0
}

func growUint32(s []uint32, n int) []uint32 {
	if cap(s)-len(s) >= n {
		return s
	}
	t := make([]uint32, len(s), len(s)+n)
	copy(t, s)
	return t
}

func growFloat64(s []float64, n int) []float64 {
	if cap(s)-len(s) >= n {
		return s
	}
	t := make([]float64, len(s), len(s)+n)
	copy(t, s)
	return t
}

// Field encoders. Field numbers up to 15 take a one-byte tag, 16 and above
// (RoundAnnouncement's 16-20) two bytes: SizeTag counts them.

func sizeVarint(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func boolVarint(v bool) uint64 { return protowire.EncodeBool(v) }

// isZeroDouble reports whether proto3 omits x: +0 only (-0 is written).
func isZeroDouble(x float64) bool { return math.Float64bits(x) == 0 }

func sizeDouble(num protowire.Number, v float64) int {
	if isZeroDouble(v) {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeFixed64()
}

func appendDouble(b []byte, num protowire.Number, v float64) []byte {
	if isZeroDouble(v) {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, math.Float64bits(v))
}

func sizeString(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(s))
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func sizeBytes(num protowire.Number, v []byte) int {
	if len(v) == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(v))
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// sizeMessage and appendMessage take present = false for a nil sub-message.
func sizeMessage(num protowire.Number, present bool, m codec) int {
	if !present {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(m.size())
}

func appendMessage(b []byte, num protowire.Number, present bool, m codec) []byte {
	if !present {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(m.size()))
	return m.appendTo(b)
}

func sizeStrings(num protowire.Number, s []string) int {
	n := 0
	for _, v := range s {
		n += protowire.SizeTag(num) + protowire.SizeBytes(len(v))
	}
	return n
}

func appendStrings(b []byte, num protowire.Number, s []string) []byte {
	for _, v := range s {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendString(b, v)
	}
	return b
}

func packedUint32Len(s []uint32) int {
	n := 0
	for _, v := range s {
		n += protowire.SizeVarint(uint64(v))
	}
	return n
}

func sizePackedUint32(num protowire.Number, s []uint32) int {
	if len(s) == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(packedUint32Len(s))
}

func appendPackedUint32(b []byte, num protowire.Number, s []uint32) []byte {
	if len(s) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(packedUint32Len(s)))
	for _, v := range s {
		b = protowire.AppendVarint(b, uint64(v))
	}
	return b
}

func sizePackedDouble(num protowire.Number, s []float64) int {
	if len(s) == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(8*len(s))
}

func appendPackedDouble(b []byte, num protowire.Number, s []float64) []byte {
	if len(s) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(8*len(s)))
	for _, v := range s {
		b = protowire.AppendFixed64(b, math.Float64bits(v))
	}
	return b
}

// Envelope

// message returns the body and its field number, or nil and 0 when there is
// none (including a oneof wrapper holding a nil message).
func (x *Envelope) message() (Message, protowire.Number) {
	switch b := x.Body.(type) {
	case *Envelope_Round:
		if b != nil && b.Round != nil {
			return b.Round, fieldRound
		}
	case *Envelope_Status:
		if b != nil && b.Status != nil {
			return b.Status, fieldStatus
		}
	case *Envelope_Update:
		if b != nil && b.Update != nil {
			return b.Update, fieldUpdate
		}
	case *Envelope_Receipt:
		if b != nil && b.Receipt != nil {
			return b.Receipt, fieldReceipt
		}
	case *Envelope_Statistics:
		if b != nil && b.Statistics != nil {
			return b.Statistics, fieldStatistics
		}
	case *Envelope_Evaluation:
		if b != nil && b.Evaluation != nil {
			return b.Evaluation, fieldEvaluation
		}
	}
	return nil, 0
}

// encodedBody is the body as marshalled: like message, but a oneof wrapper
// holding a nil message is an empty message, as protobuf-go wrote it.
func (x *Envelope) encodedBody() (codec, protowire.Number) {
	switch b := x.Body.(type) {
	case *Envelope_Round:
		if b != nil && b.Round != nil {
			return b.Round, fieldRound
		}
		if b != nil {
			return &RoundAnnouncement{}, fieldRound
		}
	case *Envelope_Status:
		if b != nil && b.Status != nil {
			return b.Status, fieldStatus
		}
		if b != nil {
			return &ClientStatus{}, fieldStatus
		}
	case *Envelope_Update:
		if b != nil && b.Update != nil {
			return b.Update, fieldUpdate
		}
		if b != nil {
			return &ClientUpdate{}, fieldUpdate
		}
	case *Envelope_Receipt:
		if b != nil && b.Receipt != nil {
			return b.Receipt, fieldReceipt
		}
		if b != nil {
			return &Receipt{}, fieldReceipt
		}
	case *Envelope_Statistics:
		if b != nil && b.Statistics != nil {
			return b.Statistics, fieldStatistics
		}
		if b != nil {
			return &SiteStatistics{}, fieldStatistics
		}
	case *Envelope_Evaluation:
		if b != nil && b.Evaluation != nil {
			return b.Evaluation, fieldEvaluation
		}
		if b != nil {
			return &EvalReport{}, fieldEvaluation
		}
	}
	return nil, 0
}

func (x *Envelope) size() int {
	n := sizeVarint(fieldVersion, uint64(x.Version))
	if m, num := x.encodedBody(); m != nil {
		n += sizeMessage(num, true, m)
	}
	return n
}

func (x *Envelope) appendTo(b []byte) []byte {
	b = appendVarint(b, fieldVersion, uint64(x.Version))
	if m, num := x.encodedBody(); m != nil {
		b = appendMessage(b, num, true, m)
	}
	return b
}

func (x *Envelope) unmarshal(b []byte, d *decoder) error {
	return fields("Envelope", b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == fieldVersion && typ == protowire.VarintType:
			return consumeUint32(&x.Version, b), nil
		case typ != protowire.BytesType:
			return 0, nil
		case num == fieldRound:
			w, ok := x.Body.(*Envelope_Round)
			if !ok || w == nil || w.Round == nil {
				w = &Envelope_Round{Round: &RoundAnnouncement{}}
			}
			n, err := consumeMessage(w.Round, b, d)
			x.Body = w
			return n, err
		case num == fieldStatus:
			w, ok := x.Body.(*Envelope_Status)
			if !ok || w == nil || w.Status == nil {
				w = &Envelope_Status{Status: &ClientStatus{}}
			}
			n, err := consumeMessage(w.Status, b, d)
			x.Body = w
			return n, err
		case num == fieldUpdate:
			w, ok := x.Body.(*Envelope_Update)
			if !ok || w == nil || w.Update == nil {
				w = &Envelope_Update{Update: &ClientUpdate{}}
			}
			n, err := consumeMessage(w.Update, b, d)
			x.Body = w
			return n, err
		case num == fieldReceipt:
			w, ok := x.Body.(*Envelope_Receipt)
			if !ok || w == nil || w.Receipt == nil {
				w = &Envelope_Receipt{Receipt: &Receipt{}}
			}
			n, err := consumeMessage(w.Receipt, b, d)
			x.Body = w
			return n, err
		case num == fieldStatistics:
			w, ok := x.Body.(*Envelope_Statistics)
			if !ok || w == nil || w.Statistics == nil {
				w = &Envelope_Statistics{Statistics: &SiteStatistics{}}
			}
			n, err := consumeMessage(w.Statistics, b, d)
			x.Body = w
			return n, err
		case num == fieldEvaluation:
			w, ok := x.Body.(*Envelope_Evaluation)
			if !ok || w == nil || w.Evaluation == nil {
				w = &Envelope_Evaluation{Evaluation: &EvalReport{}}
			}
			n, err := consumeMessage(w.Evaluation, b, d)
			x.Body = w
			return n, err
		}
		return 0, nil
	})
}

// Vector

func (x *Vector) size() int {
	return sizeString(1, x.Codec) + sizeVarint(2, uint64(x.Dimension)) + sizeBytes(3, x.Payload)
}

func (x *Vector) appendTo(b []byte) []byte {
	b = appendString(b, 1, x.Codec)
	b = appendVarint(b, 2, uint64(x.Dimension))
	return appendBytes(b, 3, x.Payload)
}

func (x *Vector) unmarshal(b []byte, d *decoder) error {
	return fields("Vector", b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == 1 && typ == protowire.BytesType:
			return consumeString(&x.Codec, b)
		case num == 2 && typ == protowire.VarintType:
			return consumeUint32(&x.Dimension, b), nil
		case num == 3 && typ == protowire.BytesType:
			return consumeBytes(&x.Payload, b), nil
		}
		return 0, nil
	})
}

// Params

func (x *Params) size() int {
	return sizeDouble(1, x.Mu) + sizeDouble(2, x.Step) + sizeDouble(3, x.Relax) +
		sizeString(4, x.Solver) + sizeDouble(5, x.Gamma) + sizeDouble(6, x.Lr) +
		sizeVarint(7, uint64(x.Batch)) + sizeVarint(8, uint64(x.Clients)) + sizeVarint(9, x.TotalSamples)
}

func (x *Params) appendTo(b []byte) []byte {
	b = appendDouble(b, 1, x.Mu)
	b = appendDouble(b, 2, x.Step)
	b = appendDouble(b, 3, x.Relax)
	b = appendString(b, 4, x.Solver)
	b = appendDouble(b, 5, x.Gamma)
	b = appendDouble(b, 6, x.Lr)
	b = appendVarint(b, 7, uint64(x.Batch))
	b = appendVarint(b, 8, uint64(x.Clients))
	return appendVarint(b, 9, x.TotalSamples)
}

func (x *Params) unmarshal(b []byte, d *decoder) error {
	return fields("Params", b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch typ {
		case protowire.Fixed64Type:
			switch num {
			case 1:
				return consumeDouble(&x.Mu, b), nil
			case 2:
				return consumeDouble(&x.Step, b), nil
			case 3:
				return consumeDouble(&x.Relax, b), nil
			case 5:
				return consumeDouble(&x.Gamma, b), nil
			case 6:
				return consumeDouble(&x.Lr, b), nil
			}
		case protowire.BytesType:
			if num == 4 {
				return consumeString(&x.Solver, b)
			}
		case protowire.VarintType:
			switch num {
			case 7:
				return consumeUint32(&x.Batch, b), nil
			case 8:
				return consumeUint32(&x.Clients, b), nil
			case 9:
				return consumeUint64(&x.TotalSamples, b), nil
			}
		}
		return 0, nil
	})
}

// ModelSpec

func (x *ModelSpec) size() int {
	return sizeString(1, x.Kind) + sizeVarint(2, uint64(x.Inputs)) + sizeVarint(3, uint64(x.Classes)) +
		sizePackedUint32(4, x.Hidden) + sizeString(5, x.Activation) + sizeDouble(6, x.L2)
}

func (x *ModelSpec) appendTo(b []byte) []byte {
	b = appendString(b, 1, x.Kind)
	b = appendVarint(b, 2, uint64(x.Inputs))
	b = appendVarint(b, 3, uint64(x.Classes))
	b = appendPackedUint32(b, 4, x.Hidden)
	b = appendString(b, 5, x.Activation)
	return appendDouble(b, 6, x.L2)
}

func (x *ModelSpec) unmarshal(b []byte, d *decoder) error {
	return fields("ModelSpec", b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == 1 && typ == protowire.BytesType:
			return consumeString(&x.Kind, b)
		case num == 2 && typ == protowire.VarintType:
			return consumeUint32(&x.Inputs, b), nil
		case num == 3 && typ == protowire.VarintType:
			return consumeUint32(&x.Classes, b), nil
		case num == 4:
			return consumeRepeatedUint32(&x.Hidden, typ, b, d, "round announcement", "model.hidden", d.maxHidden), nil
		case num == 5 && typ == protowire.BytesType:
			return consumeString(&x.Activation, b)
		case num == 6 && typ == protowire.Fixed64Type:
			return consumeDouble(&x.L2, b), nil
		}
		return 0, nil
	})
}

// WorkBudget

func (x *WorkBudget) size() int {
	return sizeVarint(1, uint64(x.MaxEpochs)) + sizeDouble(2, x.MaxSeconds) + sizeVarint(3, x.MaxGradEvals)
}

func (x *WorkBudget) appendTo(b []byte) []byte {
	b = appendVarint(b, 1, uint64(x.MaxEpochs))
	b = appendDouble(b, 2, x.MaxSeconds)
	return appendVarint(b, 3, x.MaxGradEvals)
}

func (x *WorkBudget) unmarshal(b []byte, d *decoder) error {
	return fields("WorkBudget", b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == 1 && typ == protowire.VarintType:
			return consumeUint32(&x.MaxEpochs, b), nil
		case num == 2 && typ == protowire.Fixed64Type:
			return consumeDouble(&x.MaxSeconds, b), nil
		case num == 3 && typ == protowire.VarintType:
			return consumeUint64(&x.MaxGradEvals, b), nil
		}
		return 0, nil
	})
}

// SketchSpec

func (x *SketchSpec) size() int {
	return sizeVarint(1, uint64(x.Dimension)) + sizeVarint(2, x.Seed)
}

func (x *SketchSpec) appendTo(b []byte) []byte {
	b = appendVarint(b, 1, uint64(x.Dimension))
	return appendVarint(b, 2, x.Seed)
}

func (x *SketchSpec) unmarshal(b []byte, d *decoder) error {
	return fields("SketchSpec", b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == 1 && typ == protowire.VarintType:
			return consumeUint32(&x.Dimension, b), nil
		case num == 2 && typ == protowire.VarintType:
			return consumeUint64(&x.Seed, b), nil
		}
		return 0, nil
	})
}

// RoundAnnouncement

func (x *RoundAnnouncement) size() int {
	return sizeString(1, x.Federation) + sizeVarint(2, x.Round) + sizeString(3, x.Algorithm) +
		sizeString(4, x.Aggregator) + sizeMessage(5, x.Params != nil, x.Params) +
		sizeMessage(6, x.Model != nil, x.Model) + sizeMessage(7, x.Budget != nil, x.Budget) +
		sizeVarint(8, uint64(x.DeadlineUnixMs)) + sizeStrings(9, x.Selected) +
		sizeMessage(10, x.Global != nil, x.Global) + sizeString(11, x.UplinkCodec) +
		sizeVarint(12, uint64(x.CreatedAtUnixMs)) + sizeMessage(13, x.AnchorSketch != nil, x.AnchorSketch) +
		sizeString(14, x.RunId) + sizeBytes(15, x.Schema) + sizeBytes(16, x.Transform) +
		sizeVarint(17, uint64(x.Phase)) + sizeVarint(18, boolVarint(x.Evaluate)) +
		sizeBytes(19, x.Bundle) + sizeVarint(20, uint64(x.EvalRound))
}

func (x *RoundAnnouncement) appendTo(b []byte) []byte {
	b = appendString(b, 1, x.Federation)
	b = appendVarint(b, 2, x.Round)
	b = appendString(b, 3, x.Algorithm)
	b = appendString(b, 4, x.Aggregator)
	b = appendMessage(b, 5, x.Params != nil, x.Params)
	b = appendMessage(b, 6, x.Model != nil, x.Model)
	b = appendMessage(b, 7, x.Budget != nil, x.Budget)
	b = appendVarint(b, 8, uint64(x.DeadlineUnixMs))
	b = appendStrings(b, 9, x.Selected)
	b = appendMessage(b, 10, x.Global != nil, x.Global)
	b = appendString(b, 11, x.UplinkCodec)
	b = appendVarint(b, 12, uint64(x.CreatedAtUnixMs))
	b = appendMessage(b, 13, x.AnchorSketch != nil, x.AnchorSketch)
	b = appendString(b, 14, x.RunId)
	b = appendBytes(b, 15, x.Schema)
	b = appendBytes(b, 16, x.Transform)
	b = appendVarint(b, 17, uint64(x.Phase))
	b = appendVarint(b, 18, boolVarint(x.Evaluate))
	b = appendBytes(b, 19, x.Bundle)
	return appendVarint(b, 20, uint64(x.EvalRound))
}

func (x *RoundAnnouncement) unmarshal(b []byte, d *decoder) error {
	return fields("RoundAnnouncement", b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch typ {
		case protowire.VarintType:
			switch num {
			case 2:
				return consumeUint64(&x.Round, b), nil
			case 8:
				return consumeInt64(&x.DeadlineUnixMs, b), nil
			case 12:
				return consumeInt64(&x.CreatedAtUnixMs, b), nil
			case 17:
				return consumeEnum((*int32)(&x.Phase), b), nil
			case 18:
				return consumeBool(&x.Evaluate, b), nil
			case 20:
				return consumeUint32(&x.EvalRound, b), nil
			}
		case protowire.BytesType:
			switch num {
			case 1:
				return consumeString(&x.Federation, b)
			case 3:
				return consumeString(&x.Algorithm, b)
			case 4:
				return consumeString(&x.Aggregator, b)
			case 5:
				if x.Params == nil {
					x.Params = &Params{}
				}
				return consumeMessage(x.Params, b, d)
			case 6:
				if x.Model == nil {
					x.Model = &ModelSpec{}
				}
				return consumeMessage(x.Model, b, d)
			case 7:
				if x.Budget == nil {
					x.Budget = &WorkBudget{}
				}
				return consumeMessage(x.Budget, b, d)
			case 9:
				return consumeRepeatedString(&x.Selected, b, d, "round announcement", "selected", d.lim.MaxClients)
			case 10:
				if x.Global == nil {
					x.Global = &Vector{}
				}
				return consumeMessage(x.Global, b, d)
			case 11:
				return consumeString(&x.UplinkCodec, b)
			case 13:
				if x.AnchorSketch == nil {
					x.AnchorSketch = &SketchSpec{}
				}
				return consumeMessage(x.AnchorSketch, b, d)
			case 14:
				return consumeString(&x.RunId, b)
			case 15:
				return consumeBytes(&x.Schema, b), nil
			case 16:
				return consumeBytes(&x.Transform, b), nil
			case 19:
				return consumeBytes(&x.Bundle, b), nil
			}
		}
		return 0, nil
	})
}

// ClientStatus

func (x *ClientStatus) size() int {
	return sizeString(1, x.ClientId) + sizeVarint(2, boolVarint(x.Online)) + sizeVarint(3, x.SampleCount) +
		sizeStrings(4, x.Capabilities) + sizeString(5, x.SoftwareVersion) + sizeVarint(6, uint64(x.TimestampUnixMs)) +
		sizeVarint(7, x.Connection) + sizeString(8, x.ErrorReason) + sizeString(9, x.ErrorMessage) +
		sizeString(10, x.InstanceId)
}

func (x *ClientStatus) appendTo(b []byte) []byte {
	b = appendString(b, 1, x.ClientId)
	b = appendVarint(b, 2, boolVarint(x.Online))
	b = appendVarint(b, 3, x.SampleCount)
	b = appendStrings(b, 4, x.Capabilities)
	b = appendString(b, 5, x.SoftwareVersion)
	b = appendVarint(b, 6, uint64(x.TimestampUnixMs))
	b = appendVarint(b, 7, x.Connection)
	b = appendString(b, 8, x.ErrorReason)
	b = appendString(b, 9, x.ErrorMessage)
	return appendString(b, 10, x.InstanceId)
}

func (x *ClientStatus) unmarshal(b []byte, d *decoder) error {
	return fields("ClientStatus", b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch typ {
		case protowire.VarintType:
			switch num {
			case 2:
				return consumeBool(&x.Online, b), nil
			case 3:
				return consumeUint64(&x.SampleCount, b), nil
			case 6:
				return consumeInt64(&x.TimestampUnixMs, b), nil
			case 7:
				return consumeUint64(&x.Connection, b), nil
			}
		case protowire.BytesType:
			switch num {
			case 1:
				return consumeString(&x.ClientId, b)
			case 4:
				return consumeRepeatedString(&x.Capabilities, b, d, "client status", "capabilities", d.maxCapabilities)
			case 5:
				return consumeString(&x.SoftwareVersion, b)
			case 8:
				return consumeString(&x.ErrorReason, b)
			case 9:
				return consumeString(&x.ErrorMessage, b)
			case 10:
				return consumeString(&x.InstanceId, b)
			}
		}
		return 0, nil
	})
}

// WorkReport

func (x *WorkReport) size() int {
	return sizeDouble(1, x.AchievedGamma) + sizeVarint(2, x.Epochs) + sizeVarint(3, x.GradEvals) +
		sizeDouble(4, x.Seconds) + sizeDouble(5, x.LocalLoss) + sizeDouble(6, x.AnchorLoss) +
		sizeVarint(7, uint64(x.StopReason)) + sizeVarint(8, boolVarint(x.Partial))
}

func (x *WorkReport) appendTo(b []byte) []byte {
	b = appendDouble(b, 1, x.AchievedGamma)
	b = appendVarint(b, 2, x.Epochs)
	b = appendVarint(b, 3, x.GradEvals)
	b = appendDouble(b, 4, x.Seconds)
	b = appendDouble(b, 5, x.LocalLoss)
	b = appendDouble(b, 6, x.AnchorLoss)
	b = appendVarint(b, 7, uint64(x.StopReason))
	return appendVarint(b, 8, boolVarint(x.Partial))
}

func (x *WorkReport) unmarshal(b []byte, d *decoder) error {
	return fields("WorkReport", b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch typ {
		case protowire.Fixed64Type:
			switch num {
			case 1:
				return consumeDouble(&x.AchievedGamma, b), nil
			case 4:
				return consumeDouble(&x.Seconds, b), nil
			case 5:
				return consumeDouble(&x.LocalLoss, b), nil
			case 6:
				return consumeDouble(&x.AnchorLoss, b), nil
			}
		case protowire.VarintType:
			switch num {
			case 2:
				return consumeUint64(&x.Epochs, b), nil
			case 3:
				return consumeUint64(&x.GradEvals, b), nil
			case 7:
				return consumeEnum((*int32)(&x.StopReason), b), nil
			case 8:
				return consumeBool(&x.Partial, b), nil
			}
		}
		return 0, nil
	})
}

// ClientUpdate

func (x *ClientUpdate) size() int {
	return sizeString(1, x.ClientId) + sizeVarint(2, x.Round) + sizeVarint(3, uint64(x.Kind)) +
		sizeMessage(4, x.Vector != nil, x.Vector) + sizeVarint(5, x.SampleCount) +
		sizeMessage(6, x.Report != nil, x.Report) + sizePackedDouble(7, x.AnchorGrad) +
		sizeVarint(8, x.BaseRound) + sizeVarint(9, uint64(x.SentAtUnixMs)) + sizeVarint(10, x.Seq) +
		sizeString(11, x.InstanceId)
}

func (x *ClientUpdate) appendTo(b []byte) []byte {
	b = appendString(b, 1, x.ClientId)
	b = appendVarint(b, 2, x.Round)
	b = appendVarint(b, 3, uint64(x.Kind))
	b = appendMessage(b, 4, x.Vector != nil, x.Vector)
	b = appendVarint(b, 5, x.SampleCount)
	b = appendMessage(b, 6, x.Report != nil, x.Report)
	b = appendPackedDouble(b, 7, x.AnchorGrad)
	b = appendVarint(b, 8, x.BaseRound)
	b = appendVarint(b, 9, uint64(x.SentAtUnixMs))
	b = appendVarint(b, 10, x.Seq)
	return appendString(b, 11, x.InstanceId)
}

func (x *ClientUpdate) unmarshal(b []byte, d *decoder) error {
	return fields("ClientUpdate", b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		if num == 7 {
			return consumeRepeatedDouble(&x.AnchorGrad, typ, b, d, "client update", "anchor_grad", d.lim.MaxAnchorGrad), nil
		}
		switch typ {
		case protowire.VarintType:
			switch num {
			case 2:
				return consumeUint64(&x.Round, b), nil
			case 3:
				return consumeEnum((*int32)(&x.Kind), b), nil
			case 5:
				return consumeUint64(&x.SampleCount, b), nil
			case 8:
				return consumeUint64(&x.BaseRound, b), nil
			case 9:
				return consumeInt64(&x.SentAtUnixMs, b), nil
			case 10:
				return consumeUint64(&x.Seq, b), nil
			}
		case protowire.BytesType:
			switch num {
			case 1:
				return consumeString(&x.ClientId, b)
			case 4:
				if x.Vector == nil {
					x.Vector = &Vector{}
				}
				return consumeMessage(x.Vector, b, d)
			case 6:
				if x.Report == nil {
					x.Report = &WorkReport{}
				}
				return consumeMessage(x.Report, b, d)
			case 11:
				return consumeString(&x.InstanceId, b)
			}
		}
		return 0, nil
	})
}

// Receipt

func (x *Receipt) size() int {
	return sizeString(1, x.ClientId) + sizeVarint(2, x.Round) + sizeVarint(3, boolVarint(x.Accepted)) +
		sizeString(4, x.Reason) + sizeVarint(5, uint64(x.StoredAtUnixMs)) + sizeVarint(6, uint64(x.Code)) +
		sizeVarint(7, x.UpdateSeq) + sizeVarint(8, uint64(x.Subject))
}

func (x *Receipt) appendTo(b []byte) []byte {
	b = appendString(b, 1, x.ClientId)
	b = appendVarint(b, 2, x.Round)
	b = appendVarint(b, 3, boolVarint(x.Accepted))
	b = appendString(b, 4, x.Reason)
	b = appendVarint(b, 5, uint64(x.StoredAtUnixMs))
	b = appendVarint(b, 6, uint64(x.Code))
	b = appendVarint(b, 7, x.UpdateSeq)
	return appendVarint(b, 8, uint64(x.Subject))
}

func (x *Receipt) unmarshal(b []byte, d *decoder) error {
	return fields("Receipt", b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch typ {
		case protowire.VarintType:
			switch num {
			case 2:
				return consumeUint64(&x.Round, b), nil
			case 3:
				return consumeBool(&x.Accepted, b), nil
			case 5:
				return consumeInt64(&x.StoredAtUnixMs, b), nil
			case 6:
				return consumeEnum((*int32)(&x.Code), b), nil
			case 7:
				return consumeUint64(&x.UpdateSeq, b), nil
			case 8:
				return consumeEnum((*int32)(&x.Subject), b), nil
			}
		case protowire.BytesType:
			switch num {
			case 1:
				return consumeString(&x.ClientId, b)
			case 4:
				return consumeString(&x.Reason, b)
			}
		}
		return 0, nil
	})
}

// SiteStatistics

func (x *SiteStatistics) size() int {
	return sizeString(1, x.ClientId) + sizeString(2, x.RunId) + sizeString(3, x.SchemaDigest) +
		sizeBytes(4, x.Stats) + sizeVarint(5, uint64(x.SentAtUnixMs))
}

func (x *SiteStatistics) appendTo(b []byte) []byte {
	b = appendString(b, 1, x.ClientId)
	b = appendString(b, 2, x.RunId)
	b = appendString(b, 3, x.SchemaDigest)
	b = appendBytes(b, 4, x.Stats)
	return appendVarint(b, 5, uint64(x.SentAtUnixMs))
}

func (x *SiteStatistics) unmarshal(b []byte, d *decoder) error {
	return fields("SiteStatistics", b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch typ {
		case protowire.VarintType:
			if num == 5 {
				return consumeInt64(&x.SentAtUnixMs, b), nil
			}
		case protowire.BytesType:
			switch num {
			case 1:
				return consumeString(&x.ClientId, b)
			case 2:
				return consumeString(&x.RunId, b)
			case 3:
				return consumeString(&x.SchemaDigest, b)
			case 4:
				return consumeBytes(&x.Stats, b), nil
			}
		}
		return 0, nil
	})
}

// EvalReport

func (x *EvalReport) size() int {
	return sizeString(1, x.ClientId) + sizeString(2, x.RunId) + sizeVarint(3, x.Round) +
		sizeBytes(4, x.Report) + sizeVarint(5, uint64(x.SentAtUnixMs))
}

func (x *EvalReport) appendTo(b []byte) []byte {
	b = appendString(b, 1, x.ClientId)
	b = appendString(b, 2, x.RunId)
	b = appendVarint(b, 3, x.Round)
	b = appendBytes(b, 4, x.Report)
	return appendVarint(b, 5, uint64(x.SentAtUnixMs))
}

func (x *EvalReport) unmarshal(b []byte, d *decoder) error {
	return fields("EvalReport", b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch typ {
		case protowire.VarintType:
			switch num {
			case 3:
				return consumeUint64(&x.Round, b), nil
			case 5:
				return consumeInt64(&x.SentAtUnixMs, b), nil
			}
		case protowire.BytesType:
			switch num {
			case 1:
				return consumeString(&x.ClientId, b)
			case 2:
				return consumeString(&x.RunId, b)
			case 4:
				return consumeBytes(&x.Report, b), nil
			}
		}
		return 0, nil
	})
}

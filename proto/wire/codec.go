package wire

// The protobuf encoding of the messages of edgefl.proto, with protowire
// instead of the reflection-based protobuf runtime (which would double
// edge-agent's size): the field encoders and decoders below, written by
// hand, and each message's size, appendTo and unmarshal in codec_gen.go,
// generated from edgefl.proto by proto/wire/internal/gen (see gen.go). It follows
// proto3 and what protobuf-go's deterministic Marshal and Unmarshal did, so
// that the bytes are the same (testdata/golden/ pins them):
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

// over records that the repeated field (repeatedLimit's key) would exceed
// its limit.
func (d *decoder) over(field string, limit int) {
	if d.tooMany == nil {
		msg, name, _ := d.repeatedLimit(field)
		d.tooMany = invalid(msg, "%s has more than %d values", name, limit)
	}
}

// limit is the most elements the decoder keeps of the repeated field.
func (d *decoder) limit(field string) int {
	_, _, limit := d.repeatedLimit(field)
	return limit
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
	v, n, err := consumeUTF8(b)
	if n < 0 || err != nil {
		return n, err
	}
	*dst = string(v)
	return n, nil
}

// consumeUTF8 decodes a length-delimited value that must be valid UTF-8 (a
// string field's): the value and the bytes consumed, a negative protowire
// error code, or errInvalidUTF8.
func consumeUTF8(b []byte) ([]byte, int, error) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return nil, n, nil
	}
	if !utf8.Valid(v) {
		return nil, 0, errInvalidUTF8
	}
	return v, n, nil
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

// consumeVarint decodes a varint into *dst, converted by conv; *dst is left
// alone if the varint is malformed.
func consumeVarint[T any](dst *T, b []byte, conv func(uint64) T) int {
	v, n := protowire.ConsumeVarint(b)
	if n >= 0 {
		*dst = conv(v)
	}
	return n
}

func consumeUint64(dst *uint64, b []byte) int {
	return consumeVarint(dst, b, func(v uint64) uint64 { return v })
}

func consumeUint32(dst *uint32, b []byte) int {
	return consumeVarint(dst, b, func(v uint64) uint32 { return uint32(v) })
}

func consumeInt64(dst *int64, b []byte) int {
	return consumeVarint(dst, b, func(v uint64) int64 { return int64(v) })
}

// consumeEnum decodes an enum's varint, truncated to int32 like protobuf-go.
func consumeEnum(dst *int32, b []byte) int {
	return consumeVarint(dst, b, func(v uint64) int32 { return int32(v) })
}

func consumeBool(dst *bool, b []byte) int {
	return consumeVarint(dst, b, protowire.DecodeBool)
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

// consumeRepeatedString appends one element to a repeated string field, up to
// its limit (field is repeatedLimit's key).
func consumeRepeatedString(dst *[]string, b []byte, d *decoder, field string) (int, error) {
	v, n, err := consumeUTF8(b)
	if n < 0 || err != nil {
		return n, err
	}
	if limit := d.limit(field); len(*dst) >= limit {
		d.over(field, limit)
		return n, nil
	}
	*dst = append(*dst, string(v))
	return n, nil
}

// appendOne appends v to the repeated field *dst unless that would take it
// over its limit (field is repeatedLimit's key), which is then recorded.
func appendOne[T any](dst *[]T, v T, d *decoder, field string) {
	if limit := d.limit(field); len(*dst) >= limit {
		d.over(field, limit)
		return
	}
	*dst = append(*dst, v)
}

// consumeRepeatedUint32 decodes one element (VarintType) or a packed run
// (BytesType) of a repeated uint32 field, up to its limit (field is
// repeatedLimit's key).
func consumeRepeatedUint32(dst *[]uint32, typ protowire.Type, b []byte, d *decoder, field string) int {
	switch typ {
	case protowire.VarintType:
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return n
		}
		appendOne(dst, uint32(v), d, field)
		return n
	case protowire.BytesType:
		p, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return n
		}
		limit := d.limit(field)
		count := 0 // varints in the run, if it is well formed
		for _, c := range p {
			if c < 0x80 {
				count++
			}
		}
		keep := len(*dst)+count <= limit
		if !keep {
			d.over(field, limit)
		} else if count > 0 {
			*dst = grow(*dst, count)
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
// (BytesType) of a repeated double field, up to its limit (field is
// repeatedLimit's key).
func consumeRepeatedDouble(dst *[]float64, typ protowire.Type, b []byte, d *decoder, field string) int {
	switch typ {
	case protowire.Fixed64Type:
		v, n := protowire.ConsumeFixed64(b)
		if n < 0 {
			return n
		}
		appendOne(dst, math.Float64frombits(v), d, field)
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
		limit := d.limit(field)
		if len(*dst)+count > limit {
			d.over(field, limit)
			return n
		}
		if count > 0 {
			s := grow(*dst, count)
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

// grow returns s with room for n more elements (slices.Grow without its
// rounding up, so a packed run allocates exactly what it holds).
func grow[T any](s []T, n int) []T {
	if cap(s)-len(s) >= n {
		return s
	}
	t := make([]T, len(s), len(s)+n)
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

// sizeLen is the size of a length-delimited field of n bytes, omitted when
// empty.
func sizeLen(num protowire.Number, n int) int {
	if n == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

func sizeString(num protowire.Number, s string) int { return sizeLen(num, len(s)) }

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func sizeBytes(num protowire.Number, v []byte) int { return sizeLen(num, len(v)) }

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
	return sizeLen(num, packedUint32Len(s)) // 0 only when s is empty
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

func sizePackedDouble(num protowire.Number, s []float64) int { return sizeLen(num, 8*len(s)) }

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

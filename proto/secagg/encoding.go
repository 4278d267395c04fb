package secagg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// The binary encoding shared by messages and persisted state. Integers are
// unsigned varints; a byte string, a string and a list carry their length
// first; a vector of ring elements is its length then 4 little-endian bytes
// per element. A decoder checks every length against the bytes left before
// it allocates, so hostile input costs no more memory than its own size and
// never panics.

// MaxIDLen bounds a site id (an MQTT client id).
const MaxIDLen = 256

// maxSession bounds the session bytes.
const maxSession = 256

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func appendUvarint(b []byte, v uint64) []byte { return binary.AppendUvarint(b, v) }

func appendBytes(b, v []byte) []byte { return append(appendUvarint(b, uint64(len(v))), v...) }

func appendString(b []byte, s string) []byte {
	return append(appendUvarint(b, uint64(len(s))), s...)
}

func appendVector(b []byte, v []uint32) []byte {
	b = appendUvarint(b, uint64(len(v)))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, x)
	}
	return b
}

func appendStrings(b []byte, v []string) []byte {
	b = appendUvarint(b, uint64(len(v)))
	for _, s := range v {
		b = appendString(b, s)
	}
	return b
}

// sealFrame appends the CRC-32C of b (which catches accidental damage; the
// AEAD and the reconstruction checks catch tampering).
func sealFrame(b []byte) []byte {
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// openFrame checks and strips the trailing CRC-32C.
func openFrame(b []byte) ([]byte, error) {
	if len(b) < 4 {
		return nil, errors.New("secagg: truncated frame")
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return nil, errors.New("secagg: frame checksum mismatch")
	}
	return body, nil
}

// reader reads the encoding with a sticky error.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(format string, a ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("secagg: "+format, a...)
	}
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 || n != len(binary.AppendUvarint(nil, v)) { // overlong: one encoding per message
		r.fail("bad varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

// count reads a length of items of at least min bytes each, bounded by max.
func (r *reader) count(min, max uint64, what string) int {
	n := r.uvarint()
	if r.err == nil && (n > max || n*min > uint64(len(r.b))) {
		r.fail("%s count %d too large", what, n)
		return 0
	}
	return int(n)
}

func (r *reader) byte1() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 1 {
		r.fail("truncated")
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) raw(n int) []byte {
	if r.err != nil {
		return nil
	}
	if len(r.b) < n {
		r.fail("truncated")
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) bytes(max uint64, what string) []byte {
	n := r.count(1, max, what)
	return append([]byte(nil), r.raw(n)...)
}

func (r *reader) string(max uint64, what string) string {
	return string(r.raw(r.count(1, max, what)))
}

func (r *reader) session() []byte { return r.bytes(maxSession, "session") }

func (r *reader) id() string {
	s := r.string(MaxIDLen, "site id")
	if r.err == nil && s == "" {
		r.fail("empty site id")
	}
	return s
}

func (r *reader) key() (k [KeySize]byte) {
	copy(k[:], r.raw(KeySize))
	return k
}

func (r *reader) shareValue() (s [ShareSize]byte) {
	copy(s[:], r.raw(ShareSize))
	return s
}

func (r *reader) vector() []uint32 {
	n := r.count(4, 1<<28, "vector")
	raw := r.raw(4 * n)
	if r.err != nil {
		return nil
	}
	v := make([]uint32, n)
	for i := range v {
		v[i] = binary.LittleEndian.Uint32(raw[4*i:])
	}
	return v
}

// ids reads a strictly increasing list of site ids.
func (r *reader) ids() []string {
	n := r.count(2, MaxSites, "site")
	out := make([]string, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		s := r.id()
		if len(out) > 0 && s <= out[len(out)-1] {
			r.fail("site ids not strictly increasing")
		}
		out = append(out, s)
	}
	return out
}

// done fails unless every byte was read.
func (r *reader) done() error {
	if r.err == nil && len(r.b) != 0 {
		r.fail("%d trailing bytes", len(r.b))
	}
	return r.err
}

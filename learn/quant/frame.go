package quant

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

const (
	magic     = "EFLQ"
	version   = 1 // frames without a transform or the ac stage
	version2  = 2 // frames with either: a 40-byte header
	headerLen = 32
	header2   = 40
	crcLen    = 4

	tfNone   = 0
	tfDCT    = 1
	entNone  = 0 // zstd or raw, as flag bit 0 says
	entRange = 1 // the ac stage

	flagZstd = 1 << 0
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli) // immutable after init

// header is a parsed frame header.
type header struct {
	zstd   bool
	ac     bool
	tf     dctShape
	sparse bool
	val    valueCoder
	dim    int
	nnz    int
	rawLen int
	payLen int
}

// v2 says whether the frame needs the version 2 header.
func (h *header) v2() bool { return h.ac || h.tf.on() }

func (h *header) len() int {
	if h.v2() {
		return header2
	}
	return headerLen
}

func (h *header) put(b []byte) {
	copy(b, magic)
	b[4] = version
	b[5] = 0
	if h.zstd {
		b[5] = flagZstd
	}
	b[6] = sparseNone
	if h.sparse {
		b[6] = sparseTopK
	}
	b[7] = h.val.kind
	b[8] = h.val.scale
	b[9] = uint8(h.val.levels)
	b[10], b[11] = 0, 0
	binary.LittleEndian.PutUint32(b[12:], uint32(h.val.bucket))
	binary.LittleEndian.PutUint32(b[16:], uint32(h.dim))
	binary.LittleEndian.PutUint32(b[20:], uint32(h.nnz))
	binary.LittleEndian.PutUint32(b[24:], uint32(h.rawLen))
	binary.LittleEndian.PutUint32(b[28:], uint32(h.payLen))
	if h.v2() {
		b[4] = version2
		if h.tf.on() {
			b[10] = tfDCT
			binary.LittleEndian.PutUint16(b[32:], uint16(h.tf.h))
			binary.LittleEndian.PutUint16(b[34:], uint16(h.tf.w))
			binary.LittleEndian.PutUint32(b[36:], uint32(h.tf.c))
		} else {
			clear(b[32:40])
		}
		if h.ac {
			b[11] = entRange
		}
	}
}

// spec is the canonical spec of the frame's codec (a top-k frame shows the
// number of values it carries as its count).
func (h *header) spec() string {
	c := Codec{tf: h.tf, sparse: h.sparse, top: topK{count: h.nnz}, val: h.val, raw: !h.zstd && !h.ac, ac: h.ac}
	return c.String()
}

// parseFrame checks everything the header alone can tell, in an order that
// reads no byte it has not bounded and allocates nothing: frame size, magic,
// version, lengths, CRC32C, flags, codec ids and parameters, dimension, and
// that the declared payload sizes are consistent with each other and with
// the payload present. It returns the header and the payload.
func parseFrame(msg []byte, lim Limits) (header, []byte, error) {
	var h header
	hl, err := checkEnvelope(msg, lim)
	if err != nil {
		return h, nil, err
	}
	h.payLen = len(msg) - hl - crcLen
	if err := h.parseFlags(msg); err != nil {
		return h, nil, err
	}
	if msg[4] == version2 {
		if err := h.parseTransform(msg, lim); err != nil {
			return h, nil, err
		}
	}
	if err := h.parseCodec(msg); err != nil {
		return h, nil, err
	}
	if err := h.parseSizes(msg, lim); err != nil {
		return h, nil, err
	}
	return h, msg[hl : hl+h.payLen], nil
}

// le32 is the four-byte field at off, as a uint64: the fields are compared
// as uint64 before any becomes an int (on 32-bit ARM an int conversion of
// 2^31 or more would be negative).
func le32(msg []byte, off int) uint64 { return uint64(binary.LittleEndian.Uint32(msg[off:])) }

// checkEnvelope checks what surrounds the fields: the size limit, magic,
// version, the declared length against the message's, and the CRC32C. It
// returns the header's length.
func checkEnvelope(msg []byte, lim Limits) (int, error) {
	if len(msg) > lim.MaxFrame {
		return 0, fmt.Errorf("%w: frame is %d bytes, limit %d", ErrTooLarge, len(msg), lim.MaxFrame)
	}
	if len(msg) < len(magic) || string(msg[:len(magic)]) != magic {
		if len(msg) < len(magic) && string(msg) == magic[:len(msg)] {
			return 0, fmt.Errorf("%w: %d bytes, shorter than a header", ErrTruncated, len(msg))
		}
		return 0, fmt.Errorf("%w: no %q magic", ErrFormat, magic)
	}
	if len(msg) < 5 {
		return 0, fmt.Errorf("%w: %d bytes, shorter than a header", ErrTruncated, len(msg))
	}
	if msg[4] != version && msg[4] != version2 {
		return 0, fmt.Errorf("%w: version %d (this build speaks %d and %d)", ErrVersion, msg[4], version, version2)
	}
	hl := headerLen
	if msg[4] == version2 {
		hl = header2
	}
	if len(msg) < hl+crcLen {
		return 0, fmt.Errorf("%w: %d bytes, shorter than header and checksum (%d)", ErrTruncated, len(msg), hl+crcLen)
	}
	if want := uint64(hl) + le32(msg, 28) + crcLen; uint64(len(msg)) != want {
		if uint64(len(msg)) < want {
			return 0, fmt.Errorf("%w: %d bytes, header declares %d", ErrTruncated, len(msg), want)
		}
		return 0, fmt.Errorf("%w: %d bytes after the declared %d-byte frame", ErrFormat, uint64(len(msg))-want, want)
	}
	end := len(msg) - crcLen
	if got, want := crc32.Checksum(msg[:end], castagnoli), binary.LittleEndian.Uint32(msg[end:]); got != want {
		return 0, fmt.Errorf("%w: computed %08x, frame says %08x", ErrChecksum, got, want)
	}
	return hl, nil
}

// parseFlags reads the flags, transform and entropy-coder ids (not yet the
// transform's parameters) and the reserved bytes of a version 1 frame.
func (h *header) parseFlags(msg []byte) error {
	if msg[4] == version && (msg[10] != 0 || msg[11] != 0) {
		return fmt.Errorf("%w: reserved bytes %#x %#x set", ErrFormat, msg[10], msg[11])
	}
	if msg[5]&^flagZstd != 0 || msg[10] > tfDCT || msg[11] > entRange {
		return fmt.Errorf("%w: unknown flags %#x, transform %d or entropy coder %d", ErrFormat, msg[5], msg[10], msg[11])
	}
	h.zstd = msg[5]&flagZstd != 0
	h.ac = msg[11] == entRange
	if h.zstd && h.ac {
		return fmt.Errorf("%w: both zstd and ac", ErrFormat)
	}
	return nil
}

// parseTransform reads a version 2 frame's transform parameters; a
// version 2 frame has a transform, ac, or both.
func (h *header) parseTransform(msg []byte, lim Limits) error {
	th, tw, tc := binary.LittleEndian.Uint16(msg[32:]), binary.LittleEndian.Uint16(msg[34:]), le32(msg, 36)
	switch {
	case msg[10] == tfNone && (th != 0 || tw != 0 || tc != 0):
		return fmt.Errorf("%w: transform parameters without a transform", ErrFormat)
	case msg[10] == tfDCT:
		if th < 1 || th > maxDCTSide || tw < 1 || tw > maxDCTSide || tc < 1 {
			return fmt.Errorf("%w: dct shape %dx%dx%d (sides 1..%d, channels >= 1)", ErrCodec, th, tw, tc, maxDCTSide)
		}
		// Compared with dim in parseSizes, once dim is bounded.
		if uint64(th)*uint64(tw)*tc > uint64(lim.MaxDim) {
			return fmt.Errorf("%w: dct shape %dx%dx%d beyond dimension limit %d", ErrTooLarge, th, tw, tc, lim.MaxDim)
		}
		h.tf = dctShape{h: int(th), w: int(tw), c: int(tc)}
	case !h.ac:
		return fmt.Errorf("%w: version 2 frame with neither transform nor ac", ErrFormat)
	}
	return nil
}

// parseCodec reads the sparsifier and the value coder.
func (h *header) parseCodec(msg []byte) error {
	switch msg[6] {
	case sparseNone:
	case sparseTopK:
		h.sparse = true
	default:
		return fmt.Errorf("%w: sparsifier id %d", ErrCodec, msg[6])
	}
	if b := le32(msg, 12); b > maxBucket {
		return fmt.Errorf("%w: bucket %d above %d", ErrCodec, b, maxBucket)
	}
	v := valueCoder{kind: msg[7], scale: msg[8], levels: int(msg[9]), bucket: int(le32(msg, 12))}
	if err := v.check(); err != nil {
		return err
	}
	h.val = v
	return nil
}

// parseSizes reads the dimension, nnz and raw payload length and checks
// them against the limits, the transform, the codec and the payload.
func (h *header) parseSizes(msg []byte, lim Limits) error {
	dim, nnz, rawLen := le32(msg, 16), le32(msg, 20), le32(msg, 24)
	if dim > uint64(lim.MaxDim) {
		return fmt.Errorf("%w: dimension %d, limit %d", ErrTooLarge, dim, lim.MaxDim)
	}
	if nnz > dim {
		return corrupt("nnz %d above dimension %d", nnz, dim)
	}
	// dim, nnz <= MaxDim <= 2^27, so the sizes checkSizes computes from them
	// (<= 14·2^27) fit an int everywhere; rawLen is compared before it is
	// converted.
	h.dim, h.nnz = int(dim), int(nnz)
	if h.tf.on() && h.tf.size() > h.dim {
		return corrupt("dct shape %dx%dx%d covers %d values, dimension is %d", h.tf.h, h.tf.w, h.tf.c, h.tf.size(), h.dim)
	}
	if err := h.checkSizes(rawLen); err != nil {
		return err
	}
	h.rawLen = int(rawLen)
	return nil
}

// check validates a value coder read from a frame.
func (v valueCoder) check() error {
	bucketed := false
	switch v.kind {
	case valFP32, valFP16:
	case valQ8, valQ4:
		if v.scale != scaleMinMax && v.scale != scaleAbsMax {
			return fmt.Errorf("%w: scale mode %d", ErrCodec, v.scale)
		}
		bucketed = true
	case valQSGD:
		if v.levels < 1 || v.levels > maxLevels {
			return fmt.Errorf("%w: qsgd levels %d", ErrCodec, v.levels)
		}
		bucketed = true
	default:
		return fmt.Errorf("%w: value coder id %d", ErrCodec, v.kind)
	}
	if v.kind != valQ8 && v.kind != valQ4 && v.scale != 0 {
		return fmt.Errorf("%w: scale mode %d for %s", ErrCodec, v.scale, v)
	}
	if v.kind != valQSGD && v.levels != 0 {
		return fmt.Errorf("%w: levels %d for %s", ErrCodec, v.levels, v)
	}
	if bucketed != (v.bucket != 0) || v.bucket > maxBucket {
		return fmt.Errorf("%w: bucket %d for %s", ErrCodec, v.bucket, v)
	}
	return nil
}

// checkSizes checks nnz (<= dim), the declared raw payload length and the
// payload length against dim and the codec.
func (h *header) checkSizes(rawLen uint64) error {
	if !h.sparse && h.nnz != h.dim {
		return corrupt("dense frame with nnz %d != dimension %d", h.nnz, h.dim)
	}
	lo := uint64(h.val.size(h.nnz)) // dense, or sparse with 1-byte varints
	hi := lo
	if h.ac {
		// rawLen is the value section the stream decodes to; the support
		// travels as bits, and the stream holds at least its 4 flush bytes.
		if rawLen != lo {
			return corrupt("ac raw payload length %d, want %d for %d values of %s", rawLen, lo, h.nnz, h.val)
		}
		if recs := uint64(h.val.buckets(h.nnz) * h.val.recLen()); uint64(h.payLen) < recs+4 {
			return corrupt("ac payload of %d bytes, below its %d bytes of scale records and 4 of stream", h.payLen, recs)
		}
		return nil
	}
	if h.sparse {
		lo += uint64(h.nnz)
		hi += binary.MaxVarintLen32 * uint64(h.nnz)
	}
	if rawLen < lo || rawLen > hi {
		if lo == hi {
			return corrupt("raw payload length %d, want %d for %d values of %s", rawLen, lo, h.nnz, h.val)
		}
		return corrupt("raw payload length %d outside %d..%d for %d values of %s", rawLen, lo, hi, h.nnz, h.val)
	}
	pay := uint64(h.payLen)
	switch {
	case !h.zstd && pay != rawLen:
		return corrupt("uncompressed payload is %d bytes, header declares %d", pay, rawLen)
	case h.zstd && rawLen == 0 && pay != 0:
		return corrupt("empty raw payload with %d payload bytes", pay)
	case h.zstd && rawLen > zMaxRatio*pay:
		return corrupt("declared %d bytes cannot come from %d bytes of zstd", rawLen, pay)
	}
	return nil
}

// Info describes a frame, as Inspect reads it from the header.
type Info struct {
	// Spec is the frame's codec in canonical spec form. A top-k frame shows
	// the number of values it carries as the count ("topk:79+qsgd:16").
	Spec       string
	Dim        int  // vector length
	NNZ        int  // values carried (Dim for dense codecs)
	Compressed bool // payload is zstd
	RawLen     int  // payload bytes before zstd
	FrameLen   int  // whole frame, header and checksum included
}

// inspectLimits accept any frame the format can express.
var inspectLimits = Limits{MaxDim: maxLimitDim, MaxFrame: maxLimitFrame}

// Inspect checks a frame's structure and checksum and describes it without
// decoding the payload (and without allocating). A frame Inspect accepts can
// still fail to decode: payload content and Limits are checked by Decode.
func Inspect(msg []byte) (Info, error) {
	h, _, err := parseFrame(msg, inspectLimits)
	if err != nil {
		return Info{}, err
	}
	return Info{
		Spec: h.spec(), Dim: h.dim, NNZ: h.nnz, Compressed: h.zstd,
		RawLen: h.rawLen, FrameLen: len(msg),
	}, nil
}

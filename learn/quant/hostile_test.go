package quant

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// allocated reports the bytes f allocates.
func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// checkRejects asserts that msg fails to decode with want, through both
// Decode and DecodeAdd (which must leave dst untouched), and that Inspect
// agrees when the failure is in the header.
func checkRejects(t *testing.T, name string, c *Codec, msg []byte, want error) {
	t.Helper()
	if _, err := c.Decode(msg, nil); !errors.Is(err, want) {
		t.Errorf("%s: Decode error %v, want %v", name, err, want)
	}
	dim := 8
	if info, err := Inspect(msg); err == nil && info.Dim <= 1<<20 {
		dim = info.Dim
	}
	dst := gaussian(newRNG(1), dim, 1)
	before := slices.Clone(dst)
	if err := c.DecodeAdd(msg, dst, 1); err == nil {
		t.Errorf("%s: DecodeAdd accepted the frame", name)
	} else if !classified(err) {
		t.Errorf("%s: DecodeAdd error %v wraps no quant error class", name, err)
	}
	if !slices.Equal(dst, before) {
		t.Errorf("%s: DecodeAdd changed dst on error", name)
	}
}

func TestDecodeHostileHeader(t *testing.T) {
	c := mustParse(t, "q8")
	x := gaussian(newRNG(2), 1000, 1)
	good := encode(t, c, x, nil, 1)
	edit := func(f func(m []byte)) []byte {
		m := slices.Clone(good)
		f(m)
		return resealed(m)
	}
	u32 := func(off int, v uint32) []byte {
		return edit(func(m []byte) { binary.LittleEndian.PutUint32(m[off:], v) })
	}
	tests := []struct {
		name string
		msg  []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"magic prefix", []byte("EF"), ErrTruncated},
		{"magic only", []byte("EFLQ"), ErrTruncated},
		{"header only", good[:headerLen], ErrTruncated},
		{"no checksum", good[:len(good)-1], ErrTruncated},
		{"not a frame", []byte("{\"json\": true}"), ErrFormat},
		{"bad magic", edit(func(m []byte) { m[0] = 'X' }), ErrFormat},
		{"version 0", edit(func(m []byte) { m[4] = 0 }), ErrVersion},
		{"version 3", edit(func(m []byte) { m[4] = 3 }), ErrVersion},
		{"version 3, short", []byte("EFLQ\x03"), ErrVersion},
		{"trailing byte", append(slices.Clone(good), 0), ErrFormat},
		{"bad checksum", append(slices.Clone(good[:len(good)-1]), good[len(good)-1]^1), ErrChecksum},
		{"flags", edit(func(m []byte) { m[5] |= 2 }), ErrFormat},
		{"reserved", edit(func(m []byte) { m[11] = 1 }), ErrFormat},
		{"sparsifier 2", edit(func(m []byte) { m[6] = 2 }), ErrCodec},
		{"value coder 0", edit(func(m []byte) { m[7] = 0 }), ErrCodec},
		{"value coder 6", edit(func(m []byte) { m[7] = 6 }), ErrCodec},
		{"scale mode 2", edit(func(m []byte) { m[8] = 2 }), ErrCodec},
		{"levels on q8", edit(func(m []byte) { m[9] = 3 }), ErrCodec},
		{"qsgd levels 0", edit(func(m []byte) { m[7] = valQSGD; m[8] = 0 }), ErrCodec},
		{"qsgd levels 128", edit(func(m []byte) { m[7] = valQSGD; m[8] = 0; m[9] = 128 }), ErrCodec},
		{"scale mode on fp32", edit(func(m []byte) { m[7] = valFP32; m[8] = 1 }), ErrCodec},
		{"bucket 0", u32(12, 0), ErrCodec},
		{"bucket 2^24+1", u32(12, maxBucket+1), ErrCodec},
		{"bucket on fp16", edit(func(m []byte) { m[7] = valFP16 }), ErrCodec},
		{"dim above MaxDim", u32(16, uint32(DefaultLimits.MaxDim+1)), ErrTooLarge},
		{"dim 2^32-1", u32(16, math.MaxUint32), ErrTooLarge},
		{"dense nnz != dim", u32(20, 999), ErrCorrupt},
		{"raw length", u32(24, 1000+2*8-1), ErrCorrupt},
		{"payload length short", u32(28, uint32(len(good)-headerLen-crcLen-1)), ErrFormat},
		{"payload length long", u32(28, uint32(len(good)-headerLen-crcLen+1)), ErrTruncated},
		{"payload length 2^32-1", u32(28, math.MaxUint32), ErrTruncated},
	}
	for _, tt := range tests {
		checkRejects(t, tt.name, c, tt.msg, tt.want)
	}
	// Every truncation, and every single-byte corruption, is rejected.
	for i := range good {
		if _, err := c.Decode(good[:i], nil); !errors.Is(err, ErrTruncated) {
			t.Fatalf("truncated to %d of %d bytes: %v, want ErrTruncated", i, len(good), err)
		}
		m := slices.Clone(good)
		m[i] ^= 0x10
		_, err := c.Decode(m, nil)
		if err == nil || !classified(err) {
			t.Fatalf("byte %d flipped: %v", i, err)
		}
		if i >= headerLen && !errors.Is(err, ErrChecksum) {
			t.Fatalf("payload/checksum byte %d flipped: %v, want ErrChecksum", i, err)
		}
	}
	if _, err := Inspect(good); err != nil {
		t.Fatalf("Inspect(good): %v", err)
	}
	if err := c.DecodeAdd(good, make([]float64, 999), 1); !errors.Is(err, ErrDimension) {
		t.Errorf("DecodeAdd into 999 values: %v, want ErrDimension", err)
	}
	for _, s := range []float64{math.NaN(), math.Inf(-1)} {
		if err := c.DecodeAdd(good, make([]float64, 1000), s); !errors.Is(err, ErrInput) {
			t.Errorf("DecodeAdd with scale %v: %v, want ErrInput", s, err)
		}
	}
	small, err := ParseWithLimits("q8", Limits{MaxFrame: len(good) - 1})
	if err != nil {
		t.Fatal(err)
	}
	checkRejects(t, "frame above MaxFrame", small, good, ErrTooLarge)
}

// TestDecodeHostilePayload: frames with a valid header and checksum whose
// payload lies.
func TestDecodeHostilePayload(t *testing.T) {
	c := mustParse(t, "fp32")
	f32 := func(vals ...uint32) []byte { // fp32 section, byte-plane shuffled
		n := len(vals)
		p := make([]byte, 4*n)
		for i, b := range vals {
			p[i], p[n+i], p[2*n+i], p[3*n+i] = byte(b), byte(b>>8), byte(b>>16), byte(b>>24)
		}
		return p
	}
	le32 := func(vals ...float32) []byte {
		var p []byte
		for _, v := range vals {
			p = binary.LittleEndian.AppendUint32(p, math.Float32bits(v))
		}
		return p
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	dense := func(v valueCoder, n int, p []byte) []byte {
		return buildFrame(header{val: v, dim: n, nnz: n, rawLen: len(p)}, p)
	}
	sparse := func(v valueCoder, dim, nnz int, p []byte) []byte {
		return buildFrame(header{sparse: true, val: v, dim: dim, nnz: nnz, rawLen: len(p)}, p)
	}
	fp32 := valueCoder{kind: valFP32}
	fp16 := valueCoder{kind: valFP16}
	q8 := valueCoder{kind: valQ8, bucket: 4}
	q8a := valueCoder{kind: valQ8, bucket: 4, scale: scaleAbsMax}
	q4a := valueCoder{kind: valQ4, bucket: 4, scale: scaleAbsMax}
	q4 := valueCoder{kind: valQ4, bucket: 4}
	qsgd := valueCoder{kind: valQSGD, levels: 3, bucket: 4}
	zstdOf := func(p []byte) []byte { return c.z.compress(nil, p) }
	tests := []struct {
		name string
		msg  []byte
		want error
	}{
		{"fp32 NaN", dense(fp32, 2, f32(0x3f800000, 0x7fc00000)), ErrCorrupt},
		{"fp32 +Inf", dense(fp32, 1, f32(0x7f800000)), ErrCorrupt},
		{"fp32 -Inf", dense(fp32, 1, f32(0xff800000)), ErrCorrupt},
		{"fp16 Inf", dense(fp16, 1, []byte{0x00, 0x7c}), ErrCorrupt},
		{"fp16 NaN", dense(fp16, 1, []byte{0x01, 0xfe}), ErrCorrupt},
		{"q8 NaN step", dense(q8, 1, cat(le32(0, float32(math.NaN())), []byte{1})), ErrCorrupt},
		{"q8 negative step", dense(q8, 1, cat(le32(0, -1), []byte{1})), ErrCorrupt},
		{"q8 Inf lo", dense(q8, 1, cat(le32(float32(math.Inf(1)), 1), []byte{1})), ErrCorrupt},
		{"q8 absmax -128", dense(q8a, 2, cat(le32(1), []byte{1, 0x80})), ErrCorrupt},
		{"q4 absmax nibble 0", dense(q4a, 2, cat(le32(1), []byte{0x08})), ErrCorrupt},
		{"q4 padding", dense(q4, 3, cat(le32(0, 1), []byte{0x11, 0x11})), ErrCorrupt},
		{"qsgd level s+1", dense(qsgd, 2, cat(le32(1), []byte{1, 4})), ErrCorrupt},
		{"qsgd level -128", dense(qsgd, 2, cat(le32(1), []byte{0x80, 0})), ErrCorrupt},
		{"qsgd negative scale", dense(qsgd, 1, cat(le32(-1), []byte{1})), ErrCorrupt},
		{"qsgd NaN scale", dense(qsgd, 1, cat(le32(float32(math.NaN())), []byte{1})), ErrCorrupt},
		{"raw length != payload", buildFrame(header{val: fp32, dim: 1, nnz: 1, rawLen: 4}, []byte{1, 2, 3}), ErrCorrupt},
		{"dim far beyond raw payload", buildFrame(header{val: fp32, dim: 1 << 22, nnz: 1 << 22, rawLen: 1 << 24}, f32(1, 2)), ErrCorrupt},
		{"dim far beyond zstd payload", buildFrame(header{zstd: true, val: fp32, dim: 1 << 22, nnz: 1 << 22, rawLen: 1 << 24}, zstdOf(f32(1, 2))), ErrCorrupt},
		{"zstd garbage", buildFrame(header{zstd: true, val: fp32, dim: 2, nnz: 2, rawLen: 8}, []byte("not zstd at all")), ErrCorrupt},
		{"zstd short", buildFrame(header{zstd: true, val: fp32, dim: 3, nnz: 3, rawLen: 12}, zstdOf(f32(1, 2))), ErrCorrupt},
		{"zstd long", buildFrame(header{zstd: true, val: fp32, dim: 2, nnz: 2, rawLen: 8}, zstdOf(f32(1, 2, 3))), ErrTooLarge},
		{"zstd empty payload", buildFrame(header{zstd: true, val: fp32, dim: 0, nnz: 0, rawLen: 0}, []byte{1}), ErrCorrupt},
		{"zstd two frames", buildFrame(header{zstd: true, val: fp32, dim: 2, nnz: 2, rawLen: 8}, cat(zstdOf(f32(1)), zstdOf(f32(2)))), nil},
		{"zstd trailing garbage", buildFrame(header{zstd: true, val: fp32, dim: 2, nnz: 2, rawLen: 8}, cat(zstdOf(f32(1, 2)), []byte{0})), ErrCorrupt},
		{"nnz above dim", sparse(fp32, 1, 2, cat([]byte{0, 0}, f32(1, 2))), ErrCorrupt},
		{"index out of range", sparse(fp32, 4, 1, cat([]byte{4}, f32(1))), ErrCorrupt},
		{"gap out of range", sparse(fp32, 4, 2, cat([]byte{1, 2}, f32(1, 2))), ErrCorrupt},
		{"index varint 6 bytes", sparse(fp32, 4, 1, cat([]byte{0x80, 0x80, 0x80, 0x80, 0x80, 0}, f32(1))), ErrCorrupt},
		{"index varint huge", sparse(fp32, 4, 1, cat([]byte{0xff, 0xff, 0xff, 0xff, 0x0f}, f32(1))), ErrCorrupt},
		{"index varint cut", sparse(fp32, 200, 1, cat([]byte{0x80}, f32(1))[:5]), ErrCorrupt},
		{"index bytes eat the values", sparse(fp32, 1000, 2, cat([]byte{0x81, 0x01, 0x81, 0x01}, f32(1, 2))[:9]), ErrCorrupt},
		{"sparse fp32 NaN", sparse(fp32, 4, 1, cat([]byte{3}, f32(0x7fc00000))), ErrCorrupt},
	}
	for _, tt := range tests {
		if tt.want == nil { // concatenated zstd frames are valid zstd
			if _, err := c.Decode(tt.msg, nil); err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		checkRejects(t, tt.name, c, tt.msg, tt.want)
	}
	// A declared dimension far beyond the payload allocates nothing.
	i := slices.IndexFunc(tests, func(tt struct {
		name string
		msg  []byte
		want error
	}) bool {
		return tt.name == "dim far beyond raw payload"
	})
	msg := tests[i].msg
	if n := allocated(func() { _, _ = c.Decode(msg, nil) }); n > 4096 {
		t.Errorf("rejecting a 4M-dimension frame with an 8-byte payload allocated %d bytes", n)
	}
	// Sanity: the well-formed versions of these frames decode.
	for _, m := range [][]byte{
		dense(fp32, 2, f32(0x3f800000, 0xc0000000)),
		dense(q8a, 2, cat(le32(1), []byte{1, 0x81})),
		dense(q4a, 3, cat(le32(1), []byte{0x19, 0x0f})),
		dense(qsgd, 2, cat(le32(3), []byte{3, 0xfd})),
		sparse(fp32, 4, 2, cat([]byte{1, 1}, f32(0x3f800000, 0x40000000))),
	} {
		y, err := c.Decode(m, nil)
		if err != nil {
			t.Errorf("well-formed frame % x: %v", m, err)
		}
		t.Logf("decoded %v", y)
	}
}

// TestZstdBomb: a small frame whose zstd payload expands far past what its
// header declares stops at the declared size, allocating little.
func TestZstdBomb(t *testing.T) {
	const bomb = 64 << 20
	zeros := make([]byte, 1<<20)
	// With the content size in the zstd frame header (EncodeAll writes it).
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	withFCS := enc.EncodeAll(bytes.Repeat(zeros, bomb>>20), nil)
	// Streamed: the size is unknown until the data ends.
	var buf bytes.Buffer
	w, err := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	for range bomb >> 20 {
		if _, err := w.Write(zeros); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	streamed := slices.Clone(buf.Bytes())
	// A big window: legitimate zstd, but beyond what we accept.
	buf.Reset()
	wBig, err := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(8<<20))
	if err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, 4*600_000)
	if _, err := wBig.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := wBig.Close(); err != nil {
		t.Fatal(err)
	}
	bigWindow := slices.Clone(buf.Bytes())

	c := mustParse(t, "fp32")
	fp32 := valueCoder{kind: valFP32}
	for _, tt := range []struct {
		name    string
		payload []byte
		dim     int
		want    error
		msg     string // in the error
	}{
		{"content size in header", withFCS, 1000, ErrTooLarge, "decodes to more than the declared"},
		{"streamed", streamed, 1000, ErrTooLarge, "decodes to more than the declared"},
		{"streamed, large declared", streamed, 1 << 20, ErrTooLarge, "decodes to more than the declared"},
		{"8 MiB window", bigWindow, 600_000, ErrTooLarge, "window"},
	} {
		t.Logf("%s: %d-byte payload, declared %d values", tt.name, len(tt.payload), tt.dim)
		msg := buildFrame(header{zstd: true, val: fp32, dim: tt.dim, nnz: tt.dim, rawLen: 4 * tt.dim}, tt.payload)
		var derr error
		n := allocated(func() { _, derr = c.Decode(msg, nil) })
		t.Logf("%s: %v (allocated %d bytes)", tt.name, derr, n)
		if !errors.Is(derr, tt.want) || !strings.Contains(fmt.Sprint(derr), tt.msg) {
			t.Errorf("%s: %v, want %v (%s)", tt.name, derr, tt.want, tt.msg)
		}
		// The declared size (4·dim) plus, on a codec's first zstd decode,
		// its window and block buffers (about 1.5 MiB).
		if limit := uint64(4*tt.dim) + 2<<20; n > limit {
			t.Errorf("%s: allocated %d bytes, limit %d", tt.name, n, limit)
		}
		dst := make([]float64, tt.dim)
		if err := c.DecodeAdd(msg, dst, 1); !errors.Is(err, tt.want) {
			t.Errorf("%s: DecodeAdd: %v, want %v", tt.name, err, tt.want)
		}
	}
}

// TestDecodeAllocations: a legitimate frame at the limit allocates what the
// Limits documentation says, and decoding into a reused dst allocates
// (almost) nothing.
func TestDecodeAllocations(t *testing.T) {
	const n = 100_000
	lim := Limits{MaxDim: n}
	x := gaussian(newRNG(3), n, 1)
	for _, spec := range []string{"fp32", "q8", "topk:1.0+fp32", "topk:0.01+qsgd:16"} {
		enc := mustParse(t, spec)
		msg := encode(t, enc, x, nil, 1)
		c, err := ParseWithLimits("fp32", lim)
		if err != nil {
			t.Fatal(err)
		}
		info, _ := Inspect(msg)
		var y []float64
		first := allocated(func() { y, err = c.Decode(msg, nil) })
		if err != nil {
			t.Fatal(err)
		}
		// output + raw payload + top-k scratch (12 B/value) + zstd's window.
		if limit := uint64(8*n+info.RawLen+12*info.NNZ) + 2<<20; first > limit {
			t.Errorf("%s: first Decode allocated %d bytes, limit %d", spec, first, limit)
		}
		allocs := testing.AllocsPerRun(5, func() {
			if y, err = c.Decode(msg, y); err != nil {
				t.Fatal(err)
			}
		})
		if allocs > 2 {
			t.Errorf("%s: Decode into a reused dst: %v allocations", spec, allocs)
		}
		allocs = testing.AllocsPerRun(5, func() {
			if err := c.DecodeAdd(msg, y, 0.5); err != nil {
				t.Fatal(err)
			}
		})
		if allocs > 2 {
			t.Errorf("%s: DecodeAdd: %v allocations", spec, allocs)
		}
	}
}

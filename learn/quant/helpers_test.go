package quant

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"testing"
)

// allSpecs is one spec of every stage combination the tests sweep.
var allSpecs = []string{
	"fp32", "fp16", "q8", "q4", "q8:absmax", "q4:absmax", "q8:b=7", "q4:b=33:absmax",
	"qsgd:16", "qsgd:1:b=1", "qsgd:127:b=100",
	"topk:0.1", "topk:3+fp16", "topk:0.05+q8", "topk:0.2+q4:absmax", "topk:0.01+qsgd:16",
	"q4+ac", "fp16+ac", "topk:0.1+qsgd:16+ac", "topk:0.05+fp32+ac", "topk:0.3+q8:absmax+ac",
	"dct:4x4x2+q8", "dct:3x3x4+topk:0.2+q4+ac", "dct:1x7+fp32+raw", "dct:5x4x2+topk:0.1+qsgd:4",
	"fp32+raw", "q4+raw", "qsgd:4+raw", "topk:0.1+q8+raw",
}

// errClasses are the sentinels every returned error wraps one of.
var errClasses = []error{ErrSpec, ErrInput, ErrTruncated, ErrFormat, ErrVersion, ErrCodec, ErrChecksum, ErrTooLarge, ErrDimension, ErrCorrupt}

func classified(err error) bool {
	for _, c := range errClasses {
		if errors.Is(err, c) {
			return true
		}
	}
	return false
}

func newRNG(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) }

func mustParse(tb testing.TB, spec string) *Codec {
	tb.Helper()
	c, err := Parse(spec)
	if err != nil {
		tb.Fatalf("Parse(%q): %v", spec, err)
	}
	return c
}

func gaussian(rng *rand.Rand, n int, sigma float64) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = sigma * rng.NormFloat64()
	}
	return x
}

// studentT draws Student-t values with nu degrees of freedom: heavy tails,
// as deltas of real models have.
func studentT(rng *rand.Rand, n int, nu int, sigma float64) []float64 {
	x := make([]float64, n)
	for i := range x {
		chi := 0.0
		for range nu {
			z := rng.NormFloat64()
			chi += z * z
		}
		x[i] = sigma * rng.NormFloat64() / math.Sqrt(chi/float64(nu))
	}
	return x
}

// resealed recomputes a frame's CRC32C after the test changed its bytes.
func resealed(msg []byte) []byte {
	m := append([]byte(nil), msg...)
	if len(m) >= crcLen {
		binary.LittleEndian.PutUint32(m[len(m)-crcLen:], crc32.Checksum(m[:len(m)-crcLen], castagnoli))
	}
	return m
}

// buildFrame assembles a frame from a header and a payload as given (no
// checks), with a valid CRC.
func buildFrame(h header, payload []byte) []byte {
	h.payLen = len(payload)
	m := make([]byte, h.len(), h.len()+len(payload)+crcLen)
	h.put(m)
	m = append(m, payload...)
	return binary.LittleEndian.AppendUint32(m, crc32.Checksum(m, castagnoli))
}

func encode(tb testing.TB, c *Codec, x, res []float64, seed uint64) []byte {
	tb.Helper()
	msg, err := c.Encode(nil, x, res, newRNG(seed))
	if err != nil {
		tb.Fatalf("%s: Encode: %v", c, err)
	}
	return msg
}

func decode(tb testing.TB, c *Codec, msg []byte) []float64 {
	tb.Helper()
	y, err := c.Decode(msg, nil)
	if err != nil {
		tb.Fatalf("%s: Decode: %v", c, err)
	}
	return y
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

package quant

import (
	"fmt"
	"strings"
	"testing"
)

// Throughput: go test ./learn/quant -run '^$' -bench . -cpu 1
// MB/s counts float32-equivalent input (4 bytes per value), so codecs and
// sizes compare directly; "ratio" is frame bytes / raw float32 bytes.

var (
	benchSpecs = []string{"fp32", "fp16", "q8", "q4", "qsgd:16", "topk:0.01+qsgd:16", "topk:0.01+q8", "fp32+raw", "q8+raw"}
	benchSizes = []int{7850, 1_000_000}
)

// benchDelta is a heavy-tailed delta (Student-t, 3 degrees of freedom).
func benchDelta(n int) []float64 { return studentT(newRNG(1), n, 3, 0.01) }

func BenchmarkEncode(b *testing.B) {
	for _, n := range benchSizes {
		x := benchDelta(n)
		for _, spec := range benchSpecs {
			b.Run(fmt.Sprintf("%s/n=%d", spec, n), func(b *testing.B) {
				c, rng := mustParse(b, spec), newRNG(2)
				var dst []byte
				var err error
				b.SetBytes(int64(4 * n))
				b.ReportAllocs()
				for b.Loop() {
					if dst, err = c.Encode(dst[:0], x, nil, rng); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(dst))/float64(4*n), "ratio")
			})
		}
	}
}

// BenchmarkEncodeEF: the same with error feedback (the residual read and
// rewritten every call).
func BenchmarkEncodeEF(b *testing.B) {
	for _, n := range benchSizes {
		x := benchDelta(n)
		for _, spec := range []string{"q8", "qsgd:16", "topk:0.01+qsgd:16"} {
			b.Run(fmt.Sprintf("%s/n=%d", spec, n), func(b *testing.B) {
				c, rng := mustParse(b, spec), newRNG(2)
				res := make([]float64, n)
				var dst []byte
				var err error
				b.SetBytes(int64(4 * n))
				b.ReportAllocs()
				for b.Loop() {
					if dst, err = c.Encode(dst[:0], x, res, rng); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, n := range benchSizes {
		x := benchDelta(n)
		for _, spec := range benchSpecs {
			b.Run(fmt.Sprintf("%s/n=%d", spec, n), func(b *testing.B) {
				c := mustParse(b, spec)
				msg := encode(b, c, x, nil, 2)
				y := make([]float64, n)
				var err error
				b.SetBytes(int64(4 * n))
				b.ReportAllocs()
				for b.Loop() {
					if y, err = c.Decode(msg, y); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkDecodeAdd: decode-and-accumulate into an aggregate, next to a
// plain copy of a float64 slice of the same length (same SetBytes), for the
// ratio.
func BenchmarkDecodeAdd(b *testing.B) {
	for _, n := range benchSizes {
		x := benchDelta(n)
		b.Run(fmt.Sprintf("copy/n=%d", n), func(b *testing.B) {
			src, dst := make([]float64, n), make([]float64, n)
			b.SetBytes(int64(4 * n))
			for b.Loop() {
				copy(dst, src)
			}
		})
		for _, spec := range benchSpecs {
			b.Run(fmt.Sprintf("%s/n=%d", spec, n), func(b *testing.B) {
				c := mustParse(b, spec)
				msg := encode(b, c, x, nil, 2)
				agg := make([]float64, n)
				b.SetBytes(int64(4 * n))
				b.ReportAllocs()
				for b.Loop() {
					if err := c.DecodeAdd(msg, agg, 0.1); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestCompressionRatios logs frame bytes / raw float32 bytes for every codec
// on realistic deltas (go test ./learn/quant -run CompressionRatios -v), and checks
// each codec stays near what it is measured at.
func TestCompressionRatios(t *testing.T) {
	const n = 100_000
	rng := newRNG(14)
	deltas := []struct {
		name string
		x    []float64
	}{
		{"gaussian", gaussian(rng, n, 0.01)},
		{"student-t3", studentT(rng, n, 3, 0.01)},
		{"student-t1", studentT(rng, n, 1, 0.01)}, // Cauchy: very heavy tails
	}
	specs := []struct {
		spec string
		max  float64 // the worst ratio accepted over the deltas
	}{
		{"fp32", 1.0}, {"fp32+raw", 1.001}, {"fp16", 0.5}, {"q8", 0.26}, {"q8:absmax", 0.26},
		{"q4", 0.14}, {"q4:absmax", 0.14}, {"qsgd:16", 0.12}, {"qsgd:4", 0.07}, {"qsgd:16+raw", 0.26},
		{"topk:0.1", 0.12}, {"topk:0.01", 0.014}, {"topk:0.01+fp16", 0.0095}, {"topk:0.01+q8", 0.0065},
		{"topk:0.01+qsgd:16", 0.0048}, {"topk:0.001+qsgd:16", 0.001},
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "frame bytes / raw float32 bytes, n=%d (bits per value in parentheses)\n%-20s", n, "codec")
	for _, d := range deltas {
		fmt.Fprintf(&sb, " %20s", d.name)
	}
	sb.WriteByte('\n')
	for _, s := range specs {
		c := mustParse(t, s.spec)
		fmt.Fprintf(&sb, "%-20s", s.spec)
		for _, d := range deltas {
			msg := encode(t, c, d.x, nil, 1)
			r := float64(len(msg)) / float64(4*n)
			fmt.Fprintf(&sb, " %11.4f (%5.2f b)", r, 32*r)
			if r > s.max {
				t.Errorf("%s on %s: ratio %.4f above %.4f", s.spec, d.name, r, s.max)
			}
		}
		sb.WriteByte('\n')
	}
	t.Log("\n" + sb.String())
}

// BenchmarkFashionMNISTDelta: docs/results.md's FedSplit codecs on a real uplink
// delta (testdata/fedsplit_delta.f32, 7,850 values): what one update costs
// the gateway to encode and the aggregator to decode, with and without the
// dct and ac stages.
func BenchmarkFashionMNISTDelta(b *testing.B) {
	x := readDelta(b)
	n := len(x)
	for _, spec := range []string{"topk:0.16+q4", "dct:28x28x10+topk:0.16+q4", "dct:28x28x10+topk:0.16+q4+ac"} {
		c := mustParse(b, spec)
		msg := encode(b, c, x, nil, 2)
		name := strings.ReplaceAll(spec, "+", "_")
		b.Run("encode/"+name, func(b *testing.B) {
			var dst []byte
			var err error
			b.SetBytes(int64(4 * n))
			b.ReportAllocs()
			for b.Loop() {
				if dst, err = c.EncodeBounded(dst[:0], x, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(dst)), "bytes")
		})
		b.Run("decode-add/"+name, func(b *testing.B) {
			acc := make([]float64, n)
			b.SetBytes(int64(4 * n))
			b.ReportAllocs()
			for b.Loop() {
				if err := c.DecodeAdd(msg, acc, 0.5); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

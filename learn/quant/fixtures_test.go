package quant

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden and the fuzz seed corpora in testdata/fuzz")

// goldenName turns a spec into a file name.
func goldenName(spec string) string {
	return strings.NewReplacer(":", "_", "+", "__", "=", "", ".", "p").Replace(spec)
}

const goldenInput = "testdata/golden/input.f64"

// goldenVector is the golden input: 200 heavy-tailed values, some zeros.
func goldenVector() []float64 {
	x := studentT(newRNG(2024), 200, 3, 0.05)
	for i := 0; i < len(x); i += 17 {
		x[i] = 0
	}
	return x
}

func readF64(tb testing.TB, path string) []float64 {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatalf("%v (regenerate with: go test ./learn/quant -run TestWriteFixtures -update)", err)
	}
	x := make([]float64, len(b)/8)
	for i := range x {
		x[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return x
}

// TestGolden: frames written by an earlier build still decode to what this
// build encodes from the same input and seed (for +raw and +ac specs, byte for byte;
// zstd output may change with the library, the decoded values may not).
func TestGolden(t *testing.T) {
	x := readF64(t, goldenInput)
	for _, spec := range allSpecs {
		c := mustParse(t, spec)
		golden, err := os.ReadFile(filepath.Join("testdata/golden", goldenName(spec)+".frame"))
		if err != nil {
			t.Fatalf("%s: %v (regenerate with: go test ./learn/quant -run TestWriteFixtures -update)", spec, err)
		}
		fresh := encode(t, c, x, nil, 1)
		if (c.raw || c.ac) && !bytes.Equal(fresh, golden) { // ours alone: byte for byte
			t.Errorf("%s: frame differs from testdata (format or determinism changed)", spec)
		}
		want, got := decode(t, c, fresh), decode(t, c, golden)
		for i := range want {
			if math.Float64bits(want[i]) != math.Float64bits(got[i]) {
				t.Fatalf("%s: golden value %d decodes to %v, this build encodes %v", spec, i, got[i], want[i])
			}
		}
	}
}

// TestWriteFixtures regenerates testdata/golden and the fuzz seed corpora
// when run with -update.
func TestWriteFixtures(t *testing.T) {
	if !*update {
		t.Skip("run with -update to rewrite the fixtures")
	}
	x := goldenVector()
	var in []byte
	for _, f := range x {
		in = binary.LittleEndian.AppendUint64(in, math.Float64bits(f))
	}
	write(t, goldenInput, in)
	small := x[:40]
	var frames [][]byte
	for _, spec := range allSpecs {
		c := mustParse(t, spec)
		write(t, filepath.Join("testdata/golden", goldenName(spec)+".frame"), encode(t, c, x, nil, 1))
		msg := encode(t, c, small, nil, 1)
		frames = append(frames, msg)
		name := goldenName(spec)
		corpus(t, "FuzzDecode", name, msg, false)
		corpus(t, "FuzzDecodeAdd", name, msg, false, 1.5)
		corpus(t, "FuzzInspect", name, msg)
		corpus(t, "FuzzParse", name, spec)
	}
	// Edge frames: empty vectors, all zeros, a truncated frame, a resealed
	// corruption (exercising the payload checks).
	for _, spec := range []string{"fp32", "topk:0.1+qsgd:4", "q4:absmax"} {
		c := mustParse(t, spec)
		name := goldenName(spec)
		corpus(t, "FuzzDecode", name+"-empty", encode(t, c, nil, nil, 1), false)
		corpus(t, "FuzzDecode", name+"-zeros", encode(t, c, make([]float64, 33), nil, 1), false)
	}
	corpus(t, "FuzzDecode", "truncated", frames[0][:len(frames[0])/2], false)
	bad := bytes.Clone(frames[len(frames)-1])
	bad[headerLen] ^= 0x40
	corpus(t, "FuzzDecode", "payload-flip-resealed", bad, true)
	for i, spec := range []string{"topk:0", "qsgd:16:b=", "q8:b=1:absmax+raw", "topk:1e-3+fp16", " fp32 + zstd "} {
		corpus(t, "FuzzParse", "extra-"+strconv.Itoa(i), spec)
	}
	for i, spec := range allSpecs {
		var data []byte
		for _, f := range small {
			data = binary.LittleEndian.AppendUint32(data, math.Float32bits(float32(f)))
		}
		corpus(t, "FuzzRoundTrip", goldenName(spec), data, uint8(i), uint64(i), i%2 == 0)
	}
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// corpus writes one seed in the `go test fuzz v1` format.
func corpus(t *testing.T, target, name string, args ...any) {
	t.Helper()
	var sb strings.Builder
	sb.WriteString("go test fuzz v1\n")
	for _, a := range args {
		switch v := a.(type) {
		case []byte:
			fmt.Fprintf(&sb, "[]byte(%q)\n", v)
		case string:
			fmt.Fprintf(&sb, "string(%q)\n", v)
		case bool:
			fmt.Fprintf(&sb, "bool(%v)\n", v)
		case float64:
			fmt.Fprintf(&sb, "float64(%v)\n", v)
		case uint8:
			fmt.Fprintf(&sb, "uint8(%d)\n", v)
		case uint64:
			fmt.Fprintf(&sb, "uint64(%d)\n", v)
		default:
			t.Fatalf("corpus: unsupported %T", a)
		}
	}
	write(t, filepath.Join("testdata/fuzz", target, name), []byte(sb.String()))
}

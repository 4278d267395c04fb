package dataset

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// checkDecimal fails unless parseDecimal either declines s or returns
// strconv.ParseFloat's value bit for bit.
func checkDecimal(t *testing.T, s string) bool {
	t.Helper()
	v, ok := parseDecimal(s)
	if !ok {
		return false
	}
	want, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("parseDecimal(%q) = %v, but ParseFloat refuses it: %v", s, v, err)
	}
	if math.Float64bits(v) != math.Float64bits(want) {
		t.Fatalf("parseDecimal(%q) = %v (%#x), ParseFloat %v (%#x)", s, v, math.Float64bits(v), want, math.Float64bits(want))
	}
	return true
}

func TestParseDecimal(t *testing.T) {
	for _, tc := range []struct {
		s  string
		ok bool // taken by the fast path (else left to ParseFloat)
	}{
		{"0", true}, {"-0", true}, {"+0", true}, {"-0.0e5", true}, {"1", true}, {"-1.5", true},
		{"0.1", true}, {"-0.123456", true}, {"1.e5", true}, {".5", true}, {"-.5e-3", true},
		{"1E22", true}, {"1e-22", true}, {"9007199254740991", true}, {"9007199254740991e22", true},
		{"123456789012345678e-22", false}, // beyond 2^53
		{"9007199254740992", false}, {"1e23", false}, {"1e-23", false}, {"1e0001", false},
		{"00000000000000000001", false}, {"0.30000000000000004", false},
		{"", false}, {"+", false}, {"-", false}, {".", false}, {"e5", false}, {"1e", false}, {"1e+", false},
		{"1e5x", false}, {"1..2", false}, {"1.2.3", false}, {"1_000", false}, {"0x1p3", false},
		{"Inf", false}, {"-inf", false}, {"NaN", false}, {" 1", false}, {"1 ", false}, {"--1", false},
	} {
		if got := checkDecimal(t, tc.s); got != tc.ok {
			t.Errorf("parseDecimal(%q): fast path %v, want %v", tc.s, got, tc.ok)
		}
	}
}

// TestParseDecimalRandom compares with ParseFloat on the cells numeric
// files hold: %g, %e and %f of random values at every precision, and
// random digit strings near the limits (19 digits, 2^53, 10^±22).
func TestParseDecimalRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	taken := 0
	for range 200000 {
		x := rng.NormFloat64() * math.Pow(10, float64(rng.IntN(40)-20))
		prec := rng.IntN(19) - 1
		var s string
		switch rng.IntN(4) {
		case 0:
			s = strconv.FormatFloat(x, 'g', prec, 64)
		case 1:
			s = strconv.FormatFloat(x, 'e', prec, 64)
		case 2:
			s = strconv.FormatFloat(x, 'f', min(prec, 25), 64)
		default:
			b := make([]byte, 1+rng.IntN(20))
			for i := range b {
				b[i] = byte('0' + rng.IntN(10))
			}
			b[rng.IntN(len(b))] = '.'
			s = string(b) + "e" + strconv.Itoa(rng.IntN(50)-25)
		}
		if checkDecimal(t, s) {
			taken++
		}
	}
	if taken < 100000 {
		t.Errorf("the fast path took only %d of 200000 cells", taken)
	}
}

// FuzzParseDecimal: whatever parseDecimal accepts, ParseFloat reads to the
// same bits.
func FuzzParseDecimal(f *testing.F) {
	for _, s := range []string{"0", "-0.5", "1e22", "9007199254740991", ".5e-3", "1.e5", "12345678901234567890"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) { checkDecimal(t, s) })
}

// TestLineCapacity: the rows allocated up front are the lines after the
// header when that many rows of d cells fit the file, else none.
func TestLineCapacity(t *testing.T) {
	for _, tc := range []struct {
		lc   lineCount
		d    int
		want int
	}{
		{lineCount{size: 1000, lines: 11}, 10, 10}, // 10 rows of 10 cells: 200 bytes at least
		{lineCount{size: 1000, lines: 1}, 10, 0},   // the header alone
		{lineCount{size: 100, lines: 51}, 10, 0},   // 50 rows of 10 cells cannot fit 100 bytes
		{lineCount{size: 1000, lines: 101}, 10, 0}, // nor 100 rows in 1,000
		{lineCount{size: 1000, lines: 51}, 10, 50}, // 50 rows of "0,...,0\n" is exactly 1,000 bytes
		{lineCount{}, 10, 0},                       // unknown (ReadCSV)
		{lineCount{size: 1 << 40, lines: 3}, 0, 0}, // no features
	} {
		if got := tc.lc.capacity(tc.d); got != tc.want {
			t.Errorf("%+v.capacity(%d) = %d, want %d", tc.lc, tc.d, got, tc.want)
		}
	}
}

// BenchmarkLoadCSV reads a 2,000 x 784 file of %.6g cells, as the local
// solve's comparison with PyTorch does (scripts/bench-torch.sh).
func BenchmarkLoadCSV(b *testing.B) {
	path := filepath.Join(b.TempDir(), "bench.csv")
	var sb strings.Builder
	sb.WriteString("y")
	for j := range 784 {
		fmt.Fprintf(&sb, ",f%d", j)
	}
	sb.WriteByte('\n')
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range 2000 {
		sb.WriteString(strconv.Itoa(i % 10))
		for range 784 {
			sb.WriteByte(',')
			sb.WriteString(strconv.FormatFloat(rng.NormFloat64(), 'g', 6, 64))
		}
		sb.WriteByte('\n')
	}
	if err := os.WriteFile(path, []byte(sb.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(sb.Len()))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := LoadCSV(path, CSVOptions{Label: "y"}); err != nil {
			b.Fatal(err)
		}
	}
}

package storage

import (
	"errors"
	"math"
	"testing"
	"time"
)

func TestEncodings(t *testing.T) {
	vecs := [][]float64{{0}, {1, -2.5, math.MaxFloat64, math.SmallestNonzeroFloat64, math.Copysign(0, -1)}}
	for _, v := range vecs {
		got, err := DecodeFloats(EncodeFloats(v), "v")
		if err != nil || len(got) != len(v) {
			t.Fatalf("floats %v: %v, %v", v, got, err)
		}
		for i := range v {
			if math.Float64bits(got[i]) != math.Float64bits(v[i]) {
				t.Fatalf("floats %v: got %v", v, got)
			}
		}
		r, got, err := DecodeRoundVec(EncodeRoundVec(42, v), "rv")
		if err != nil || r != 42 || len(got) != len(v) {
			t.Fatalf("round vec: %d %v %v", r, got, err)
		}
	}
	// Little-endian float64 on disk, as documented.
	if b := EncodeFloats([]float64{1}); string(b) != "\x00\x00\x00\x00\x00\x00\xf0\x3f" {
		t.Fatalf("1.0 encodes as %x", b)
	}
	tm := time.Unix(1700000000, 123)
	if got, err := DecodeTime(EncodeTime(tm), "t"); err != nil || !got.Equal(tm) {
		t.Fatalf("time: %v %v", got, err)
	}
	if got, err := DecodeTime(EncodeTime(time.Time{}), "t"); err != nil || !got.IsZero() {
		t.Fatalf("zero time: %v %v", got, err)
	}
	bad := []struct {
		name string
		err  error
	}{
		{"floats empty", func() error { _, err := DecodeFloats(nil, "x"); return err }()},
		{"floats 7 bytes", func() error { _, err := DecodeFloats(make([]byte, 7), "x"); return err }()},
		{"floats 9 bytes", func() error { _, err := DecodeFloats(make([]byte, 9), "x"); return err }()},
		{"roundvec 8 bytes", func() error { _, _, err := DecodeRoundVec(make([]byte, 8), "x"); return err }()},
		{"roundvec 20 bytes", func() error { _, _, err := DecodeRoundVec(make([]byte, 20), "x"); return err }()},
		{"u64 3 bytes", func() error { _, err := DecodeU64(make([]byte, 3), "x"); return err }()},
	}
	for _, tt := range bad {
		if !errors.Is(tt.err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", tt.name, tt.err)
		}
	}
}

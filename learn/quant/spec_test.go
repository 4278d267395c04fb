package quant

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		spec, want string
	}{
		{"fp32", "fp32"},
		{"fp16", "fp16"},
		{"q8", "q8"},
		{"q8:minmax", "q8"},
		{"q8:b=512", "q8"},
		{"q8:b=128:absmax", "q8:b=128:absmax"},
		{"q4:absmax:b=64", "q4:b=64:absmax"},
		{"q4", "q4"},
		{"qsgd:16", "qsgd:16"},
		{"qsgd:16:b=512", "qsgd:16"},
		{"qsgd:4:b=1024", "qsgd:4:b=1024"},
		{"qsgd:127:b=1", "qsgd:127:b=1"},
		{"topk:0.01", "topk:0.01+fp32"},
		{"topk:100", "topk:100+fp32"},
		{"topk:1", "topk:1+fp32"},
		{"topk:1.0+q8", "topk:1.0+q8"},
		{"topk:1e-3+fp16", "topk:0.001+fp16"},
		{"topk:0.01+qsgd:16", "topk:0.01+qsgd:16"},
		{"topk:0.01+q8", "topk:0.01+q8"},
		{"q8+zstd", "q8"},
		{"q8+raw", "q8+raw"},
		{"topk:0.01+qsgd:16:b=64+raw", "topk:0.01+qsgd:16:b=64+raw"},
		{" topk:0.5 + q4 ", "topk:0.5+q4"},
	}
	for _, tt := range tests {
		c, err := Parse(tt.spec)
		if err != nil {
			t.Errorf("Parse(%q): %v", tt.spec, err)
			continue
		}
		if got := c.String(); got != tt.want {
			t.Errorf("Parse(%q).String() = %q, want %q", tt.spec, got, tt.want)
		}
		c2, err := Parse(c.String())
		if err != nil || c2.String() != c.String() || c2.val != c.val || c2.top != c.top || c2.sparse != c.sparse || c2.raw != c.raw {
			t.Errorf("Parse(%q) does not round-trip: %v %v", c.String(), c2, err)
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		spec, want string // want: a substring of the error
	}{
		{"", "empty"},
		{"fp64", "unknown stage"},
		{"FP32", "unknown stage"},
		{"fp32:1", "no parameters"},
		{"q8:b=0", "bucket"},
		{"q8:b=x", "bucket"},
		{"q8:b=16777217", "bucket"},
		{"q8:b=1:b=2", "twice"},
		{"q8:absmax:minmax", "twice"},
		{"q8:foo", "unknown option"},
		{"q8:", "unknown option"},
		{"qsgd", "levels"},
		{"qsgd:", "levels"},
		{"qsgd:0", "1..127"},
		{"qsgd:128", "1..127"},
		{"qsgd:x", "1..127"},
		{"qsgd:16:b=0", "bucket"},
		{"qsgd:16:c=4", "unknown option"},
		{"qsgd:16:b=4:b=8", "unknown option"},
		{"topk", "needs k"},
		{"topk:", "needs k"},
		{"topk:0", "count"},
		{"topk:-1", "count"},
		{"topk:4294967296", "count"},
		{"topk:2147483648", "count"},
		{"topk:abc", "count"},
		{"topk:0.0", "fraction"},
		{"topk:1.5", "fraction"},
		{"topk:1e400", "fraction"},
		{"topk:NaN", "count"},
		{"q8+topk:0.1", "first stage"},
		{"topk:0.1+topk:0.2", "first stage"},
		{"fp32+q8", "more than one value"},
		{"raw", "needs a value stage"},
		{"zstd", "needs a value stage"},
		{"fp32+raw+zstd", "must come last"},
		{"fp32+raw+q8", "must come last"},
		{"fp32+raw:1", "no parameters"},
		{"fp32++q8", "empty stage"},
		{"fp32+", "empty stage"},
		{strings.Repeat("q8", 200), "longer than 256"},
	}
	for _, tt := range tests {
		c, err := Parse(tt.spec)
		if err == nil {
			t.Errorf("Parse(%q) = %v, want an error", tt.spec, c)
			continue
		}
		if !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%q) error %q: want ErrSpec mentioning %q", tt.spec, err, tt.want)
		}
	}
}

func TestLimits(t *testing.T) {
	if c := mustParse(t, "q8"); c.Limits() != DefaultLimits {
		t.Errorf("Parse limits = %+v, want %+v", c.Limits(), DefaultLimits)
	}
	bad := []Limits{{MaxDim: 1<<27 + 1}, {MaxFrame: 10}}
	if strconv.IntSize == 64 {
		big := int64(1) << 31
		bad = append(bad, Limits{MaxFrame: int(big)})
	}
	for _, lim := range bad {
		if _, err := ParseWithLimits("q8", lim); !errors.Is(err, ErrSpec) {
			t.Errorf("ParseWithLimits(%+v): %v, want ErrSpec", lim, err)
		}
	}
	c, err := ParseWithLimits("fp32+raw", Limits{MaxDim: 10, MaxFrame: 60})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Encode(nil, make([]float64, 11), nil, nil); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Encode past MaxDim: %v, want ErrTooLarge", err)
	}
	if _, err := c.Encode(nil, make([]float64, 10), nil, nil); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Encode of a 76-byte frame with MaxFrame 60: %v, want ErrTooLarge", err)
	}
	msg, err := c.Encode(nil, make([]float64, 6), nil, nil)
	if err != nil || len(msg) != 60 {
		t.Fatalf("Encode of 6 values: %d bytes, %v; want a 60-byte frame", len(msg), err)
	}
	big := mustParse(t, "fp32+raw")
	for _, n := range []int{11, 7} {
		msg := encode(t, big, make([]float64, n), nil, 1)
		if _, err := c.Decode(msg, nil); !errors.Is(err, ErrTooLarge) {
			t.Errorf("Decode of %d values, %d bytes under %+v: %v, want ErrTooLarge", n, len(msg), c.Limits(), err)
		}
	}
}

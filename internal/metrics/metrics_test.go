package metrics

import (
	"math"
	"strings"
	"sync"
	"testing"
)

func TestWrite(t *testing.T) {
	tests := []struct {
		name    string
		fams    []Family
		want    string
		wantErr bool
	}{
		{
			name: "counter and gauge",
			fams: []Family{
				One("x_total", "things done", Counter, 3),
				One("y", "", Gauge, 0.5),
			},
			want: "# HELP x_total things done\n# TYPE x_total counter\nx_total 3\n# TYPE y gauge\ny 0.5\n",
		},
		{
			name: "labels escaped",
			fams: []Family{{Name: "z", Help: "a\\b\nc", Type: Counter, Samples: []Sample{
				{Labels: []Label{{"reason", `q"uo\te` + "\n"}}, Value: 1},
				{Labels: []Label{{"a", "1"}, {"b", "2"}}, Value: 2},
			}}},
			want: "# HELP z a\\\\b\\nc\n# TYPE z counter\nz{reason=\"q\\\"uo\\\\te\\n\"} 1\nz{a=\"1\",b=\"2\"} 2\n",
		},
		{
			name: "special values and summary",
			fams: []Family{{Name: "s", Type: Summary, Samples: []Sample{{Suffix: "_sum", Value: math.Inf(1)}, {Suffix: "_count", Value: 2}}},
				One("n", "", Gauge, math.NaN()), One("m", "", Gauge, math.Inf(-1))},
			want: "# TYPE s summary\ns_sum +Inf\ns_count 2\n# TYPE n gauge\nn NaN\n# TYPE m gauge\nm -Inf\n",
		},
		{name: "empty family skipped", fams: []Family{{Name: "e", Type: Gauge}}, want: ""},
		{name: "bad name", fams: []Family{One("1x", "", Gauge, 1)}, wantErr: true},
		{name: "bad label", fams: []Family{{Name: "x", Samples: []Sample{{Labels: []Label{{"a:b", "v"}}}}}}, wantErr: true},
		{name: "bad suffix", fams: []Family{{Name: "x", Samples: []Sample{{Suffix: "-sum"}}}}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			err := Write(&b, tt.fams)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if !tt.wantErr && b.String() != tt.want {
				t.Errorf("got\n%s\nwant\n%s", b.String(), tt.want)
			}
		})
	}
}

func TestLabeledCounter(t *testing.T) {
	var c LabeledCounter
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100; j++ {
				c.Inc("a")
			}
			c.Add("b", 2)
		}()
	}
	wg.Wait()
	if c.Get("a") != 800 || c.Get("b") != 16 {
		t.Fatalf("a=%d b=%d", c.Get("a"), c.Get("b"))
	}
	s := Samples("k", c.Snapshot())
	if len(s) != 2 || s[0].Labels[0].Value != "a" || s[1].Value != 16 {
		t.Fatalf("samples %+v", s)
	}
}

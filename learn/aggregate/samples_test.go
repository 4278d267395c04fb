package aggregate

import (
	"math"
	"slices"
	"testing"
)

// A site claiming 2e9 samples, from its first message on: uncapped FedAvg
// (fedavg:cap=0) gives it the whole weight; the default fedavg counts it
// for 3 x the median of the others' counts, also when there are only two
// sites (the round's median would be half the liar's claim), and changes
// nothing while every count is within the cap.
func TestFedAvgCap(t *testing.T) {
	honest := []Update{{Client: "a", Params: []float64{1}, Samples: 100}, {Client: "b", Params: []float64{1}, Samples: 120},
		{Client: "c", Params: []float64{1}, Samples: 90}, {Client: "d", Params: []float64{1}, Samples: 110}}
	liar := Update{Client: "liar", Params: []float64{8}, Samples: 2e9}
	tests := []struct {
		name    string
		spec    string
		ups     []Update
		want    float64 // the aggregate of x = 0
		capped  []Capped
		weightB float64 // the liar's weight is at most this
	}{
		{"off: the liar takes the weight", "fedavg:cap=0", append(slices.Clone(honest), liar), 1 + 7*2e9/(2e9+420), nil, 1},
		// the others' median is (100+110)/2 = 105: the liar counts 315 of 735.
		{"default, five sites", "fedavg", append(slices.Clone(honest), liar), 1 + 7*315.0/735,
			[]Capped{{"liar", 2e9, 315}}, 3.0 / (3 + 2)},
		{"default, two sites", "fedavg", []Update{honest[0], liar}, 1 + 7*300.0/400,
			[]Capped{{"liar", 2e9, 300}}, 3.0 / (3 + 1)},
		{"cap=10, five sites", "fedavg:cap=10", append(slices.Clone(honest), liar), 1 + 7*1050.0/1470,
			[]Capped{{"liar", 2e9, 1050}}, 10.0 / (10 + 2)},
		{"default, honest", "fedavg", honest, 1, nil, 1},
		{"default, one site", "fedavg", []Update{liar}, 8, nil, 1},
		{"default, a site 3x the others' median is not capped", "fedavg",
			[]Update{{Client: "a", Params: []float64{0}, Samples: 10}, {Client: "b", Params: []float64{0}, Samples: 10},
				{Client: "big", Params: []float64{4}, Samples: 30}}, 4 * 30.0 / 50, nil, 1},
		{"default, two liars", "fedavg", append(slices.Clone(honest), liar, Update{Client: "liar2", Params: []float64{8}, Samples: 1e9}),
			// others' median: liar's {90,100,110,120,1e9} 110 -> 330; liar2's {90,100,110,120,2e9} 110 -> 330.
			1 + 7*660.0/(420+660), []Capped{{"liar", 2e9, 330}, {"liar2", 1e9, 330}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			agg, err := NewAggregator(tt.spec, 1)
			if err != nil {
				t.Fatal(err)
			}
			in := slices.Clone(tt.ups)
			out := make([]float64, 1)
			rep, err := agg.Aggregate([]float64{0}, tt.ups, out)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(out[0]-tt.want) > 1e-9*math.Max(1, tt.want) {
				t.Errorf("aggregate %v, want %v", out[0], tt.want)
			}
			if !slices.Equal(rep.Capped, tt.capped) {
				t.Errorf("capped %+v, want %+v", rep.Capped, tt.capped)
			}
			if n := rep.Metrics["samples_capped"]; int(n) != len(tt.capped) {
				t.Errorf("samples_capped %v, want %d", n, len(tt.capped))
			}
			for k, u := range tt.ups {
				if u.Client == "liar" && rep.Weights[k] > tt.weightB+1e-12 {
					t.Errorf("the liar's weight %v exceeds the bound %v", rep.Weights[k], tt.weightB)
				}
			}
			if !slices.EqualFunc(in, tt.ups, func(a, b Update) bool { return a.Samples == b.Samples }) {
				t.Error("the cap changed its input")
			}
		})
	}
}

// The cap changes nothing, bit for bit, while every count is within cap x
// the others' median: the same bits as uncapped FedAvg.
func TestFedAvgCapHonestIsExact(t *testing.T) {
	ups := []Update{{Client: "a", Params: []float64{0.1, 3}, Samples: 199}, {Client: "b", Params: []float64{0.7, -1}, Samples: 172},
		{Client: "c", Params: []float64{1.3, 2}, Samples: 30}, {Client: "d", Params: []float64{-2, 0.25}, Samples: 85}}
	a, b := make([]float64, 2), make([]float64, 2)
	if _, err := (FedAvg{}).Aggregate([]float64{0, 0}, ups, a); err != nil {
		t.Fatal(err)
	}
	rep, err := (FedAvg{Cap: DefaultFedAvgCap}).Aggregate([]float64{0, 0}, ups, b)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Capped) != 0 || math.Float64bits(a[0]) != math.Float64bits(b[0]) || math.Float64bits(a[1]) != math.Float64bits(b[1]) {
		t.Fatalf("the cap changed an honest round: %v vs %v (capped %+v)", a, b, rep.Capped)
	}
}

func TestFedAvgCapSpec(t *testing.T) {
	for _, spec := range []string{"fedavg:cap=0.5", "fedavg:cap=-1", "fedavg:cap=nan"} {
		if _, err := NewAggregator(spec, 1); err == nil {
			t.Errorf("%s accepted", spec)
		}
	}
}

package aggregate

import (
	"math"
	"testing"
)

// A site claiming 2e9 samples among four of 100: plain FedAvg gives it the
// whole weight; fedavg:cap=3 bounds it at 3 x the median, 3 / (3 + 4) of
// the weight, and changes nothing while every count is within the cap.
func TestFedAvgCap(t *testing.T) {
	x := []float64{0}
	ups := []Update{{Client: "a", Params: []float64{1}, Samples: 100}, {Client: "b", Params: []float64{1}, Samples: 120},
		{Client: "c", Params: []float64{1}, Samples: 90}, {Client: "d", Params: []float64{1}, Samples: 110},
		{Client: "liar", Params: []float64{8}, Samples: 2e9}}
	out := make([]float64, 1)
	if _, err := (FedAvg{}).Aggregate(x, ups, out); err != nil || !(out[0] > 7.99) {
		t.Fatalf("plain fedavg: %v %v (the liar should dominate)", out, err)
	}
	agg, err := NewAggregator("fedavg:cap=3", 1)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := agg.Aggregate(x, ups, out)
	if err != nil {
		t.Fatal(err)
	}
	// median 110, the liar counts 330: weight 330 / 750.
	if want := 1 + 7*330.0/750; math.Abs(out[0]-want) > 1e-12 || rep.Metrics["samples_capped"] != 1 {
		t.Fatalf("capped fedavg %v (want %v), report %+v", out[0], want, rep)
	}
	if ups[4].Samples != 2e9 {
		t.Fatal("CapSamples changed its input")
	}
	honest := ups[:4]
	a, b := make([]float64, 1), make([]float64, 1)
	if _, err := (FedAvg{}).Aggregate(x, honest, a); err != nil {
		t.Fatal(err)
	}
	if _, err := agg.Aggregate(x, honest, b); err != nil {
		t.Fatal(err)
	}
	if math.Float64bits(a[0]) != math.Float64bits(b[0]) {
		t.Fatalf("cap changed an honest round: %v vs %v", a, b)
	}
}

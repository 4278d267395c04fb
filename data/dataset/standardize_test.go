package dataset

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/edgefl/edgefl/learn/model"
)

// columnStats returns each feature's mean and population standard
// deviation.
func columnStats(d model.Data) (mean, sd []float64) {
	mean, sd = make([]float64, d.D), make([]float64, d.D)
	for i := range d.N {
		for j, v := range d.Row(i) {
			mean[j] += v / float64(d.N)
		}
	}
	for i := range d.N {
		for j, v := range d.Row(i) {
			sd[j] += (v - mean[j]) * (v - mean[j]) / float64(d.N)
		}
	}
	for j := range sd {
		sd[j] = math.Sqrt(sd[j])
	}
	return mean, sd
}

// rawFederation returns 40 samples over 2 IID clients: feature 0 the
// index, feature 1 with a large offset and scale, feature 2 constant (zero
// variance).
func rawFederation(t *testing.T) *Federated {
	t.Helper()
	ds := indexed(40, 3, 2, modLabels(2))
	for i := range ds.Data.N {
		ds.Data.X[i*3+1] = 1000 + 50*math.Sin(float64(i)) // large offset and scale
		ds.Data.X[i*3+2] = 7                              // constant
	}
	f, err := PartitionIID(ds, 2, PartitionOptions{Seed: 1, TestFraction: 0.25})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func cloneFed(f *Federated) *Federated {
	g := *f
	g.Clients = slices.Clone(f.Clients)
	for i := range g.Clients {
		for _, d := range []*model.Data{&g.Clients[i].Train, &g.Clients[i].Test} {
			d.X, d.Y = slices.Clone(d.X), slices.Clone(d.Y)
		}
	}
	return &g
}

func TestStandardize(t *testing.T) {
	raw := rawFederation(t)
	for _, mode := range []string{StandardizeNone, StandardizeClient, StandardizeGlobal} {
		t.Run(mode, func(t *testing.T) {
			f := cloneFed(raw)
			if err := Standardize(f, mode); err != nil {
				t.Fatal(err)
			}
			if mode == StandardizeNone {
				if fingerprint(f) != fingerprint(raw) || f.Standardized != "" {
					t.Fatal("mode none changed the data")
				}
				return
			}
			if f.Standardized != mode {
				t.Errorf("Standardized %q, want %q", f.Standardized, mode)
			}
			check := func(what string, d model.Data) {
				mean, sd := columnStats(d)
				for j := range mean {
					wantSD := 1.0
					if j == 2 {
						wantSD = 0 // constant: centred, not scaled
					}
					if math.Abs(mean[j]) > 1e-9 || math.Abs(sd[j]-wantSD) > 1e-9 {
						t.Errorf("%s feature %d: mean %g sd %g, want 0 and %g", what, j, mean[j], sd[j], wantSD)
					}
				}
			}
			if mode == StandardizeGlobal {
				train, _ := f.Pooled()
				check("pooled train", train)
			}
			for i, c := range f.Clients {
				if mode == StandardizeClient {
					check("client "+c.ID+" train", c.Train)
				}
				if c.Mean == nil || c.Scale == nil || c.Scale[2] != 1 {
					t.Fatalf("client %s: mean %v scale %v", c.ID, c.Mean, c.Scale)
				}
				// The test set went through the train statistics.
				r := raw.Clients[i]
				for k, v := range c.Test.X {
					j := k % f.D
					if want := (r.Test.X[k] - c.Mean[j]) / c.Scale[j]; math.Abs(v-want) > 1e-12 {
						t.Fatalf("client %s test value %d: %v, want %v", c.ID, k, v, want)
					}
				}
				if !slices.Equal(c.Test.Y, r.Test.Y) || !slices.Equal(c.Train.Y, r.Train.Y) {
					t.Fatalf("client %s: labels changed", c.ID)
				}
			}
			if mode == StandardizeClient && slices.Equal(f.Clients[0].Mean, f.Clients[1].Mean) {
				t.Error("client mode: both clients have the same mean (pooled statistics?)")
			}
			if mode == StandardizeGlobal && !slices.Equal(f.Clients[0].Mean, f.Clients[1].Mean) {
				t.Error("global mode: clients have different means")
			}
			if err := Standardize(f, mode); err == nil {
				t.Error("standardizing twice accepted")
			}
		})
	}
	if err := Standardize(cloneFed(raw), "minmax"); err == nil || !errors.Is(err, ErrSpec) {
		t.Errorf("unknown mode: %v", err)
	}
}

func TestStandardizeSingleSample(t *testing.T) {
	// A client of one sample: train has zero variance, every feature is
	// centred to 0 and nothing divides by zero.
	ds := indexed(3, 2, 2, modLabels(2))
	f, err := PartitionIID(ds, 3, PartitionOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := Standardize(f, StandardizeClient); err != nil {
		t.Fatal(err)
	}
	for _, c := range f.Clients {
		if c.Train.N != 1 || c.Test.N != 0 || c.Train.X[0] != 0 || c.Train.X[1] != 0 {
			t.Errorf("client %s: train %v test %d", c.ID, c.Train.X, c.Test.N)
		}
	}
	if err := f.Validate(); err != nil {
		t.Error(err)
	}
}

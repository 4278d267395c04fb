package dataset

import (
	"crypto/sha256"
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/learn/model"
)

// fingerprint hashes everything a Federated holds.
func fingerprint(f *Federated) [32]byte {
	h := sha256.New()
	var b [8]byte
	put := func(v float64) {
		binary.LittleEndian.PutUint64(b[:], math.Float64bits(v))
		h.Write(b[:])
	}
	h.Write([]byte(f.Name))
	put(float64(f.D))
	put(float64(f.Classes))
	for _, c := range f.Clients {
		h.Write([]byte(c.ID))
		for _, d := range []model.Data{c.Train, c.Test} {
			put(float64(d.N))
			for _, v := range d.X {
				put(v)
			}
			for _, v := range d.Y {
				put(v)
			}
		}
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// indexed returns a data set of n samples whose first feature is the
// sample's index (so partitions can be traced back), the others noise-free
// functions of it, and label(i) as the target.
func indexed(n, d, classes int, label func(i int) int) *Dataset {
	ds := &Dataset{Name: "indexed", Classes: classes, Data: model.Data{N: n, D: d, X: make([]float64, n*d), Y: make([]float64, n)}}
	for i := range n {
		for j := range d {
			ds.Data.X[i*d+j] = float64(i) + float64(j)/10
		}
		ds.Data.Y[i] = float64(label(i))
	}
	return ds
}

// sampleIndices returns the first feature (the source index) of every
// train and test row of every client.
func sampleIndices(f *Federated) []int {
	var idx []int
	for _, c := range f.Clients {
		for _, d := range []model.Data{c.Train, c.Test} {
			for i := range d.N {
				idx = append(idx, int(d.X[i*d.D]))
			}
		}
	}
	return idx
}

// checkUsedOnce fails unless every index of want appears exactly once.
func checkUsedOnce(t *testing.T, f *Federated, want int) {
	t.Helper()
	got := sampleIndices(f)
	slices.Sort(got)
	if len(got) != want {
		t.Fatalf("%d samples across the clients, want %d", len(got), want)
	}
	for i, v := range got {
		if v != i {
			t.Fatalf("sample %d missing or duplicated (sorted position %d holds %d)", i, i, v)
		}
	}
}

// checkSplits fails unless every client's test set has the size the split
// rule gives.
func checkSplits(t *testing.T, f *Federated, frac float64) {
	t.Helper()
	for _, c := range f.Clients {
		n := c.Train.N + c.Test.N
		want := testCount(n, frac)
		if c.Test.N != want {
			t.Errorf("client %s: %d samples, %d test, want %d", c.ID, n, c.Test.N, want)
		}
		if n >= 2 && (c.Test.N < 1 || c.Train.N < 1) {
			t.Errorf("client %s: %d train, %d test", c.ID, c.Train.N, c.Test.N)
		}
	}
	if err := f.Validate(); err != nil {
		t.Error(err)
	}
}

// checkOneLine fails if an error message spans lines.
func checkOneLine(t *testing.T, err error) {
	t.Helper()
	if err != nil && strings.ContainsAny(err.Error(), "\r\n") {
		t.Errorf("error spans lines: %q", err)
	}
}

// classesOf returns the distinct labels of a client.
func classesOf(c Client) []int {
	seen := map[int]bool{}
	for _, d := range []model.Data{c.Train, c.Test} {
		for _, y := range d.Y {
			seen[int(y)] = true
		}
	}
	var out []int
	for y := range seen {
		out = append(out, y)
	}
	slices.Sort(out)
	return out
}

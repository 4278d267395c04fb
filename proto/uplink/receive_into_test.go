package uplink

import (
	"math"
	"slices"
	"testing"

	"github.com/edgefl/edgefl/proto/wire"
)

// TestReceiveIntoMatchesReceive: ReceiveInto gives Receive's bits; a
// DELTA's into the caller's storage (d itself included) when it has the
// capacity, so the aggregator can take w = x + d per update without
// allocating.
func TestReceiveIntoMatchesReceive(t *testing.T) {
	const dim = 50
	x, d, z := make([]float64, dim), make([]float64, dim), make([]float64, dim)
	for i := range dim {
		x[i] = math.Sin(float64(i)) * 1e3
		d[i] = math.Cos(float64(i)) * 1e-7
		z[i] = float64(i) / 3
	}
	tests := []struct {
		name string
		h    Header
		held *Copy
		into bool // written into the scratch (else Receive's own slice)
	}{
		{"delta", Header{Kind: wire.UpdateKind_UPDATE_KIND_DELTA}, nil, true},
		{"z delta on the copy", Header{Kind: wire.UpdateKind_UPDATE_KIND_Z_DELTA, BaseRound: 3}, &Copy{Round: 3, Z: z}, false},
		{"full", Header{Kind: wire.UpdateKind_UPDATE_KIND_FULL}, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, err := Receive(tt.h, d, x, tt.held)
			if err != nil {
				t.Fatal(err)
			}
			scratch := make([]float64, dim)
			got, err := ReceiveInto(scratch, tt.h, d, x, tt.held)
			if err != nil || !slices.Equal(got, want) {
				t.Fatalf("into scratch: %v, equal %v", err, slices.Equal(got, want))
			}
			if tt.into != (&got[0] == &scratch[0]) {
				t.Fatalf("written into the scratch: %v, want %v", &got[0] == &scratch[0], tt.into)
			}
			inPlace := slices.Clone(d)
			got, err = ReceiveInto(inPlace, tt.h, inPlace, x, tt.held)
			if err != nil || !slices.Equal(got, want) {
				t.Fatalf("in place: %v, equal %v", err, slices.Equal(got, want))
			}
			if n := testing.AllocsPerRun(10, func() { _, _ = ReceiveInto(scratch, tt.h, d, x, tt.held) }); tt.into && n != 0 {
				t.Fatalf("%v allocations with scratch to spare", n)
			}
			if got, err := ReceiveInto(make([]float64, 0, dim-1), tt.h, d, x, tt.held); err != nil || !slices.Equal(got, want) {
				t.Fatalf("short scratch: %v, equal %v", err, slices.Equal(got, want))
			}
		})
	}
}

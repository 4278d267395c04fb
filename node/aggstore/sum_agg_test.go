package aggstore

import (
	"testing"
	"time"

	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/testkit/storetest"
)

// TestRoundSum: the sum-mode state is stored with the round it opens and
// read back.
func TestRoundSum(t *testing.T) {
	a, err := OpenAgg(storetest.TempPath(t, "agg.db"), storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	at := time.Unix(1700000000, 0)
	if err := a.OpenRound(Round{Number: 1, OpenedAt: at}, []float64{0}); err != nil {
		t.Fatal(err)
	}
	if err := a.OpenRound(Round{Number: 2, OpenedAt: at, Sum: []byte("S")}, []float64{1}); err != nil {
		t.Fatal(err)
	}
	r1, _ := a.Round(1)
	r2, err := a.CurrentRound()
	if err != nil || r1.Sum != nil || string(r2.Sum) != "S" {
		t.Fatalf("round 1 sum %q, round 2 %q, %v", r1.Sum, r2.Sum, err)
	}
}

package dp_test

import (
	"fmt"

	"github.com/edgefl/edgefl/learn/dp"
)

// A run of K = 10 sites selected from N = 100 per round (q = 0.1) with noise
// multiplier z = 1.1: the accountant's epsilon at delta = 1e-5 after 100
// rounds, and how many rounds a budget of epsilon = 8 allows.
func ExampleAccountant() {
	acc := dp.NewAccountant(nil)
	for range 100 {
		if err := acc.Step(10.0/100, 1.1); err != nil {
			panic(err)
		}
	}
	eps, order := acc.Epsilon(1e-5)
	fmt.Printf("after %d rounds: epsilon %.3g (order %g)\n", acc.Rounds, eps, order)
	n, _ := dp.RoundsWithin(8, 1e-5, 0.1, 1.1)
	fmt.Println("rounds within epsilon 8:", n)
	// Output:
	// after 100 rounds: epsilon 6.61 (order 3.6)
	// rounds within epsilon 8: 149
}

// A site's update clipped to C = 1 and, in distributed mode, its share of
// the noise for a round whose quorum is 8.
func ExampleClip() {
	update := []float64{3, 4}
	res, err := dp.Clip(update, 1)
	fmt.Println(update, res.Norm, res.Clipped, err)
	fmt.Printf("site noise std %.4f\n", dp.SiteStd(1.1, 1, 8))
	// Output:
	// [0.6000000000000001 0.8] 5 true <nil>
	// site noise std 0.3889
}

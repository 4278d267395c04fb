package aggregate

import (
	"errors"
	"fmt"
	"math"
)

// PNI is FedSim's Privacy-preserving Non-IID Index (seeds/002, sec. 3.3,
// eq. 15-18). It is not computed from gradients: the server initialises a
// model w_rnd with random weights and sends it to every client; client i
// predicts its own training labels with it and reports only
// RMSE_i = sqrt(sum_n (yhat_n - y_n)^2 / n) (eq. 16; see RMSE). Then
//
//	PNI_i = || RMSE_i - RMSE_{j != i} ||_2 = sqrt(sum_{j != i} (RMSE_i - RMSE_j)^2)   (17)
//	PNI   = (1/|C|) sum_i PNI_i                                                     (18)
//
// PNI takes the clients' RMSE values (any order) and returns the index; 0 for
// a single client or identical errors. It grows with the spread of the
// clients' errors of one shared random model, i.e. with how differently
// their data look to that model. Values must be finite and non-negative.
func PNI(rmse []float64) (float64, error) {
	if len(rmse) == 0 {
		return 0, errors.New("aggregate: PNI of no clients")
	}
	var mx float64
	for i, v := range rmse {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return 0, fmt.Errorf("%w: RMSE of client %d is %v", ErrNonFinite, i, v)
		}
		if v < 0 {
			return 0, fmt.Errorf("aggregate: PNI: RMSE of client %d is negative (%v)", i, v)
		}
		mx = max(mx, v)
	}
	if mx == 0 {
		return 0, nil
	}
	// Differences of non-negative values lie in [-mx, mx]: scale by a power
	// of two so that their squares and sums neither overflow nor underflow.
	s, inv := pow2Scale(mx)
	var sum float64
	for i, a := range rmse {
		var ss float64
		for j, b := range rmse {
			if j != i {
				ss += sq(a*inv - b*inv)
			}
		}
		sum += math.Sqrt(ss)
	}
	return sum / float64(len(rmse)) * s, nil
}

// RMSE is eq. 16 of seeds/002: sqrt(mean_n (pred_n - label_n)^2), the error a
// client reports for PNI (pred are its labels as predicted by the server's
// random model). Empty or mismatched inputs are an error.
func RMSE(pred, label []float64) (float64, error) {
	if len(pred) == 0 || len(pred) != len(label) {
		return 0, fmt.Errorf("%w: RMSE of %d predictions and %d labels", ErrDim, len(pred), len(label))
	}
	for i := range pred {
		if math.IsNaN(pred[i]) || math.IsInf(pred[i], 0) || math.IsNaN(label[i]) || math.IsInf(label[i], 0) {
			return 0, fmt.Errorf("%w in RMSE input %d", ErrNonFinite, i)
		}
	}
	return dist(pred, label) / math.Sqrt(float64(len(pred))), nil
}

// Package evaluate computes the federated evaluation metrics of a schema run,
// pure: a site's Report on its held-out rows (Classification,
// Regression) and the federation's figures from the sites' reports
// (Combine).
//
// Definitions (as scikit-learn's, checked against it in the tests):
//   - classification loss: mean cross-entropy, probabilities clipped to
//     [1e-15, 1-1e-15]; the predicted class is the argmax (lowest index on
//     ties); Confusion[true][predicted]; balanced accuracy is the mean
//     recall over the classes present in the true labels; AUC (binary
//     only) is the ROC AUC of P(class 1), ties counted half, undefined
//     (nil) when one class is absent.
//   - regression loss: mean squared error; RMSE its square root; R^2 is
//     1 - SSE/SST around the rows' own mean (undefined, nil, when SST = 0).
//
// Combining reports: N, loss (sample-weighted), the confusion matrix
// (summed), hence accuracy and balanced accuracy, RMSE and R^2 of the
// federation are exact, i.e. equal to those of the pooled held-out rows: a
// report carries the label mean and M2 of its rows, pooled with Chan et
// al.'s formula for the federation's SST. AUC is not decomposable: the
// federation's AUC is the sample-weighted mean of the sites' defined AUCs
// (an approximation, reported as such).
package evaluate

import (
	"errors"
	"fmt"
	"math"
	"sort"
)

// Report is one evaluation (a site's or, after Combine, the federation's).
type Report struct {
	N                int64     `json:"n"`
	Loss             float64   `json:"loss"`
	Accuracy         float64   `json:"accuracy,omitempty"`
	BalancedAccuracy float64   `json:"balanced_accuracy,omitempty"`
	Confusion        [][]int64 `json:"confusion,omitempty"`
	AUC              *float64  `json:"auc,omitempty"`
	RMSE             float64   `json:"rmse,omitempty"`
	R2               *float64  `json:"r2,omitempty"`
	// Regression: SSE and the label mean and M2, for exact combination.
	SSE       float64 `json:"sse,omitempty"`
	LabelMean float64 `json:"label_mean,omitempty"`
	LabelM2   float64 `json:"label_m2,omitempty"`
	// Baseline is what the model is measured against (WithBaseline): the
	// aggregator sets it for display, a site's report does not carry it.
	Baseline *Baseline `json:"baseline,omitempty"`
}

// Baseline is the rule a model must beat on the same rows to be of any
// use. Classification: always predicting the rows' majority class (its
// accuracy is that class's share; its balanced accuracy 1 / the classes
// present). Regression: always predicting the rows' own mean, whose R^2 is
// 0 by definition, so the model beats it when its R^2 is above 0.
type Baseline struct {
	Rule string `json:"rule"` // BaselineMajority or BaselineMean
	// Class is the majority class (its index; the lowest on ties) and
	// Accuracy the rule's accuracy (classification only).
	Class    int     `json:"class,omitempty"`
	Accuracy float64 `json:"accuracy,omitempty"`
	// Beaten: the model's accuracy is above the rule's (classification),
	// its R^2 above 0 (regression). A model equal to the rule does not
	// beat it.
	Beaten bool `json:"beaten"`
}

// Baseline rules.
const (
	BaselineMajority = "majority_class"
	BaselineMean     = "mean"
)

// WithBaseline returns r with its Baseline computed from its own rows
// (the confusion matrix's row sums, or R^2): nil when there is none (no
// rows, or a regression whose labels are all equal).
func (r Report) WithBaseline() Report {
	r.Baseline = nil
	switch {
	case r.N == 0:
	case r.Confusion != nil:
		best, bestN, total := 0, int64(-1), int64(0)
		for t, row := range r.Confusion {
			var n int64
			for _, c := range row {
				n += c
			}
			total += n
			if n > bestN {
				best, bestN = t, n
			}
		}
		if total > 0 {
			acc := float64(bestN) / float64(total)
			r.Baseline = &Baseline{Rule: BaselineMajority, Class: best, Accuracy: acc, Beaten: r.Accuracy > acc}
		}
	case r.R2 != nil:
		r.Baseline = &Baseline{Rule: BaselineMean, Beaten: *r.R2 > 0}
	}
	return r
}

// Classification evaluates class probabilities probs (n rows of k, row
// major) against true classes y.
func Classification(probs []float64, y []float64, k int) (Report, error) {
	n := len(y)
	if k < 2 || len(probs) != n*k {
		return Report{}, fmt.Errorf("evaluate: %d probabilities for %d rows of %d classes", len(probs), n, k)
	}
	r := Report{N: int64(n), Confusion: make([][]int64, k)}
	for c := range r.Confusion {
		r.Confusion[c] = make([]int64, k)
	}
	for i := range n {
		t := int(y[i])
		if t < 0 || t >= k || float64(t) != y[i] {
			return Report{}, fmt.Errorf("evaluate: row %d has class %v, expected 0..%d", i, y[i], k-1)
		}
		p := probs[i*k : (i+1)*k]
		best := 0
		for c := 1; c < k; c++ {
			if p[c] > p[best] {
				best = c
			}
		}
		r.Confusion[t][best]++
		r.Loss -= math.Log(min(max(p[t], 1e-15), 1-1e-15))
	}
	if n > 0 {
		r.Loss /= float64(n)
	}
	r.fromConfusion()
	if k == 2 {
		scores := make([]float64, n)
		for i := range n {
			scores[i] = probs[i*2+1]
		}
		r.AUC = auc(scores, y)
	}
	return r, nil
}

func (r *Report) fromConfusion() {
	var correct, total int64
	recall, present := 0.0, 0
	for t, row := range r.Confusion {
		var rowSum int64
		for _, c := range row {
			rowSum += c
		}
		total += rowSum
		correct += row[t]
		if rowSum > 0 {
			recall += float64(row[t]) / float64(rowSum)
			present++
		}
	}
	if total > 0 {
		r.Accuracy = float64(correct) / float64(total)
	}
	if present > 0 {
		r.BalancedAccuracy = recall / float64(present)
	}
}

// auc is the Mann-Whitney statistic with average ranks for ties.
func auc(scores, y []float64) *float64 {
	idx := make([]int, len(scores))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return scores[idx[a]] < scores[idx[b]] })
	var pos, neg float64
	rankSum := 0.0
	for i := 0; i < len(idx); {
		j := i
		for j < len(idx) && scores[idx[j]] == scores[idx[i]] {
			j++
		}
		avg := float64(i+j+1) / 2 // ranks i+1..j
		for _, k := range idx[i:j] {
			if y[k] == 1 {
				rankSum += avg
				pos++
			} else {
				neg++
			}
		}
		i = j
	}
	if pos == 0 || neg == 0 {
		return nil
	}
	a := (rankSum - pos*(pos+1)/2) / (pos * neg)
	return &a
}

// Regression evaluates predictions pred against values y.
func Regression(pred, y []float64) (Report, error) {
	if len(pred) != len(y) {
		return Report{}, fmt.Errorf("evaluate: %d predictions for %d rows", len(pred), len(y))
	}
	r := Report{N: int64(len(y))}
	for i := range y {
		d := pred[i] - y[i]
		r.SSE += d * d
		r.LabelMean += y[i]
	}
	if r.N > 0 {
		r.LabelMean /= float64(r.N)
		for _, v := range y {
			d := v - r.LabelMean
			r.LabelM2 += d * d
		}
	}
	r.regressionFigures()
	return r, nil
}

func (r *Report) regressionFigures() {
	if r.N == 0 {
		return
	}
	r.Loss = r.SSE / float64(r.N)
	r.RMSE = math.Sqrt(r.Loss)
	if r.LabelM2 > 0 {
		v := 1 - r.SSE/r.LabelM2
		r.R2 = &v
	}
}

// Combine the sites' reports (all classification with the same classes or
// all regression) into the federation's. Reports with N = 0 are skipped.
func Combine(reports []Report) (Report, error) {
	var out Report
	var aucW float64
	aucSum := 0.0
	first := true
	for k, r := range reports {
		if r.N == 0 {
			continue
		}
		if r.N < 0 || math.IsNaN(r.Loss) || math.IsInf(r.Loss, 0) {
			return Report{}, fmt.Errorf("evaluate: report %d: bad n or loss", k+1)
		}
		cls := r.Confusion != nil
		if first {
			if cls {
				out.Confusion = make([][]int64, len(r.Confusion))
				for c := range r.Confusion {
					out.Confusion[c] = make([]int64, len(r.Confusion))
				}
			}
			out.LabelMean, out.LabelM2 = r.LabelMean, r.LabelM2
		} else if cls != (out.Confusion != nil) || len(r.Confusion) != len(out.Confusion) {
			return Report{}, errors.New("evaluate: combining reports of different tasks or class counts")
		} else if !cls {
			na, nb := float64(out.N), float64(r.N)
			d := r.LabelMean - out.LabelMean
			out.LabelMean += d * nb / (na + nb)
			out.LabelM2 += r.LabelM2 + d*d*na*nb/(na+nb)
		}
		for t, row := range r.Confusion {
			if len(row) != len(out.Confusion) {
				return Report{}, fmt.Errorf("evaluate: report %d: confusion matrix is not square", k+1)
			}
			for p, c := range row {
				out.Confusion[t][p] += c
			}
		}
		out.Loss += r.Loss * float64(r.N)
		out.SSE += r.SSE
		out.N += r.N
		if r.AUC != nil {
			aucSum += *r.AUC * float64(r.N)
			aucW += float64(r.N)
		}
		first = false
	}
	if out.N == 0 {
		return out, nil
	}
	out.Loss /= float64(out.N)
	if out.Confusion != nil {
		out.fromConfusion()
		if aucW > 0 {
			a := aucSum / aucW
			out.AUC = &a
		}
		return out, nil
	}
	loss := out.Loss
	out.regressionFigures()
	out.Loss = loss
	return out, nil
}

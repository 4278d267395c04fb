// Package model owns parameter vectors and the models trained on them:
// multinomial and binary logistic regression, linear least squares and a
// one-hidden-layer MLP. Every model maps a flat []float64 parameter vector and
// a batch of samples to a loss, its gradient, predictions and a score. The
// package is pure: no goroutines or clocks, and no globals but the read-only
// CPU feature flags of kernel_*.go, which choose between kernels that give
// the same bits (or, without a hardware FMA, keep Step on LossGrad).
package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// Data is a batch of samples: X is row-major N×D, Y holds one target per row
// (the class index as a float64 for classifiers, the real target for
// regression).
type Data struct {
	N, D int
	X    []float64
	Y    []float64
}

// Row returns sample i's features (aliasing X).
func (d Data) Row(i int) []float64 { return d.X[i*d.D : (i+1)*d.D] }

// Gather copies the rows idx of d into dst, reusing dst's storage when large
// enough, and returns it.
func (d Data) Gather(idx []int, dst Data) Data {
	n := len(idx)
	if cap(dst.X) < n*d.D {
		dst.X = make([]float64, n*d.D)
	}
	if cap(dst.Y) < n {
		dst.Y = make([]float64, n)
	}
	dst.X, dst.Y = dst.X[:n*d.D], dst.Y[:n]
	dst.N, dst.D = n, d.D
	for k, i := range idx {
		copy(dst.X[k*d.D:(k+1)*d.D], d.X[i*d.D:(i+1)*d.D])
		dst.Y[k] = d.Y[i]
	}
	return dst
}

// Validate checks shapes and that every value is finite.
func (d Data) Validate() error {
	if d.N < 0 || d.D <= 0 {
		return fmt.Errorf("data: bad shape %d×%d", d.N, d.D)
	}
	if len(d.X) != d.N*d.D || len(d.Y) != d.N {
		return fmt.Errorf("data: %d×%d needs %d features and %d targets, have %d and %d", d.N, d.D, d.N*d.D, d.N, len(d.X), len(d.Y))
	}
	for i, v := range d.X {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("data: sample %d feature %d is %v", i/d.D, i%d.D, v)
		}
	}
	for i, v := range d.Y {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("data: sample %d target is %v", i, v)
		}
	}
	return nil
}

// Model is a differentiable model over flat parameter vectors.
//
// A Model value keeps scratch buffers between calls so that the inner loops do
// not allocate: it is not safe for concurrent use. Use Clone to get an
// independent copy for another goroutine.
//
// LossGrad, Predict and Score assume valid targets (see CheckTargets) and
// panic when w, grad, out or the feature count do not match the model: those
// are programmer errors, which CheckTargets rules out for user data.
type Model interface {
	// Spec returns the configuration the model was built from.
	Spec() Spec
	// NumParams is the length of the flat parameter vector.
	NumParams() int
	// InitParams returns a starting point: zeros for the convex models,
	// small random weights (drawn from rng) for the MLP.
	InitParams(rng *rand.Rand) []float64
	// LossGrad returns the mean loss over d plus the L2 term (l2/2)||w||^2.
	// When grad is non-nil (length NumParams) it is overwritten with the
	// gradient of that objective.
	LossGrad(w []float64, d Data, grad []float64) float64
	// Predict writes one prediction per sample into out (length d.N): the
	// class index for classifiers, the value for regression.
	Predict(w []float64, d Data, out []float64)
	// Score returns the fraction of correctly classified samples for
	// classifiers, and the coefficient of determination R^2 for regression
	// (scikit-learn's convention). It is NaN for an empty batch.
	Score(w []float64, d Data) float64
	// Layout documents the flat parameter layout.
	Layout() string
	// Clone returns an independent model with the same Spec.
	Clone() Model
}

// Kinds of model.
const (
	KindLogReg       = "logreg"        // multinomial logistic regression
	KindBinaryLogReg = "binary-logreg" // binary logistic regression, labels 0/1
	KindLinear       = "linear"        // linear least squares
	KindMLP          = "mlp"           // one hidden layer, softmax output
)

// Spec describes a model.
type Spec struct {
	Kind       string `json:"kind"`
	Inputs     int    `json:"inputs"`               // feature dimension D
	Classes    int    `json:"classes,omitempty"`    // output classes (logreg, mlp)
	Hidden     int    `json:"hidden,omitempty"`     // hidden units (mlp)
	Activation string `json:"activation,omitempty"` // "relu" or "tanh" (mlp)
	// Head is the bottleneck width of the MLP's prediction head (FedSiam-DA's
	// SimSiam-style predictor, contrast.go); 0 = no head. Its parameters
	// follow the classifier's in the flat vector and prediction ignores
	// them.
	Head int     `json:"head,omitempty"`
	L2   float64 `json:"l2"` // lambda of (lambda/2)||w||^2
}

// ErrSpec is wrapped by every error New returns.
var ErrSpec = errors.New("model spec")

// New builds the model described by s, or explains what is wrong with s.
func New(s Spec) (Model, error) {
	if err := checkSpec(s); err != nil {
		return nil, err
	}
	return build(s), nil
}

// l2Term adds (l2/2)||w||^2 to the loss and l2*w to grad (when non-nil).
func l2Term(l2 float64, w, grad []float64) float64 {
	if l2 == 0 {
		return 0
	}
	var ss float64
	for i, v := range w {
		ss += v * v
		if grad != nil {
			grad[i] += l2 * v
		}
	}
	return 0.5 * l2 * ss
}

func grow(buf []float64, n int) []float64 {
	if cap(buf) < n {
		return make([]float64, n)
	}
	return buf[:n]
}

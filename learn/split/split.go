// Package split owns FedSplit (Pathak & Wainwright 2020) in its relaxed
// Peaceman-Rachford form: the client step that reflects the global model
// through the client's z state, applies a prox update and moves z, and the
// server step that averages the clients' z. Functions are pure; the client's z
// is an explicit value the caller persists.
package split

import (
	"errors"
	"fmt"
	"math"
)

// Params are FedSplit's step size s > 0 and relaxation alpha in (0, 1]
// (1 = Peaceman-Rachford, 1/2 = Douglas-Rachford).
type Params struct {
	Step  float64
	Relax float64
}

// Validate reports a parameter outside its range.
func (p Params) Validate() error {
	if !(p.Step > 0) || math.IsInf(p.Step, 0) {
		return fmt.Errorf("fedsplit: step size s must be a finite number > 0, got %v", p.Step)
	}
	if !(p.Relax > 0 && p.Relax <= 1) {
		return fmt.Errorf("fedsplit: relaxation alpha must be in (0, 1], got %v", p.Relax)
	}
	return nil
}

// ClientStepSize is the prox step of client j for the sample-weighted
// objective F = sum_j p_j f_j over m clients: s_j = s m p_j, so that the plain
// mean of the z_j still has the minimiser of F as its fixed point.
func ClientStepSize(s float64, m int, pj float64) float64 { return s * float64(m) * pj }

// Prox computes (approximately) argmin_w f_j(w) + (1/(2 step))||w - v||^2.
type Prox func(v []float64, step float64) ([]float64, error)

// Reflect writes 2x - z into dst and returns it (dst may be nil).
func Reflect(dst, x, z []float64) []float64 {
	if dst == nil {
		dst = make([]float64, len(x))
	}
	for i := range x {
		dst[i] = 2*x[i] - z[i]
	}
	return dst
}

// Move writes z + 2 alpha (zHalf - x) into dst and returns it (dst may be nil
// or alias z).
func Move(dst, z, zHalf, x []float64, alpha float64) []float64 {
	if dst == nil {
		dst = make([]float64, len(z))
	}
	for i := range z {
		dst[i] = z[i] + 2*alpha*(zHalf[i]-x[i])
	}
	return dst
}

// ErrDim is returned when vectors disagree in length.
var ErrDim = errors.New("fedsplit: vector dimensions differ")

// ClientStep runs one FedSplit client round: v = 2x - z, zHalf = prox(v, step),
// zNew = z + 2 alpha (zHalf - x). It returns the new z and zHalf (the client's
// local model for this round). z is not modified.
func ClientStep(x, z []float64, step float64, p Params, prox Prox) (zNew, zHalf []float64, err error) {
	if len(x) != len(z) {
		return nil, nil, fmt.Errorf("%w: x has %d, z has %d", ErrDim, len(x), len(z))
	}
	if err := p.Validate(); err != nil {
		return nil, nil, err
	}
	v := Reflect(nil, x, z)
	zHalf, err = prox(v, step)
	if err != nil {
		return nil, nil, fmt.Errorf("fedsplit prox update: %w", err)
	}
	if len(zHalf) != len(x) {
		return nil, nil, fmt.Errorf("%w: prox returned %d, want %d", ErrDim, len(zHalf), len(x))
	}
	return Move(nil, z, zHalf, x, p.Relax), zHalf, nil
}

// ServerStep writes the mean of zs into dst and returns it: x^{t+1} = (1/m)
// sum_j z_j over every known client's latest z (stragglers contribute their
// last one).
func ServerStep(dst []float64, zs [][]float64) ([]float64, error) {
	if len(zs) == 0 {
		return nil, errors.New("fedsplit: no client states to average")
	}
	d := len(zs[0])
	if dst == nil {
		dst = make([]float64, d)
	}
	if len(dst) != d {
		return nil, fmt.Errorf("%w: dst has %d, want %d", ErrDim, len(dst), d)
	}
	clear(dst)
	for j, z := range zs {
		if len(z) != d {
			return nil, fmt.Errorf("%w: client %d has %d, want %d", ErrDim, j, len(z), d)
		}
		for i, v := range z {
			dst[i] += v
		}
	}
	inv := 1 / float64(len(zs))
	for i := range dst {
		dst[i] *= inv
	}
	return dst, nil
}

package dp

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// Accountant composes the rounds of a run: RDP adds up over adaptively
// chosen mechanisms, so it keeps the running sum of RDP at each order, one
// Step per aggregate released, with that round's sampling rate and noise
// multiplier (both may change from round to round). Its fields are its
// whole state, exported so that the aggregator can store it in its round
// log (JSON) and restore it after a restart.
type Accountant struct {
	Orders []float64 `json:"orders"`
	RDP    []float64 `json:"rdp"`
	Rounds uint64    `json:"rounds"`

	// cache: the per-order RDP of the last (q, z) charged, reused while
	// rounds repeat it (not state: recomputed after a restore).
	cacheQ, cacheZ float64
	cache          []float64
}

// NewAccountant returns an accountant over orders (nil: DefaultOrders) that
// has spent nothing.
func NewAccountant(orders []float64) *Accountant {
	if orders == nil {
		orders = DefaultOrders()
	}
	return &Accountant{Orders: slices.Clone(orders), RDP: make([]float64, len(orders))}
}

// Step charges one round: the sampled Gaussian mechanism with sampling rate
// q (the round's selection rate, docs/privacy.md "Sampling rate") and noise
// multiplier z (the total noise std over the clip norm: z, not the
// adaptive-clipping z_delta, see UpdateNoise).
func (a *Accountant) Step(q, z float64) error {
	if err := checkQZ(q, z); err != nil {
		return err
	}
	if len(a.RDP) != len(a.Orders) {
		return fmt.Errorf("dp: accountant has %d orders and %d RDP values", len(a.Orders), len(a.RDP))
	}
	if len(a.cache) != len(a.Orders) || a.cacheQ != q || a.cacheZ != z {
		a.cache = make([]float64, len(a.Orders))
		for i, o := range a.Orders {
			a.cache[i] = RDP(q, z, o)
		}
		a.cacheQ, a.cacheZ = q, z
	}
	for i, r := range a.cache {
		a.RDP[i] += r
	}
	a.Rounds++
	return nil
}

// Epsilon is the epsilon spent so far at delta (Epsilon's conversion) and
// the order attaining it.
func (a *Accountant) Epsilon(delta float64) (eps, order float64) {
	return Epsilon(a.Orders, a.RDP, delta)
}

func checkQZ(q, z float64) error {
	if !(q >= 0 && q <= 1) {
		return fmt.Errorf("dp: sampling rate must be in [0, 1], got %v", q)
	}
	if !(z > 0) || math.IsInf(z, 0) {
		return fmt.Errorf("dp: noise multiplier must be a finite number > 0, got %v", z)
	}
	return nil
}

func checkBudget(eps, delta float64) error {
	if !(eps > 0) || math.IsInf(eps, 0) {
		return fmt.Errorf("dp: epsilon budget must be a finite number > 0, got %v", eps)
	}
	if !(delta > 0 && delta < 1) {
		return fmt.Errorf("dp: delta must be in (0, 1), got %v", delta)
	}
	return nil
}

// EpsilonAfter is the epsilon at delta of rounds identical rounds (q, z)
// over orders (nil: DefaultOrders).
func EpsilonAfter(q, z float64, rounds int, delta float64, orders []float64) float64 {
	if orders == nil {
		orders = DefaultOrders()
	}
	rdp := make([]float64, len(orders))
	for i, o := range orders {
		rdp[i] = float64(rounds) * RDP(q, z, o)
	}
	eps, _ := Epsilon(orders, rdp, delta)
	return eps
}

// MaxRounds caps RoundsWithin: a budget that fits more rounds than this
// (q = 0, or a huge z) is reported as MaxRounds.
const MaxRounds = 1 << 30 // fits a 32-bit int (the gateways include armv7)

// RoundsWithin is how many rounds of (q, z) fit in the budget (eps, delta)
// from a fresh start, over DefaultOrders: the largest T with
// EpsilonAfter(q, z, T, delta) <= eps (0 if not even one does, MaxRounds
// if more than that do). RDP grows linearly in T, so epsilon is monotone in
// T and a doubling then bisection search finds T exactly.
func RoundsWithin(eps, delta, q, z float64) (int, error) {
	if err := checkBudget(eps, delta); err != nil {
		return 0, err
	}
	if err := checkQZ(q, z); err != nil {
		return 0, err
	}
	orders := DefaultOrders()
	per := make([]float64, len(orders))
	for i, o := range orders {
		per[i] = RDP(q, z, o)
	}
	rdp := make([]float64, len(orders))
	fits := func(t int) bool {
		for i := range per {
			rdp[i] = float64(t) * per[i]
		}
		e, _ := Epsilon(orders, rdp, delta)
		return e <= eps
	}
	if !fits(1) {
		return 0, nil
	}
	lo, hi := 1, 2 // fits(lo); hi unknown
	for fits(hi) {
		if hi >= MaxRounds {
			return MaxRounds, nil
		}
		lo, hi = hi, hi*2
	}
	for hi-lo > 1 { // fits(lo), !fits(hi)
		mid := lo + (hi-lo)/2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, nil
}

// ErrBudgetTooSmall: no noise multiplier up to 1e6 meets the budget.
var ErrBudgetTooSmall = errors.New("dp: the privacy budget is too small for any noise multiplier up to 1e6")

// CalibrateNoise returns a noise multiplier z with which rounds rounds of
// sampling rate q spend at most eps at delta, within tol of eps (> 0;
// Opacus's default is 0.01), over orders (nil: DefaultOrders). It is
// Opacus's get_noise_multiplier (opacus/accountants/utils.py): double z
// from 20 until epsilon is under budget, then bisect until
// eps - epsilon(z) <= tol, returning the z of the last under-budget
// epsilon. So the z returned always meets the budget and is at most a
// little larger than needed; with OpacusOrders its results are Opacus's.
func CalibrateNoise(eps, delta, q float64, rounds int, tol float64, orders []float64) (float64, error) {
	if err := checkBudget(eps, delta); err != nil {
		return 0, err
	}
	if !(q > 0 && q <= 1) {
		return 0, fmt.Errorf("dp: sampling rate must be in (0, 1], got %v", q)
	}
	if rounds < 1 {
		return 0, fmt.Errorf("dp: rounds must be >= 1, got %d", rounds)
	}
	if !(tol > 0) {
		return 0, fmt.Errorf("dp: tolerance must be > 0, got %v", tol)
	}
	if orders == nil {
		orders = DefaultOrders()
	}
	lo, hi := 0.0, 10.0
	epsHi := math.Inf(1)
	for epsHi > eps {
		hi *= 2
		if hi > 1e6 {
			return 0, ErrBudgetTooSmall
		}
		epsHi = EpsilonAfter(q, hi, rounds, delta, orders)
	}
	for eps-epsHi > tol {
		mid := (lo + hi) / 2
		if e := EpsilonAfter(q, mid, rounds, delta, orders); e < eps {
			hi, epsHi = mid, e
		} else {
			lo = mid
		}
		if hi-lo < 1e-12 {
			break
		}
	}
	return hi, nil
}

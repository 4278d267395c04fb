package dp

import (
	"math"
)

// DefaultOrders are the Rényi orders the accountant tracks: Opacus's
// RDPAccountant.DEFAULT_ALPHAS (1.1, 1.2, ..., 10.9 and 12, ..., 63) and
// 128, 256, 512 as TensorFlow Privacy adds for very small epsilon. Epsilon
// is the minimum over the orders, so more orders only tighten it.
func DefaultOrders() []float64 {
	o := OpacusOrders()
	return append(o, 128, 256, 512)
}

// OpacusOrders is Opacus's RDPAccountant.DEFAULT_ALPHAS exactly:
// [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)).
func OpacusOrders() []float64 {
	o := make([]float64, 0, 99+52)
	for x := 1; x < 100; x++ {
		o = append(o, 1+float64(x)/10.0)
	}
	for a := 12; a < 64; a++ {
		o = append(o, float64(a))
	}
	return o
}

// RDP is the Rényi divergence of order alpha (> 1) of one step of the
// sampled Gaussian mechanism: Poisson sampling with rate q in [0, 1], then
// the Gaussian mechanism of noise multiplier z (noise std / L2
// sensitivity), under add/remove-one neighbouring (Mironov, Talwar & Zhang
// 2019, sec. 3.3). Computed in log space as TensorFlow Privacy's
// rdp_accountant._compute_rdp and Opacus's analysis/rdp.py do: the binomial
// expansion for integer orders, the two-sided series for fractional ones.
// +Inf where the mechanism gives no guarantee (z = 0) or the series fails.
func RDP(q, z, alpha float64) float64 {
	switch {
	case q == 0:
		return 0
	case z == 0 || math.IsInf(alpha, 1):
		return math.Inf(1)
	case q == 1:
		return alpha / (2 * z * z)
	}
	var la float64
	if alpha == math.Trunc(alpha) {
		la = logAInt(q, z, int(alpha))
	} else {
		la = logAFrac(q, z, alpha)
	}
	return la / (alpha - 1)
}

// logAInt is log(A_alpha) for integer alpha (0 < q < 1):
// A = sum_i binom(alpha, i) q^i (1-q)^(alpha-i) exp((i^2 - i) / (2 z^2)).
func logAInt(q, z float64, alpha int) float64 {
	la := math.Inf(-1)
	lq, l1q := math.Log(q), math.Log1p(-q)
	for i := 0; i <= alpha; i++ {
		fi := float64(i)
		s := logBinom(alpha, i) + fi*lq + float64(alpha-i)*l1q + (fi*fi-fi)/(2*z*z)
		la = logAdd(la, s)
	}
	return la
}

// logAFrac is log(A_alpha) for fractional alpha (0 < q < 1): the integrals
// over (-inf, z0] and [z0, inf), each a series in i with signed generalised
// binomial coefficients, summed until both terms fall below exp(-30).
func logAFrac(q, z, alpha float64) float64 {
	la0, la1 := math.Inf(-1), math.Inf(-1)
	lq, l1q := math.Log(q), math.Log1p(-q)
	z0 := z*z*math.Log(1/q-1) + 0.5
	logCoef, positive := 0.0, true // binom(alpha, 0) = 1
	for i := 0; ; i++ {
		fi := float64(i)
		if i > 0 {
			// binom(alpha, i) = binom(alpha, i-1) * (alpha - i + 1) / i
			f := alpha - fi + 1
			logCoef += math.Log(math.Abs(f)) - math.Log(fi)
			if f < 0 {
				positive = !positive
			}
		}
		j := alpha - fi
		lt0 := logCoef + fi*lq + j*l1q
		lt1 := logCoef + j*lq + fi*l1q
		le0 := math.Log(0.5) + logErfc((fi-z0)/(math.Sqrt2*z))
		le1 := math.Log(0.5) + logErfc((z0-j)/(math.Sqrt2*z))
		ls0 := lt0 + (fi*fi-fi)/(2*z*z) + le0
		ls1 := lt1 + (j*j-j)/(2*z*z) + le1
		if positive {
			la0 = logAdd(la0, ls0)
			la1 = logAdd(la1, ls1)
		} else {
			var ok0, ok1 bool
			la0, ok0 = logSub(la0, ls0)
			la1, ok1 = logSub(la1, ls1)
			if !ok0 || !ok1 {
				return math.Inf(1) // no bound at this order
			}
		}
		if max(ls0, ls1) < -30 {
			break
		}
		if i > 100000 {
			return math.Inf(1) // the series does not settle: no bound
		}
	}
	return logAdd(la0, la1)
}

func logBinom(n, k int) float64 {
	a, _ := math.Lgamma(float64(n + 1))
	b, _ := math.Lgamma(float64(k + 1))
	c, _ := math.Lgamma(float64(n - k + 1))
	return a - b - c
}

// logAdd is log(exp(x) + exp(y)).
func logAdd(x, y float64) float64 {
	a, b := min(x, y), max(x, y)
	if math.IsInf(a, -1) {
		return b
	}
	return math.Log1p(math.Exp(a-b)) + b
}

// logSub is log(exp(x) - exp(y)); ok is false when the result would be
// negative.
func logSub(x, y float64) (float64, bool) {
	switch {
	case x < y:
		return math.NaN(), false
	case math.IsInf(y, -1):
		return x, true
	case x == y:
		return math.Inf(-1), true
	}
	d := math.Expm1(x - y)
	if math.IsInf(d, 1) {
		return x, true
	}
	return math.Log(d) + y, true
}

// logErfc is log(erfc(x)), accurate where erfc underflows: for x > 25 the
// asymptotic series erfc(x) ~ exp(-x^2 - 1/(2x^2) + 5/(8x^4) - ...)/(x
// sqrt(pi)) that TensorFlow Privacy falls back on (relative error below
// x^-10 there).
func logErfc(x float64) float64 {
	if x <= 25 {
		return math.Log(math.Erfc(x))
	}
	x2 := x * x
	return -math.Log(math.Pi)/2 - math.Log(x) - x2 - 0.5/x2 + 0.625/(x2*x2) -
		37.0/24.0/(x2*x2*x2) + 353.0/64.0/(x2*x2*x2*x2)
}

// Epsilon converts an RDP curve (rdp[i] at orders[i]) to the smallest
// epsilon of (epsilon, delta)-DP over the orders, with the conversion
// Opacus uses by default (Balle, Barthe, Gaboardi, Hsu & Sato 2020,
// "Hypothesis testing interpretations and Rényi differential privacy",
// Theorem 21):
//
//	eps = rdp - (log(delta) + log(alpha)) / (alpha - 1) + log((alpha - 1) / alpha)
//
// It returns epsilon (at least 0; +Inf if no order gives a bound) and the
// order that attains it. This is the epsilon edgefl reports.
func Epsilon(orders, rdp []float64, delta float64) (eps, order float64) {
	return minEps(orders, rdp, func(a, r float64) float64 {
		return r - (math.Log(delta)+math.Log(a))/(a-1) + math.Log((a-1)/a)
	})
}

// EpsilonClassic is the classic conversion (Mironov 2017, Proposition 3):
// eps = rdp - log(delta) / (alpha - 1). It is never smaller than Epsilon's;
// kept for comparison with older tables (Abadi et al. 2016's era).
func EpsilonClassic(orders, rdp []float64, delta float64) (eps, order float64) {
	return minEps(orders, rdp, func(a, r float64) float64 {
		return r - math.Log(delta)/(a-1)
	})
}

func minEps(orders, rdp []float64, conv func(a, r float64) float64) (float64, float64) {
	best, order := math.Inf(1), math.NaN()
	for i, a := range orders {
		if i >= len(rdp) || !(a > 1) {
			continue
		}
		if e := conv(a, rdp[i]); e < best { // NaN never wins
			best, order = e, a
		}
	}
	return max(best, 0), order
}

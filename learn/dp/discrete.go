package dp

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
)

// The distributed mode's noise is the discrete Gaussian N_Z(0, sigma^2) on
// the secure-aggregation ring's integers (docs/privacy.md, "Threat models";
// docs/privacy.md, "Distributed DP"): each site rounds its clipped update to
// the grid first and adds its integer share after, so the ring sum is the
// sites' rounded updates plus a sum of independent discrete Gaussians,
// which is the distributed discrete Gaussian mechanism of Kairouz, Liu &
// Steinke (ICML 2021), and the modular wrap is post-processing of it. The
// sampler is exact: Canonne, Kamath & Steinke (NeurIPS 2020, "The Discrete
// Gaussian for Differential Privacy"), Algorithm 3 over their Algorithms 1
// and 2, in rational arithmetic, so no floating-point rounding shapes the
// distribution (the attack Mironov 2012 showed on a float Laplace).

// DiscreteGaussian draws from N_Z(0, sigma^2): P(x) proportional to
// exp(-x^2 / (2 sigma^2)) over the integers. The fractions it compares
// are kept as integer numerators and denominators (sigma^2 = a/b exactly,
// the float64 sigma squared), never rounded.
type DiscreteGaussian struct {
	rng  *rand.Rand
	a, b *big.Int // sigma^2 = a / b
	t    int64    // floor(sigma) + 1: the discrete Laplace's scale
	// The acceptance test's exponent for |Y| = y is
	// (y b t - a)^2 / (2 a b t^2) (CKS20 Algorithm 3 with sigma^2 = a/b).
	bt, den *big.Int
	// Scratch.
	num, q, r, m, k, u *big.Int
	buf                []byte
}

// MaxDiscreteSigma bounds sigma so that the discrete Laplace's draws stay
// far inside int64 (sigma beyond it would not fit a 32-bit ring anyway).
const MaxDiscreteSigma = 1 << 40

// NewDiscreteGaussian is the sampler of N_Z(0, sigma^2) over rng; sigma is
// a finite number in (0, MaxDiscreteSigma].
func NewDiscreteGaussian(sigma float64, rng *rand.Rand) (*DiscreteGaussian, error) {
	if !(sigma > 0) || sigma > MaxDiscreteSigma {
		return nil, fmt.Errorf("dp: discrete Gaussian sigma %v: want a finite number in (0, 2^40]", sigma)
	}
	// sigma = mant 2^exp exactly (mant a 53-bit integer), so sigma^2 =
	// mant^2 2^(2 exp): a = mant^2 and b = 1, shifted to the side exp
	// says.
	frac, exp := math.Frexp(sigma)
	mant, exp := int64(math.Ldexp(frac, 53)), exp-53
	a := new(big.Int).Mul(big.NewInt(mant), big.NewInt(mant))
	b := big.NewInt(1)
	if exp >= 0 {
		a.Lsh(a, uint(2*exp))
	} else {
		b.Lsh(b, uint(-2*exp))
	}
	g := &DiscreteGaussian{rng: rng, a: a, b: b, t: int64(math.Floor(sigma)) + 1,
		num: new(big.Int), q: new(big.Int), r: new(big.Int), m: new(big.Int), k: new(big.Int), u: new(big.Int)}
	t := big.NewInt(g.t)
	g.bt = new(big.Int).Mul(g.b, t)
	g.den = new(big.Int).Mul(g.bt, t)
	g.den.Mul(g.den, g.a)
	g.den.Lsh(g.den, 1)
	return g, nil
}

// Draw returns one draw (CKS20 Algorithm 3): a discrete Laplace draw Y of
// scale t, accepted with probability exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)).
func (g *DiscreteGaussian) Draw() int64 {
	for {
		y := g.laplace()
		g.num.SetInt64(abs64(y))
		g.num.Mul(g.num, g.bt)
		g.num.Sub(g.num, g.a)
		g.num.Mul(g.num, g.num)
		if g.bernoulliExpNeg(g.num, g.den) {
			return y
		}
	}
}

// laplace draws from the discrete Laplace of scale t, P(x) proportional to
// exp(-|x|/t) (CKS20 Algorithm 2 with s = 1).
func (g *DiscreteGaussian) laplace() int64 {
	for {
		u := g.rng.Int64N(g.t)
		if !g.expNegUnit64(uint64(u), uint64(g.t)) {
			continue
		}
		v := int64(0)
		for g.expNegUnit64(1, 1) {
			v++
		}
		x := u + g.t*v
		neg := g.rng.Uint64()&1 == 1
		if neg && x == 0 {
			continue
		}
		if neg {
			return -x
		}
		return x
	}
}

// expNegUnit64 is true with probability exp(-n/d), 0 <= n <= d (CKS20
// Algorithm 1): the parity of the first k with Bernoulli(n/(d k)) false.
func (g *DiscreteGaussian) expNegUnit64(n, d uint64) bool {
	k := uint64(1)
	for {
		if dk, hi := d*k, d*k/k; hi != d || dk == 0 {
			// d k overflows (practically never: k is a few): go big.
			return g.expNegUnitBig(new(big.Int).SetUint64(n), new(big.Int).SetUint64(d), k)
		} else if g.rng.Uint64N(dk) >= n {
			return k%2 == 1
		}
		k++
	}
}

// bernoulliExpNeg is true with probability exp(-n/d), n >= 0, d > 0 (CKS20
// Algorithm 1): beyond 1, floor(n/d) draws of exp(-1) and one of the
// fractional part.
func (g *DiscreteGaussian) bernoulliExpNeg(n, d *big.Int) bool {
	g.q.QuoRem(n, d, g.r)
	for i := g.q.Int64(); i > 0 || !g.q.IsInt64(); i-- {
		if !g.expNegUnit64(1, 1) {
			return false
		}
		if !g.q.IsInt64() { // more than 2^63 draws of exp(-1): false, surely
			return false
		}
	}
	return g.expNegUnitBig(g.r, d, 1)
}

// expNegUnitBig is expNegUnit64 over big integers, from k.
func (g *DiscreteGaussian) expNegUnitBig(n, d *big.Int, k uint64) bool {
	for {
		g.m.Mul(d, g.k.SetUint64(k))
		if g.uniformBelow(g.m).Cmp(n) >= 0 {
			return k%2 == 1
		}
		k++
	}
}

// uniformBelow is uniform in [0, n) by rejection over n's bit length (in
// g.u, overwritten by the next call).
func (g *DiscreteGaussian) uniformBelow(n *big.Int) *big.Int {
	if n.IsUint64() {
		return g.u.SetUint64(g.rng.Uint64N(n.Uint64()))
	}
	bits := n.BitLen()
	if need := (bits + 7) / 8; cap(g.buf) < need+8 {
		g.buf = make([]byte, need+8)
	}
	buf := g.buf[:(bits+7)/8] // big-endian, any word size
	for {
		for i := 0; i < len(buf); i += 8 {
			binary.LittleEndian.PutUint64(g.buf[i:i+8], g.rng.Uint64())
		}
		if r := bits % 8; r != 0 {
			buf[0] &= byte(1)<<r - 1
		}
		if g.u.SetBytes(buf).Cmp(n) < 0 {
			return g.u
		}
	}
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// DistributedTau is tau of Kairouz, Liu & Steinke 2021 (Theorem 1): the sum
// of n independent N_Z(0, sigma^2) draws is within tau (per coordinate, in
// the RDP bound alpha Delta^2 / (2 n sigma^2) + tau d) of N_Z(0, n sigma^2):
// tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k+1)).
func DistributedTau(sigma float64, n int) float64 {
	tau := 0.0
	for k := 1; k < n; k++ {
		tau += 10 * math.Exp(-2*math.Pi*math.Pi*sigma*sigma*float64(k)/float64(k+1))
	}
	return tau
}

// MaxDistributedSlack is the largest tau * d the distributed mode accepts:
// the accountant charges the continuous Gaussian's RDP, alpha / (2 z^2),
// and the discrete mechanism's bound adds tau * d at every order (above),
// so the reported epsilon may understate the bound by at most this much
// per round, far below its printed digits. Parameters above it (a share of
// a few grid steps or less) are refused: raise the scale.
const MaxDistributedSlack = 1e-12

// CheckDistributedShare refuses a share of sigma grid steps, summed over at
// most n sites, for d coordinates, whose tau * d exceeds
// MaxDistributedSlack.
func CheckDistributedShare(sigma float64, n, d int) error {
	if s := DistributedTau(sigma, n) * float64(d); !(s <= MaxDistributedSlack) {
		return fmt.Errorf("dp: noise share of %.3g grid steps: %d discrete Gaussians sum too far from one (slack %.3g over %d coordinates > %g) (hint: raise the scale bits or noise)", sigma, n, s, d, MaxDistributedSlack)
	}
	return nil
}

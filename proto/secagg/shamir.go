package secagg

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"math/big"
)

// Shamir secret sharing over the prime field GF(p), p = 2^256 + 297, the
// smallest prime above 2^256 (TestFieldPrime checks it). Why this field: the
// secrets are 32-byte strings (an X25519 private key, a self-mask seed), and
// every 32-byte string is an element of GF(p) as it stands, so a secret is
// shared whole, with no splitting and no reduction; GF(2^8) byte-wise would
// cap a federation at 255 sites. A share is the polynomial's value at a
// non-zero x (the holder's index + 1), encoded as ShareSize big-endian
// bytes. math/big is not constant-time; a share's timing can leak to an
// observer on the same machine only, which the threat model (docs/privacy.md)
// accepts.

// ShareSize is the encoded size of one share's value.
const ShareSize = 33

// SecretSize is the size of every shared secret.
const SecretSize = 32

var fieldP = new(big.Int).Add(new(big.Int).Lsh(big.NewInt(1), 256), big.NewInt(297))

// splitSecret shares secret among the holders at xs (distinct, non-zero)
// with threshold t: any t shares reconstruct it, t-1 reveal nothing. The
// t-1 random coefficients come from rnd.
func splitSecret(secret []byte, xs []uint32, t int, rnd io.Reader) ([][ShareSize]byte, error) {
	if len(secret) != SecretSize {
		return nil, fmt.Errorf("secagg: secret of %d bytes, want %d", len(secret), SecretSize)
	}
	if t < 1 || t > len(xs) {
		return nil, fmt.Errorf("secagg: threshold %d for %d holders", t, len(xs))
	}
	coef := make([]*big.Int, t)
	coef[0] = new(big.Int).SetBytes(secret)
	for i := 1; i < t; i++ {
		c, err := rand.Int(rnd, fieldP)
		if err != nil {
			return nil, wrapErr("secagg: randomness", err)
		}
		coef[i] = c
	}
	out := make([][ShareSize]byte, len(xs))
	y, bx := new(big.Int), new(big.Int)
	for k, x := range xs {
		if x == 0 {
			return nil, errors.New("secagg: share at x = 0")
		}
		bx.SetUint64(uint64(x))
		y.SetInt64(0)
		for i := t - 1; i >= 0; i-- { // Horner
			y.Mul(y, bx)
			y.Add(y, coef[i])
			y.Mod(y, fieldP)
		}
		y.FillBytes(out[k][:])
	}
	return out, nil
}

// lagrangeAtZero returns the coefficients l_i with f(0) = sum l_i f(x_i) for
// distinct non-zero xs.
func lagrangeAtZero(xs []uint32) ([]*big.Int, error) {
	out := make([]*big.Int, len(xs))
	num, den, d := new(big.Int), new(big.Int), new(big.Int)
	for i, xi := range xs {
		num.SetInt64(1)
		den.SetInt64(1)
		for j, xj := range xs {
			if j == i {
				continue
			}
			if xj == xi {
				return nil, fmt.Errorf("secagg: two shares at x = %d", xi)
			}
			num.Mul(num, d.SetUint64(uint64(xj)))
			num.Mod(num, fieldP)
			den.Mul(den, d.SetInt64(int64(xj)-int64(xi)))
			den.Mod(den, fieldP)
		}
		inv := new(big.Int).ModInverse(den, fieldP)
		out[i] = inv.Mul(inv, num).Mod(inv, fieldP)
	}
	return out, nil
}

// combineShares evaluates at 0 the polynomial through the shares' points
// whose x are those lagrangeAtZero gave coef for, and returns the secret. A
// value that is not a field element, or a result above 2^256-1 (no honest
// sharing of a 32-byte secret gives one), is an error.
func combineShares(coef []*big.Int, ys [][ShareSize]byte) ([]byte, error) {
	acc, y := new(big.Int), new(big.Int)
	for i := range ys {
		y.SetBytes(ys[i][:])
		if y.Cmp(fieldP) >= 0 {
			return nil, errors.New("secagg: share value outside the field")
		}
		acc.Add(acc, y.Mul(y, coef[i]))
	}
	acc.Mod(acc, fieldP)
	if acc.BitLen() > 8*SecretSize {
		return nil, errors.New("secagg: shares reconstruct no 32-byte secret (tampered or inconsistent)")
	}
	return acc.FillBytes(make([]byte, SecretSize)), nil
}

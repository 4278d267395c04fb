package secagg

import (
	"bytes"
	"io"
	"math/big"
	"math/rand/v2"
	"testing"
)

func TestFieldPrime(t *testing.T) {
	if !fieldP.ProbablyPrime(64) {
		t.Fatal("p is not prime")
	}
	two256 := new(big.Int).Lsh(big.NewInt(1), 256)
	for i := int64(1); i < 297; i += 2 { // the smallest prime above 2^256
		if new(big.Int).Add(two256, big.NewInt(i)).ProbablyPrime(32) {
			t.Fatalf("2^256 + %d is prime too", i)
		}
	}
}

// TestShamir: any t of n shares give the secret back, t-1 do not, and a
// changed share gives another value (caught later by the key checks).
func TestShamir(t *testing.T) {
	rnd := seeded(5)
	r := rand.New(rand.NewPCG(5, 5))
	for _, tc := range []struct{ n, t int }{{2, 2}, {3, 2}, {10, 7}, {50, 34}, {100, 67}} {
		var secret [32]byte
		if _, err := io.ReadFull(rnd, secret[:]); err != nil {
			t.Fatal(err)
		}
		secret[0] = 0xff // the top of the range
		xs := make([]uint32, tc.n)
		for i := range xs {
			xs[i] = uint32(i + 1)
		}
		shares, err := splitSecret(secret[:], xs, tc.t, rnd)
		if err != nil {
			t.Fatal(err)
		}
		for trial := range 5 {
			pick := r.Perm(tc.n)[:tc.t]
			sx := make([]uint32, tc.t)
			sy := make([][ShareSize]byte, tc.t)
			for i, p := range pick {
				sx[i], sy[i] = xs[p], shares[p]
			}
			coef, err := lagrangeAtZero(sx)
			if err != nil {
				t.Fatal(err)
			}
			got, err := combineShares(coef, sy)
			if err != nil || !bytes.Equal(got, secret[:]) {
				t.Fatalf("n %d t %d trial %d: %x, %v", tc.n, tc.t, trial, got, err)
			}
			coef, _ = lagrangeAtZero(sx[1:])
			if got, err := combineShares(coef, sy[1:]); err == nil && bytes.Equal(got, secret[:]) {
				t.Fatalf("n %d t %d: t-1 shares gave the secret", tc.n, tc.t)
			}
			sy[0][ShareSize-1] ^= 1
			coef, _ = lagrangeAtZero(sx)
			if got, err := combineShares(coef, sy); err == nil && bytes.Equal(got, secret[:]) {
				t.Fatalf("n %d t %d: a changed share gave the secret", tc.n, tc.t)
			}
		}
	}
	if _, err := splitSecret(make([]byte, 32), []uint32{1, 2}, 3, rnd); err == nil {
		t.Fatal("threshold above the holders accepted")
	}
	if _, err := lagrangeAtZero([]uint32{3, 3}); err == nil {
		t.Fatal("duplicate x accepted")
	}
}

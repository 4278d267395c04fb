package secagg

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"slices"
)

// neighbours returns, for n sites (indices into the sorted key list), each
// site's neighbours in increasing order. Degree 0, or a degree that is not
// below n-1, gives the complete graph (Bonawitz et al. 2017). Otherwise
// (SecAgg+, Bell et al. 2020) the sites are placed on a cycle in a random
// order drawn from the public seed, and each is joined to the degree/2
// sites on either side: a degree-regular circulant (Harary) graph under a
// random labelling, the construction of Bell et al.'s Algorithm 2. The order
// comes from AES-256-CTR keyed by HKDF(seed), so every party computes the
// same graph whatever its Go version.
func neighbours(n, degree int, seed [KeySize]byte, session []byte) [][]int {
	out := make([][]int, n)
	if degree == 0 || degree >= n-1 {
		for i := range out {
			out[i] = make([]int, 0, n-1)
			for j := range n {
				if j != i {
					out[i] = append(out[i], j)
				}
			}
		}
		return out
	}
	perm := make([]int, n)
	for i := range perm {
		perm[i] = i
	}
	key, err := derive(seed[:], session, labelGraph)
	if err != nil {
		panic(err) // HKDF fails only for absurd lengths
	}
	block, _ := aes.NewCipher(key[:])
	stream := cipher.NewCTR(block, make([]byte, aes.BlockSize))
	var b [8]byte
	next := func(bound uint64) uint64 { // uniform in [0, bound) by rejection
		limit := ^uint64(0) - (^uint64(0)%bound+1)%bound
		for {
			clear(b[:])
			stream.XORKeyStream(b[:], b[:])
			if v := binary.LittleEndian.Uint64(b[:]); v <= limit {
				return v % bound
			}
		}
	}
	for i := n - 1; i > 0; i-- { // Fisher-Yates
		j := int(next(uint64(i + 1)))
		perm[i], perm[j] = perm[j], perm[i]
	}
	half := degree / 2
	for pos, site := range perm {
		for d := 1; d <= half; d++ {
			out[site] = append(out[site], perm[(pos+d)%n], perm[(pos-d+n)%n])
		}
		slices.Sort(out[site])
	}
	return out
}

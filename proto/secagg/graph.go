package secagg

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"slices"
)

// graph is the neighbour relation among the n sites of U1 (indices into the
// sorted key list). Degree 0, or a degree that is not below n-1, gives the
// complete graph (Bonawitz et al. 2017). Otherwise (SecAgg+, Bell et al.
// 2020) the sites are placed on a cycle in a random order drawn from the
// public seed, and each is joined to the degree/2 sites on either side: a
// degree-regular circulant (Harary) graph under a random labelling, the
// construction of Bell et al. The order comes from AES-256-CTR keyed by
// HKDF(seed), so every party computes the same graph whatever its Go
// version. It takes O(n) memory: rows are made on demand, so a party never
// holds the n^2 edges of a complete graph.
type graph struct {
	n, half int   // half = degree/2; 0 for the complete graph
	perm    []int // position -> site (sparse only)
	pos     []int // site -> position (sparse only)
}

func newGraph(n, degree int, seed [KeySize]byte, session []byte) graph {
	if degree == 0 || degree >= n-1 {
		return graph{n: n}
	}
	g := graph{n: n, half: degree / 2, perm: make([]int, n), pos: make([]int, n)}
	for i := range g.perm {
		g.perm[i] = i
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
		g.perm[i], g.perm[j] = g.perm[j], g.perm[i]
	}
	for p, site := range g.perm {
		g.pos[site] = p
	}
	return g
}

// of returns site i's neighbours in increasing order.
func (g graph) of(i int) []int {
	if g.half == 0 {
		out := make([]int, 0, g.n-1)
		for j := range g.n {
			if j != i {
				out = append(out, j)
			}
		}
		return out
	}
	out := make([]int, 0, 2*g.half)
	p := g.pos[i]
	for d := 1; d <= g.half; d++ {
		out = append(out, g.perm[(p+d)%g.n], g.perm[(p-d+g.n)%g.n])
	}
	slices.Sort(out)
	return out
}

// connected reports whether the sites marked in form one connected part of
// g. The masks of two survivors that are neighbours stay secret, so the
// server learns the sum of each connected part of the survivors' graph: with
// more than one part it would learn partial sums (with a lone survivor, its
// input). The complete graph on two or more sites is always connected.
func (g graph) connected(in []bool) bool {
	start, total := -1, 0
	for i, b := range in {
		if b {
			total++
			if start < 0 {
				start = i
			}
		}
	}
	if total == 0 {
		return false
	}
	if g.half == 0 {
		return total >= 2 || g.n == 1
	}
	seen := make([]bool, g.n)
	seen[start] = true
	queue, reached := []int{start}, 1
	for len(queue) > 0 {
		v := queue[0]
		queue = queue[1:]
		for _, w := range g.of(v) {
			if in[w] && !seen[w] {
				seen[w] = true
				reached++
				queue = append(queue, w)
			}
		}
	}
	return reached == total
}

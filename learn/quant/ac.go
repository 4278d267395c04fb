package quant

// The "ac" entropy stage. It codes the same content as the raw payload (the
// top-k support and the value section), but with the adaptive range coder:
//
//	payload = scale records (verbatim, as in the value section)
//	          range-coded stream:
//	            support (top-k only): one bit per position 0, 1, ... until
//	              nnz positions are kept; where the positions left equal the
//	              kept ones still to come, those are kept without a bit.
//	              Context: the position's band (4 per vector) and the two
//	              previous bits.
//	            codes: each value's code, most significant bit first in a bit
//	              tree. q4: 4 bits; q8, qsgd: 8 bits (the code byte); context:
//	              the band of the value's position. fp16, fp32: each byte of
//	              the shuffled planes, 8 bits, context: its plane.
//
// After a DCT the kept positions crowd the low frequencies and their codes
// shrink with frequency; the bands let the model follow, where zstd's one
// Huffman table per block cannot (TestACBeatsZstd measures both).

const acBands = 4

// acModel holds the adaptive probabilities of one frame.
type acModel struct {
	support [acBands * 4]prob
	codes   []prob // acBands (or planes) trees of 2^bits probabilities
}

// symbols describes the code region of a value section for the ac stage:
// how many symbols, their width, and how many context trees.
func (v valueCoder) acSymbols(n int) (count int, bits uint, trees int) {
	switch v.kind {
	case valFP32:
		return 4 * n, 8, 4
	case valFP16:
		return 2 * n, 8, 2
	case valQ4:
		return n, 4, acBands
	default: // q8, qsgd
		return n, 8, acBands
	}
}

func (m *acModel) init(v valueCoder) {
	initProbs(m.support[:])
	_, bits, trees := v.acSymbols(0)
	m.codes = resize(m.codes, trees<<bits)
	initProbs(m.codes)
}

// band maps a position of a dim-long vector to its context band.
func band(pos, dim int) int { return int(uint64(pos) * acBands / uint64(max(dim, 1))) }

// acEncode appends the ac payload of the raw value section sec (for
// len(idx) values at positions idx, or dim values when idx is nil).
func (c *Codec) acEncode(dst []byte, dim int, idx []uint32, sparse bool, v valueCoder, sec []byte) []byte {
	n := dim
	if sparse {
		n = len(idx)
	}
	recs := v.buckets(n) * v.recLen()
	dst = append(dst, sec[:recs]...)
	codes := sec[recs:]
	m := &c.acm
	m.init(v)
	e := &c.rce
	e.reset(dst)
	if sparse {
		var b1, b2 int
		kept := 0
		for pos := 0; pos < dim && kept < n; pos++ {
			b := 0
			if idx[kept] == uint32(pos) {
				b = 1
			}
			if dim-pos > n-kept { // otherwise every position left is kept
				e.bit(&m.support[band(pos, dim)*4+b1*2+b2], b)
			}
			kept += b
			b1, b2 = b, b1
		}
	}
	count, bits, _ := v.acSymbols(n)
	for j := range count {
		sym, tree := acSymbol(v, codes, j, n, dim, idx, sparse)
		encodeTree(e, m.codes[tree<<bits:(tree+1)<<bits], bits, sym)
	}
	out := e.finish()
	e.out = nil
	return out
}

// acSymbol returns symbol j of the code region and its context tree.
func acSymbol(v valueCoder, codes []byte, j, n, dim int, idx []uint32, sparse bool) (sym, tree int) {
	tree = acTree(v, j, n, dim, idx, sparse)
	if v.kind == valQ4 {
		return int(codes[j>>1]>>(4*(j&1))) & 15, tree
	}
	return int(codes[j]), tree
}

// acTree is the context tree of symbol j: its byte plane (fp32, fp16), or
// the band of its value's position.
func acTree(v valueCoder, j, n, dim int, idx []uint32, sparse bool) int {
	switch {
	case v.kind == valFP32 || v.kind == valFP16:
		return j / max(n, 1)
	case sparse:
		return band(int(idx[j]), dim)
	default:
		return band(j, dim)
	}
}

// acDecode reads an ac payload for header h: the kept indices (top-k) into
// c.didx and the raw value section into c.draw, which it returns. It fails
// on a short payload, on a stream that reads past its end or stops before
// it, and on a nonzero padding nibble; the section's contents are then
// checked by the value coder's validate like any other.
func (c *Codec) acDecode(pay []byte, h header) ([]byte, error) {
	n, v := h.nnz, h.val
	recs := v.buckets(n) * v.recLen()
	if len(pay) < recs {
		return nil, corrupt("ac payload of %d bytes, shorter than its %d bytes of scale records", len(pay), recs)
	}
	sec := resize(c.draw, v.size(n))
	c.draw = sec
	copy(sec, pay[:recs])
	codes := sec[recs:]
	clear(codes)
	m := &c.acm
	m.init(v)
	d := &c.rcd
	d.reset(pay[recs:])
	if h.sparse {
		c.didx = resize(c.didx, n)
		var b1, b2 int
		kept := 0
		for pos := 0; pos < h.dim && kept < n && !d.overrun; pos++ {
			b := 1
			if h.dim-pos > n-kept {
				b = d.bit(&m.support[band(pos, h.dim)*4+b1*2+b2])
			}
			if b == 1 {
				c.didx[kept] = uint32(pos)
				kept++
			}
			b1, b2 = b, b1
		}
	}
	count, bits, _ := v.acSymbols(n)
	for j := 0; j < count && !d.overrun; j++ { // a short stream stops here, not after dim bits
		tree := acTree(v, j, n, h.dim, c.didx, h.sparse)
		sym := decodeTree(d, m.codes[tree<<bits:(tree+1)<<bits], bits)
		if v.kind == valQ4 {
			codes[j>>1] |= byte(sym) << (4 * (j & 1))
		} else {
			codes[j] = byte(sym)
		}
	}
	d.in = nil
	if d.overrun {
		return nil, corrupt("ac stream ends early (%d bytes)", len(pay)-recs)
	}
	if d.pos != len(pay)-recs {
		return nil, corrupt("%d bytes after the ac stream", len(pay)-recs-d.pos)
	}
	return sec, nil
}

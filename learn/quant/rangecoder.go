package quant

// A binary adaptive range coder (the LZMA construction: 32-bit range, carry
// propagation through a cached byte, probabilities that adapt after every
// bit). It is the "ac" entropy stage: zstd codes bytes with one static
// Huffman table per block, while the support of a top-k frame and its codes
// change statistics along the vector (after a DCT, low frequencies are kept
// far more often than high ones); an adaptive model follows that drift.

const (
	probBits  = 12
	probOne   = 1 << probBits
	probInit  = probOne / 2
	probShift = 4 // adaptation speed: measured best of 4 and 5 on FedSplit deltas
	rcTop     = 1 << 24
)

// prob is P(bit = 0) in units of 2^-probBits, always in [15, 4081].
type prob uint16

type rcEncoder struct {
	low       uint64
	rng       uint32
	cache     byte
	cacheSize int64
	first     bool // the first byte the construction emits is always 0: not sent
	out       []byte
}

func (e *rcEncoder) reset(out []byte) {
	*e = rcEncoder{rng: 0xFFFFFFFF, cacheSize: 1, first: true, out: out}
}

func (e *rcEncoder) bit(p *prob, b int) {
	bound := (e.rng >> probBits) * uint32(*p)
	if b == 0 {
		e.rng = bound
		*p += (probOne - *p) >> probShift
	} else {
		e.low += uint64(bound)
		e.rng -= bound
		*p -= *p >> probShift
	}
	for e.rng < rcTop {
		e.rng <<= 8
		e.shiftLow()
	}
}

func (e *rcEncoder) shiftLow() {
	if uint32(e.low) < 0xFF000000 || e.low>>32 != 0 {
		carry := byte(e.low >> 32)
		temp := e.cache
		for {
			if e.first {
				e.first = false // always 0 (a carry cannot reach it)
			} else {
				e.out = append(e.out, temp+carry)
			}
			temp = 0xFF
			e.cacheSize--
			if e.cacheSize == 0 {
				break
			}
		}
		e.cache = byte(uint32(e.low) >> 24)
	}
	e.cacheSize++
	e.low = (e.low & 0x00FFFFFF) << 8
}

// finish flushes the coder and returns the output.
func (e *rcEncoder) finish() []byte {
	for range 5 {
		e.shiftLow()
	}
	return e.out
}

// rcDecoder reads exactly the bytes its encoder wrote; asking for more is
// corruption (overrun), which the caller checks once at the end: the bits
// decoded past the end are garbage but bounded in number by the header.
type rcDecoder struct {
	in      []byte
	pos     int
	code    uint32
	rng     uint32
	overrun bool
}

func (d *rcDecoder) reset(in []byte) {
	*d = rcDecoder{in: in, rng: 0xFFFFFFFF}
	for range 4 {
		d.code = d.code<<8 | uint32(d.next())
	}
}

func (d *rcDecoder) next() byte {
	if d.pos >= len(d.in) {
		d.overrun = true
		return 0
	}
	b := d.in[d.pos]
	d.pos++
	return b
}

func (d *rcDecoder) bit(p *prob) int {
	bound := (d.rng >> probBits) * uint32(*p)
	var b int
	if d.code < bound {
		d.rng = bound
		*p += (probOne - *p) >> probShift
	} else {
		d.code -= bound
		d.rng -= bound
		*p -= *p >> probShift
		b = 1
	}
	for d.rng < rcTop {
		d.rng <<= 8
		d.code = d.code<<8 | uint32(d.next())
	}
	return b
}

// A bit tree codes a bits-wide symbol most significant bit first, each bit
// in the context of the bits before it: 2^bits - 1 probabilities.
func encodeTree(e *rcEncoder, probs []prob, bits uint, sym int) {
	node := 1
	for i := int(bits) - 1; i >= 0; i-- {
		b := (sym >> uint(i)) & 1
		e.bit(&probs[node], b)
		node = node<<1 | b
	}
}

func decodeTree(d *rcDecoder, probs []prob, bits uint) int {
	node := 1
	for range bits {
		node = node<<1 | d.bit(&probs[node])
	}
	return node - 1<<bits
}

func initProbs(p []prob) {
	for i := range p {
		p[i] = probInit
	}
}

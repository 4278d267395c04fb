package quant

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"math/rand/v2"
)

// Encode appends to dst the frame of delta under c's spec and returns it.
//
// residual may be nil (no error feedback). Otherwise it must have
// len(delta): Encode encodes v = delta + residual and, on success only,
// overwrites residual with v minus what the receiver will decode. delta is
// never written. With a residual, qsgd scales each bucket by its MMSE factor
// so that error feedback stays bounded (see the package documentation).
//
// rng is required by qsgd (the only stage that draws) and ignored otherwise;
// the same rng state gives the same bytes. Encode fails with ErrInput on NaN
// or ±Inf in delta or residual, on a magnitude beyond the float32 range or a
// qsgd bucket norm that overflows float32, and with ErrTooLarge when
// len(delta) > Limits.MaxDim or the frame would exceed Limits.MaxFrame. On
// error it returns dst unchanged in length.
func (c *Codec) Encode(dst []byte, delta, residual []float64, rng *rand.Rand) ([]byte, error) {
	c.bound = false
	return c.encode(dst, delta, residual, rng)
}

// EncodeBounded encodes delta without a residual, like Encode with a nil
// one, except that qsgd scales a bucket down (by its MMSE factor) where its
// variance would exceed the bucket's energy, and stays unbiased elsewhere.
// That is for a sender whose next delta contains what this one failed to
// deliver (FedSplit's z_j minus the receiver's copy): re-encoding it can
// then never amplify the error, while unbiased errors still average out
// across senders.
func (c *Codec) EncodeBounded(dst []byte, delta []float64, rng *rand.Rand) ([]byte, error) {
	c.bound = true
	defer func() { c.bound = false }()
	return c.encode(dst, delta, nil, rng)
}

// shrinkFor picks the qsgd scaling of the Encode in progress.
func (c *Codec) shrinkFor(recon []float64) shrinkMode {
	switch {
	case c.bound:
		return shrinkIfAmplifies
	case recon != nil:
		return shrinkMMSE
	}
	return shrinkNone
}

func (c *Codec) encode(dst []byte, delta, residual []float64, rng *rand.Rand) ([]byte, error) {
	if err := c.checkArgs(delta, residual, rng); err != nil {
		return dst, err
	}
	v, err := c.input(delta, residual)
	if err != nil {
		return dst, err
	}
	u, err := c.forward(v)
	if err != nil {
		return dst, err
	}
	h, raw, recon, idx, err := c.payload(u, residual != nil, rng)
	if err != nil {
		return dst, err
	}
	dst, err = c.frame(dst, h, raw, idx)
	if err != nil {
		return dst, err
	}
	if residual != nil {
		c.feedback(residual, v, recon, idx)
	}
	return dst, nil
}

// checkArgs checks an Encode's arguments before any value is read.
func (c *Codec) checkArgs(delta, residual []float64, rng *rand.Rand) error {
	n := len(delta)
	if n > c.lim.MaxDim {
		return fmt.Errorf("%w: dimension %d, limit %d", ErrTooLarge, n, c.lim.MaxDim)
	}
	if residual != nil && len(residual) != n {
		return fmt.Errorf("%w: residual has %d values, delta %d", ErrInput, len(residual), n)
	}
	if c.val.kind == valQSGD && rng == nil {
		return fmt.Errorf("%w: %s needs a *rand.Rand", ErrInput, c.val)
	}
	return nil
}

// forward returns the vector the payload codes: v itself, or its transform
// coefficients (in c.coef) when c has a transform.
func (c *Codec) forward(v []float64) ([]float64, error) {
	if !c.tf.on() {
		return v, nil
	}
	n := len(v)
	if n < c.tf.size() {
		return nil, fmt.Errorf("%w: %s needs at least %d values, delta has %d", ErrInput, c.tf, c.tf.size(), n)
	}
	c.coef = resize(c.coef, n)
	c.dctForward(c.tf, v, c.coef)
	if i := beyondFloat32(c.coef); i >= 0 {
		return nil, fmt.Errorf("%w: dct coefficient %d = %g is beyond the float32 range", ErrInput, i, c.coef[i])
	}
	return c.coef, nil
}

// payload codes u (its top-k when c sparsifies) into the raw payload (in
// c.rawb) and returns the frame's header without its payload length, the
// payload, the kept indices (top-k), and, when withRecon, the receiver's
// view of the values sent (in c.recon, one per value coded).
func (c *Codec) payload(u []float64, withRecon bool, rng *rand.Rand) (h header, raw []byte, recon []float64, idx []uint32, err error) {
	n := len(u)
	raw = c.rawb[:0]
	h = header{zstd: !c.raw && !c.ac, ac: c.ac, tf: c.tf, sparse: c.sparse, val: c.val, dim: n, nnz: n}
	vals := u
	if c.sparse {
		idx = c.selectTopK(u, c.top.k(n))
		h.nnz = len(idx)
		if !c.ac { // ac codes the support itself
			raw = appendIndices(raw, idx)
		}
		c.vals = resize(c.vals, len(idx))
		for j, i := range idx {
			c.vals[j] = u[i]
		}
		vals = c.vals
	}
	if withRecon {
		recon = resize(c.recon, len(vals))
	}
	raw, err = c.val.encode(raw, vals, rng, recon, c.shrinkFor(recon))
	c.rawb = raw
	if recon != nil {
		c.recon = recon
	}
	if err != nil {
		return h, nil, nil, nil, err
	}
	h.rawLen = len(raw)
	return h, raw, recon, idx, nil
}

// frame appends the frame to dst: header, payload (zstd and ac append in
// place), CRC32C. On error dst is returned unchanged in length.
func (c *Codec) frame(dst []byte, h header, raw []byte, idx []uint32) ([]byte, error) {
	off := len(dst)
	hl := h.len()
	dst = grow(dst, hl)
	switch {
	case h.ac:
		dst = c.acEncode(dst, h.dim, idx, c.sparse, c.val, raw)
	case h.zstd && len(raw) > 0:
		dst = c.z.compress(dst, raw)
	default:
		dst = append(dst, raw...)
	}
	h.payLen = len(dst) - off - hl
	if size := hl + h.payLen + crcLen; size > c.lim.MaxFrame {
		return dst[:off], fmt.Errorf("%w: frame would be %d bytes, limit %d", ErrTooLarge, size, c.lim.MaxFrame)
	}
	h.put(dst[off:])
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[off:], castagnoli)), nil
}

// feedback is error feedback: residual becomes v minus what the receiver
// will decode from the values it gets (recon, at idx when top-k), so what
// was not sent stays with the sender.
func (c *Codec) feedback(residual, v, recon []float64, idx []uint32) {
	n := len(v)
	switch {
	case c.tf.on():
		// The receiver inverts the coefficients it got; so does this.
		got := recon
		if c.sparse {
			c.vals = resize(c.vals, n)
			scatter(c.vals, idx, recon)
			got = c.vals
		}
		dec := resize(c.abs, n)
		c.abs = dec
		c.dctInverse(c.tf, got, dec)
		for i := range residual {
			residual[i] = v[i] - dec[i]
		}
	case c.sparse:
		copy(residual, v)
		for j, i := range idx {
			residual[i] = v[i] - recon[j]
		}
	default:
		for i := range residual {
			residual[i] = v[i] - recon[i]
		}
	}
}

// scatter sets dst to zero but dst[idx[j]] = vals[j].
func scatter(dst []float64, idx []uint32, vals []float64) {
	clear(dst)
	for j, i := range idx {
		dst[i] = vals[j]
	}
}

// beyondFloat32 is the index of the first value beyond the float32 range
// (a transform can grow a magnitude by up to sqrt(H·W)), or -1.
func beyondFloat32(u []float64) int {
	for i, f := range u {
		if math.Abs(f) > math.MaxFloat32 && math.IsInf(float64(float32(f)), 0) {
			return i
		}
	}
	return -1
}

// input validates delta and residual and returns the vector to encode:
// delta itself, or delta + residual in scratch.
func (c *Codec) input(delta, residual []float64) ([]float64, error) {
	for i, f := range delta {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("%w: delta[%d] is %v", ErrInput, i, f)
		}
	}
	v := delta
	if residual != nil {
		c.sum = resize(c.sum, len(delta))
		for i, r := range residual {
			if math.IsNaN(r) || math.IsInf(r, 0) {
				return nil, fmt.Errorf("%w: residual[%d] is %v", ErrInput, i, r)
			}
			c.sum[i] = delta[i] + r
		}
		v = c.sum
	}
	if i := beyondFloat32(v); i >= 0 {
		what := "delta"
		if residual != nil {
			what = "delta+residual"
		}
		return nil, fmt.Errorf("%w: %s[%d] = %g is beyond the float32 range", ErrInput, what, i, v[i])
	}
	return v, nil
}

// open parses and checks a frame and decompresses and validates its
// payload; after it succeeds, writing the values cannot fail. wantDim >= 0
// demands that dimension (checked before decompressing). For a top-k frame
// the indices are in c.didx[:nnz]. It returns the value section.
func (c *Codec) open(msg []byte, wantDim int) (header, []byte, error) {
	h, pay, err := parseFrame(msg, c.lim)
	if err != nil {
		return h, nil, err
	}
	if wantDim >= 0 && h.dim != wantDim {
		return h, nil, fmt.Errorf("%w: frame has dimension %d, destination %d", ErrDimension, h.dim, wantDim)
	}
	raw := pay
	switch {
	case h.ac:
		if raw, err = c.acDecode(pay, h); err != nil {
			return h, nil, err
		}
	case h.zstd && h.rawLen > 0:
		raw, c.draw, err = c.z.decompress(c.draw, pay, h.rawLen)
		if err != nil {
			return h, nil, err
		}
	}
	if h.sparse && !h.ac {
		var used int
		c.didx, used, err = parseIndices(raw, h.nnz, h.dim, c.didx)
		if err != nil {
			return h, nil, err
		}
		raw = raw[used:]
	}
	if err := h.val.validate(raw, h.nnz); err != nil {
		return h, nil, err
	}
	return h, raw, nil
}

// Decode decodes any valid frame, whatever codec made it (the frame says),
// into dst's storage when it has the capacity (else a new slice), and returns
// the vector, of the frame's dimension, all values finite. On error it
// returns nil and dst's contents are unspecified. Limits bound every size
// before anything is allocated.
func (c *Codec) Decode(msg []byte, dst []float64) ([]float64, error) {
	h, vals, err := c.open(msg, -1)
	if err != nil {
		return nil, err
	}
	out := resize(dst, h.dim)
	if out == nil {
		out = []float64{} // dimension 0: empty, not nil (nil means error)
	}
	if h.tf.on() {
		c.coef = c.coefficients(h, vals)
		c.dctInverse(h.tf, c.coef, out)
		return out, nil
	}
	c.decodeDense(h, vals, out)
	return out, nil
}

// DecodeAdd adds scale times the frame's vector to dst, whose length must be
// the frame's dimension (ErrDimension, checked before decompressing). Dense
// frames are accumulated straight from the payload and top-k frames touch
// only their nnz coordinates: the dense vector is never materialised. The
// whole frame is validated first, so on any error dst is unchanged.
func (c *Codec) DecodeAdd(msg []byte, dst []float64, scale float64) error {
	if math.IsNaN(scale) || math.IsInf(scale, 0) {
		return fmt.Errorf("%w: scale is %v", ErrInput, scale)
	}
	h, vals, err := c.open(msg, len(dst))
	if err != nil {
		return err
	}
	if h.tf.on() {
		c.coef = c.coefficients(h, vals)
		dec := resize(c.abs, h.dim)
		c.abs = dec
		c.dctInverse(h.tf, c.coef, dec)
		for i, x := range dec {
			dst[i] += float64(scale * x)
		}
		return nil
	}
	if !h.sparse {
		h.val.decode(vals, dst, true, scale)
		return nil
	}
	c.dvals = resize(c.dvals, h.nnz)
	h.val.decode(vals, c.dvals, false, 0)
	for j, i := range c.didx[:h.nnz] {
		dst[i] += float64(scale * c.dvals[j])
	}
	return nil
}

// coefficients decodes an opened frame's values into the dense coefficient
// vector (zeros where top-k kept nothing), in c.coef's storage.
func (c *Codec) coefficients(h header, vals []byte) []float64 {
	u := resize(c.coef, h.dim)
	c.decodeDense(h, vals, u)
	return u
}

// decodeDense decodes an opened frame's values into out, of the frame's
// dimension (zeros where top-k kept nothing).
func (c *Codec) decodeDense(h header, vals []byte, out []float64) {
	if !h.sparse {
		h.val.decode(vals, out, false, 0)
		return
	}
	c.dvals = resize(c.dvals, h.nnz)
	h.val.decode(vals, c.dvals, false, 0)
	scatter(out, c.didx[:h.nnz], c.dvals)
}

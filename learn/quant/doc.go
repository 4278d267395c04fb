// Package quant owns the update codecs: it turns a delta vector ([]float64,
// whatever it means) into a self-describing, checksummed frame and back.
// Stages compose: an optional transform (a 2-D DCT over image-shaped
// weights), an optional top-k sparsifier, one value coder (lossless float32,
// float16, 8/4-bit linear quantisation, QSGD stochastic quantisation), then
// an entropy stage (zstd by default, or an adaptive range coder), then the
// frame.
//
// Everything is pure and deterministic given the *rand.Rand passed to Encode
// (only QSGD draws from it). A Codec owns one reused zstd encoder and decoder
// (concurrency 1, no goroutines) and scratch buffers, so it is not safe for
// concurrent use: give each goroutine its own.
//
// # Codec spec
//
// Users write a codec as a spec string, stages joined with '+':
//
//	spec    = [ dct "+" ] ( [ sparse "+" ] value | sparse ) [ "+" framing ]
//	dct     = "dct:" H "x" W [ "x" C ]        2-D DCT of the first H·W·C values: an H×W image
//	                                          (row-major) of C interleaved channels; H, W in
//	                                          1..256, C >= 1 (default 1). See dct.go.
//	sparse  = "topk:" ( COUNT | FRACTION )    k largest |x|: COUNT is an integer >= 1,
//	                                          FRACTION has a '.' or an exponent and is in (0, 1]
//	value   = "fp32"                          lossless float32 (the reference codec)
//	        | "fp16"                          IEEE half precision
//	        | "q8" { ":" qopt }               8-bit linear, scale per bucket
//	        | "q4" { ":" qopt }               4-bit linear, scale per bucket
//	        | "qsgd:" S [ ":b=" B ]           QSGD, S levels (1..127) per bucket of B (default 512)
//	qopt    = "b=" B | "minmax" | "absmax"    bucket size (default 512); scale mode (default minmax)
//	framing = "zstd" | "raw" | "ac"           zstd is the default; raw skips it; ac is the
//	                                          adaptive range coder (see ac.go)
//
// Examples: "fp32", "fp16", "q8", "q4:b=128:absmax", "qsgd:16", "qsgd:16:b=1024",
// "topk:0.01+qsgd:16", "topk:100+q8", "q8+raw", "dct:28x28x10+topk:0.16+q4+ac".
// A sparse stage alone sends the kept values as fp32 ("topk:0.01" =
// "topk:0.01+fp32"). Every payload is zstd-compressed unless the spec ends in
// "+raw" or "+ac". (*Codec).String prints the canonical form (defaults
// omitted, the value stage always present), which Parse reads back to the
// same codec.
//
// The dct stage suits weights that multiply image pixels (logistic
// regression, the first layer of an MLP, on images), laid out pixel-major
// with the outputs innermost: for Fashion-MNIST logistic regression,
// "dct:28x28x10". Top-k and the value coder then work on its coefficients,
// and the receiver inverts the transform. A vector shorter than H·W·C is an
// input error (MinDim says how long it must be).
//
// # Frame layout (versions 1 and 2, little-endian)
//
// A frame with neither a dct stage nor the ac stage is version 1; otherwise
// version 2, whose header is 8 bytes longer and gives bytes 10 and 11 a
// meaning (a version 1 decoder refuses it by its version byte).
//
//	offset size  field
//	 0      4    magic "EFLQ"
//	 4      1    version (1)
//	 5      1    flags: bit 0 = payload is one or more zstd frames; other bits 0
//	 6      1    sparsifier: 0 dense, 1 top-k
//	 7      1    value coder: 1 fp32, 2 fp16, 3 q8, 4 q4, 5 qsgd
//	 8      1    scale mode (q8/q4): 0 min/max, 1 absmax; otherwise 0
//	 9      1    QSGD levels s (1..127); otherwise 0
//	10      1    version 1: reserved, 0. Version 2: transform, 0 none, 1 dct
//	11      1    version 1: reserved, 0. Version 2: entropy stage, 0 zstd/raw (flag bit 0), 1 ac
//	12      4    bucket size (q8/q4/qsgd, >= 1); otherwise 0
//	16      4    dim: length of the vector
//	20      4    nnz: number of values sent (= dim when dense, <= dim for top-k)
//	24      4    raw payload length (before zstd; for ac, the value section's length)
//	28      4    payload length P (bytes in this frame)
//	version 2 only:
//	32      2    dct H (1..256), or 0 without a transform
//	34      2    dct W (1..256), or 0
//	36      4    dct C (>= 1, H·W·C <= dim), or 0
//	L       P    payload (L = 32 for version 1, 40 for version 2)
//	L+P     4    CRC32C (Castagnoli) of bytes [0, L+P)
//
// With a dct stage, the values the payload carries are the transform's
// coefficients (in its zigzag order); the decoder inverts the transform.
// An ac payload is described in ac.go. Otherwise, the raw payload of a
// dense frame is the value section for dim values; a
// top-k frame's is the nnz indices (ascending; the first as a uvarint, then
// each gap minus one as a uvarint) followed by the value section for the nnz
// kept values, in index order. Value sections (n values, nb = ceil(n/B)
// buckets):
//
//	fp32  4n bytes: the float32 bits, byte-plane shuffled (all byte 0s, then all byte 1s, ...)
//	fp16  2n bytes: the half bits, byte-plane shuffled
//	q8    nb scale records, then n codes (uint8 for min/max, int8 -127..127 for absmax)
//	q4    nb scale records, then ceil(n/2) bytes of 4-bit codes, low nibble first
//	      (0..15 for min/max; code+8 with code in -7..7 for absmax); a padding nibble is 0
//	qsgd  nb float32 bucket scales, then n int8 signed levels in -s..s
//
// A min/max scale record is float32 lo then float32 step; an absmax record is
// float32 step. A qsgd scale is the bucket's L2 norm rounded up to float32
// (or, under error feedback, shrunk: see below). Decoded values:
// lo + code*step (min/max), code*step (absmax), scale/s * level (qsgd), all
// computed in float64.
//
// # Error bounds (per element, x the input, x' the decoded value)
//
//   - fp32: x' = float32(x), round to nearest even: |x'-x| <= 2^-24 |x| for
//     normal float32 values; bit-exact for values representable in float32
//     (including -0 and subnormals).
//   - fp16: |x'-x| <= max(2^-11 |x|, 2^-25) for |x| <= 65504 (round to
//     nearest even, directly from float64); larger magnitudes saturate to
//     ±65504.
//   - q8 min/max: |x'-x| <= (max-min)/255/2 per bucket; q4 min/max:
//     (max-min)/15/2; q8 absmax: max|x|/127/2; q4 absmax: max|x|/7/2. The
//     bucket's lo and step are float32, so add their rounding: a relative
//     2^-22 on the bound, plus 2^-23·|min| (min/max mode), plus 2^-149 (the
//     float32 resolution, which matters only for values below ~1e-38).
//   - qsgd (without error feedback): unbiased, E[x'] = x; per bucket v,
//     E||x'-v||^2 <= min(B/s^2, sqrt(B)/s) ||v||^2 (Alistarh et al. 2017,
//     Lemma 3.1; B = bucket length). The transmitted norm is rounded up to
//     float32, which scales the bound by at most (1+2^-23)^2. Per element,
//     |x'-x| <= ||v||/s (to the same rounding).
//   - topk: the dropped coordinates decode as 0; the kept ones carry the value
//     coder's error. Exact zeros are never sent, so nnz <= k.
//   - dct: the bounds above hold for the coefficients, not per element. The
//     transform is orthonormal, so the L2 error of the decoded vector is the
//     L2 error of the coefficients, plus float64 rounding (about 1e-15
//     relative); no dct codec is lossless.
//
// Encode rejects NaN and ±Inf in delta or residual and magnitudes beyond the
// float32 range (and a QSGD bucket whose norm overflows float32): every scale
// travels as float32.
//
// # Error feedback
//
// When Encode is given a residual (the caller owns and persists it, same
// length as delta) it encodes v = delta + residual and overwrites residual
// with v - decoded(frame), computed with the decoder's own arithmetic. So over
// rounds sum(decoded) + residual = sum(delta) up to float64 rounding: nothing
// is lost, only delayed. On error the residual is left untouched.
//
// Error feedback needs a compressor whose error is a fraction of what it is
// given, or the residual grows without bound. top-k is contractive in L2;
// fp32, fp16, q8 and q4 err per element by at most a fixed fraction of the
// bucket's largest magnitude (q8: 1/255, q4: 1/15), which bounds the residual
// too (max|residual| <= max|delta|/14 for q4). QSGD has neither: its variance
// bound min(B/s^2, sqrt(B)/s)·||v||^2 exceeds ||v||^2 whenever s < sqrt(B),
// and on Gaussian buckets of 512 the actual variance does for s=4
// (TestErrorFeedbackBounded: unscaled, the residual of qsgd:4 reached
// 1e6·||delta|| in 150 rounds, qsgd:1 1e10; qsgd:16 stayed bounded). So with a
// residual, qsgd sends each bucket's scale multiplied by
// gamma = ||v||^2/(||v||^2 + V), V the bucket's quantisation variance (known
// before drawing): the MMSE scaling, which makes the expected squared error
// gamma·V < ||v||^2. The frame format is unchanged; the decoded vector is then
// shrunk towards 0 (biased) in each round, and error feedback carries the
// difference to the next one. Without a residual qsgd stays unbiased.
//
// # Hostile input
//
// Decoders check, before allocating anything: the frame length against
// Limits.MaxFrame and the header's lengths; magic, version, flags, codec ids
// and parameters; the CRC32C; dim against Limits.MaxDim; that the raw payload
// length is exactly what dim/nnz and the codec imply (within the varint range
// for top-k); for zstd, that the declared size is achievable from the payload
// (zstd cannot expand by more than 32768x). zstd then streams into a buffer
// of exactly the declared size, its window capped at 1 MiB
// (WithDecoderMaxWindow, WithDecoderMaxMemory), and one more byte of output
// is an error: a decompression bomb stops one block past the declared size,
// and the decoded length must equal it. Indices must be strictly increasing
// and < dim, codes in range, scales and values finite. DecodeAdd validates
// the whole frame before it touches dst, so a bad frame never half-applies.
package quant

package quant

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Errors. Every error this package returns wraps exactly one of these, so a
// caller can count failures by class with errors.Is.
var (
	// ErrSpec: a codec spec string or Limits value is invalid.
	ErrSpec = errors.New("quant: invalid codec spec")
	// ErrInput: Encode's or DecodeAdd's arguments are unusable (NaN/Inf,
	// out of float32 range, length mismatch, missing rng).
	ErrInput = errors.New("quant: invalid input")
	// ErrTruncated: the frame is shorter than its header says.
	ErrTruncated = errors.New("quant: truncated frame")
	// ErrFormat: not a quant frame (magic, flags, reserved bytes, trailing
	// bytes).
	ErrFormat = errors.New("quant: malformed frame")
	// ErrVersion: a frame version this build does not speak.
	ErrVersion = errors.New("quant: unsupported frame version")
	// ErrCodec: an unknown codec id or parameter out of range in a frame.
	ErrCodec = errors.New("quant: unknown codec in frame")
	// ErrChecksum: the CRC32C does not match.
	ErrChecksum = errors.New("quant: frame checksum mismatch")
	// ErrTooLarge: a size beyond Limits (frame, dimension, decompressed
	// payload: a decompression bomb ends here).
	ErrTooLarge = errors.New("quant: frame exceeds limits")
	// ErrDimension: the frame's dimension is not len(dst) in DecodeAdd.
	ErrDimension = errors.New("quant: dimension mismatch")
	// ErrCorrupt: the payload does not decode to what the header declares
	// (bad zstd data, varints, indices, codes, non-finite values).
	ErrCorrupt = errors.New("quant: corrupt payload")
)

// Limits bound what a Codec decodes (and encodes: it never produces a frame
// its peer would refuse). A zero field takes the value from DefaultLimits.
//
// A decode allocates at most: the output vector (8·dim bytes, only in Decode
// and only when dst is too small); the decompressed payload, exactly its
// declared size, which the header checks already tie to dim (4·dim for fp32,
// about 1·dim for q8/qsgd, up to 9·nnz for top-k with fp32 values); for
// top-k, 12·nnz bytes of index and value scratch; and, once per Codec, about
// 1.5 MiB of zstd window and block buffers. Buffers are kept for reuse. Set
// MaxDim to the model's dimension to keep this tight.
type Limits struct {
	MaxDim   int // largest dimension accepted; at most 1<<27
	MaxFrame int // largest frame in bytes; at most 1<<31 - 1
}

// DefaultLimits suit models of up to a few million parameters, and match the
// wire package's defaults (MaxDimension 1<<22, MaxMessageBytes 32 MiB).
var DefaultLimits = Limits{MaxDim: 1 << 22, MaxFrame: 32 << 20}

const (
	maxLimitDim   = 1 << 27
	maxLimitFrame = math.MaxInt32
)

func (l Limits) withDefaults() (Limits, error) {
	if l.MaxDim <= 0 {
		l.MaxDim = DefaultLimits.MaxDim
	}
	if l.MaxFrame <= 0 {
		l.MaxFrame = DefaultLimits.MaxFrame
	}
	if l.MaxDim > maxLimitDim {
		return l, fmt.Errorf("%w: Limits.MaxDim %d above %d", ErrSpec, l.MaxDim, maxLimitDim)
	}
	if l.MaxFrame > maxLimitFrame {
		return l, fmt.Errorf("%w: Limits.MaxFrame %d above %d", ErrSpec, l.MaxFrame, maxLimitFrame)
	}
	if l.MaxFrame < headerLen+crcLen {
		return l, fmt.Errorf("%w: Limits.MaxFrame %d below the %d-byte frame overhead", ErrSpec, l.MaxFrame, headerLen+crcLen)
	}
	return l, nil
}

// Frame ids of the stages.
const (
	sparseNone uint8 = 0
	sparseTopK uint8 = 1

	valFP32 uint8 = 1
	valFP16 uint8 = 2
	valQ8   uint8 = 3
	valQ4   uint8 = 4
	valQSGD uint8 = 5

	scaleMinMax uint8 = 0
	scaleAbsMax uint8 = 1
)

const (
	// DefaultBucket is the bucket size of q8, q4 and qsgd when the spec
	// gives none.
	DefaultBucket = 512
	maxBucket     = 1 << 24
	maxLevels     = 127
)

// valueCoder is the value stage with its parameters, as a frame carries it.
type valueCoder struct {
	kind   uint8 // valFP32 ...
	scale  uint8 // q8/q4: scaleMinMax or scaleAbsMax
	levels int   // qsgd s
	bucket int   // q8/q4/qsgd
}

// topK is the sparsifier's parameter: exactly one of count and frac is set.
type topK struct {
	count int
	frac  float64
}

// k is the number of coordinates kept of n.
func (t topK) k(n int) int {
	if n == 0 {
		return 0
	}
	k := t.count
	if t.frac > 0 {
		k = int(math.Ceil(t.frac * float64(n)))
	}
	return max(1, min(k, n))
}

// Codec is a parsed codec spec together with the zstd encoder and decoder and
// the scratch buffers it reuses. It encodes with its own spec and decodes any
// valid frame. It is not safe for concurrent use. Its scratch grows to the
// largest vector it has handled (about 40 bytes per value after a top-k
// Encode with error feedback) and is kept for reuse.
type Codec struct {
	tf     dctShape // transform stage (zero: none)
	sparse bool
	top    topK
	val    valueCoder
	raw    bool // skip zstd
	ac     bool // the adaptive range coder instead of zstd
	lim    Limits
	bound  bool // the Encode in progress is EncodeBounded

	z   zcodec
	dct *dctTables
	acm acModel
	rce rcEncoder
	rcd rcDecoder

	// Encode scratch.
	sum   []float64 // delta + residual
	abs   []float64 // top-k selection
	idx   []uint32  // top-k indices
	vals  []float64 // top-k gathered values
	recon []float64 // what the receiver will decode (error feedback)
	rawb  []byte    // raw payload
	coef  []float64 // transform coefficients (encode and decode)
	// Decode scratch.
	draw  []byte // decompressed payload
	didx  []uint32
	dvals []float64
}

// Parse reads a codec spec (see the package documentation) and returns a
// Codec with DefaultLimits.
func Parse(spec string) (*Codec, error) {
	return ParseWithLimits(spec, Limits{})
}

// ParseWithLimits is Parse with explicit decode/encode limits (zero fields
// take DefaultLimits).
func ParseWithLimits(spec string, lim Limits) (*Codec, error) {
	c, err := parseSpec(spec)
	if err != nil {
		return nil, err
	}
	if c.lim, err = lim.withDefaults(); err != nil {
		return nil, err
	}
	if err := c.z.init(); err != nil {
		return nil, err
	}
	return c, nil
}

// Limits returns the limits the codec enforces.
func (c *Codec) Limits() Limits { return c.lim }

func specErr(spec, format string, args ...any) error {
	return fmt.Errorf("%w %q: %s", ErrSpec, spec, fmt.Sprintf(format, args...))
}

const specHelp = `want [dct:HxWxC+][topk:K+]VALUE[+zstd|+raw|+ac] with VALUE one of fp32, fp16, q8, q4, qsgd:S (e.g. "topk:0.01+qsgd:16", "dct:28x28x10+topk:0.16+q4+ac")`

// parseSpec parses the grammar without creating the zstd state.
func parseSpec(spec string) (*Codec, error) {
	if len(spec) > 256 {
		return nil, specErr(spec[:32]+"...", "longer than 256 bytes")
	}
	if strings.TrimSpace(spec) == "" {
		return nil, specErr(spec, "empty; %s", specHelp)
	}
	c := &Codec{}
	var haveVal, haveFraming bool
	for i, st := range strings.Split(spec, "+") {
		st = strings.TrimSpace(st)
		name, args, _ := strings.Cut(st, ":")
		if haveFraming {
			return nil, specErr(spec, "stage %q after the framing stage: zstd/raw/ac must come last", st)
		}
		switch name {
		case "dct":
			if i != 0 {
				return nil, specErr(spec, "dct must be the first stage")
			}
			sh, err := parseDCT(args)
			if err != nil {
				return nil, specErr(spec, "%v", err)
			}
			c.tf = sh
		case "topk":
			if i != 0 && !(i == 1 && c.tf.on()) {
				return nil, specErr(spec, "topk must be the first stage, or follow dct")
			}
			t, err := parseTopK(args)
			if err != nil {
				return nil, specErr(spec, "%v", err)
			}
			c.sparse, c.top = true, t
		case "fp32", "fp16", "q8", "q4", "qsgd":
			if haveVal {
				return nil, specErr(spec, "more than one value stage (%q)", st)
			}
			v, err := parseValue(name, args, strings.Contains(st, ":"))
			if err != nil {
				return nil, specErr(spec, "%v", err)
			}
			c.val, haveVal = v, true
		case "zstd", "raw", "ac":
			if args != "" || strings.Contains(st, ":") {
				return nil, specErr(spec, "%s takes no parameters", name)
			}
			if !haveVal && !c.sparse {
				return nil, specErr(spec, "%s needs a value stage before it; %s", name, specHelp)
			}
			c.raw, c.ac, haveFraming = name == "raw", name == "ac", true
		case "":
			return nil, specErr(spec, "empty stage; %s", specHelp)
		default:
			return nil, specErr(spec, "unknown stage %q; %s", st, specHelp)
		}
	}
	if !haveVal {
		if !c.sparse {
			return nil, specErr(spec, "no value stage; %s", specHelp)
		}
		c.val = valueCoder{kind: valFP32}
	}
	return c, nil
}

// parseDCT reads "HxW" or "HxWxC".
func parseDCT(arg string) (dctShape, error) {
	parts := strings.Split(arg, "x")
	if arg == "" || len(parts) < 2 || len(parts) > 3 {
		return dctShape{}, fmt.Errorf("dct needs the image shape: dct:HxW or dct:HxWxC (e.g. dct:28x28x10), got %q", arg)
	}
	var v [3]int
	v[2] = 1
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		limit := maxDCTSide
		if i == 2 {
			limit = maxLimitDim
		}
		if err != nil || n < 1 || n > limit {
			return dctShape{}, fmt.Errorf("dct %s %q must be an integer in 1..%d", [3]string{"height", "width", "channels"}[i], p, limit)
		}
		v[i] = n
	}
	if uint64(v[0])*uint64(v[1])*uint64(v[2]) > maxLimitDim {
		return dctShape{}, fmt.Errorf("dct %s covers more than %d values", arg, maxLimitDim)
	}
	return dctShape{h: v[0], w: v[1], c: v[2]}, nil
}

func (s dctShape) String() string {
	out := "dct:" + strconv.Itoa(s.h) + "x" + strconv.Itoa(s.w)
	if s.c != 1 {
		out += "x" + strconv.Itoa(s.c)
	}
	return out
}

func parseTopK(arg string) (topK, error) {
	if arg == "" {
		return topK{}, errors.New("topk needs k: a count (topk:100) or a fraction (topk:0.01)")
	}
	if strings.ContainsAny(arg, ".eE") {
		f, err := strconv.ParseFloat(arg, 64)
		if err != nil || !(f > 0 && f <= 1) {
			return topK{}, fmt.Errorf("topk fraction %q must be a number in (0, 1]", arg)
		}
		return topK{frac: f}, nil
	}
	n, err := strconv.ParseUint(arg, 10, 31) // fits int on 32-bit ARM too
	if err != nil || n == 0 {
		return topK{}, fmt.Errorf("topk count %q must be an integer in 1..%d (write a fraction with a '.')", arg, math.MaxInt32)
	}
	return topK{count: int(n)}, nil
}

func parseValue(name, args string, hasColon bool) (valueCoder, error) {
	var opts []string
	if hasColon {
		opts = strings.Split(args, ":")
	}
	switch name {
	case "fp32", "fp16":
		if hasColon {
			return valueCoder{}, fmt.Errorf("%s takes no parameters", name)
		}
		if name == "fp32" {
			return valueCoder{kind: valFP32}, nil
		}
		return valueCoder{kind: valFP16}, nil
	case "q8", "q4":
		v := valueCoder{kind: valQ8, bucket: DefaultBucket}
		if name == "q4" {
			v.kind = valQ4
		}
		var seenB, seenMode bool
		for _, o := range opts {
			switch {
			case strings.HasPrefix(o, "b="):
				if seenB {
					return v, fmt.Errorf("%s: bucket given twice", name)
				}
				b, err := parseBucket(o)
				if err != nil {
					return v, fmt.Errorf("%s: %w", name, err)
				}
				v.bucket, seenB = b, true
			case o == "minmax" || o == "absmax":
				if seenMode {
					return v, fmt.Errorf("%s: scale mode given twice", name)
				}
				if o == "absmax" {
					v.scale = scaleAbsMax
				}
				seenMode = true
			default:
				return v, fmt.Errorf("%s: unknown option %q (want b=N, minmax or absmax)", name, o)
			}
		}
		return v, nil
	default: // qsgd
		if len(opts) == 0 || opts[0] == "" {
			return valueCoder{}, errors.New("qsgd needs the number of levels: qsgd:S with S in 1..127")
		}
		s, err := strconv.Atoi(opts[0])
		if err != nil || s < 1 || s > maxLevels {
			return valueCoder{}, fmt.Errorf("qsgd levels %q must be an integer in 1..%d", opts[0], maxLevels)
		}
		v := valueCoder{kind: valQSGD, levels: s, bucket: DefaultBucket}
		for i, o := range opts[1:] {
			if i > 0 || !strings.HasPrefix(o, "b=") {
				return v, fmt.Errorf("qsgd: unknown option %q (want qsgd:S or qsgd:S:b=N)", o)
			}
			if v.bucket, err = parseBucket(o); err != nil {
				return v, wrapErr("qsgd", err)
			}
		}
		return v, nil
	}
}

func parseBucket(o string) (int, error) {
	b, err := strconv.Atoi(strings.TrimPrefix(o, "b="))
	if err != nil || b < 1 || b > maxBucket {
		return 0, fmt.Errorf("bucket %q must be an integer in 1..%d", o, maxBucket)
	}
	return b, nil
}

// Lossless reports whether the codec delivers every float32 value bit for
// bit (fp32, dense): error feedback has nothing to carry for it.
// MinDim is the shortest vector the codec encodes: the size of its dct
// shape, else 0. Check it against the model when a federation is configured.
func (c *Codec) MinDim() int { return c.tf.size() }

// A transform is never lossless: its float64 arithmetic rounds.
func (c *Codec) Lossless() bool { return c.val.kind == valFP32 && !c.sparse && !c.tf.on() }

// String returns the canonical spec: Parse(c.String()) is the same codec.
func (c *Codec) String() string {
	var sb strings.Builder
	if c.tf.on() {
		sb.WriteString(c.tf.String())
		sb.WriteByte('+')
	}
	if c.sparse {
		sb.WriteString("topk:")
		if c.top.frac > 0 {
			f := strconv.FormatFloat(c.top.frac, 'g', -1, 64)
			if !strings.ContainsAny(f, ".eE") {
				f += ".0"
			}
			sb.WriteString(f)
		} else {
			sb.WriteString(strconv.Itoa(c.top.count))
		}
		sb.WriteByte('+')
	}
	sb.WriteString(c.val.String())
	if c.raw {
		sb.WriteString("+raw")
	}
	if c.ac {
		sb.WriteString("+ac")
	}
	return sb.String()
}

func (v valueCoder) String() string {
	var s string
	switch v.kind {
	case valFP32:
		return "fp32"
	case valFP16:
		return "fp16"
	case valQ8, valQ4:
		s = "q8"
		if v.kind == valQ4 {
			s = "q4"
		}
		if v.bucket != DefaultBucket {
			s += ":b=" + strconv.Itoa(v.bucket)
		}
		if v.scale == scaleAbsMax {
			s += ":absmax"
		}
		return s
	case valQSGD:
		s = "qsgd:" + strconv.Itoa(v.levels)
		if v.bucket != DefaultBucket {
			s += ":b=" + strconv.Itoa(v.bucket)
		}
		return s
	}
	return fmt.Sprintf("value(%d)", v.kind)
}

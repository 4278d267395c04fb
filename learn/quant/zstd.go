package quant

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"
)

const (
	// zWindow is the encoder's window and the largest window the decoder
	// accepts. Our payloads are vectors of small codes: matches are local, so
	// a 1 MiB window loses nothing and bounds what a hostile frame may ask.
	zWindow = 1 << 20
	// zMaxRatio: a zstd block holds at most 128 KiB and costs at least 4
	// bytes (3-byte header + 1 RLE byte), so no payload of P bytes decodes
	// to more than 32768·P bytes.
	zMaxRatio = 32768
)

// zcodec owns one zstd encoder and one decoder, reused across calls,
// concurrency 1: EncodeAll, and the decoder in synchronous streaming mode,
// start no goroutines.
type zcodec struct {
	enc *zstd.Encoder
	dec *zstd.Decoder
	rd  bytes.Reader
}

func (z *zcodec) init() error {
	var err error
	z.enc, err = zstd.NewWriter(nil,
		zstd.WithEncoderConcurrency(1),
		zstd.WithEncoderLevel(zstd.SpeedDefault),
		// Quantised codes are literal-only blocks with a skewed byte
		// distribution: without this, fast/default levels store them raw.
		zstd.WithAllLitEntropyCompression(true),
		zstd.WithWindowSize(zWindow),
		zstd.WithEncoderCRC(false), // the frame's CRC32C covers the payload
	)
	if err != nil {
		return wrapErr("quant: zstd encoder", err)
	}
	// The decoder streams into a buffer of exactly the declared size (see
	// decompress): in streaming mode MaxMemory and MaxWindow both cap the
	// window, so its memory is one window plus a block, whatever the frame
	// claims. (DecodeAll with a capacity cap would save a copy, but zstd's
	// generic sequence decoder, used on armv7 and 386, appends past the cap
	// before it checks: a bomb then costs over twice the declared size.)
	z.dec, err = zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxMemory(zWindow),
		zstd.WithDecoderMaxWindow(zWindow),
		zstd.WithDecodeBuffersBelow(0), // never switch to a whole-buffer decode
	)
	if err != nil {
		return wrapErr("quant: zstd decoder", err)
	}
	return nil
}

// compress appends the zstd frame of src to dst.
func (z *zcodec) compress(dst, src []byte) []byte {
	return z.enc.EncodeAll(src, dst)
}

// decompress decodes src, which must decode to exactly want bytes, into
// buf's storage (grown to want if needed) and returns the decoded bytes and
// the buffer to keep for reuse. It decodes at most one zstd block past want
// (into the decoder's window, not into buf): a bomb stops there.
func (z *zcodec) decompress(buf []byte, src []byte, want int) (out, keep []byte, err error) {
	if cap(buf) < want {
		buf = make([]byte, want)
	}
	out = buf[:want]
	z.rd.Reset(src)
	defer func() { _ = z.dec.Reset(nil) }() // let go of src (a nil reader cannot fail)
	if err := z.dec.Reset(&z.rd); err != nil {
		return nil, buf, fmt.Errorf("%w: zstd: %w", ErrCorrupt, err)
	}
	n, err := io.ReadFull(z.dec, out)
	switch {
	case err == nil:
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return nil, buf, fmt.Errorf("%w: zstd payload decodes to %d bytes, header declares %d", ErrCorrupt, n, want)
	case errors.Is(err, zstd.ErrWindowSizeExceeded) || errors.Is(err, zstd.ErrDecoderSizeExceeded):
		return nil, buf, fmt.Errorf("%w: zstd window above %d bytes: %w", ErrTooLarge, zWindow, err)
	default:
		return nil, buf, fmt.Errorf("%w: zstd: %w", ErrCorrupt, err)
	}
	var one [1]byte
	if m, err := z.dec.Read(one[:]); m > 0 {
		return nil, buf, fmt.Errorf("%w: zstd payload decodes to more than the declared %d bytes", ErrTooLarge, want)
	} else if err != io.EOF {
		return nil, buf, fmt.Errorf("%w: zstd data after the declared %d bytes: %w", ErrCorrupt, want, err)
	}
	return out, buf, nil
}

package quant

import (
	"fmt"
	"strings"

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
	// zSlack is spare capacity past the declared size that lets zstd use its
	// fast copy loops; anything decoded into it is rejected.
	zSlack = 16
)

// zcodec owns one zstd encoder and one decoder, reused across calls,
// concurrency 1 (no goroutines: only EncodeAll/DecodeAll are used).
type zcodec struct {
	enc *zstd.Encoder
	dec *zstd.Decoder
}

func (z *zcodec) init(lim Limits) error {
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
		return fmt.Errorf("quant: zstd encoder: %w", err)
	}
	// The per-call cap (WithDecodeAllCapLimit + the buffer's capacity) is the
	// binding limit; MaxMemory is the backstop for the largest payload
	// Limits allow.
	maxMem := max(uint64(maxRawPerElem)*uint64(lim.MaxDim)+zSlack, zWindow)
	z.dec, err = zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxMemory(maxMem),
		zstd.WithDecoderMaxWindow(zWindow),
		zstd.WithDecodeAllCapLimit(true),
	)
	if err != nil {
		return fmt.Errorf("quant: zstd decoder: %w", err)
	}
	return nil
}

// compress appends the zstd frame of src to dst.
func (z *zcodec) compress(dst, src []byte) []byte {
	return z.enc.EncodeAll(src, dst)
}

// decompress decodes src, which must decode to exactly want bytes, into
// buf's storage (grown if needed) and returns the decoded bytes and the
// buffer to keep for reuse. It never decodes more than want+zSlack bytes.
func (z *zcodec) decompress(buf []byte, src []byte, want int) (out, keep []byte, err error) {
	if cap(buf) < want+zSlack {
		buf = make([]byte, 0, want+zSlack)
	}
	out, err = z.dec.DecodeAll(src, buf[:0:want+zSlack])
	if err != nil {
		// At the cap, zstd may instead fail with an unexported block-size
		// error: after the declared size was produced, that is the same
		// bomb. (Were the message to change, the bomb still fails, as
		// ErrCorrupt; the test would notice.)
		if err == zstd.ErrDecoderSizeExceeded || err == zstd.ErrFrameSizeExceeded ||
			(len(out) >= want && strings.Contains(err.Error(), "bigger than max block size")) {
			return nil, buf, fmt.Errorf("%w: zstd payload decodes to more than the declared %d bytes: %w", ErrTooLarge, want, err)
		}
		if err == zstd.ErrWindowSizeExceeded {
			return nil, buf, fmt.Errorf("%w: zstd window above %d bytes: %w", ErrTooLarge, zWindow, err)
		}
		return nil, buf, fmt.Errorf("%w: zstd: %w", ErrCorrupt, err)
	}
	if len(out) > want {
		return nil, buf, fmt.Errorf("%w: zstd payload decodes to %d bytes, header declares %d", ErrTooLarge, len(out), want)
	}
	if len(out) != want {
		return nil, buf, fmt.Errorf("%w: zstd payload decodes to %d bytes, header declares %d", ErrCorrupt, len(out), want)
	}
	return out, buf, nil
}

package dataset

import (
	"bufio"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/edgefl/edgefl/learn/model"
)

// MaxIDXElements bounds the number of data bytes (elements) of one IDX
// file: 256 Mi, which become 2 GiB as float64. Fashion-MNIST's training
// images have 47 M.
const MaxIDXElements = 1 << 28

// maxIDXDims bounds the number of dimensions of an IDX array.
const maxIDXDims = 8

// idxUbyte is the only IDX data type supported: unsigned byte.
const idxUbyte = 0x08

// IDXArray is the content of an IDX file of unsigned bytes: Dims from the
// header, Data the row-major elements.
type IDXArray struct {
	Dims []int
	Data []byte
}

// ReadIDX decodes an uncompressed IDX stream of unsigned bytes. size is the
// stream's total length in bytes when known (a plain file), -1 otherwise:
// when known, the header's dimensions must account for exactly that many
// bytes, which is checked before the data are allocated; when unknown, the
// data are read incrementally, so a header that promises more than the
// stream holds costs only what the stream holds. Either way an array of more
// than MaxIDXElements elements is refused from its header. Trailing bytes
// after the data are an error.
func ReadIDX(r io.Reader, size int64) (*IDXArray, error) {
	var magic [4]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return nil, fmt.Errorf("reading the 4-byte IDX magic: %w", noEOF(err))
	}
	if magic[0] != 0 || magic[1] != 0 {
		return nil, fmt.Errorf("bad IDX magic % x: expected 00 00 TYPE NDIM", magic[:])
	}
	if magic[2] != idxUbyte {
		return nil, fmt.Errorf("IDX data type 0x%02x (%s) is not supported: expected 0x08 (unsigned byte)", magic[2], idxTypeName(magic[2]))
	}
	ndim := int(magic[3])
	if ndim < 1 || ndim > maxIDXDims {
		return nil, fmt.Errorf("IDX header has %d dimensions: expected 1..%d", ndim, maxIDXDims)
	}
	hdr := make([]byte, 4*ndim)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, fmt.Errorf("reading the %d IDX dimensions: %w", ndim, noEOF(err))
	}
	dims := make([]int, ndim)
	total := int64(1)
	for i := range dims {
		d := int64(binary.BigEndian.Uint32(hdr[4*i:]))
		dims[i] = int(d)
		if d > MaxIDXElements || total*d > MaxIDXElements {
			return nil, fmt.Errorf("IDX header claims dimensions %v: more than the limit of %d elements", headerDims(hdr), MaxIDXElements)
		}
		total *= d
	}
	headerLen := int64(4 + 4*ndim)
	if size >= 0 {
		if size-headerLen != total {
			return nil, fmt.Errorf("IDX header claims dimensions %v = %d data bytes, but the file holds %d", dims, total, size-headerLen)
		}
		data := make([]byte, total)
		if _, err := io.ReadFull(r, data); err != nil {
			return nil, fmt.Errorf("reading %d IDX data bytes: %w", total, noEOF(err))
		}
		return &IDXArray{Dims: dims, Data: data}, nil
	}
	data, err := io.ReadAll(io.LimitReader(r, total+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("reading %d IDX data bytes: %w", total, err)
	case int64(len(data)) < total:
		return nil, fmt.Errorf("IDX header claims dimensions %v = %d data bytes, but the data end after %d", dims, total, len(data))
	case int64(len(data)) > total:
		return nil, fmt.Errorf("IDX header claims dimensions %v = %d data bytes, but more data follow", dims, total)
	}
	return &IDXArray{Dims: dims, Data: data}, nil
}

func headerDims(hdr []byte) []uint32 {
	out := make([]uint32, len(hdr)/4)
	for i := range out {
		out[i] = binary.BigEndian.Uint32(hdr[4*i:])
	}
	return out
}

func idxTypeName(t byte) string {
	switch t {
	case 0x08:
		return "unsigned byte"
	case 0x09:
		return "signed byte"
	case 0x0B:
		return "int16"
	case 0x0C:
		return "int32"
	case 0x0D:
		return "float32"
	case 0x0E:
		return "float64"
	}
	return "unknown"
}

// noEOF turns a bare EOF (nothing read) into ErrUnexpectedEOF: in the middle
// of a header or of the data both mean the file is truncated.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// ReadIDXFile reads an IDX file, gzip-compressed or not (recognised by the
// gzip magic, whatever the name).
func ReadIDXFile(path string) (*IDXArray, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, wrapErr("idx", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, wrapErr("idx", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("idx %s: not a regular file", path)
	}
	a, err := decodeIDX(f, st.Size())
	if err != nil {
		return nil, fmt.Errorf("idx %s: %w", path, err)
	}
	return a, nil
}

// decodeIDX reads an IDX stream of size bytes (-1 if unknown) that may be
// gzip-compressed (recognised by the gzip magic).
func decodeIDX(r io.Reader, size int64) (*IDXArray, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	head, _ := br.Peek(2)
	if len(head) == 2 && head[0] == 0x1f && head[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, wrapErr("gzip", err)
		}
		a, err := ReadIDX(zr, -1)
		if err != nil {
			return nil, wrapErr("gzip", err)
		}
		return a, nil
	}
	return ReadIDX(br, size)
}

// findIDX returns the path of the file of dir called prefix + one of the
// usual suffixes for an IDX file of the given rank (MNIST's
// "-idx3-ubyte", the ".idx3-ubyte" some mirrors use, each optionally
// ".gz"). A plain file is preferred over a compressed one.
func findIDX(dir, prefix string, rank int) (string, error) {
	var tried []string
	for _, sep := range []string{"-", "."} {
		for _, ext := range []string{"", ".gz"} {
			name := fmt.Sprintf("%s%sidx%d-ubyte%s", prefix, sep, rank, ext)
			p := filepath.Join(dir, name)
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
				return p, nil
			} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return "", fmt.Errorf("idx %s: %w", dir, err)
			}
			tried = append(tried, name)
		}
	}
	return "", fmt.Errorf("idx %s: no %s file (looked for %s, %s)", dir, tried[0], tried[0], tried[1])
}

// LoadIDX loads an MNIST-style directory holding train-images-idx3-ubyte,
// train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte
// (each optionally gzip-compressed, ".gz"). The training and test files are
// pooled into one Dataset, training samples first: the federation
// partitions the pool and every client keeps its own test split. Pixels are
// scaled to [0, 1]; the labels are the classes (Classes = largest label +
// 1). The Dataset is named after the directory.
func LoadIDX(dir string) (*Dataset, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, wrapErr("idx", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("idx %s: not a directory (hint: one holding train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, .gz or not)", dir)
	}
	var images, labels [2]*IDXArray
	var paths [2][2]string
	for s, split := range []string{"train", "t10k"} {
		for k, what := range []struct {
			name string
			rank int
		}{{"images", 3}, {"labels", 1}} {
			p, err := findIDX(dir, split+"-"+what.name, what.rank)
			if err != nil {
				return nil, err
			}
			paths[s][k] = p
			a, err := ReadIDXFile(p)
			if err != nil {
				return nil, err
			}
			if k == 0 {
				images[s] = a
			} else {
				labels[s] = a
			}
		}
	}
	d := 0
	n := 0
	for s := range images {
		img, lab := images[s], labels[s]
		if len(img.Dims) < 2 {
			return nil, fmt.Errorf("idx %s: dimensions %v, expected samples × features (2 or more dimensions)", paths[s][0], img.Dims)
		}
		if len(lab.Dims) != 1 {
			return nil, fmt.Errorf("idx %s: dimensions %v, expected one label per sample (1 dimension)", paths[s][1], lab.Dims)
		}
		if img.Dims[0] != lab.Dims[0] {
			return nil, fmt.Errorf("idx %s: %d labels for the %d images of %s", paths[s][1], lab.Dims[0], img.Dims[0], paths[s][0])
		}
		if img.Dims[0] == 0 {
			return nil, fmt.Errorf("idx %s: no samples", paths[s][0])
		}
		sd := len(img.Data) / img.Dims[0]
		if sd == 0 {
			return nil, fmt.Errorf("idx %s: dimensions %v give samples with no features", paths[s][0], img.Dims)
		}
		if s == 0 {
			d = sd
		} else if !slices.Equal(img.Dims[1:], images[0].Dims[1:]) {
			return nil, fmt.Errorf("idx %s: samples of dimensions %v, but %s has %v", paths[s][0], img.Dims[1:], paths[0][0], images[0].Dims[1:])
		}
		n += img.Dims[0]
	}
	var scale [256]float64
	for i := range scale {
		scale[i] = float64(i) / 255
	}
	data := model.Data{N: n, D: d, X: make([]float64, 0, n*d), Y: make([]float64, 0, n)}
	maxLabel := 0
	for s := range images {
		for _, b := range images[s].Data {
			data.X = append(data.X, scale[b])
		}
		for _, b := range labels[s].Data {
			data.Y = append(data.Y, float64(b))
			maxLabel = max(maxLabel, int(b))
		}
		images[s] = nil // let the bytes go before the next conversion
	}
	return &Dataset{Name: filepath.Base(filepath.Clean(dir)), Data: data, Classes: maxLabel + 1}, nil
}

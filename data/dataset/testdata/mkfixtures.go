//go:build ignore

// mkfixtures writes the binary test fixtures of package dataset: a tiny
// MNIST-style IDX directory (some files plain, some gzip) and the seed
// corpora of FuzzIDX and FuzzCSV. Run from the repository root:
//
//	go run ./dataset/testdata/mkfixtures.go
package main

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
)

const root = "data/dataset/testdata"

// idx encodes an unsigned-byte IDX array.
func idx(dims []uint32, data []byte) []byte {
	var b bytes.Buffer
	b.Write([]byte{0, 0, 0x08, byte(len(dims))})
	for _, d := range dims {
		binary.Write(&b, binary.BigEndian, d)
	}
	b.Write(data)
	return b.Bytes()
}

func gz(p []byte) []byte {
	var b bytes.Buffer
	w, _ := gzip.NewWriterLevel(&b, gzip.BestCompression)
	w.Write(p)
	w.Close()
	return b.Bytes()
}

func write(path string, p []byte) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		panic(err)
	}
	if err := os.WriteFile(path, p, 0o644); err != nil {
		panic(err)
	}
}

// corpus writes one seed of a []byte fuzz target.
func corpus(target, name string, p []byte) {
	write(filepath.Join(root, "fuzz", target, name), []byte(fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", p)))
}

func main() {
	// 6 training images of 2×3 pixels, labels 0 1 2 0 1 2; 3 test images,
	// labels 2 1 0. Pixel (i, j) of image n is 40n + 10i + j (train) and
	// 250 - (10n + i + j) (test), so the tests can check the order.
	var trainImg, testImg []byte
	for n := 0; n < 6; n++ {
		for i := 0; i < 2; i++ {
			for j := 0; j < 3; j++ {
				trainImg = append(trainImg, byte(40*n+10*i+j))
			}
		}
	}
	for n := 0; n < 3; n++ {
		for i := 0; i < 2; i++ {
			for j := 0; j < 3; j++ {
				testImg = append(testImg, byte(250-(10*n+i+j)))
			}
		}
	}
	dir := filepath.Join(root, "idx")
	write(filepath.Join(dir, "train-images-idx3-ubyte"), idx([]uint32{6, 2, 3}, trainImg))
	write(filepath.Join(dir, "train-labels-idx1-ubyte.gz"), gz(idx([]uint32{6}, []byte{0, 1, 2, 0, 1, 2})))
	write(filepath.Join(dir, "t10k-images-idx3-ubyte.gz"), gz(idx([]uint32{3, 2, 3}, testImg)))
	write(filepath.Join(dir, "t10k-labels-idx1-ubyte"), idx([]uint32{3}, []byte{2, 1, 0}))

	corpus("FuzzIDX", "images", idx([]uint32{2, 2, 2}, []byte{0, 1, 2, 3, 255, 254, 253, 252}))
	corpus("FuzzIDX", "labels", idx([]uint32{4}, []byte{0, 1, 9, 3}))
	corpus("FuzzIDX", "gzip", gz(idx([]uint32{3}, []byte{7, 8, 9})))
	corpus("FuzzIDX", "truncated", idx([]uint32{5, 2}, []byte{1, 2, 3}))
	corpus("FuzzIDX", "trailing", idx([]uint32{1}, []byte{1, 2}))
	corpus("FuzzIDX", "huge-header", idx([]uint32{60000, 28, 28, 1 << 20}, nil))
	corpus("FuzzIDX", "float-type", []byte{0, 0, 0x0D, 1, 0, 0, 0, 1, 0, 0, 0, 0})
	corpus("FuzzIDX", "zero-dims", []byte{0, 0, 8, 0})
	corpus("FuzzIDX", "gzip-bomb-header", gz(append(idx([]uint32{1 << 27}, nil), make([]byte, 4096)...)))

	corpus("FuzzCSV", "good", []byte("a,b,y\n1,2,0\n3.5,-4e2,1\n"))
	corpus("FuzzCSV", "ragged", []byte("a,b,y\n1,2,0\n3,1\n"))
	corpus("FuzzCSV", "nan", []byte("a,b,y\n1,NaN,0\n"))
	corpus("FuzzCSV", "quoted", []byte("\"a\",\"b, c\",y\n\"1\",\" 2 \",3\n"))
	corpus("FuzzCSV", "bom", []byte("\ufeffy,x\n1,2\n0,0x1p-2\n"))
	corpus("FuzzCSV", "bigLabel", []byte("x,y\n1,1e300\n"))
	corpus("FuzzCSV", "badquote", []byte("x,y\n\"1,2\n"))
}

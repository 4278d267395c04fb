package dataset

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// FashionMNISTDir is where Debian's dataset-fashion-mnist package installs
// the data (CI installs it too).
const FashionMNISTDir = "/usr/share/datasets/fashion-mnist"

// idxBytes encodes an unsigned-byte IDX array.
func idxBytes(dims []uint32, data []byte) []byte {
	var b bytes.Buffer
	b.Write([]byte{0, 0, 0x08, byte(len(dims))})
	for _, d := range dims {
		b.Write(binary.BigEndian.AppendUint32(nil, d))
	}
	b.Write(data)
	return b.Bytes()
}

func gzipBytes(t testing.TB, p []byte) []byte {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	if _, err := w.Write(p); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestLoadIDXFixture(t *testing.T) {
	// testdata/idx: train images plain, train labels gzip, t10k images
	// gzip, t10k labels plain (see testdata/mkfixtures.go).
	ds, err := LoadIDX("testdata/idx")
	if err != nil {
		t.Fatal(err)
	}
	if ds.Name != "idx" || ds.Data.N != 9 || ds.Data.D != 6 || ds.Classes != 3 {
		t.Fatalf("got %s %d×%d, %d classes; want idx 9×6, 3 classes", ds.Name, ds.Data.N, ds.Data.D, ds.Classes)
	}
	wantY := []float64{0, 1, 2, 0, 1, 2, 2, 1, 0}
	for i, y := range ds.Data.Y {
		if y != wantY[i] {
			t.Fatalf("labels %v, want %v", ds.Data.Y, wantY)
		}
	}
	for n := range 9 {
		for p := range 6 {
			i, j := p/3, p%3
			want := float64(40*n+10*i+j) / 255
			if n >= 6 {
				want = float64(250-(10*(n-6)+i+j)) / 255
			}
			if got := ds.Data.X[n*6+p]; got != want {
				t.Fatalf("sample %d pixel %d = %v, want %v", n, p, got, want)
			}
		}
	}
	if err := ds.Data.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestFashionMNIST loads the real data set. It fails (does not skip) when
// the data are missing: install Debian's dataset-fashion-mnist.
func TestFashionMNIST(t *testing.T) {
	start := time.Now()
	ds, err := LoadIDX(FashionMNISTDir)
	if err != nil {
		t.Fatalf("%v (install Debian's dataset-fashion-mnist package)", err)
	}
	t.Logf("loaded %s (%d×%d) in %v", FashionMNISTDir, ds.Data.N, ds.Data.D, time.Since(start))
	if ds.Data.N != 70000 || ds.Data.D != 784 || ds.Classes != 10 {
		t.Fatalf("got %d samples × %d features, %d classes; want 60,000 + 10,000 samples, 784 features, 10 classes", ds.Data.N, ds.Data.D, ds.Classes)
	}
	// Fashion-MNIST is balanced: 6,000 training and 1,000 test images per
	// class.
	var train, test [10]int
	for i, y := range ds.Data.Y {
		if i < 60000 {
			train[int(y)]++
		} else {
			test[int(y)]++
		}
	}
	for c := range 10 {
		if train[c] != 6000 || test[c] != 1000 {
			t.Errorf("class %d: %d train and %d test images, want 6000 and 1000", c, train[c], test[c])
		}
	}
	lo, hi := 1.0, 0.0
	for _, v := range ds.Data.X {
		lo, hi = min(lo, v), max(hi, v)
	}
	if lo != 0 || hi != 1 {
		t.Errorf("pixels in [%v, %v], want [0, 1]", lo, hi)
	}
}

func TestReadIDXErrors(t *testing.T) {
	valid := idxBytes([]uint32{2, 3}, []byte{1, 2, 3, 4, 5, 6})
	for _, tc := range []struct {
		name  string
		input []byte
		sized bool // pass the size (a plain file) or -1 (a stream)
		want  string
	}{
		{"empty", nil, true, "magic"},
		{"short magic", []byte{0, 0}, false, "magic"},
		{"bad magic", []byte{1, 2, 8, 1, 0, 0, 0, 0}, true, "bad IDX magic"},
		{"float type", []byte{0, 0, 0x0D, 1, 0, 0, 0, 1, 0, 0, 0, 0}, true, "0x0d (float32) is not supported"},
		{"zero dims", []byte{0, 0, 8, 0}, true, "0 dimensions"},
		{"many dims", []byte{0, 0, 8, 200}, true, "200 dimensions"},
		{"short dims", []byte{0, 0, 8, 3, 0, 0, 0, 1}, false, "unexpected EOF"},
		{"huge header sized", idxBytes([]uint32{60000, 28, 28, 1000}, nil), true, "more than the limit"},
		{"huge header stream", idxBytes([]uint32{1 << 31, 1 << 31}, nil), false, "more than the limit"},
		{"size mismatch", valid[:len(valid)-1], true, "but the file holds 5"},
		{"truncated stream", valid[:len(valid)-2], false, "the data end after 4"},
		{"trailing stream", append(valid[:len(valid):len(valid)], 9), false, "more data follow"},
		{"trailing sized", append(valid[:len(valid):len(valid)], 9), true, "but the file holds 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			size := int64(-1)
			if tc.sized {
				size = int64(len(tc.input))
			}
			a, err := ReadIDX(bytes.NewReader(tc.input), size)
			if err == nil {
				t.Fatalf("got dims %v, want an error containing %q", a.Dims, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
			checkOneLine(t, err)
		})
	}
	for _, size := range []int64{-1, int64(len(valid))} {
		a, err := ReadIDX(bytes.NewReader(valid), size)
		if err != nil || len(a.Dims) != 2 || a.Dims[0] != 2 || a.Dims[1] != 3 || !bytes.Equal(a.Data, valid[12:]) {
			t.Errorf("size %d: got %v, %v", size, a, err)
		}
	}
}

func TestLoadIDXErrors(t *testing.T) {
	images := idxBytes([]uint32{2, 1, 2}, []byte{1, 2, 3, 4})
	labels := idxBytes([]uint32{2}, []byte{0, 1})
	write := func(t *testing.T, files map[string][]byte) string {
		dir := t.TempDir()
		for name, p := range files {
			if err := os.WriteFile(filepath.Join(dir, name), p, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	good := func() map[string][]byte {
		return map[string][]byte{
			"train-images-idx3-ubyte": images, "train-labels-idx1-ubyte": labels,
			"t10k-images-idx3-ubyte": images, "t10k-labels-idx1-ubyte": labels,
		}
	}
	for _, tc := range []struct {
		name   string
		change func(map[string][]byte)
		want   string
	}{
		{"ok", func(map[string][]byte) {}, ""},
		{"dotted gzip names", func(m map[string][]byte) {
			m["train-images.idx3-ubyte.gz"] = gzipBytes(t, m["train-images-idx3-ubyte"])
			delete(m, "train-images-idx3-ubyte")
		}, ""},
		{"missing test labels", func(m map[string][]byte) { delete(m, "t10k-labels-idx1-ubyte") }, "no t10k-labels-idx1-ubyte file"},
		{"label count", func(m map[string][]byte) { m["train-labels-idx1-ubyte"] = idxBytes([]uint32{3}, []byte{0, 1, 1}) }, "3 labels for the 2 images"},
		{"labels 2-d", func(m map[string][]byte) { m["t10k-labels-idx1-ubyte"] = idxBytes([]uint32{2, 1}, []byte{0, 1}) }, "expected one label per sample"},
		{"images 1-d", func(m map[string][]byte) { m["t10k-images-idx3-ubyte"] = idxBytes([]uint32{2}, []byte{0, 1}) }, "expected samples × features"},
		{"dimension mismatch", func(m map[string][]byte) {
			m["t10k-images-idx3-ubyte"] = idxBytes([]uint32{2, 2, 1}, []byte{1, 2, 3, 4})
		}, "but"},
		{"no samples", func(m map[string][]byte) {
			m["t10k-images-idx3-ubyte"] = idxBytes([]uint32{0, 1, 2}, nil)
			m["t10k-labels-idx1-ubyte"] = idxBytes([]uint32{0}, nil)
		}, "no samples"},
		{"corrupt gzip", func(m map[string][]byte) {
			z := gzipBytes(t, labels)
			z[len(z)-6] ^= 0xff // the CRC
			m["train-labels-idx1-ubyte.gz"] = z
			delete(m, "train-labels-idx1-ubyte")
		}, "checksum"},
		{"truncated gzip", func(m map[string][]byte) {
			z := gzipBytes(t, images)
			m["t10k-images-idx3-ubyte.gz"] = z[:len(z)/2]
			delete(m, "t10k-images-idx3-ubyte")
		}, "t10k-images-idx3-ubyte.gz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files := good()
			tc.change(files)
			ds, err := LoadIDX(write(t, files))
			if tc.want == "" {
				if err != nil || ds.Data.N != 4 || ds.Data.D != 2 || ds.Classes != 2 {
					t.Fatalf("got %v, %v; want 4×2 with 2 classes", ds, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want one containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
			checkOneLine(t, err)
		})
	}
	if _, err := LoadIDX("testdata/no-such-dir"); err == nil || !strings.Contains(err.Error(), "no-such-dir") {
		t.Errorf("missing directory: %v", err)
	}
	if _, err := LoadIDX("testdata/idx/t10k-labels-idx1-ubyte"); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("file instead of directory: %v", err)
	}
}

// FuzzIDX feeds arbitrary bytes, as a plain file of known size and as a
// stream (gzip or not), to the IDX decoder: it must never panic, and what
// it accepts must be consistent with its header.
func FuzzIDX(f *testing.F) {
	for _, name := range []string{"testdata/idx/train-images-idx3-ubyte", "testdata/idx/t10k-images-idx3-ubyte.gz"} {
		p, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		for _, size := range []int64{int64(len(p)), -1} {
			a, err := decodeIDX(bytes.NewReader(p), size)
			if err != nil {
				if strings.ContainsAny(err.Error(), "\n") {
					t.Fatalf("multi-line error %q", err)
				}
				continue
			}
			n := 1
			for _, d := range a.Dims {
				n *= d
			}
			if len(a.Dims) == 0 || n != len(a.Data) || n > MaxIDXElements {
				t.Fatalf("dims %v but %d data bytes", a.Dims, len(a.Data))
			}
		}
	})
}

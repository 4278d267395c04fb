package aggstore

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgefl/edgefl/node/storage"
)

// BenchmarkPutUpdate measures one stored update (one write transaction,
// fsync included) on files of growing size: rounds of 10 updates with a
// 1 KB message and a 100-value z each, a checkpoint per round. It reports
// the file's size after the fill and the CPU time per update (cpu-ns/op:
// steadier than the wall time on a loaded machine), so the cost of the
// sealed entry counts (node/storage/census.go) can be read against the file it grows
// with.
func BenchmarkPutUpdate(b *testing.B) {
	for _, rounds := range []uint64{10, 100, 1000} {
		b.Run(fmt.Sprintf("rounds=%d", rounds), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "agg.db")
			a, err := OpenAgg(path, storage.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			at := time.Unix(1700000000, 0)
			z := make([]float64, 100)
			msg := make([]byte, 1024)
			for r := uint64(1); r <= rounds; r++ {
				if err := a.OpenRound(Round{Number: r, OpenedAt: at, Config: []byte(`{}`)}, z); err != nil {
					b.Fatal(err)
				}
				for c := range 10 {
					if _, err := a.PutUpdate(Update{Round: r, ClientID: fmt.Sprintf("site-%d", c), StoredAt: at, Msg: msg}, z); err != nil {
						b.Fatal(err)
					}
				}
			}
			if st, err := os.Stat(path); err == nil {
				b.ReportMetric(float64(st.Size()), "file-bytes")
			}
			i := 0
			cpu := cpuNow()
			defer func() { reportCPU(b, cpu) }()
			for b.Loop() {
				i++
				if _, err := a.PutUpdate(Update{Round: rounds, ClientID: fmt.Sprintf("bench-%d", i), StoredAt: at, Msg: msg}, z); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPutUpdatesGroup is group commit at the store: one op is one
// update made durable, in groups of 1 (PutUpdate: a transaction and its
// fsync per update, what the aggregator did before group commit) to 64
// (PutUpdates), with the 1 KB message of BenchmarkPutUpdate. updates/s is
// the durable rate; the group=1 and larger groups of one run compare on
// the same disk.
func BenchmarkPutUpdatesGroup(b *testing.B) {
	for _, group := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("group=%d", group), func(b *testing.B) {
			a, err := OpenAgg(filepath.Join(b.TempDir(), "agg.db"), storage.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			at := time.Unix(1700000000, 0)
			if err := a.OpenRound(Round{Number: 1, OpenedAt: at, Config: []byte(`{}`)}, make([]float64, 100)); err != nil {
				b.Fatal(err)
			}
			msg := make([]byte, 1024)
			cpu := cpuNow()
			start := time.Now()
			n := 0
			for n < b.N {
				g := make([]Update, 0, group)
				for len(g) < group && n+len(g) < b.N {
					g = append(g, Update{Round: 1, ClientID: fmt.Sprintf("site-%d", n+len(g)), StoredAt: at, Msg: msg})
				}
				if group == 1 {
					if _, err := a.PutUpdate(g[0], nil); err != nil {
						b.Fatal(err)
					}
				} else {
					next, err := a.NextLogIndex()
					if err != nil {
						b.Fatal(err)
					}
					if err := a.PutUpdates(next, g); err != nil {
						b.Fatal(err)
					}
				}
				n += len(g)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "updates/s")
			reportCPU(b, cpu)
		})
	}
}

package aggstore

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edgefl/edgefl/node/storage"
)

// BenchmarkOpenAgg measures what the checks on open cost on a realistic
// round log: 50 rounds of 10 FedSplit updates on the Fashion-MNIST logistic
// regression (7,850 parameters: a 31 KB fp32 message and a z per update, a
// checkpoint per round), about 60 MB. Compare "bbolt only" (bbolt.Open,
// what opening cost before the checks) with "verified" (the page walk,
// bbolt's check and every value's checksum).
func BenchmarkOpenAgg(b *testing.B) {
	dir := b.TempDir()
	path := filepath.Join(dir, "agg.db")
	const rounds, clients, dim = 50, 10, 7850
	a, err := OpenAgg(path, storage.Options{})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	vec := make([]float64, dim)
	msg := make([]byte, 4*dim)
	at := time.Unix(1700000000, 0)
	for r := uint64(1); r <= rounds; r++ {
		for i := range vec {
			vec[i] = rng.NormFloat64()
		}
		if err := a.OpenRound(Round{Number: r, OpenedAt: at, Config: []byte(`{}`), State: make([]byte, 2000)}, vec); err != nil {
			b.Fatal(err)
		}
		for c := range clients {
			if _, err := a.PutUpdate(Update{Round: r, ClientID: fmt.Sprintf("site-%d", c), StoredAt: at, Msg: msg}, vec); err != nil {
				b.Fatal(err)
			}
		}
	}
	a.Close()
	st, _ := os.Stat(path)
	b.Logf("file: %d bytes", st.Size())
	b.Run("bbolt only", func(b *testing.B) {
		defer reportCPU(b, cpuNow())
		for b.Loop() {
			db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
			if err != nil {
				b.Fatal(err)
			}
			db.Close()
		}
	})
	b.Run("verified", func(b *testing.B) {
		defer reportCPU(b, cpuNow())
		for b.Loop() {
			s, err := OpenAgg(path, storage.Options{})
			if err != nil {
				b.Fatal(err)
			}
			s.Close()
		}
	})
}

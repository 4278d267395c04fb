package sim

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/edgefl/edgefl/learn/model"
)

// optimumCachePath names the cache file for the optimum of this run's
// objective: it depends on the data, the partition, the model and the
// tolerance, not on the algorithms.
// extra keys what else the data depends on (a --schema run: the schema's
// digest and the site column); "" keeps the keys of runs without it.
func optimumCachePath(cfg Config, spec model.Spec, extra string) string {
	key, _ := json.Marshal(struct {
		Dataset, Partition, Standardize string
		Clients                         int
		Seed                            uint64
		TestFrac, Tol                   float64
		Spec                            model.Spec
		Extra                           string `json:",omitempty"`
	}{cfg.Dataset, cfg.Partition, cfg.Standardize, cfg.Clients, cfg.Seed, cfg.TestFrac, cfg.OptimumTol, spec, extra})
	h := sha256.Sum256(key)
	return filepath.Join(cfg.OptimumCache, "optimum-"+hex.EncodeToString(h[:8])+".bin")
}

func readOptimum(path string, n int) ([]float64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) != 8*n {
		return nil, fmt.Errorf("%s: %d bytes, want %d", path, len(b), 8*n)
	}
	x := make([]float64, n)
	for i := range x {
		x[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
		if math.IsNaN(x[i]) || math.IsInf(x[i], 0) {
			return nil, fmt.Errorf("%s: non-finite value", path)
		}
	}
	return x, nil
}

func writeOptimum(path string, x []float64) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b := make([]byte, 8*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

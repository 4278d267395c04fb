package dp

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
)

// Mode says who adds the Gaussian noise (docs/privacy.md, "Threat models").
type Mode uint8

const (
	// Central: the aggregator adds noise of standard deviation z*C to the sum
	// of the clipped updates. It sees every clipped update: trusted.
	Central Mode = iota + 1
	// Distributed: each of the K selected sites adds z*C/sqrt(K) to its own
	// clipped update, so that the secure sum (secure aggregation) carries
	// z*C in all and no single party sees an un-noised update or sum.
	Distributed
)

func (m Mode) String() string {
	switch m {
	case Central:
		return "central"
	case Distributed:
		return "distributed"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// CentralStd is the standard deviation of the noise on the sum of clipped
// updates: z*C (the sum's L2 sensitivity to one site is C).
func CentralStd(z, c float64) float64 { return z * c }

// SiteStd is the standard deviation each of k sites adds in Distributed
// mode: z*C/sqrt(k), so that k independent draws sum to z*C. Pass the
// fewest sites the sum can hold (the round's quorum), not the selection:
// a sum of fewer sites than k would carry less than z*C.
func SiteStd(z, c float64, k int) float64 {
	if k < 1 {
		return math.NaN()
	}
	return z * c / math.Sqrt(float64(k))
}

// AddNoise adds independent N(0, std^2) draws from rng to every value of v.
func AddNoise(v []float64, std float64, rng *rand.Rand) {
	for i := range v {
		v[i] += std * rng.NormFloat64()
	}
}

// NoiseRand is the noise stream of one round: ChaCha8 (a cryptographically
// secure generator; PCG is not, its state can be recovered from its output)
// keyed by SHA-256(key, round). key must be secret: in production 32 bytes
// from crypto/rand that the aggregator (central mode) or the site
// (distributed mode) draws once and keeps in its state file, so a restart
// that redoes a round redraws the same noise rather than releasing a second,
// differently noised view of the same sum. TestKey gives the fixed key of a
// reproducible test or simulation.
func NoiseRand(key [32]byte, round uint64) *rand.Rand {
	return keyedRand("edgefl dp noise v1", key, round)
}

// BitNoiseRand is the stream of a round's clip-bit noise (adaptive
// clipping): keyed like NoiseRand, in its own domain, so the update noise
// and the bit noise are independent draws whatever either consumes.
func BitNoiseRand(key [32]byte, round uint64) *rand.Rand {
	return keyedRand("edgefl dp clip-bit noise v1", key, round)
}

// keyedRand is ChaCha8 seeded by SHA-256(domain, key, round big-endian).
func keyedRand(domain string, key [32]byte, round uint64) *rand.Rand {
	h := sha256.New()
	h.Write([]byte(domain))
	h.Write(key[:])
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], round)
	h.Write(b[:])
	var seed [32]byte
	copy(seed[:], h.Sum(nil))
	return rand.New(rand.NewChaCha8(seed))
}

// TestKey is a noise key derived from a public seed: reproducible, and
// therefore predictable by anyone who knows the seed. For tests and
// `simulate` only, behind an explicit flag; never for a live federation.
func TestKey(seed uint64) [32]byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seed)
	return sha256.Sum256(append([]byte("edgefl dp test key v1"), b[:]...))
}

// TestSelectionKey is a selection key (internal/streams.Secret) derived
// from a public seed, the counterpart of TestKey for the selection stream:
// `simulate --dp-noise-seed` and tests only, never a live federation
// (whose key is 32 bytes from crypto/rand; docs/privacy.md, "Sampling
// rate").
func TestSelectionKey(seed uint64) [32]byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seed)
	return sha256.Sum256(append([]byte("edgefl dp test selection key v1"), b[:]...))
}

// Package streams derives every seeded random stream of a federation, in one
// place, so that adding one kind of randomness never shifts another and the
// daemons and `broker-agg simulate` draw alike where they can.
//
// Two derivations exist, because the parties know different things:
//
//   - Run streams (Of): from the run's seed, a Stream and two integers (a
//     round and a client index, or a round and an attempt). `simulate` draws
//     every kind from them (initial model, selection, stragglers, SGD order,
//     QSGD noise), and the aggregator's coordinator draws its selection from
//     Select, so that for attempt 0 a live federation and `simulate` with the
//     same seed pick alike when handed the same candidates in the same order.
//   - Site streams (Site): a site does not know its index in the federation,
//     only its id, so its SGD order and QSGD noise are keyed by its own seed,
//     its id (sites with the same seed still draw independently: QSGD's noise
//     must not be correlated across clients), the round and the SiteStream.
//
// A site's stochastic draws therefore agree with `simulate`'s in
// distribution, not bit for bit; deterministic solves (L-BFGS) and codecs
// (everything but qsgd) agree bit for bit (sim's TestSimMatchesLive).
//
// Pure: no state, no globals; each call returns a new generator.
package streams

import (
	"crypto/sha256"
	"encoding/binary"
	"hash/fnv"
	"io"
	"math/rand/v2"
)

// golden is 2^64 divided by the golden ratio, the multiplier that spreads
// stream numbers over the seed space.
const golden = 0x9e3779b97f4a7c15

// Stream names one kind of a run's randomness.
type Stream uint64

// Run streams. The numbers are part of every recorded simulation: never
// renumber one.
const (
	Init     Stream = iota + 1 // the initial model (a = 0) and PNI's probe model (a = 1)
	Select                     // client selection: a = round, b = attempt (simulate: 0)
	Straggle                   // which selected clients straggle, and their epochs: a = round
	Solve                      // a client's local solve (SGD order): a = round, b = client index
	Codec                      // uplink QSGD noise: a = round, b = client index; downlink: b = -1
	SecAgg                     // secure aggregation's stochastic rounding (simulate; a site uses crypto/rand): a = round, b = client index
)

// Of is the run stream s of seed for (a, b).
func Of(seed uint64, s Stream, a, b int) *rand.Rand {
	return rand.New(rand.NewPCG(seed^uint64(s)*golden, uint64(a)<<32^uint64(b)))
}

// Secret is the run stream s for (a, b) keyed by a secret 32-byte key
// instead of the public seed: ChaCha8 (a cryptographically secure
// generator; PCG's state can be recovered from its output) seeded with
// SHA-256 of a label, the key, s, a and b. Under --dp the selection is
// drawn from it (docs/privacy.md, "Sampling rate": nobody who knows --seed
// may predict who is sampled); the key is 32 bytes from crypto/rand in the
// aggregator's state file, or a key derived from a seed in `simulate` and
// tests.
func Secret(key [32]byte, s Stream, a, b int) *rand.Rand {
	h := sha256.New()
	h.Write([]byte("edgefl secret stream v1"))
	h.Write(key[:])
	var n [24]byte
	binary.BigEndian.PutUint64(n[0:], uint64(s))
	binary.BigEndian.PutUint64(n[8:], uint64(a))
	binary.BigEndian.PutUint64(n[16:], uint64(b))
	h.Write(n[:])
	var seed [32]byte
	copy(seed[:], h.Sum(nil))
	return rand.New(rand.NewChaCha8(seed))
}

// Selection is the stream a round's selection is drawn from, for the
// coordinator and `simulate` alike: Secret(*key, Select, round, attempt)
// when a selection key is set (--dp), else Of(seed, Select, round,
// attempt).
func Selection(seed uint64, key *[32]byte, round, attempt int) *rand.Rand {
	if key != nil {
		return Secret(*key, Select, round, attempt)
	}
	return Of(seed, Select, round, attempt)
}

// SiteStream names one kind of a site's randomness.
type SiteStream uint64

// Site streams (their own numbering; never renumber one).
const (
	SiteSolve SiteStream = iota + 1 // the local solve (SGD order)
	SiteCodec                       // the uplink codec (QSGD noise)
)

// Site is the stream s of a site with seed and id in round.
func Site(seed uint64, id string, round uint64, s SiteStream) *rand.Rand {
	f := fnv.New64a()
	f.Write([]byte(id))
	return rand.New(rand.NewPCG(seed^f.Sum64(), round*golden^uint64(s)))
}

// Reader reads the bytes of r's 64-bit draws, little-endian: a seeded
// io.Reader for what takes one (secagg.Quantizer.Quantize).
func Reader(r *rand.Rand) io.Reader { return reader{r} }

type reader struct{ r *rand.Rand }

func (r reader) Read(p []byte) (int, error) {
	for i := 0; i < len(p); i += 8 {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], r.r.Uint64())
		copy(p[i:], b[:])
	}
	return len(p), nil
}

// ModelInit is the random source of the aggregator's initial model
// (`broker-agg run --init model --init-seed SEED`): a stream of its own,
// apart from the run streams.
func ModelInit(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 0x696e6974)) // "init"
}

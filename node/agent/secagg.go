package agent

import (
	crand "crypto/rand"
	"io"

	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// The shell's half of the site's secure aggregation: its rules are the
// site core's (core_secagg.go); the shell hands them their randomness and
// the signing identity (secAggConfig) and carries their plans out, as for
// any round.

// secAggConfig is what the core's secure-aggregation steps are handed by
// the shell: the randomness they draw from and the signing identity.
type secAggConfig struct {
	// Rand is the randomness of a round's session (keys, shares,
	// stochastic rounding): crypto/rand, or the seeded stream of a test
	// that compares a live run with simulate (RoundHandler.SecAggRand).
	Rand func(round uint64) io.Reader
	// Entropy is crypto/rand: signatures and the distributed-DP noise key.
	Entropy io.Reader
	// Identity is the signing identity of signed secure aggregation (nil:
	// password-only), NoiseKey a test's fixed noise key (nil: the site's).
	Identity *uplink.SecAggIdentity
	NoiseKey *[32]byte
}

// secAggConfig is the core's secure-aggregation configuration from the
// handler's.
func (h *RoundHandler) secAggConfig() secAggConfig {
	return secAggConfig{Rand: h.secAggRand, Entropy: crand.Reader, Identity: h.SecAggIdentity, NoiseKey: h.SecAggNoiseKey}
}

// secAggRand is the randomness of the site's secure aggregation: its keys,
// shares and stochastic rounding. crypto/rand unless a test that compares a
// live run with simulate gives a seeded stream (RoundHandler.SecAggRand).
func (h *RoundHandler) secAggRand(round uint64) io.Reader {
	if h.SecAggRand != nil {
		return h.SecAggRand(round)
	}
	return crand.Reader
}

// HandleShareList answers the aggregator's ShareList (the masked phase):
// the core's step (siteRules.shareList) is carried out, its masked input
// committed before it is returned for publishing. A ShareList of another
// session, or one the site has answered, changes nothing (the stored
// answer is re-sent).
func (h *RoundHandler) HandleShareList(m *wire.SecAggMessage) (Result, error) {
	pl := h.rules().shareList(h.Store, m, h.clock().Now())
	if res, stop, err := h.commit(pl.records, pl.base); stop {
		return res, err
	}
	return pl.res, pl.err
}

// SecAggSession reads the secure-aggregation session stored in a site's
// state file: its round, attempt and quantised input (for tests and
// inspection; the client state with the site's keys is not returned).
// ErrNotFound (storage's) when the site has none.
func SecAggSession(s *edgestore.EdgeStore) (round uint64, attempt uint32, input []uint32, err error) {
	b, err := s.SecAgg()
	if err != nil {
		return 0, 0, nil, err
	}
	rec, err := unmarshalSecAggRecord(b)
	if err != nil {
		return 0, 0, nil, err
	}
	return rec.round, rec.attempt, rec.input, nil
}

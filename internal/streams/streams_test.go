package streams

import (
	"math/rand/v2"
	"testing"
)

// The derivations are part of every recorded run (results.json, the
// figures of docs/results.md, a restarted coordinator's selection): these are the
// formulas sim, the coordinator and the agent used before this package,
// and the first draws of a few streams, pinned.
func TestDerivationsPinned(t *testing.T) {
	for _, tc := range []struct {
		seed uint64
		s    Stream
		a, b int
	}{{1, Init, 0, 0}, {1, Select, 7, 0}, {7, Select, 3, 2}, {3, Straggle, 150, 0}, {1, Solve, 20, 29}, {2, Codec, 5, -1}} {
		want := rand.New(rand.NewPCG(tc.seed^uint64(tc.s)*0x9e3779b97f4a7c15, uint64(tc.a)<<32^uint64(tc.b))).Uint64()
		if got := Of(tc.seed, tc.s, tc.a, tc.b).Uint64(); got != want {
			t.Errorf("Of(%d, %d, %d, %d) drew %#x, want %#x", tc.seed, tc.s, tc.a, tc.b, got, want)
		}
	}
	if got := Of(1, Select, 1, 0).Uint64(); got != 0xd6a72ce4ed553bb6 {
		t.Errorf("Of(1, Select, 1, 0) drew %#x", got)
	}
	if got := Site(1, "site-a", 3, SiteSolve).Uint64(); got != 0x82912442dcfbf3cd {
		t.Errorf("Site(1, site-a, 3, SiteSolve) drew %#x", got)
	}
	if got := ModelInit(1).Uint64(); got != rand.New(rand.NewPCG(1, 0x696e6974)).Uint64() {
		t.Errorf("ModelInit(1) drew %#x", got)
	}
}

// Streams are distinct across kinds, rounds, clients and sites.
func TestStreamsDiffer(t *testing.T) {
	seen := map[uint64]string{}
	add := func(name string, r *rand.Rand) {
		v := r.Uint64()
		if other, ok := seen[v]; ok {
			t.Fatalf("%s and %s draw alike", name, other)
		}
		seen[v] = name
	}
	for s := Init; s <= Codec; s++ {
		for a := 0; a < 3; a++ {
			for b := -1; b < 3; b++ {
				add("run", Of(1, s, a, b))
			}
		}
	}
	for _, id := range []string{"site-a", "site-b"} {
		for r := uint64(1); r < 4; r++ {
			add(id+" solve", Site(1, id, r, SiteSolve))
			add(id+" codec", Site(1, id, r, SiteCodec))
		}
	}
}

// Secret streams: keyed by the key, not the seed; distinct across streams,
// rounds and attempts; Selection picks the keyed stream when a key is set.
func TestSecretStreams(t *testing.T) {
	var k1, k2 [32]byte
	k2[0] = 1
	seen := map[uint64]string{}
	for _, k := range [][32]byte{k1, k2} {
		for s := Init; s <= Codec; s++ {
			for a := 0; a < 3; a++ {
				for b := 0; b < 2; b++ {
					v := Secret(k, s, a, b).Uint64()
					if _, dup := seen[v]; dup {
						t.Fatalf("two secret streams draw alike")
					}
					seen[v] = "x"
				}
			}
		}
	}
	if Selection(1, &k2, 3, 0).Uint64() != Secret(k2, Select, 3, 0).Uint64() {
		t.Error("Selection with a key is not the secret stream")
	}
	if Selection(1, nil, 3, 0).Uint64() != Of(1, Select, 3, 0).Uint64() {
		t.Error("Selection without a key is not the seeded stream")
	}
	if Selection(1, &k1, 3, 0).Uint64() != Selection(2, &k1, 3, 0).Uint64() {
		t.Error("a keyed selection depends on the public seed")
	}
}

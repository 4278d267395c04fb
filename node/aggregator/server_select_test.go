package aggregator

import (
	"bytes"
	"encoding/json"
	"errors"
	"github.com/edgefl/edgefl/node/aggstore"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/internal/metrics"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/storage"
)

// TestSelectionKey: under --dp a new round log gets a selection key of 32
// bytes from crypto/rand, next to (and unlike) its noise key, different in
// every run; a restart reads the same key back and the coordinator draws
// from it (not from the public seed); poisson is --dp's default selector;
// a --dp round log without a selection key (written before it was kept) is
// refused as damaged.
func TestSelectionKey(t *testing.T) {
	f := newFixture(t)
	conf := func() ServerConfig {
		c := f.config()
		c.Algorithm, c.StatePath = AlgoFedProx, t.TempDir()+"/state.db"
		c.DP = &dp.Config{Clip: 1, Noise: 1, Delta: 1e-5}
		return c
	}
	keysOf := func(path string) storedConfig {
		t.Helper()
		var sc storedConfig
		if err := json.Unmarshal([]byte(roundOneConfig(t, path)), &sc); err != nil {
			t.Fatal(err)
		}
		return sc
	}
	open := func(c ServerConfig) *Server {
		t.Helper()
		s, err := NewServer(c)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := conf(), conf()
	sa, sb := open(a), open(b)
	if name := sa.coord.SelectorName(); name != "poisson" {
		t.Errorf("--dp's selector is %s, want poisson", name)
	}
	var coordKey [32]byte
	if k := sa.coord.SelectionKey(); k != nil {
		coordKey = *k
	}
	sa.Close()
	sb.Close()
	ka, kb := keysOf(a.StatePath), keysOf(b.StatePath)
	if len(ka.SelectionKey) != 32 || bytes.Equal(ka.SelectionKey, kb.SelectionKey) || bytes.Equal(ka.SelectionKey, ka.NoiseKey) ||
		bytes.Equal(ka.SelectionKey, make([]byte, 32)) {
		t.Fatalf("selection keys %x and %x (noise key %x): want 32 random bytes per run, not the noise key", ka.SelectionKey, kb.SelectionKey, ka.NoiseKey)
	}
	if !bytes.Equal(coordKey[:], ka.SelectionKey) {
		t.Fatal("the coordinator does not draw from the stored selection key")
	}
	re := open(a)
	reKey := re.coord.SelectionKey()
	re.Close()
	if reKey == nil || !bytes.Equal(reKey[:], ka.SelectionKey) || !bytes.Equal(keysOf(a.StatePath).SelectionKey, ka.SelectionKey) {
		t.Fatal("the restarted aggregator has another selection key")
	}

	// A --dp log without a selection key.
	if _, err := aggstore.Rollback(a.StatePath, 1, start0, func(b []byte) ([]byte, error) {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, err
		}
		delete(m, "dp_selection_key")
		return json.Marshal(m)
	}); err != nil {
		t.Fatal(err)
	}
	if s, err := NewServer(a); err == nil || !errors.Is(err, storage.ErrCorrupt) || !strings.Contains(err.Error(), "selection key") {
		if err == nil {
			s.Close()
		}
		t.Fatalf("a --dp log without a selection key: %v, want ErrCorrupt naming the selection key", err)
	}

	// Without --dp: no keys, the public seed, uniform; poisson refused.
	c := conf()
	c.DP = nil
	s := open(c)
	ck, sel := s.coord.SelectionKey(), s.coord.SelectorName()
	s.Close()
	if sc := keysOf(c.StatePath); sc.SelectionKey != nil || sc.NoiseKey != nil || ck != nil || sel != "uniform" {
		t.Errorf("without --dp: keys %x %x, coordinator key %v, selector %s", sc.SelectionKey, sc.NoiseKey, ck, sel)
	}
	c = conf()
	c.DP, c.Selector = nil, "poisson"
	if s, err := NewServer(c); err == nil || !errors.Is(err, coordinator.ErrConfig) {
		if err == nil {
			s.Close()
		}
		t.Fatalf("poisson without --dp: %v, want ErrConfig", err)
	}
}

// TestPrivacyMetrics: /metrics of a --dp run carries the amplified epsilon
// and, next to it, the per-site unamplified epsilon and its rounds.
func TestPrivacyMetrics(t *testing.T) {
	var b strings.Builder
	p := &PrivacyStatus{Mode: "central", Epsilon: 2.5, Delta: 1e-5, Rounds: 40, Budget: 3, Clip: 1, Noise: 1.2,
		EpsilonUnamplified: 9.75, SiteRounds: 8}
	if err := metrics.Write(&b, privacyFamilies(p)); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"edgefl_dp_epsilon 2.5\n", "edgefl_dp_rounds 40\n", "edgefl_dp_epsilon_unamplified 9.75\n", "edgefl_dp_max_site_rounds 8\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, b.String())
		}
	}
	if len(privacyFamilies(nil)) != 0 {
		t.Error("privacy gauges without --dp")
	}
}

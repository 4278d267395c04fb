package aggregator

import (
	crand "crypto/rand"
	"encoding/json"
	"fmt"

	"github.com/edgefl/edgefl/aggregate"
	"github.com/edgefl/edgefl/dp"
	"github.com/edgefl/edgefl/metrics"
	"github.com/edgefl/edgefl/storage"
	"github.com/edgefl/edgefl/uplink"
	"github.com/edgefl/edgefl/wire"
)

// The shell's part of central differential privacy (ServerConfig.DP;
// docs/privacy.md, "The mechanism per round" and "Threat models"): the
// refusals, the noise key in the state file, the announced parameters, and
// the aggregation through uplink.NoisyMean, the rule `simulate` runs too.

// checkDP refuses what DP cannot cover; d is the derived configuration.
func (cfg *ServerConfig) checkDP(d *derived) error {
	if cfg.DP == nil {
		return nil
	}
	if err := cfg.DP.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	switch {
	case isSplit(d.fam):
		return fmt.Errorf("%w: %w", ErrConfig, uplink.ErrSplitDP)
	case cfg.Schema != nil:
		return fmt.Errorf("%w: differential privacy with a federation schema: the per-site statistics and evaluation reports are outside the privacy guarantee until they are privatised (docs/privacy.md, \"What the guarantee covers\")", ErrConfig)
	case cfg.AnchorSketch != nil:
		return fmt.Errorf("%w: differential privacy with anchor gradients: a site's anchor gradient is not clipped or noised (docs/privacy.md, \"What the guarantee covers\")", ErrConfig)
	}
	if err := aggregate.CheckDP(d.aggSpec, cfg.Selector); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	d.coord.MaxReselections = 0
	d.coord.DP = cfg.DP
	d.coord.Invitations = true
	return nil
}

// dpText is a DP setting as resumeDiffs compares and names it.
func dpText(c *dp.Config) string {
	if c == nil {
		return "off"
	}
	b, _ := json.Marshal(c)
	return string(b)
}

// newNoiseKey draws a new run's noise key and selection key.
func (s *Server) newNoiseKey() error {
	if s.cfg.DP == nil {
		return nil
	}
	var err error
	if s.stored.NoiseKey, err = newKey(s.cfg.DPTestKey); err != nil {
		return fmt.Errorf("aggregator: draw the DP noise key: %w", err)
	}
	if s.stored.SelectionKey, err = newKey(s.cfg.DPTestSelectionKey); err != nil {
		return fmt.Errorf("aggregator: draw the DP selection key: %w", err)
	}
	s.coord.setSelectionKey(s.stored.SelectionKey)
	return nil
}

// newKey is 32 bytes from crypto/rand, or a copy of test when set.
func newKey(test *[32]byte) ([]byte, error) {
	key := make([]byte, 32)
	if test != nil {
		copy(key, test[:])
		return key, nil
	}
	_, err := crand.Read(key)
	return key, err
}

// checkNoiseKey checks a restored run's noise and selection keys and hands
// the selection key to the coordinator. A --dp round log written before the
// selection key was kept has none: its rounds were drawn from the public
// seed, and mixing the two in one run would not make the earlier draws
// secret, so it is refused like a damaged key.
func (s *Server) checkNoiseKey() error {
	if s.cfg.DP == nil {
		return nil
	}
	if len(s.stored.NoiseKey) != 32 {
		return fmt.Errorf("%w: %s: the run's DP noise key is missing or damaged (%d bytes)", storage.ErrCorrupt, s.cfg.StatePath, len(s.stored.NoiseKey))
	}
	if len(s.stored.SelectionKey) != 32 {
		return fmt.Errorf("%w: %s: the run's DP selection key is missing or damaged (%d bytes); a --dp run started by an older broker-agg drew its selection from the public --seed: finish it with that version or start a new run with another --state-file",
			storage.ErrCorrupt, s.cfg.StatePath, len(s.stored.SelectionKey))
	}
	s.coord.setSelectionKey(s.stored.SelectionKey)
	return nil
}

// dpParams are the DP parameters of the next announcement (nil without).
func (s *Server) dpParams() *wire.DPParams {
	c := s.cfg.DP
	if c == nil {
		return nil
	}
	eps, _, _ := s.coord.Privacy()
	return &wire.DPParams{Mode: wire.DPMode_DP_MODE_CENTRAL, ClipNorm: c.Clip, NoiseMultiplier: c.Noise,
		Delta: c.Delta, EpsilonSpent: eps, EpsilonBudget: c.Budget}
}

// privateAggregate is the closed round's noisy mean: the contributors'
// decoded deltas, re-clipped, summed, noised from the run's key and the
// round, over the round's fixed denominator (every site it invited).
// Redone after a restart, it draws the same noise.
func (s *Server) privateAggregate(cr CloseRound) ([]float64, aggregate.Report, error) {
	var cs []uplink.Contribution
	err := s.forClosed(cr, func(u storage.Update, m *wire.ClientUpdate, d []float64) error {
		if m.GetKind() != wire.UpdateKind_UPDATE_KIND_DELTA {
			return fmt.Errorf("stored update of %q is a %v, not a delta", u.ClientID, m.GetKind())
		}
		cs = append(cs, uplink.Contribution{Client: u.ClientID, Delta: d})
		return nil
	})
	if err != nil {
		return nil, aggregate.Report{}, err
	}
	var key [32]byte
	copy(key[:], s.stored.NoiseKey)
	m := cr.Denominator
	if m == 0 {
		m = len(cr.Contributors) + len(cr.Stragglers) // a state written before the denominator was kept
	}
	c := s.cfg.DP
	out, err := uplink.NoisyMean(s.global, cs, uplink.Private{Clip: c.Clip, Noise: c.Noise, Denominator: m}, dp.NoiseRand(key, uint64(cr.Round)))
	if err != nil {
		return nil, aggregate.Report{}, fmt.Errorf("aggregator: round %d: %w", cr.Round, err)
	}
	return out, aggregate.Report{Metrics: map[string]float64{"dp_denominator": float64(m)}}, nil
}

// PrivacyStatus is a --dp run's accounting, as `status`, /status and
// /metrics report it: the epsilon spent at Delta after Rounds charged
// rounds, the budget (0: none), the clip norm and the noise multiplier;
// and the unamplified per-site epsilon (docs/privacy.md, "Sampling rate"):
// the unsampled Gaussian over the SiteRounds rounds of the site that
// contributed to the most, the figure that holds against whoever learns
// the selection (the aggregator itself included). The budget is on
// Epsilon.
type PrivacyStatus struct {
	Mode               string  `json:"mode"`
	Epsilon            float64 `json:"epsilon"`
	Delta              float64 `json:"delta"`
	Rounds             uint64  `json:"rounds"`
	Budget             float64 `json:"epsilon_budget,omitempty"`
	Clip               float64 `json:"clip"`
	Noise              float64 `json:"noise_multiplier"`
	EpsilonUnamplified float64 `json:"epsilon_unamplified"`
	SiteRounds         uint64  `json:"max_site_rounds"`
}

func newPrivacyStatus(c *dp.Config, a *dp.Accountant, siteEps float64, siteRounds uint64) *PrivacyStatus {
	eps, _ := a.Epsilon(c.Delta)
	return &PrivacyStatus{Mode: dp.Central.String(), Epsilon: eps, Delta: c.Delta, Rounds: a.Rounds, Budget: c.Budget, Clip: c.Clip, Noise: c.Noise,
		EpsilonUnamplified: siteEps, SiteRounds: siteRounds}
}

// storedPrivacyStatus is the accounting of a state read from the round log
// (`status`): the per-site figure recomputed from the sites' counts.
func storedPrivacyStatus(c *dp.Config, st *DPState) *PrivacyStatus {
	var most uint64
	for _, n := range st.SiteRounds {
		most = max(most, n)
	}
	var siteEps float64
	if most > 0 && most <= dp.MaxRounds {
		siteEps = dp.EpsilonAfter(1, c.Noise, int(most), c.Delta, st.Accountant.Orders)
	}
	return newPrivacyStatus(c, st.Accountant, siteEps, most)
}

// privacyStatus is the running coordinator's accounting (nil without DP).
func (s *Server) privacyStatus() *PrivacyStatus {
	if s.cfg.DP == nil {
		return nil
	}
	st := s.coord.snapshotDP()
	siteEps, siteRounds, _ := s.coord.SitePrivacy()
	return newPrivacyStatus(s.cfg.DP, st.Accountant, siteEps, siteRounds)
}

// privacyFamilies are the /metrics gauges of p (none when nil).
func privacyFamilies(p *PrivacyStatus) []metrics.Family {
	if p == nil {
		return nil
	}
	return []metrics.Family{
		metrics.One("edgefl_dp_epsilon", "Differential privacy: epsilon spent so far at edgefl_dp_delta (RDP accountant).", metrics.Gauge, p.Epsilon),
		metrics.One("edgefl_dp_delta", "Differential privacy: the run's delta.", metrics.Gauge, p.Delta),
		metrics.One("edgefl_dp_epsilon_budget", "Differential privacy: the epsilon budget (0: none).", metrics.Gauge, p.Budget),
		metrics.One("edgefl_dp_rounds", "Differential privacy: rounds charged to the accountant.", metrics.Gauge, float64(p.Rounds)),
		metrics.One("edgefl_dp_epsilon_unamplified", "Differential privacy: the largest per-site epsilon without amplification by subsampling (q = 1 over the rounds the site contributed to), at edgefl_dp_delta: what holds against whoever knows the selection.", metrics.Gauge, p.EpsilonUnamplified),
		metrics.One("edgefl_dp_max_site_rounds", "Differential privacy: the most rounds any one site contributed to.", metrics.Gauge, float64(p.SiteRounds)),
	}
}

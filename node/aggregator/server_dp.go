package aggregator

import (
	crand "crypto/rand"
	"encoding/json"
	"fmt"
	"github.com/edgefl/edgefl/node/aggstore"

	"github.com/edgefl/edgefl/internal/metrics"
	"github.com/edgefl/edgefl/learn/aggregate"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/learn/split"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// The shell's part of central differential privacy (ServerConfig.DP;
// docs/privacy.md, "The mechanism per round" and "Threat models"): the
// refusals, the noise key in the state file, the announced parameters, and
// the aggregation through uplink.NoisyMean, the rule `simulate` runs too.

// PrivacyConfig is differential privacy's configuration (ServerConfig
// embeds it).
type PrivacyConfig struct {
	// DP, when set, is central differential privacy (docs/privacy.md;
	// server_dp.go): every round announces the clip norm, the sites clip,
	// the aggregator re-clips and releases the fixed-denominator mean plus
	// Gaussian noise from a secret key kept in the state file, and the
	// coordinator's accountant stops the run before the budget is
	// exceeded. The FedProx family with fedavg or mean (sample weights
	// are dropped); the FedSplit family in sum mode (server_sum.go: S and
	// m only, no robust server step, no late updates); poisson (the
	// default) or uniform selection drawn from a secret key and not
	// published (invitations on receipts/<id>), no re-selection
	// (MaxReselections is taken as 0), no anchor gradients; a schema only
	// if it declares its preprocessing. With DP.Adaptive the clip norm
	// moves every round (server_dp.go).
	DP *dp.Config
	// DPTestKey and DPTestSelectionKey, when set, are a new run's noise
	// key and selection key instead of 32 bytes from crypto/rand each: for
	// tests that compare a live run with simulate --dp-noise-seed
	// (dp.TestKey, dp.TestSelectionKey), never for a deployment.
	DPTestKey          *[32]byte
	DPTestSelectionKey *[32]byte
}

// Validate checks the DP setting on its own; checkDP checks it against the
// rest of the configuration.
func (c PrivacyConfig) Validate() error {
	if c.DP == nil {
		return nil
	}
	if err := c.DP.Validate(); err != nil {
		return fmt.Errorf("%w: %w", coordinator.ErrConfig, err)
	}
	return nil
}

// checkDP refuses what DP cannot cover; d is the derived configuration.
func (cfg *ServerConfig) checkDP(d *derived) error {
	if cfg.DP == nil {
		return nil
	}
	if err := cfg.PrivacyConfig.Validate(); err != nil {
		return err
	}
	switch {
	case cfg.DP.Distributed && cfg.SecAgg == nil:
		return fmt.Errorf("%w: %w", coordinator.ErrConfig, dp.ErrDistributed)
	case isSplit(d.fam) && cfg.Aggregator != "" && cfg.Aggregator != split.StepMean:
		return fmt.Errorf("%w: --aggregator %s: %w", coordinator.ErrConfig, cfg.Aggregator, uplink.ErrSplitRobustDP)
	case cfg.Schema != nil && !cfg.Schema.Declared():
		return fmt.Errorf("%w: differential privacy with a federation schema that does not declare its preprocessing (hint: declare it as deploy/schema-dp.example.json does)", coordinator.ErrConfig)
	case cfg.AnchorSketch != nil:
		return fmt.Errorf("%w: differential privacy with anchor gradients: a site's anchor gradient is not clipped or noised (docs/privacy.md, \"What the guarantee covers\")", coordinator.ErrConfig)
	}
	aggSpec := d.aggSpec
	if isSplit(d.fam) {
		// Sum mode: the server step is S/m (server_sum.go); no late
		// updates (docs/privacy.md, "Sampling rate").
		aggSpec, d.sum, d.coord.StoreLate = "", true, false
		// Central DP: the roster is fixed at the first draw and counted
		// from round 1, so that m reveals nobody's selection (server_sum.go).
		d.coord.FixedRoster = cfg.SecAgg == nil
	}
	if err := aggregate.CheckDP(aggSpec, cfg.Selector, !cfg.DP.Distributed && cfg.SecAgg == nil); err != nil { // central with --secagg is refused as such (server_secagg.go)
		return fmt.Errorf("%w: %w", coordinator.ErrConfig, err)
	}
	d.coord.MaxReselections = 0
	d.coord.DP = cfg.DP
	// Under --secagg the selection is public anyway: the KeyList on the
	// round topic names the sites that advertised keys, so invitations
	// would hide nothing (docs/privacy.md, "Threat models").
	d.coord.Invitations = cfg.SecAgg == nil
	return nil
}

// privacy is the shell's differential privacy component: its
// configuration (ServerConfig.DP after defaults, the test keys, the secure
// aggregation settings distributed mode splits its noise over), adaptive
// clipping's next clip norm, the keys' draw and restore, the announced
// parameters and the status's privacy section. The run's keys themselves
// are stored with round 1's configuration (storedConfig), where the round
// log keeps them.
type privacy struct {
	cfg                         *dp.Config // nil: off
	testNoiseKey, testSelection *[32]byte
	secAgg                      *SecAggConfig
	// nextClip is adaptive clipping's clip norm for the round after the
	// closing one (0: none), until the checkpoint steps ClipEstimated.
	nextClip float64
}

// newPrivacy is the component of cfg (with its defaults), under the secure
// aggregation sa (nil: none) its distributed mode splits the noise over.
func newPrivacy(cfg PrivacyConfig, sa *SecAggConfig) *privacy {
	return &privacy{cfg: cfg.DP, testNoiseKey: cfg.DPTestKey, testSelection: cfg.DPTestSelectionKey, secAgg: sa}
}

// takeClip returns the next round's clip norm estimated by the closing
// round (0: none) and forgets it.
func (p *privacy) takeClip() float64 {
	c := p.nextClip
	p.nextClip = 0
	return c
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
func (s *Server) newNoiseKey() error { return s.privacy.newKeys(&s.stored, s.coord) }

// newKeys draws a new run's noise key and selection key into sc and hands
// the selection key to the coordinator.
func (p *privacy) newKeys(sc *storedConfig, coord *coordinator.Coordinator) error {
	if p.cfg == nil {
		return nil
	}
	var err error
	if sc.NoiseKey, err = newKey(p.testNoiseKey); err != nil {
		return fmt.Errorf("aggregator: draw the DP noise key: %w", err)
	}
	if sc.SelectionKey, err = newKey(p.testSelection); err != nil {
		return fmt.Errorf("aggregator: draw the DP selection key: %w", err)
	}
	coord.SetSelectionKey(sc.SelectionKey)
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

// noiseKey is the run's noise key (checkNoiseKey checked its length).
func (s *Server) noiseKey() (key [32]byte) {
	copy(key[:], s.stored.NoiseKey)
	return key
}

// checkNoiseKey checks a restored run's noise and selection keys and hands
// the selection key to the coordinator. A --dp round log written before the
// selection key was kept has none: its rounds were drawn from the public
// seed, and mixing the two in one run would not make the earlier draws
// secret, so it is refused like a damaged key.
func (s *Server) checkNoiseKey() error {
	return s.privacy.restoreKeys(s.stored, s.coord, s.cfg.StatePath)
}

// restoreKeys is checkNoiseKey for the keys in sc, read from the round log
// at path.
func (p *privacy) restoreKeys(sc storedConfig, coord *coordinator.Coordinator, path string) error {
	if p.cfg == nil {
		return nil
	}
	if len(sc.NoiseKey) != 32 {
		return fmt.Errorf("%w: %s: the run's DP noise key is missing or damaged (%d bytes)", storage.ErrCorrupt, path, len(sc.NoiseKey))
	}
	if len(sc.SelectionKey) != 32 {
		return fmt.Errorf("%w: %s: the run's DP selection key is missing or damaged (%d bytes) (hint: an older broker-agg's run? finish it with that version, or use another --state-file)",
			storage.ErrCorrupt, path, len(sc.SelectionKey))
	}
	coord.SetSelectionKey(sc.SelectionKey)
	return nil
}

// dpParams are the DP parameters of the next announcement (nil without).
func (s *Server) dpParams() *wire.DPParams { return s.privacy.announced(s.coord) }

// announced are the DP parameters of the next announcement of coord's
// round (nil without DP).
func (p *privacy) announced(coord *coordinator.Coordinator) *wire.DPParams {
	c := p.cfg
	if c == nil {
		return nil
	}
	eps, _, _ := coord.Privacy()
	w := &wire.DPParams{Mode: wire.DPMode_DP_MODE_CENTRAL, ClipNorm: coord.DPClip(), NoiseMultiplier: c.Noise,
		Delta: c.Delta, EpsilonSpent: eps, EpsilonBudget: c.Budget}
	if a := c.Adaptive; a != nil {
		w.UpdateNoiseMultiplier = c.UpdateNoise()
		w.Adaptive = &wire.AdaptiveClip{TargetQuantile: a.Quantile, LearningRate: a.LR, BitNoise: a.BitNoise}
	}
	if c.Distributed {
		k, _ := uplink.SecAggNoiseShares(p.secAgg.Threshold, c.Colluders) // checked at start (checkSecAgg)
		w.Mode, w.NoiseShares = wire.DPMode_DP_MODE_DISTRIBUTED, uint32(k)
	}
	return w
}

// estimateClip is adaptive clipping's step for the closing round cr
// (uplink.NextClip over the contributors' clip bits, noised from the
// round's bit stream, over its fixed denominator m); the next clip norm
// waits in privacy.nextClip for closeRound to step ClipEstimated before
// the state is stored with the next checkpoint. Nothing without adaptive
// clipping.
func (s *Server) estimateClip(cr coordinator.CloseRound, bits []bool, m int) error {
	a := s.privacy.cfg.Adaptive
	if a == nil {
		return nil
	}
	next, err := uplink.NextClip(*a, s.coord.DPClip(), bits, m, dp.BitNoiseRand(s.noiseKey(), uint64(cr.Round)))
	if err != nil {
		return fmt.Errorf("aggregator: round %d: %w", cr.Round, err)
	}
	s.privacy.nextClip = next
	return nil
}

// privateAggregate is the closed round's noisy mean: the contributors'
// decoded deltas, re-clipped, summed, noised from the run's key and the
// round, over the round's fixed denominator (every site it invited).
// Redone after a restart, it draws the same noise.
func (s *Server) privateAggregate(cr coordinator.CloseRound) ([]float64, aggregate.Report, error) {
	if s.sum != nil {
		return s.sumAggregate(cr)
	}
	m := denominatorOf(cr)
	c := s.cfg.DP
	clip := s.coord.DPClip()
	// Streamed: one decoded delta at a time, in the round log's order
	// (client ids: NoisyMean's order), re-clipped and summed.
	ps, err := uplink.NewPrivateSum(len(s.global), uplink.Private{Clip: clip, Noise: c.UpdateNoise(), Denominator: m})
	if err != nil {
		return nil, aggregate.Report{}, fmt.Errorf("aggregator: round %d: %w", cr.Round, err)
	}
	var bits []bool
	var buf []float64
	err = s.forClosedInto(cr, &buf, func(u aggstore.Update, m *wire.ClientUpdate, d []float64) error {
		if m.GetKind() != wire.UpdateKind_UPDATE_KIND_DELTA {
			return fmt.Errorf("stored update of %q is a %v, not a delta", u.ClientID, m.GetKind())
		}
		bits = append(bits, m.ClipBit == 1)
		return ps.Add(uplink.Contribution{Client: u.ClientID, Delta: d})
	})
	if err != nil {
		return nil, aggregate.Report{}, err
	}
	out := ps.Mean(s.global, dp.NoiseRand(s.noiseKey(), uint64(cr.Round)))
	if err := s.estimateClip(cr, bits, m); err != nil {
		return nil, aggregate.Report{}, err
	}
	return out, aggregate.Report{Metrics: map[string]float64{"dp_denominator": float64(m), "dp_clip": clip}}, nil
}

// PrivacyStatus is a --dp run's accounting, as `status`, /status and
// /metrics report it: the epsilon spent at Delta after Rounds charged
// rounds, the budget (0: none), the clip norm (with adaptive clipping, the
// open round's) and the noise multiplier; and the unamplified per-site
// epsilon (docs/privacy.md, "Sampling rate"): the unsampled Gaussian over
// the SiteRounds rounds of the site that contributed to the most, the
// figure that holds against whoever learns the selection (the aggregator
// itself included). The budget is on Epsilon.
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
	// FixedRounds: rounds close at their deadline (--dp-fixed-rounds), so
	// their timing is covered.
	FixedRounds bool `json:"fixed_rounds,omitempty"`
	// Amplified: Epsilon is amplified by subsampling (central mode, a
	// secret Poisson draw, fixed-length rounds); false: every round is
	// charged at q = 1 (distributed mode, or rounds that close early:
	// dp.Config.Amplified).
	Amplified bool `json:"amplified"`
	// Distributed mode: the collusion bound c (--dp-colluders) and whom
	// epsilon holds against (dp.Config.HoldsAgainst).
	Colluders    int    `json:"colluders,omitempty"`
	HoldsAgainst string `json:"holds_against,omitempty"`
}

func newPrivacyStatus(c *dp.Config, st *coordinator.DPState, siteEps float64, siteRounds uint64) *PrivacyStatus {
	a := st.Accountant
	eps, _ := a.Epsilon(c.Delta)
	clip := c.Clip
	if st.Clip > 0 {
		clip = st.Clip // adaptive clipping: the open round's
	}
	return &PrivacyStatus{Mode: c.Mode().String(), Epsilon: eps, Delta: c.Delta, Rounds: a.Rounds, Budget: c.Budget, Clip: clip, Noise: c.Noise,
		EpsilonUnamplified: siteEps, SiteRounds: siteRounds, FixedRounds: c.FixedRounds, Amplified: c.Amplified(),
		Colluders: c.Colluders, HoldsAgainst: c.HoldsAgainst()}
}

// storedPrivacyStatus is the accounting of a state read from the round log
// (`status`): the per-site figure recomputed from the sites' counts.
func storedPrivacyStatus(c *dp.Config, st *coordinator.DPState) *PrivacyStatus {
	var most uint64
	for _, n := range st.SiteRounds {
		most = max(most, n)
	}
	var siteEps float64
	if most > 0 && most <= dp.MaxRounds {
		siteEps = dp.EpsilonAfter(1, c.Noise, int(most), c.Delta, st.Accountant.Orders)
	}
	return newPrivacyStatus(c, st, siteEps, most)
}

// privacyStatus is the running coordinator's accounting (nil without DP).
func (s *Server) privacyStatus() *PrivacyStatus { return s.privacy.status(s.coord) }

// status is the status's privacy section: coord's accounting (nil without
// DP).
func (p *privacy) status(coord *coordinator.Coordinator) *PrivacyStatus {
	if p.cfg == nil {
		return nil
	}
	st := coord.SnapshotDP()
	siteEps, siteRounds, _ := coord.SitePrivacy()
	return newPrivacyStatus(p.cfg, st, siteEps, siteRounds)
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
		metrics.One("edgefl_dp_clip", "Differential privacy: the clip norm C of the open round (it moves with adaptive clipping).", metrics.Gauge, p.Clip),
		metrics.One("edgefl_dp_epsilon_unamplified", "Differential privacy: the largest per-site epsilon without amplification by subsampling (q = 1 over the rounds the site contributed to), at edgefl_dp_delta: what holds against whoever knows the selection.", metrics.Gauge, p.EpsilonUnamplified),
		metrics.One("edgefl_dp_max_site_rounds", "Differential privacy: the most rounds any one site contributed to.", metrics.Gauge, float64(p.SiteRounds)),
		metrics.One("edgefl_dp_amplified", "Differential privacy: 1 when edgefl_dp_epsilon is amplified by subsampling (central mode, secret Poisson draw, fixed-length rounds); 0 when every round is charged at q = 1 (distributed mode, or --dp-fixed-rounds=false).", metrics.Gauge, b2f(p.Amplified)),
	}
}

// denominatorOf is the closing round's fixed denominator (the coordinator's,
// aggregate.DPDenominator), or the sites it invited in a state written
// before the denominator was kept.
func denominatorOf(cr coordinator.CloseRound) int {
	if cr.Denominator > 0 {
		return cr.Denominator
	}
	return len(cr.Contributors) + len(cr.Stragglers)
}

package uplink

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/proto/wire"
)

// Sum mode: the FedSplit family when the aggregator may keep only
// sum_j z_j (docs/privacy.md, "FedSplit"; under --dp central, and under
// secure aggregation: secagg_sum.go). Both sides, once:
//
//   - the aggregator keeps S and m (SumState), with x = S/m; never a
//     site's z_j;
//   - site j keeps z_j and its record c_j (Record) of everything it has
//     contributed to S. Each round it sends u_j = clip(z_j - c_j, C)
//     (SumDelta), encoded as today, with UPDATE_KIND_SUM_DELTA and
//     base_round the round of its record. A site with no record joins:
//     u_j = clip(z_j - x, C), base_round 0, and the aggregator counts it
//     (S += x, m += 1) with its first delta;
//   - the site records what its update will add to S (Pending: the decoded
//     frame re-clipped as the aggregator re-clips it, plus x for a join)
//     and advances c_j by exactly that (Advance) only once the aggregator
//     confirms the update is in the round's sum (an accepted receipt:
//     STORED or DUPLICATE). A rejected update is not in S and its content
//     goes out again in the next round's z_j - c_j;
//   - the aggregator adds the round's clipped sum, the joins' x and the
//     noise to S when the round closes (SumState.Add), in the transaction
//     that stores the round's checkpoint.
//
// The "delivered" step is the caller's: under central DP it is the codec
// (EncodeSum: encode, decode, re-clip; ClippedSum at the aggregator); under
// secure aggregation it is the ring quantiser, whose dequantised vector the
// site hands to PendingOf and whose unmasked sum the aggregator hands to
// SumState.Add. Nothing else changes.

// Errors of sum mode.
var (
	// ErrSplitRobustDP is the error for the bounded FedSplit server step
	// in sum mode: split.BoundedStep measures each site's step of z_j,
	// and the aggregator no longer holds any z_j.
	ErrSplitRobustDP = errors.New("the robust FedSplit server step needs each site's z_j, not kept under differential privacy (hint: use fedsplit-mean or leave the aggregator unset)")
	// ErrNotCounted is wrapped (with ErrBaseMismatch) by a delta against a
	// record the aggregator does not count.
	ErrNotCounted = errors.New("this site is not counted in the sum")
	// ErrCounted is wrapped (with ErrBaseMismatch) by a join of a site the
	// aggregator counts already (same installation).
	ErrCounted = errors.New("this site is counted in the sum already")
)

// Record is a site's record c_j of what it has contributed to the
// aggregator's sum, and the round of the update that last advanced it.
type Record struct {
	Round uint64
	C     []float64
}

// SumUpdate is one site's sum-mode update.
type SumUpdate struct {
	// Round is the round being answered.
	Round uint64
	// Z is the site's z_j after this round's client step.
	Z []float64
	// Global is x, the round's global model as the site decoded it.
	Global []float64
	// Record is the site's confirmed record c_j; nil: the site is not
	// counted yet, and this update joins.
	Record *Record
	// Initial is the record a site without one starts from under a fixed
	// roster (SumState.Fixed): x_0, the model round 1 published, in which
	// every site of the roster is counted from the start. nil: a join is
	// against Global, this round's model (the aggregator adds it to S).
	Initial []float64
	// Clip is C (> 0 under DP; 0: no clip).
	Clip float64
	// Tamper is Update.Tamper (the e2e tests' poisoning hook).
	Tamper func(delta []float64)
}

// Pending is what a sum-mode update adds to the aggregator's S beyond the
// noise, and so to the site's record once it is confirmed.
type Pending struct {
	// Join: the update counted the site (V = x + delivered).
	Join bool
	// V is the delivered vector (plus x for a join).
	V []float64
}

// SumDelta is the site's delta: z_j - c_j, or z_j - x for a join, clipped
// to u.Clip when it is > 0, with the clip's report. The base round is the
// record's round (0 for a join).
func SumDelta(u SumUpdate) (delta []float64, baseRound uint64, cl dp.Clipped, err error) {
	n := len(u.Z)
	if len(u.Global) != n {
		return nil, 0, cl, fmt.Errorf("uplink: %d values to send, a global model of %d", n, len(u.Global))
	}
	base := u.Global
	if u.Initial != nil {
		if len(u.Initial) != n {
			return nil, 0, cl, fmt.Errorf("uplink: %d values to send, an initial model of %d", n, len(u.Initial))
		}
		base = u.Initial
	}
	if r := u.Record; r != nil {
		if len(r.C) != n {
			return nil, 0, cl, fmt.Errorf("uplink: the site's record of its contributions has %d values, the model %d: the federation changed its model", len(r.C), n)
		}
		if r.Round == 0 || r.Round >= u.Round {
			return nil, 0, cl, fmt.Errorf("uplink: the site's record is of round %d, this update answers round %d", r.Round, u.Round)
		}
		base, baseRound = r.C, r.Round
	}
	delta = make([]float64, n)
	for i := range delta {
		delta[i] = u.Z[i] - base[i]
	}
	if u.Clip > 0 {
		if delta, cl, err = ClipDelta(delta, nil, u.Clip); err != nil {
			return nil, 0, cl, err
		}
	}
	return delta, baseRound, cl, nil
}

// PendingOf is what an update with the delivered vector d adds to S: d,
// plus x for a join. d is not copied.
func PendingOf(join bool, x, d []float64) (Pending, error) {
	if !join {
		return Pending{V: d}, nil
	}
	if len(x) != len(d) {
		return Pending{}, fmt.Errorf("uplink: %d delivered values, a global model of %d", len(d), len(x))
	}
	v := make([]float64, len(d))
	for i := range v {
		v[i] = x[i] + d[i]
	}
	return Pending{Join: true, V: v}, nil
}

// Advance is the site's record once the aggregator confirmed the update of
// round whose pending contribution is p: p.V for a join (r must be nil),
// r.C + p.V otherwise (r must not be nil). The result is a new Record.
func Advance(r *Record, round uint64, p Pending) (*Record, error) {
	switch {
	case p.Join && r != nil:
		return nil, fmt.Errorf("uplink: round %d joined the sum, but the site has a record of round %d", round, r.Round)
	case p.Join:
		return &Record{Round: round, C: slices.Clone(p.V)}, nil
	case r == nil:
		return nil, fmt.Errorf("uplink: round %d adds to a record the site does not have", round)
	case len(r.C) != len(p.V):
		return nil, fmt.Errorf("uplink: round %d adds %d values to a record of %d", round, len(p.V), len(r.C))
	}
	c := make([]float64, len(r.C))
	for i := range c {
		c[i] = r.C[i] + p.V[i] // bit for bit what the aggregator's S received
	}
	return &Record{Round: round, C: c}, nil
}

// EncodeSum is the site side under central DP (or none): SumDelta, encoded
// with codec c (EncodeBounded: z_j - c_j is the residual already), decoded
// again and re-clipped as the aggregator re-clips it, so Frame.Sum is what
// the update will add to S, bit for bit.
func EncodeSum(c *quant.Codec, u SumUpdate, rng *rand.Rand) (Frame, error) {
	delta, base, cl, err := SumDelta(u)
	if err != nil {
		return Frame{}, err
	}
	if u.Tamper != nil {
		u.Tamper(delta)
	}
	f := Frame{Header: Header{Kind: wire.UpdateKind_UPDATE_KIND_SUM_DELTA, BaseRound: base}, Clipped: cl}
	if f.Payload, err = c.EncodeBounded(nil, delta, rng); err != nil {
		return Frame{}, fmt.Errorf("uplink: encode the update with %s: %w", c, err)
	}
	d, err := c.Decode(f.Payload, nil)
	if err != nil || len(d) != len(delta) {
		return Frame{}, fmt.Errorf("uplink: decode own update (%d values): %w", len(d), err)
	}
	if u.Clip > 0 {
		if err := Reclip(d, u.Clip); err != nil {
			return Frame{}, err
		}
	}
	start := u.Global
	if u.Initial != nil {
		start = u.Initial
	}
	p, err := PendingOf(u.Record == nil, start, d)
	if err != nil {
		return Frame{}, err
	}
	f.Sum = &p
	return f, nil
}

// IsJoin reports whether a sum-mode update joins the sum (under a fixed
// roster: is the site's first, against x_0).
func IsJoin(h Header) bool {
	return h.Kind == wire.UpdateKind_UPDATE_KIND_SUM_DELTA && h.BaseRound == 0
}

// Member is a site the aggregator counts in S.
type Member struct {
	// Instance is the installation that joined ("" = not told).
	Instance string
	// Joined is the round of its join.
	Joined uint64
}

// SumState is the aggregator's whole FedSplit state in sum mode: S, m and
// who is counted.
//
// Two ways of counting. Under secure aggregation (Fixed false) a site is
// counted from its first update (its join adds this round's x to S and 1
// to m): the round's participants are published there anyway. Under
// central DP the selection is secret, and an m that grows when a site is
// first drawn would publish it through the noise scale of x = S/m (the
// step ||x_{t+1} - x_t|| is dominated by z C sqrt(d)/m). So there the
// roster is fixed (Fixed true, StartRoster): every site of the roster is
// counted from round 1 with c_j = x_0, S = m x_0, and m never changes; a
// site's first update is a delta against x_0 and adds only the delta
// (docs/privacy.md, "As built (FedSplit)").
type SumState struct {
	// Fixed: the roster is fixed at round 1 (StartRoster), m = its size.
	Fixed bool
	// S is the sum of every counted site's contributions and of the noise
	// of every round (nil before the first join).
	S []float64
	// M counts the joins: m, the divisor of x = S/m. A site that joined
	// again from a new installation (its state file lost) is counted
	// again; its old record stays in S, as a site that left does.
	M uint64
	// Members are the counted sites by id.
	Members map[string]Member
}

// Clone is a deep copy of st.
func (st *SumState) Clone() *SumState {
	return &SumState{Fixed: st.Fixed, S: slices.Clone(st.S), M: st.M, Members: maps.Clone(st.Members)}
}

// StartRoster counts every site of ids (distinct, non-empty) from the
// start, each with the record x0 (Fixed: S = m x0, m = len(ids)). Only on
// a fixed-roster state that counts nobody yet.
func (st *SumState) StartRoster(ids []string, x0 []float64) error {
	switch {
	case !st.Fixed:
		return errors.New("uplink: a roster for a sum that counts sites on their first update")
	case st.M > 0:
		return fmt.Errorf("uplink: the roster of %d sites is fixed already", st.M)
	case len(ids) == 0:
		return errors.New("uplink: an empty roster")
	}
	members := make(map[string]Member, len(ids))
	for _, id := range ids {
		if _, dup := members[id]; dup || id == "" {
			return fmt.Errorf("uplink: roster member %q empty or repeated", id)
		}
		members[id] = Member{}
	}
	m := float64(len(ids))
	s := make([]float64, len(x0))
	for i, v := range x0 {
		s[i] = m * v
	}
	st.S, st.M, st.Members = s, uint64(len(ids)), members
	return nil
}

// Check is the aggregator's rule for a sum-mode update of client (from
// installation instance) before it is stored: a join from a site it counts
// (same installation, or either not told) and a delta from a site it does
// not count are refused with an error wrapping ErrBaseMismatch. A join
// from another installation of a counted site is a re-join (its state
// file was lost; --reset-state).
func (st *SumState) Check(client, instance string, join bool) error {
	m, counted := st.Members[client]
	if st.Fixed {
		return st.checkRoster(client, instance, join, m, counted)
	}
	switch {
	case join && counted && (m.Instance == "" || instance == "" || m.Instance == instance):
		return fmt.Errorf("%w: %w (joined in round %d); its record advances on the receipt of that update", ErrBaseMismatch, ErrCounted, m.Joined)
	case !join && !counted:
		return fmt.Errorf("%w: %w: a delta against a record the aggregator does not count; the site must join again (--reset-state)", ErrBaseMismatch, ErrNotCounted)
	}
	return nil
}

// ErrReinstalled is wrapped (with ErrBaseMismatch) by a first update from
// a new installation of a roster site that has contributed already: its
// old record stays in S and m is fixed, so it cannot start again at x_0.
var ErrReinstalled = errors.New("this site's record was lost (a new installation) and the roster is fixed: it cannot take part again in this run")

// checkRoster is Check under a fixed roster: a site off the roster, a
// second first update, and a delta from a site that never contributed are
// refused.
func (st *SumState) checkRoster(client, instance string, join bool, m Member, onRoster bool) error {
	switch {
	case st.M > 0 && !onRoster:
		return fmt.Errorf("%w: %w: the site is not on the run's roster (fixed at round 1)", ErrBaseMismatch, ErrNotCounted)
	case join && m.Joined > 0 && (m.Instance == "" || instance == "" || m.Instance == instance):
		return fmt.Errorf("%w: %w (first update in round %d); its record advances on the receipt of that update", ErrBaseMismatch, ErrCounted, m.Joined)
	case join && m.Joined > 0:
		return fmt.Errorf("%w: %w", ErrBaseMismatch, ErrReinstalled)
	case !join && m.Joined == 0:
		return fmt.Errorf("%w: %w: a delta against a record the site never started; the site must start again from x_0", ErrBaseMismatch, ErrNotCounted)
	}
	return nil
}

// SumContribution is one stored sum-mode update of a closed round.
type SumContribution struct {
	Client   string
	Instance string
	Join     bool
	// Delta is the decoded vector (re-clipped in place by ClippedSum).
	Delta []float64
}

// ClippedSum re-clips each contribution's delta to clip (in place; clip 0:
// no clip) and sums them in client-id order (a deterministic sum, the same
// in `simulate` and the daemon) into a new vector of dim values. It is
// ClipSum over contributions held in memory.
func ClippedSum(dim int, cs []SumContribution, clip float64) ([]float64, error) {
	cs = slices.Clone(cs)
	slices.SortFunc(cs, func(a, b SumContribution) int { return strings.Compare(a.Client, b.Client) })
	s := NewClipSum(dim, clip)
	for _, c := range cs {
		if err := s.Add(c.Client, c.Delta); err != nil {
			return nil, err
		}
	}
	return s.Sum(), nil
}

// ClipSum is ClippedSum taken one contribution at a time (a streamed close
// holds one decoded delta, not K): the contributions must come in
// client-id order, ClippedSum's summation order.
type ClipSum struct {
	sum  []float64
	clip float64
	last string
	n    int
}

// NewClipSum starts a ClippedSum of dim values, each delta re-clipped to
// clip (0: no clip).
func NewClipSum(dim int, clip float64) *ClipSum {
	return &ClipSum{sum: make([]float64, dim), clip: clip}
}

// Add re-clips client's delta d in place and adds it; client must not sort
// before the one added last.
func (s *ClipSum) Add(client string, d []float64) error {
	if s.n > 0 && client < s.last {
		return fmt.Errorf("uplink: %s after %s: the contributions are summed in client-id order", client, s.last)
	}
	if len(d) != len(s.sum) {
		return fmt.Errorf("uplink: %s: %d values, a model of %d", client, len(d), len(s.sum))
	}
	if s.clip > 0 {
		if err := Reclip(d, s.clip); err != nil {
			return fmt.Errorf("%s: %w", client, err)
		}
	}
	for i, v := range d {
		s.sum[i] += v
	}
	s.last, s.n = client, s.n+1
	return nil
}

// Sum is the sum so far (the ClipSum's own vector).
func (s *ClipSum) Sum() []float64 { return s.sum }

// Joiner is a site a round's sum counts for the first time.
type Joiner struct {
	Client, Instance string
}

// JoinersOf lists the joins among cs, in client order.
func JoinersOf(cs []SumContribution) []Joiner {
	var js []Joiner
	for _, c := range cs {
		if c.Join {
			js = append(js, Joiner{Client: c.Client, Instance: c.Instance})
		}
	}
	slices.SortFunc(js, func(a, b Joiner) int { return strings.Compare(a.Client, b.Client) })
	return js
}

// Add closes round: every joiner counted (m += 1, S += x each), then
// S += sum (the round's delivered sum, its noise included), and returns
// the next global model S/m (a new slice; x itself while nobody is
// counted). st is changed only when Add succeeds.
func (st *SumState) Add(round uint64, x, sum []float64, joins []Joiner) ([]float64, error) {
	n := len(x)
	switch {
	case len(sum) != n:
		return nil, fmt.Errorf("uplink: a sum of %d values, a model of %d", len(sum), n)
	case st.M > 0 && len(st.S) != n:
		return nil, fmt.Errorf("uplink: the aggregator's sum has %d values, the model %d", len(st.S), n)
	}
	if st.Fixed {
		return st.addRoster(round, sum, joins)
	}
	m := st.M + uint64(len(joins))
	if m == 0 {
		return slices.Clone(x), nil // nobody counted: nothing was sent either
	}
	s := st.S
	if s == nil {
		s = make([]float64, n)
	} else {
		s = slices.Clone(s)
	}
	j := float64(len(joins))
	next := make([]float64, n)
	for i := range s {
		s[i] += j*x[i] + sum[i]
		if math.IsNaN(s[i]) || math.IsInf(s[i], 0) {
			return nil, fmt.Errorf("uplink: the sum overflows at %d", i)
		}
		next[i] = s[i] / float64(m)
	}
	if st.Members == nil {
		st.Members = map[string]Member{}
	}
	for _, jn := range joins {
		st.Members[jn.Client] = Member{Instance: jn.Instance, Joined: round}
	}
	st.S, st.M = s, m
	return next, nil
}

// addRoster is Add under a fixed roster: S += sum; a site's first update
// (a "joiner") is recorded as started, m does not change.
func (st *SumState) addRoster(round uint64, sum []float64, joins []Joiner) ([]float64, error) {
	if st.M == 0 {
		return nil, errors.New("uplink: a round closed before the roster was fixed")
	}
	for _, jn := range joins {
		if _, ok := st.Members[jn.Client]; !ok {
			return nil, fmt.Errorf("uplink: %s is not on the roster", jn.Client)
		}
	}
	s := slices.Clone(st.S)
	next := make([]float64, len(s))
	for i := range s {
		s[i] += sum[i]
		if math.IsNaN(s[i]) || math.IsInf(s[i], 0) {
			return nil, fmt.Errorf("uplink: the sum overflows at %d", i)
		}
		next[i] = s[i] / float64(st.M)
	}
	st.Members = maps.Clone(st.Members)
	for _, jn := range joins {
		st.Members[jn.Client] = Member{Instance: jn.Instance, Joined: round}
	}
	st.S = s
	return next, nil
}

// CloseCentral is the aggregator's central-DP close of round in sum mode:
// ClippedSum to p.Clip, plus N(0, (p.Noise p.Clip)^2) per coordinate from
// rng (the round's dp.NoiseRand) once anybody is counted, then Add.
// p.Denominator is not used: m is st.M. Under a fixed roster everybody is
// counted from round 1, so every round, an empty draw included, is noised.
func (st *SumState) CloseCentral(round uint64, x []float64, cs []SumContribution, p Private, rng *rand.Rand) ([]float64, error) {
	if !(p.Noise > 0) {
		return nil, fmt.Errorf("uplink: DP noise multiplier must be > 0, got %v", p.Noise)
	}
	sum, err := ClippedSum(len(x), cs, p.Clip)
	if err != nil {
		return nil, err
	}
	return st.CloseCentralSum(round, x, sum, JoinersOf(cs), p, rng)
}

// CloseCentralSum is CloseCentral from the round's ClippedSum sum (taken
// by the caller, ClipSum to p.Clip: a streamed close) and its joins
// (JoinersOf the contributions); sum receives the noise.
func (st *SumState) CloseCentralSum(round uint64, x, sum []float64, joins []Joiner, p Private, rng *rand.Rand) ([]float64, error) {
	if !(p.Noise > 0) {
		return nil, fmt.Errorf("uplink: DP noise multiplier must be > 0, got %v", p.Noise)
	}
	if st.M+uint64(len(joins)) > 0 {
		dp.AddNoise(sum, dp.CentralStd(p.Noise, p.Clip), rng)
	}
	return st.Add(round, x, sum, joins)
}

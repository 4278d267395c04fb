package uplink

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/proto/wire"
)

// sumSite is one site of a sum-mode federation in these tests: its z_j,
// its confirmed record and the pending contribution of its last update.
type sumSite struct {
	id      string
	z       []float64
	rec     *Record
	pending *Pending
	round   uint64
}

// TestSumModeInvariant: over rounds of sum-mode updates through every
// codec, with random rejections, what each site adds to its record when
// its update is confirmed is bit for bit what the aggregator re-clipped,
// every delivered vector is within C, and S equals the sum of the sites'
// records plus the noise added (to rounding), so x = S/m.
func TestSumModeInvariant(t *testing.T) {
	const c = 0.3
	for _, spec := range codecs {
		t.Run(spec, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 9))
			site, server := codec(t, spec), codec(t, spec)
			sites := make([]*sumSite, 4)
			for i := range sites {
				sites[i] = &sumSite{id: string(rune('a' + i))}
			}
			st := &SumState{}
			x := randVec(rng, 1)
			noise := make([]float64, dim)
			for round := uint64(1); round <= 15; round++ {
				var cs []SumContribution
				var stored []*sumSite
				for _, s := range sites {
					if s.z == nil {
						s.z = slices.Clone(x)
					}
					for i := range s.z { // a client step of sorts
						s.z[i] += rng.NormFloat64() * 0.5
					}
					f, err := EncodeSum(site, SumUpdate{Round: round, Z: s.z, Global: x, Record: s.rec, Clip: c}, rand.New(rand.NewPCG(round, 1)))
					if err != nil {
						t.Fatal(err)
					}
					if f.Kind != wire.UpdateKind_UPDATE_KIND_SUM_DELTA || IsJoin(f.Header) != (s.rec == nil) {
						t.Fatalf("round %d, %s: header %+v with record %v", round, s.id, f.Header, s.rec != nil)
					}
					if rng.IntN(4) == 0 {
						continue // rejected: not in S, the record stays
					}
					if err := st.Check(s.id, "", IsJoin(f.Header)); err != nil {
						t.Fatalf("round %d, %s: %v", round, s.id, err)
					}
					d, err := server.Decode(f.Payload, nil)
					if err != nil {
						t.Fatal(err)
					}
					cs = append(cs, SumContribution{Client: s.id, Join: IsJoin(f.Header), Delta: d})
					s.pending, s.round = f.Sum, round
					stored = append(stored, s)
				}
				before := slices.Clone(cs)
				for i := range before {
					before[i].Delta = slices.Clone(cs[i].Delta)
				}
				next, err := st.CloseCentral(round, x, cs, Private{Clip: c, Noise: 0.01}, dp.NoiseRand(dp.TestKey(2), round))
				if err != nil {
					t.Fatal(err)
				}
				// What the aggregator added for each site, alone.
				for i, s := range stored {
					alone, err := ClippedSum(dim, before[i:i+1], c)
					if err != nil {
						t.Fatal(err)
					}
					if n := dp.Norm(alone); n > c {
						t.Fatalf("round %d, %s: delivered norm %v > C", round, s.id, n)
					}
					want, _ := PendingOf(s.pending.Join, x, alone)
					if !bitsEqual(want.V, s.pending.V) {
						t.Fatalf("round %d, %s: the site's pending contribution is not what the aggregator added", round, s.id)
					}
					if s.rec, err = Advance(s.rec, s.round, *s.pending); err != nil {
						t.Fatal(err)
					}
				}
				// The noise this round: S minus every record.
				x = next
				total := make([]float64, dim)
				for _, s := range sites {
					if s.rec != nil {
						for i, v := range s.rec.C {
							total[i] += v
						}
					}
				}
				if st.M == 0 {
					continue
				}
				for i := range noise {
					noise[i] = st.S[i] - total[i]
					if math.Abs(x[i]-st.S[i]/float64(st.M)) > 0 {
						t.Fatalf("round %d: x is not S/m", round)
					}
				}
				// Noise of std 0.01 * C per round: far below 1.
				if n := dp.Norm(noise); n > 0.1 {
					t.Fatalf("round %d: S differs from the sum of the records by %v", round, n)
				}
			}
			if st.M != uint64(len(sites)) || len(st.Members) != len(sites) {
				t.Fatalf("m = %d, %d members, want %d", st.M, len(st.Members), len(sites))
			}
		})
	}
}

// TestSumModeWithoutNoiseIsFedSplitSum: with no clip and a lossless codec
// (and no noise worth the name), once every site has delivered its delta,
// S/m is the mean of the z_j, FedSplit's server step.
func TestSumModeWithoutNoiseIsFedSplitSum(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	c := codec(t, "fp32")
	x := randVec(rng, 1)
	st := &SumState{}
	zs := [][]float64{randVec(rng, 1), randVec(rng, 1), randVec(rng, 1)}
	recs := make([]*Record, len(zs))
	for round := uint64(1); round <= 2; round++ {
		var cs []SumContribution
		var ps []Pending
		for j, z := range zs {
			f, err := EncodeSum(c, SumUpdate{Round: round, Z: z, Global: x, Record: recs[j]}, nil)
			if err != nil {
				t.Fatal(err)
			}
			d, _ := c.Decode(f.Payload, nil)
			cs = append(cs, SumContribution{Client: string(rune('a' + j)), Join: IsJoin(f.Header), Delta: d})
			ps = append(ps, *f.Sum)
		}
		sum, err := ClippedSum(dim, cs, 0)
		if err != nil {
			t.Fatal(err)
		}
		if x, err = st.Add(round, x, sum, JoinersOf(cs)); err != nil {
			t.Fatal(err)
		}
		for j := range recs {
			recs[j], _ = Advance(recs[j], round, ps[j])
		}
	}
	for i := range x {
		mean := float64(float32(zs[0][i])+float32(zs[1][i])+float32(zs[2][i])) / 3
		if math.Abs(x[i]-mean) > 1e-6 {
			t.Fatalf("x[%d] = %v, the mean of the z_j (fp32) is %v", i, x[i], mean)
		}
	}
}

// TestSumCheck: the aggregator's rule for joins and deltas.
func TestSumCheck(t *testing.T) {
	st := &SumState{M: 2, S: make([]float64, 3), Members: map[string]Member{"a": {Instance: "I1", Joined: 1}, "b": {Joined: 2}}}
	tests := []struct {
		client, instance string
		join             bool
		want             error
	}{
		{"a", "I1", false, nil},
		{"a", "I1", true, ErrCounted},
		{"a", "", true, ErrCounted},
		{"a", "I2", true, nil}, // a new installation joins again
		{"b", "I9", true, ErrCounted},
		{"c", "I3", true, nil},
		{"c", "I3", false, ErrNotCounted},
	}
	for _, tt := range tests {
		err := st.Check(tt.client, tt.instance, tt.join)
		if tt.want == nil && err != nil || tt.want != nil && (!errors.Is(err, tt.want) || !errors.Is(err, ErrBaseMismatch)) {
			t.Errorf("Check(%q, %q, join %v) = %v, want %v", tt.client, tt.instance, tt.join, err, tt.want)
		}
	}
}

// TestSumAddJoins: joins count the site and add x; a rejoin counts again;
// nobody counted keeps x; a failed Add changes nothing.
func TestSumAddJoins(t *testing.T) {
	x := []float64{1, 2}
	st := &SumState{}
	next, err := st.Add(1, x, []float64{0, 0}, nil)
	if err != nil || !slices.Equal(next, x) || st.M != 0 || st.S != nil {
		t.Fatalf("nobody counted: %v, %v, %+v", next, err, st)
	}
	next, err = st.Add(2, x, []float64{2, 0}, []Joiner{{"a", "I1"}, {"b", ""}})
	if err != nil || !slices.Equal(next, []float64{2, 2}) || st.M != 2 {
		t.Fatalf("two joins: %v, %v, %+v", next, err, st)
	}
	next, err = st.Add(3, next, []float64{0, 0}, []Joiner{{"a", "I2"}})
	if err != nil || !slices.Equal(next, []float64{2, 2}) || st.M != 3 || st.Members["a"] != (Member{Instance: "I2", Joined: 3}) {
		t.Fatalf("a rejoin: %v, %v, %+v", next, err, st)
	}
	before := st.Clone()
	if _, err := st.Add(4, []float64{math.MaxFloat64, 0}, []float64{math.MaxFloat64, 0}, []Joiner{{"c", ""}}); err == nil {
		t.Fatal("an overflowing sum was added")
	}
	if _, err := st.Add(4, x, []float64{1}, nil); err == nil {
		t.Fatal("a sum of another dimension was added")
	}
	if !slices.Equal(before.S, st.S) || before.M != st.M {
		t.Fatal("a failed Add changed the state")
	}
}

// TestAdvanceRules: the record's confirmation rule refuses what cannot
// happen instead of inventing a record.
func TestAdvanceRules(t *testing.T) {
	r, err := Advance(nil, 3, Pending{Join: true, V: []float64{1, 2}})
	if err != nil || r.Round != 3 || !slices.Equal(r.C, []float64{1, 2}) {
		t.Fatalf("join: %+v, %v", r, err)
	}
	r2, err := Advance(r, 4, Pending{V: []float64{0.5, 0.5}})
	if err != nil || r2.Round != 4 || !slices.Equal(r2.C, []float64{1.5, 2.5}) || !slices.Equal(r.C, []float64{1, 2}) {
		t.Fatalf("add: %+v, %v (the old record must not change: %v)", r2, err, r.C)
	}
	for _, bad := range []struct {
		r *Record
		p Pending
	}{{r, Pending{Join: true, V: []float64{1, 2}}}, {nil, Pending{V: []float64{1, 2}}}, {r, Pending{V: []float64{1}}}} {
		if _, err := Advance(bad.r, 5, bad.p); err == nil {
			t.Errorf("Advance(%+v, %+v) succeeded", bad.r, bad.p)
		}
	}
	if _, _, _, err := SumDelta(SumUpdate{Round: 4, Z: []float64{1, 2}, Global: []float64{0, 0}, Record: r2}); err == nil {
		t.Error("a record of the update's own round was used")
	}
	if _, _, _, err := SumDelta(SumUpdate{Round: 9, Z: []float64{1, 2, 3}, Global: []float64{0, 0, 0}, Record: r2}); err == nil {
		t.Error("a record of another dimension was used")
	}
}

// TestSumRoster: under a fixed roster every roster site is counted from
// the start with x_0 (S = m x_0), m never moves, a site's first update adds
// only its delta, and the check refuses what would break S = sum_j c_j.
func TestSumRoster(t *testing.T) {
	x0 := []float64{1, -2}
	st := &SumState{Fixed: true}
	if _, err := (&SumState{}).Clone().Add(1, x0, []float64{0, 0}, nil); err != nil {
		t.Fatal(err)
	}
	if err := (&SumState{}).StartRoster([]string{"a"}, x0); err == nil {
		t.Fatal("a roster for a sum that counts on the first update")
	}
	if err := st.StartRoster([]string{"a", "a"}, x0); err == nil {
		t.Fatal("a repeated roster member")
	}
	if err := st.StartRoster([]string{"a", "b", "c"}, x0); err != nil {
		t.Fatal(err)
	}
	if st.M != 3 || !slices.Equal(st.S, []float64{3, -6}) {
		t.Fatalf("roster: %+v", st)
	}
	if err := st.StartRoster([]string{"d"}, x0); err == nil {
		t.Fatal("the roster was fixed twice")
	}
	// Round 1: a's first update (a join against x_0) moves S by its delta only.
	next, err := st.Add(1, x0, []float64{3, 0}, []Joiner{{"a", "I1"}})
	if err != nil || st.M != 3 || !slices.Equal(next, []float64{2, -2}) || st.Members["a"] != (Member{Instance: "I1", Joined: 1}) {
		t.Fatalf("round 1: %v, %v, %+v", next, err, st)
	}
	// An empty round: m stays, the model moves by the (noise) sum only.
	next, err = st.Add(2, next, []float64{0, 3}, nil)
	if err != nil || st.M != 3 || !slices.Equal(next, []float64{2, -1}) {
		t.Fatalf("round 2: %v, %v, %+v", next, err, st)
	}
	if _, err := st.Add(3, next, []float64{0, 0}, []Joiner{{"z", ""}}); err == nil {
		t.Fatal("a site off the roster was counted")
	}
	tests := []struct {
		client, instance string
		join             bool
		want             error
	}{
		{"a", "I1", false, nil},
		{"a", "I1", true, ErrCounted},
		{"a", "I2", true, ErrReinstalled}, // its old record stays in S: it cannot restart at x_0
		{"b", "I3", true, nil},            // b's first update
		{"b", "I3", false, ErrNotCounted}, // a delta against a record b never started
		{"z", "I4", true, ErrNotCounted},  // off the roster
		{"z", "I4", false, ErrNotCounted},
	}
	for _, tt := range tests {
		err := st.Check(tt.client, tt.instance, tt.join)
		if tt.want == nil && err != nil || tt.want != nil && (!errors.Is(err, tt.want) || !errors.Is(err, ErrBaseMismatch)) {
			t.Errorf("Check(%q, %q, join %v) = %v, want %v", tt.client, tt.instance, tt.join, err, tt.want)
		}
	}
	// The site side: a first update is a delta against x_0, not against x.
	x := []float64{5, 5}
	u := SumUpdate{Round: 4, Z: []float64{2, -1}, Global: x, Initial: x0}
	d, base, _, err := SumDelta(u)
	if err != nil || base != 0 || !slices.Equal(d, []float64{1, 1}) {
		t.Fatalf("first delta: %v, %d, %v", d, base, err)
	}
	f, err := EncodeSum(codec(t, "fp32"), u, nil)
	if err != nil || !f.Sum.Join || !slices.Equal(f.Sum.V, []float64{2, -1}) {
		t.Fatalf("pending of a first update: %+v, %v", f.Sum, err)
	}
}

func sampleSumState() *SumState {
	return &SumState{S: []float64{1.5, -2, 0}, M: 3, Members: map[string]Member{"site-b": {Instance: "ABC", Joined: 2}, "site-a": {Joined: 1}}}
}

// TestSumStateRoundTrip: MarshalBinary and UnmarshalBinary agree, and
// UnmarshalBinary refuses every truncation and the inconsistent states.
func TestSumStateRoundTrip(t *testing.T) {
	fixed := sampleSumState()
	fixed.Fixed, fixed.Members["site-c"] = true, Member{}
	for _, st := range []*SumState{{}, sampleSumState(), {Fixed: true}, fixed} {
		b, err := st.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var got SumState
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatal(err)
		}
		if got.Fixed != st.Fixed || got.M != st.M || !slices.Equal(got.S, st.S) || len(got.Members) != len(st.Members) {
			t.Fatalf("round trip: %+v, want %+v", got, st)
		}
		for id, m := range st.Members {
			if got.Members[id] != m {
				t.Fatalf("member %s: %+v, want %+v", id, got.Members[id], m)
			}
		}
		for n := range len(b) {
			if err := got.UnmarshalBinary(b[:n]); err == nil {
				t.Fatalf("a truncation to %d of %d bytes decoded", n, len(b))
			}
		}
		if err := got.UnmarshalBinary(append(b, 0)); err == nil {
			t.Fatal("a trailing byte decoded")
		}
	}
	for _, bad := range []*SumState{{M: 1}, {S: []float64{1}}, {M: 1, S: []float64{1}, Members: map[string]Member{"a": {}, "b": {}}},
		{Fixed: true, M: 2, S: []float64{1}, Members: map[string]Member{"a": {}}}} {
		if _, err := bad.MarshalBinary(); err == nil {
			t.Errorf("%+v encoded", bad)
		}
	}
}

// FuzzSumState: any bytes either fail to decode or decode to a state that
// encodes back to the same bytes (the form is canonical).
func FuzzSumState(f *testing.F) {
	fixed := sampleSumState()
	fixed.Fixed, fixed.Members["site-c"] = true, Member{}
	for _, st := range []*SumState{{}, sampleSumState(), fixed} {
		b, _ := st.MarshalBinary()
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var st SumState
		if err := st.UnmarshalBinary(b); err != nil {
			return
		}
		again, err := st.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded state does not encode: %v", err)
		}
		if string(again) != string(b) {
			t.Fatalf("not canonical")
		}
	})
}

// TestSumRosterEmptyFirstRound: under a fixed roster an empty first draw
// releases x_0 plus noise of std z C/m per coordinate, like any round; a
// sum that counts on first updates released x_0 unchanged, without noise,
// which told everyone that nobody had been drawn.
func TestSumRosterEmptyFirstRound(t *testing.T) {
	x0 := make([]float64, 4000)
	const m, z, c = 5, 1.0, 0.5
	for _, fixed := range []bool{false, true} {
		st := &SumState{Fixed: fixed}
		if fixed {
			if err := st.StartRoster([]string{"a", "b", "c", "d", "e"}, x0); err != nil {
				t.Fatal(err)
			}
		}
		next, err := st.CloseCentral(1, x0, nil, Private{Clip: c, Noise: z}, dp.NoiseRand(dp.TestKey(5), 1))
		if err != nil {
			t.Fatal(err)
		}
		var ss float64
		for _, v := range next {
			ss += v * v
		}
		std := math.Sqrt(ss / float64(len(next)))
		if !fixed {
			if std != 0 {
				t.Fatalf("counting on first updates: an empty round 1 moved x_0 (std %v)", std)
			}
			continue
		}
		if want := z * c / m; math.Abs(std-want) > 0.05*want {
			t.Errorf("fixed roster: an empty round 1 released noise of std %v, want z C/m = %v", std, want)
		}
	}
}

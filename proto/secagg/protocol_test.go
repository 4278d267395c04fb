package secagg

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

// expectAbort says whether a complete-graph session must abort: fewer than
// t sites take part in some round.
func expectAbort(dropAt []int, t int) bool {
	for r := 0; r <= 3; r++ {
		n := 0
		for _, d := range dropAt {
			if d > r {
				n++
			}
		}
		if n < t {
			return true
		}
	}
	return false
}

// checkOutcome asserts the only two acceptable endings: the exact sum of the
// survivors' inputs, or a clean abort (ErrTooFewSites) when too few remain.
func checkOutcome(t *testing.T, s session, o outcome) {
	t.Helper()
	for i, err := range o.siteErrs {
		if err != nil {
			t.Fatalf("site %d: %v", i, err)
		}
	}
	if expectAbort(s.dropAt, s.cfg.Threshold) {
		if !errors.Is(o.err, ErrTooFewSites) {
			t.Fatalf("dropAt %v, t %d: want ErrTooFewSites, got sum %v err %v", s.dropAt, s.cfg.Threshold, o.sum != nil, o.err)
		}
		if _, err := o.server.Sum(); !errors.Is(err, ErrAborted) {
			t.Fatalf("an aborted session gives a sum: %v", err)
		}
		return
	}
	if o.err != nil {
		t.Fatalf("dropAt %v, t %d: %v", s.dropAt, s.cfg.Threshold, o.err)
	}
	want := plainSum(o.inputs, s.dropAt)
	if !slices.Equal(o.sum, want) {
		t.Fatalf("dropAt %v: unmasked sum differs from the plain sum", s.dropAt)
	}
	// In the integer domain: no wrap, each coordinate the exact sum.
	for j := range want {
		var n int64
		for i, in := range o.inputs {
			if s.dropAt[i] > 2 {
				n += Signed(in[j])
			}
		}
		if Signed(o.sum[j]) != n {
			t.Fatalf("coordinate %d: %d, want %d", j, Signed(o.sum[j]), n)
		}
	}
	var surv []string
	for i, d := range s.dropAt {
		if d > 2 {
			surv = append(surv, siteID(i))
		}
	}
	if !slices.Equal(o.server.Survivors(), surv) {
		t.Fatalf("survivors %v, want %v", o.server.Survivors(), surv)
	}
}

// TestExactSumWithDropouts is the property test: for K = 2..50 sites and
// random dropout patterns (each site drops before round 0, 1, 2 or 3 or
// never, seeded), the session either yields exactly the plain sum of the
// quantised inputs of the sites whose masked input arrived, or aborts with
// ErrTooFewSites when fewer than t sites remain in some round.
func TestExactSumWithDropouts(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 2))
	patterns := 2
	if testing.Short() {
		patterns = 1
	}
	aborts, sums := 0, 0
	for k := 2; k <= 50; k++ {
		for p := range patterns {
			dropAt := make([]int, k)
			rate := []float64{0.45, 0.15, 0}[(k+p)%3]
			for i := range dropAt {
				dropAt[i] = 4
				if r.Float64() < rate {
					dropAt[i] = r.IntN(4)
				}
			}
			s := session{cfg: Config{Threshold: DefaultThreshold(k), Dim: 9}, k: k, dropAt: dropAt, seed: uint64(100*k + p), persist: (k+p)%4 == 1}
			o := s.run(t)
			checkOutcome(t, s, o)
			if o.err != nil {
				aborts++
			} else {
				sums++
			}
		}
	}
	t.Logf("%d exact sums, %d clean aborts", sums, aborts)
	if sums == 0 || aborts == 0 {
		t.Fatalf("the patterns should give both sums and aborts")
	}
}

// TestDropoutAfterEachPhase drops a third of the sites after each phase in
// turn (and all phases at once), and one site short of the threshold.
func TestDropoutAfterEachPhase(t *testing.T) {
	const k = 12
	th := DefaultThreshold(k) // 8
	cases := []struct {
		name string
		drop map[int]int // site -> round it drops before
	}{
		{"none", nil},
		{"before advertise", map[int]int{0: 0, 5: 0, 7: 0, 11: 0}},
		{"before share keys", map[int]int{1: 1, 2: 1, 3: 1, 4: 1}},
		{"before masked input", map[int]int{0: 2, 6: 2, 9: 2, 10: 2}},
		{"before unmasking", map[int]int{1: 3, 3: 3, 8: 3, 11: 3}},
		{"one per phase", map[int]int{0: 0, 1: 1, 2: 2, 3: 3}},
		{"below t at advertise", map[int]int{0: 0, 1: 0, 2: 0, 3: 0, 4: 0}},
		{"below t at share keys", map[int]int{0: 1, 1: 1, 2: 1, 3: 1, 4: 1}},
		{"below t at masked input", map[int]int{0: 2, 1: 2, 2: 2, 3: 2, 4: 2}},
		{"below t at unmasking", map[int]int{0: 3, 1: 3, 2: 3, 3: 3, 4: 3}},
		{"below t over phases", map[int]int{0: 0, 1: 1, 2: 2, 3: 3, 4: 3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dropAt := make([]int, k)
			for i := range dropAt {
				dropAt[i] = 4
			}
			for i, r := range tc.drop {
				dropAt[i] = r
			}
			for _, persist := range []bool{false, true} {
				s := session{cfg: Config{Threshold: th, Dim: 33}, k: k, dropAt: dropAt, seed: 7, persist: persist}
				checkOutcome(t, s, s.run(t))
			}
		})
	}
}

// TestSparseGraph runs SecAgg+'s neighbour graph: degree 8 among 40 sites,
// threshold 6 of the 9 holders of each secret, with dropouts in every phase.
func TestSparseGraph(t *testing.T) {
	const k = 40
	r := rand.New(rand.NewPCG(4, 0))
	for p := range 4 {
		dropAt := make([]int, k)
		for i := range dropAt {
			dropAt[i] = 4
			if r.Float64() < 0.1 {
				dropAt[i] = r.IntN(4)
			}
		}
		s := session{cfg: Config{Threshold: 6, Degree: 8, GraphSeed: [32]byte{byte(p)}, Dim: 17}, k: k, dropAt: dropAt, seed: uint64(p), persist: p == 0}
		o := s.run(t)
		if o.err != nil {
			// With a sparse graph a neighbourhood can run short while the
			// federation does not; the abort must still be the clean one.
			if !errors.Is(o.err, ErrTooFewSites) {
				t.Fatalf("pattern %d: %v", p, o.err)
			}
			continue
		}
		// Sites pruned from U2 (too few holders left) are not survivors.
		want := make([]uint32, s.cfg.Dim)
		for _, id := range o.server.Survivors() {
			i := slices.Index(idsOf(k), id)
			AddRing(want, o.inputs[i])
		}
		if !slices.Equal(o.sum, want) {
			t.Fatalf("pattern %d: sum differs", p)
		}
		if n := len(o.server.Survivors()); n < k*6/10 {
			t.Fatalf("pattern %d: only %d survivors", p, n)
		}
	}
}

func idsOf(k int) []string {
	out := make([]string, k)
	for i := range out {
		out[i] = siteID(i)
	}
	return out
}

// neighbours returns every row of the graph.
func neighbours(n, degree int, seed [KeySize]byte, session []byte) [][]int {
	g := newGraph(n, degree, seed, session)
	out := make([][]int, n)
	for i := range out {
		out[i] = g.of(i)
	}
	return out
}

func TestGraphRegularSymmetric(t *testing.T) {
	for _, tc := range []struct{ n, d int }{{10, 2}, {10, 4}, {100, 14}, {9, 8}, {5, 6}} {
		g := neighbours(tc.n, tc.d, [32]byte{1}, []byte("s"))
		h := neighbours(tc.n, tc.d, [32]byte{1}, []byte("s"))
		want := min(tc.d, tc.n-1)
		for i, nb := range g {
			if len(nb) != want || !slices.Equal(nb, h[i]) {
				t.Fatalf("n %d d %d: site %d has %v", tc.n, tc.d, i, nb)
			}
			for _, j := range nb {
				if j == i || !slices.Contains(g[j], i) {
					t.Fatalf("n %d d %d: edge %d-%d not symmetric", tc.n, tc.d, i, j)
				}
			}
		}
	}
	// Connectivity: a cycle (degree 2) cut in two places falls apart; the
	// complete graph needs two survivors.
	ring := newGraph(10, 2, [32]byte{3}, []byte("s"))
	in := make([]bool, 10)
	for i := range in {
		in[i] = true
	}
	if !ring.connected(in) {
		t.Fatal("the whole cycle is not connected")
	}
	in[ring.perm[2]], in[ring.perm[6]] = false, false
	if ring.connected(in) {
		t.Fatal("a cycle cut twice is connected")
	}
	in[ring.perm[6]] = true
	if !ring.connected(in) {
		t.Fatal("a cycle cut once is not connected")
	}
	full := newGraph(5, 0, [32]byte{}, nil)
	if full.connected([]bool{false, true, false, false, false}) || !full.connected([]bool{false, true, true, false, false}) {
		t.Fatal("complete graph connectivity")
	}
	a := neighbours(100, 14, [32]byte{1}, []byte("s"))
	b := neighbours(100, 14, [32]byte{2}, []byte("s"))
	if slices.EqualFunc(a, b, slices.Equal) {
		t.Fatal("the graph does not depend on its seed")
	}
}

// TestServerSeesNoInput searches everything the server received and every
// state it stored for each site's plain quantised vector, whole and in
// every 16-byte window.
func TestServerSeesNoInput(t *testing.T) {
	const k = 10
	dropAt := []int{4, 4, 2, 4, 3, 4, 4, 4, 4, 4}
	s := session{cfg: Config{Threshold: DefaultThreshold(k), Dim: 64}, k: k, dropAt: dropAt, seed: 3}
	o := s.run(t)
	checkOutcome(t, s, o)
	hay := bytes.Join(append(o.received, o.states...), nil)
	if len(hay) < 10000 {
		t.Fatalf("only %d bytes searched", len(hay))
	}
	for i, in := range o.inputs {
		plain := make([]byte, 0, 4*len(in))
		for _, v := range in {
			plain = binary.LittleEndian.AppendUint32(plain, v)
		}
		for off := 0; off+16 <= len(plain); off += 4 {
			if bytes.Contains(hay, plain[off:off+16]) {
				t.Fatalf("site %d's input bytes %d..%d appear in what the server saw", i, off, off+16)
			}
		}
	}
	// The check has teeth: the plain sum is there, in the final state.
	sum := make([]byte, 0, 4*s.cfg.Dim)
	for _, v := range o.sum {
		sum = binary.LittleEndian.AppendUint32(sum, v)
	}
	if !bytes.Contains(o.states[len(o.states)-1], sum[:16]) {
		t.Fatal("the search does not find the sum the final state holds")
	}
}

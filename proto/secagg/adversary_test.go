package secagg

import (
	"bytes"
	"errors"
	"slices"
	"testing"
)

// staged is a session driven by hand to the unmasking round.
type staged struct {
	srv     *Server
	cls     []*Client
	kl      *KeyList
	sls     []*ShareList // by site
	req     *UnmaskRequest
	inputs  [][]uint32
	session []byte
}

// stage runs k sites to the point where the server has sent the
// UnmaskRequest; the sites in maskDrop send no masked input.
func stage(t testing.TB, k int, maskDrop ...int) *staged {
	t.Helper()
	st, err := stageConfig(t, Config{Threshold: DefaultThreshold(k), Dim: 8}, k, maskDrop...)
	must(t, err)
	return st
}

// stageConfig is stage with a configuration; it returns the server's error
// at the last Advance.
func stageConfig(t testing.TB, cfg Config, k int, maskDrop ...int) (*staged, error) {
	t.Helper()
	rnd := seeded(11)
	st := &staged{session: []byte("staged"), sls: make([]*ShareList, k)}
	var err error
	if st.srv, err = NewServer(cfg, st.session); err != nil {
		t.Fatal(err)
	}
	for i := range k {
		c, err := NewClient(cfg, st.session, siteID(i), rnd)
		if err != nil {
			t.Fatal(err)
		}
		st.cls = append(st.cls, c)
		st.inputs = append(st.inputs, []uint32{uint32(i), 1, 2, 3, 4, 5, 6, uint32(1000 * i)})
		must(t, st.srv.Receive(c.Advertise()))
	}
	out, err := st.srv.Advance()
	must(t, err)
	st.kl = out[0].Msg.(*KeyList)
	for _, c := range st.cls {
		m, err := c.ShareKeys(st.kl, rnd)
		must(t, err)
		must(t, st.srv.Receive(m))
	}
	out, err = st.srv.Advance()
	must(t, err)
	for i, g := range out {
		st.sls[i] = g.Msg.(*ShareList)
		if slices.Contains(maskDrop, i) {
			continue
		}
		m, err := st.cls[i].MaskInput(st.sls[i], st.inputs[i])
		must(t, err)
		must(t, st.srv.Receive(m))
	}
	if out, err = st.srv.Advance(); err != nil {
		return st, err
	}
	st.req = out[0].Msg.(*UnmaskRequest)
	return st, nil
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestTamperedShareBox: a box changed in transit fails AES-GCM at the
// holder, which refuses to go on (ErrTampered); the others finish with the
// exact sum of their inputs.
func TestTamperedShareBox(t *testing.T) {
	dropAt := []int{4, 4, 4, 4, 4, 4}
	s := session{cfg: Config{Threshold: 4, Dim: 5}, k: 6, dropAt: dropAt, seed: 9}
	s.tamper = func(m Message) {
		if sl, ok := m.(*ShareList); ok && sl.To == siteID(2) {
			sl.Boxes[1].Box = bytes.Clone(sl.Boxes[1].Box)
			sl.Boxes[1].Box[3] ^= 0x40
		}
	}
	o := s.run(t)
	if !errors.Is(o.siteErrs[2], ErrTampered) {
		t.Fatalf("site 2: %v", o.siteErrs[2])
	}
	if o.err != nil {
		t.Fatal(o.err)
	}
	dropAt[2] = 2 // it sent no masked input
	if !slices.Equal(o.sum, plainSum(o.inputs, dropAt)) {
		t.Fatal("wrong sum")
	}
}

// TestTamperedRevealedShare: a changed share in round 3 makes the
// reconstructed secret fail its check (the advertised mask key of a dropped
// site, the commitment to a survivor's seed): the session aborts with
// ErrTampered, never a wrong sum.
func TestTamperedRevealedShare(t *testing.T) {
	for _, kind := range []ShareKind{ShareSelf, ShareMaskKey} {
		st := stage(t, 7, 5) // site 5 dropped before its masked input
		for i, c := range st.cls {
			if i == 5 {
				continue
			}
			m, err := c.Unmask(st.req)
			must(t, err)
			if i == 0 { // site 0 is among the first t holders of every secret
				for j := range m.Shares {
					if m.Shares[j].Kind == kind {
						m.Shares[j].Value[20] ^= 1
						break
					}
				}
			}
			must(t, st.srv.Receive(m))
		}
		_, err := st.srv.Advance()
		if !errors.Is(err, ErrTampered) {
			t.Fatalf("kind %d: %v", kind, err)
		}
		if sum, err := st.srv.Sum(); sum != nil || !errors.Is(err, ErrAborted) {
			t.Fatalf("kind %d: an aborted session gives %v, %v", kind, sum, err)
		}
	}
}

// TestTamperedBytes: any changed byte of an encoded message fails its
// checksum or its structure.
func TestTamperedBytes(t *testing.T) {
	st := stage(t, 4)
	b := Encode(st.req)
	for i := range b {
		c := bytes.Clone(b)
		c[i] ^= 0x10
		if _, err := Decode(c); err == nil {
			t.Fatalf("byte %d changed and the message still decodes", i)
		}
	}
}

// TestPrivacyRule: a site reveals one kind of share per site, whatever it is
// asked later.
func TestPrivacyRule(t *testing.T) {
	st := stage(t, 6)
	c := st.cls[0]
	first, err := c.Unmask(st.req)
	must(t, err)
	for _, s := range first.Shares {
		if s.Kind != ShareSelf {
			t.Fatalf("a share of kind %d for survivor %s", s.Kind, s.Of)
		}
	}
	again, err := c.Unmask(st.req)
	must(t, err)
	if !bytes.Equal(Encode(first), Encode(again)) {
		t.Fatal("the same request answered differently")
	}
	// The server now claims site 3 dropped: its mask key share would join
	// the self-mask share already given.
	lie := &UnmaskRequest{Session: st.session, Survivors: slices.Delete(slices.Clone(st.req.Survivors), 3, 4)}
	if _, err := c.Unmask(lie); !errors.Is(err, ErrPrivacy) {
		t.Fatalf("a contradicting request: %v", err)
	}
	// ... and the refusal holds across a restart from the stored state.
	b, _ := c.MarshalBinary()
	c2, err := UnmarshalClient(b)
	must(t, err)
	if _, err := c2.Unmask(lie); !errors.Is(err, ErrPrivacy) {
		t.Fatalf("after a restart: %v", err)
	}
	// The other way: a site told first that site 3 dropped never reveals
	// its self-mask share.
	c1 := st.cls[1]
	_, err = c1.Unmask(lie)
	must(t, err)
	if _, err := c1.Unmask(st.req); !errors.Is(err, ErrPrivacy) {
		t.Fatalf("self-mask share after a mask-key share: %v", err)
	}
	// Not a survivor, too few survivors, before the masked input.
	notMe := &UnmaskRequest{Session: st.session, Survivors: slices.Delete(slices.Clone(st.req.Survivors), 4, 5)}
	if _, err := st.cls[4].Unmask(notMe); err == nil {
		t.Fatal("a site not in U3 revealed shares")
	}
	few := &UnmaskRequest{Session: st.session, Survivors: st.req.Survivors[:3]}
	if _, err := st.cls[2].Unmask(few); !errors.Is(err, ErrTooFewSites) {
		t.Fatalf("3 survivors, threshold 4: %v", err)
	}
	fresh, err := NewClient(Config{Threshold: 4, Dim: 8}, st.session, "late", seeded(1))
	must(t, err)
	if _, err := fresh.Unmask(st.req); !errors.Is(err, ErrPhase) {
		t.Fatalf("unmask before masking: %v", err)
	}
}

// TestIdempotent: a repeated server message gets the same answer, a
// different one ErrConflict; the server ignores a duplicate and refuses a
// different second message from a site.
func TestIdempotent(t *testing.T) {
	st := stage(t, 5)
	c := st.cls[1]
	a, err := c.ShareKeys(st.kl, seeded(99)) // other randomness: still the first answer
	must(t, err)
	b, err := c.ShareKeys(st.kl, seeded(98))
	must(t, err)
	if !bytes.Equal(Encode(a), Encode(b)) {
		t.Fatal("ShareKeys answered twice differently")
	}
	other := &KeyList{Session: st.session, Sites: st.kl.Sites[:4]}
	if _, err := c.ShareKeys(other, seeded(1)); !errors.Is(err, ErrConflict) {
		t.Fatalf("another key list: %v", err)
	}
	m1, err := c.MaskInput(st.sls[1], st.inputs[1])
	must(t, err)
	m2, err := c.MaskInput(st.sls[1], make([]uint32, 8))
	must(t, err)
	if !slices.Equal(m1.Masked, m2.Masked) {
		t.Fatal("MaskInput answered twice differently")
	}
	// The server: the duplicate is fine, a changed vector is a conflict,
	// an old round's message is ErrPhase.
	srv := st.srv
	if err := srv.Receive(c.Advertise()); !errors.Is(err, ErrPhase) {
		t.Fatalf("an advert in the unmask round: %v", err)
	}
	r, err := c.Unmask(st.req)
	must(t, err)
	must(t, srv.Receive(r))
	must(t, srv.Receive(r))
	r2 := *r
	r2.Shares = slices.Clone(r.Shares)
	r2.Shares[0].Value[0] ^= 1
	if err := srv.Receive(&r2); !errors.Is(err, ErrConflict) {
		t.Fatalf("a changed response: %v", err)
	}
	wrong := &UnmaskResponse{Session: []byte("other"), ID: r.ID, Shares: r.Shares}
	if err := srv.Receive(wrong); !errors.Is(err, ErrPhase) {
		t.Fatalf("another session: %v", err)
	}
}

// TestStateRoundTrip: every state a session passes through marshals and
// unmarshals to the same bytes.
func TestStateRoundTrip(t *testing.T) {
	st := stage(t, 5, 2)
	for i, c := range st.cls {
		b, _ := c.MarshalBinary()
		c2, err := UnmarshalClient(b)
		must(t, err)
		b2, _ := c2.MarshalBinary()
		if !bytes.Equal(b, b2) {
			t.Fatal("client state changes on a round trip")
		}
		want := KindMaskedInput
		if i == 2 { // dropped before its masked input
			want = KindShareKeys
		}
		if k := c2.Pending().Kind(); k != want {
			t.Fatalf("site %d re-sends a %v, want %v", i, k, want)
		}
	}
	b, _ := st.srv.MarshalBinary()
	s2, err := UnmarshalServer(b)
	must(t, err)
	b2, _ := s2.MarshalBinary()
	if !bytes.Equal(b, b2) {
		t.Fatal("server state changes on a round trip")
	}
	// A restarted server re-sends what opened its round.
	p1, p2 := st.srv.Pending(), s2.Pending()
	if len(p1) != 1 || len(p2) != 1 || !bytes.Equal(Encode(p1[0].Msg), Encode(st.req)) || !bytes.Equal(Encode(p2[0].Msg), Encode(st.req)) {
		t.Fatal("Pending after a restart is not the UnmaskRequest")
	}
	for i := range b {
		c := bytes.Clone(b)
		c[i] ^= 4
		if _, err := UnmarshalServer(c); err == nil {
			t.Fatalf("server state byte %d changed, still read", i)
		}
	}
}

// TestLowOrderKey: a site advertising a low-order X25519 key (every
// agreement with it is zero) is turned away at round 0, before it can make
// the other sites' ShareKeys fail.
func TestLowOrderKey(t *testing.T) {
	srv, err := NewServer(Config{Threshold: 2, Dim: 1}, []byte("s"))
	must(t, err)
	c, err := NewClient(Config{Threshold: 2, Dim: 1}, []byte("s"), "a", seeded(1))
	must(t, err)
	a := c.Advertise()
	a.Keys.MaskKey = [KeySize]byte{} // the point of order 1
	if err := srv.Receive(a); err == nil {
		t.Fatal("a zero key accepted")
	}
	a.Keys.MaskKey = [KeySize]byte{0: 1} // u = 1, a point of order 4
	if err := srv.Receive(a); err == nil {
		t.Fatal("a low-order key accepted")
	}
	must(t, srv.Receive(c.Advertise()))
}

// TestDisconnectedSurvivors: with a sparse graph, survivors that fall apart
// into two parts would let the server learn each part's sum. The server
// aborts (ErrTooFewSites) and a site asked anyway refuses (ErrPrivacy).
func TestDisconnectedSurvivors(t *testing.T) {
	cfg := Config{Threshold: 2, Degree: 2, GraphSeed: [32]byte{5}, Dim: 8}
	g := newGraph(10, cfg.Degree, cfg.GraphSeed, []byte("staged"))
	cut := []int{g.perm[2], g.perm[6]} // two cuts of the cycle
	if _, err := stageConfig(t, cfg, 10, cut...); !errors.Is(err, ErrTooFewSites) {
		t.Fatalf("server: %v", err)
	}
	st, err := stageConfig(t, cfg, 10)
	must(t, err)
	var surv []string
	for i := range 10 {
		if !slices.Contains(cut, i) {
			surv = append(surv, siteID(i))
		}
	}
	lie := &UnmaskRequest{Session: st.session, Survivors: surv}
	if _, err := st.cls[g.perm[0]].Unmask(lie); !errors.Is(err, ErrPrivacy) {
		t.Fatalf("site: %v", err)
	}
	if _, err := st.cls[g.perm[0]].Unmask(st.req); err != nil {
		t.Fatalf("the connected survivors: %v", err)
	}
}

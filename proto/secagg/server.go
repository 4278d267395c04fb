package secagg

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"math/big"
	"slices"
	"strings"
)

// Phase is the server's position in a session: the round whose messages it
// is collecting, or the end.
type Phase uint8

// The server's phases.
const (
	PhaseAdvertise Phase = 0 // collecting AdvertiseKeys
	PhaseShareKeys Phase = 1 // KeyList sent; collecting ShareKeys
	PhaseMasked    Phase = 2 // ShareLists sent; collecting MaskedInput
	PhaseUnmask    Phase = 3 // UnmaskRequest sent; collecting UnmaskResponse
	PhaseDone      Phase = 4 // the sum is known
	PhaseAborted   Phase = 5 // the session ended without a sum
)

func (p Phase) String() string {
	return [...]string{"advertise", "share-keys", "masked-input", "unmask", "done", "aborted", "?"}[min(int(p), 6)]
}

// Outgoing is one message the server sends: to one site (To), or with To
// empty to every site the message lists (KeyList, UnmaskRequest: the
// announcement topic).
type Outgoing struct {
	To  string
	Msg Message
}

// Server is the aggregator's side of a session, a pure state machine.
// Receive records one site message of the current round (a duplicate is
// accepted and ignored; a different second message from a site is
// ErrConflict); Advance closes the round (when all expected messages are in,
// or at its deadline: the caller decides) and returns what to send. The
// state (MarshalBinary) holds the public keys, the boxes in transit, the
// running sum of the masked inputs (never one input) and the revealed
// shares; nothing in it reveals one site's input. A session with fewer
// than Threshold sites left at any Advance aborts (ErrTooFewSites): it never
// produces a wrong sum.
type Server struct {
	cfg     Config
	session []byte
	phase   Phase
	reason  string       // why it aborted
	keys    []PublicKeys // adverts, sorted; U1 from PhaseShareKeys on
	boxes   [][]EncryptedShare
	inU2    []bool
	digests [][32]byte // digest of each site's masked input; zero = none
	inU3    []bool
	sum     []uint32 // sum of masked inputs, then the result
	resp    []*UnmaskResponse
	nbr     *graph // the graph of U1, made on first use (not persisted)
}

// NewServer starts a session.
func NewServer(cfg Config, session []byte) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkSession(session); err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, session: bytes.Clone(session)}, nil
}

// Phase returns the server's phase.
func (s *Server) Phase() Phase { return s.phase }

// Config returns the session's configuration.
func (s *Server) Config() Config { return s.cfg }

// Receive records one site message of the current round. A message of an
// earlier round (a late or re-sent one) or another session is ErrPhase and
// changes nothing; so is every message after the end.
func (s *Server) Receive(m Message) error {
	if !bytes.Equal(m.SessionID(), s.session) {
		return fmt.Errorf("%w: %v for another session", ErrPhase, m.Kind())
	}
	switch m := m.(type) {
	case *AdvertiseKeys:
		if s.phase == PhaseAdvertise {
			return s.advert(m)
		}
	case *ShareKeys:
		if s.phase == PhaseShareKeys {
			return s.shareKeys(m)
		}
	case *MaskedInput:
		if s.phase == PhaseMasked {
			return s.masked(m)
		}
	case *UnmaskResponse:
		if s.phase == PhaseUnmask {
			return s.unmaskResponse(m)
		}
	default:
		return fmt.Errorf("secagg: the server does not take %v", m.Kind())
	}
	if s.phase == PhaseAborted {
		return fmt.Errorf("%w: %s", ErrAborted, s.reason)
	}
	return fmt.Errorf("%w: %v in phase %v", ErrPhase, m.Kind(), s.phase)
}

func (s *Server) advert(m *AdvertiseKeys) error {
	k := m.Keys
	if i := index(s.keys, k.ID); i >= 0 {
		if s.keys[i] == k {
			return nil
		}
		return fmt.Errorf("%w: site %s advertised other keys", ErrConflict, k.ID)
	}
	for _, pk := range [][KeySize]byte{k.EncKey, k.MaskKey} {
		if err := checkPublicKey(pk); err != nil {
			return fmt.Errorf("secagg: site %s advertises an unusable key: %w", k.ID, err)
		}
	}
	for _, o := range s.keys {
		if o.EncKey == k.EncKey || o.MaskKey == k.MaskKey || o.EncKey == k.MaskKey || o.MaskKey == k.EncKey {
			return fmt.Errorf("%w: site %s advertises a key of site %s", ErrConflict, k.ID, o.ID)
		}
	}
	if len(s.keys) >= MaxSites {
		return fmt.Errorf("secagg: more than %d sites", MaxSites)
	}
	i, _ := slices.BinarySearchFunc(s.keys, k.ID, func(a PublicKeys, id string) int { return strings.Compare(a.ID, id) })
	s.keys = slices.Insert(s.keys, i, k)
	return nil
}

// site returns the index of a site in U1 and its neighbours.
func (s *Server) site(id string) (int, error) {
	i := index(s.keys, id)
	if i < 0 {
		return -1, fmt.Errorf("secagg: site %s is not in this session's key list", id)
	}
	return i, nil
}

// graph returns each site's neighbours in U1 (used from PhaseShareKeys on,
// when U1 no longer changes).
func (s *Server) graph() graph {
	if s.nbr == nil || s.nbr.n != len(s.keys) {
		g := newGraph(len(s.keys), s.cfg.Degree, s.cfg.GraphSeed, s.session)
		s.nbr = &g
	}
	return *s.nbr
}

func (s *Server) shareKeys(m *ShareKeys) error {
	i, err := s.site(m.ID)
	if err != nil {
		return err
	}
	if s.boxes[i] != nil {
		if slices.EqualFunc(s.boxes[i], m.Boxes, func(a, b EncryptedShare) bool { return a.Peer == b.Peer && bytes.Equal(a.Box, b.Box) }) {
			return nil
		}
		return fmt.Errorf("%w: site %s sent other share boxes", ErrConflict, m.ID)
	}
	if err := s.checkBoxes(i, m.Boxes, s.graph().of(i)); err != nil {
		return err
	}
	s.boxes[i] = slices.Clone(m.Boxes)
	return nil
}

// checkBoxes checks that site i sent one box to each of its neighbours.
func (s *Server) checkBoxes(i int, boxes []EncryptedShare, nbr []int) error {
	id := s.keys[i].ID
	if len(boxes) != len(nbr) {
		return fmt.Errorf("secagg: site %s sent %d share boxes for %d neighbours", id, len(boxes), len(nbr))
	}
	for k, j := range nbr {
		if boxes[k].Peer != s.keys[j].ID || len(boxes[k].Box) != boxSize {
			return fmt.Errorf("secagg: site %s sent a box for %s, not for its neighbour %s", id, boxes[k].Peer, s.keys[j].ID)
		}
	}
	return nil
}

func (s *Server) masked(m *MaskedInput) error {
	i, err := s.site(m.ID)
	if err != nil {
		return err
	}
	if !s.inU2[i] {
		return fmt.Errorf("secagg: masked input from %s, which did not share its keys", m.ID)
	}
	if len(m.Masked) != s.cfg.Dim {
		return fmt.Errorf("secagg: masked input of %s has length %d, want %d", m.ID, len(m.Masked), s.cfg.Dim)
	}
	d := sha256.Sum256(Encode(m))
	if s.digests[i] != ([32]byte{}) {
		if s.digests[i] == d {
			return nil
		}
		return fmt.Errorf("%w: site %s sent another masked input", ErrConflict, m.ID)
	}
	s.digests[i] = d
	AddRing(s.sum, m.Masked)
	return nil
}

// expected returns the shares site i must reveal in round 3: for each site
// whose shares it holds (itself and its neighbours in U2), the self-mask
// share if that site is in U3 and the mask-key share if not.
func (s *Server) expected(i int, nbr []int) []RevealedShare {
	var out []RevealedShare
	for _, j := range append(slices.Clone(nbr), i) {
		if !s.inU2[j] {
			continue
		}
		k := ShareMaskKey
		if s.inU3[j] {
			k = ShareSelf
		}
		out = append(out, RevealedShare{Of: s.keys[j].ID, Kind: k})
	}
	slices.SortFunc(out, func(a, b RevealedShare) int { return strings.Compare(a.Of, b.Of) })
	return out
}

func (s *Server) unmaskResponse(m *UnmaskResponse) error {
	i, err := s.site(m.ID)
	if err != nil {
		return err
	}
	if !s.inU3[i] {
		return fmt.Errorf("secagg: unmask response from %s, which is not a survivor", m.ID)
	}
	if s.resp[i] != nil {
		if bytes.Equal(Encode(s.resp[i]), Encode(m)) {
			return nil
		}
		return fmt.Errorf("%w: site %s sent another unmask response", ErrConflict, m.ID)
	}
	if err := s.checkResponse(i, m, s.graph().of(i)); err != nil {
		return err
	}
	s.resp[i] = m
	return nil
}

// checkResponse checks that survivor i revealed exactly the shares
// expected says.
func (s *Server) checkResponse(i int, m *UnmaskResponse, nbr []int) error {
	want := s.expected(i, nbr)
	if m.ID != s.keys[i].ID || len(want) != len(m.Shares) {
		return fmt.Errorf("secagg: site %s revealed %d shares, want %d", m.ID, len(m.Shares), len(want))
	}
	for k, w := range want {
		if m.Shares[k].Of != w.Of || m.Shares[k].Kind != w.Kind {
			return fmt.Errorf("secagg: site %s revealed a share of kind %d of %s, want kind %d of %s", m.ID, m.Shares[k].Kind, m.Shares[k].Of, w.Kind, w.Of)
		}
	}
	return nil
}

// abort ends the session and returns err.
func (s *Server) abort(err error) error {
	s.phase = PhaseAborted
	s.reason = err.Error()
	s.boxes, s.resp, s.sum = nil, nil, nil
	return err
}

// Advance closes the current round and returns the messages to send: the
// KeyList after round 0, one ShareList per site of U2 after round 1, the
// UnmaskRequest after round 2, nothing after round 3 (Sum has the result).
// Fewer than Threshold sites at any step abort the session: the error wraps
// ErrTooFewSites (or ErrTampered when a reconstructed secret fails its
// check), and every later call fails with ErrAborted.
func (s *Server) Advance() ([]Outgoing, error) {
	switch s.phase {
	case PhaseAdvertise:
		if err := checkKeyList(s.cfg, s.keys); err != nil {
			return nil, s.abort(err)
		}
		s.boxes = make([][]EncryptedShare, len(s.keys))
		s.phase = PhaseShareKeys
	case PhaseShareKeys:
		s.inU2 = make([]bool, len(s.keys))
		for i := range s.keys {
			s.inU2[i] = s.boxes[i] != nil
		}
		// A site with fewer than t holders left in U2 could never be
		// unmasked: leave it out (its boxes are not forwarded, nobody masks
		// with it), and repeat until every site left has enough.
		g := s.graph()
		for changed := true; changed; {
			changed = false
			for i, in := range s.inU2 {
				if in && 1+countIn(g.of(i), s.inU2) < s.cfg.Threshold {
					s.inU2[i], changed = false, true
				}
			}
		}
		if n := countTrue(s.inU2); n < s.cfg.Threshold {
			return nil, s.abort(fmt.Errorf("%w: %d sites shared their keys, threshold %d", ErrTooFewSites, n, s.cfg.Threshold))
		}
		s.digests = make([][32]byte, len(s.keys))
		s.sum = make([]uint32, s.cfg.Dim)
		s.phase = PhaseMasked
	case PhaseMasked:
		s.inU3 = make([]bool, len(s.keys))
		for i, d := range s.digests {
			s.inU3[i] = d != ([32]byte{})
		}
		if n := countTrue(s.inU3); n < s.cfg.Threshold {
			return nil, s.abort(fmt.Errorf("%w: %d masked inputs, threshold %d", ErrTooFewSites, n, s.cfg.Threshold))
		}
		if !s.graph().connected(s.inU3) {
			return nil, s.abort(fmt.Errorf("%w: the survivors' mask graph is not connected (unmasking would reveal partial sums)", ErrTooFewSites))
		}
		s.boxes, s.digests = nil, nil
		s.resp = make([]*UnmaskResponse, len(s.keys))
		s.phase = PhaseUnmask
	case PhaseUnmask:
		if err := s.unmask(); err != nil {
			return nil, s.abort(err)
		}
		s.resp = nil
		s.phase = PhaseDone
		return nil, nil
	case PhaseAborted:
		return nil, fmt.Errorf("%w: %s", ErrAborted, s.reason)
	default:
		return nil, fmt.Errorf("secagg: the session is over")
	}
	return s.Pending(), nil
}

func countTrue(v []bool) int {
	n := 0
	for _, b := range v {
		if b {
			n++
		}
	}
	return n
}

func countIn(idx []int, in []bool) int {
	n := 0
	for _, j := range idx {
		if in[j] {
			n++
		}
	}
	return n
}

// Pending returns the messages that opened the current round (what the
// last Advance returned), to send again after a restart.
func (s *Server) Pending() []Outgoing {
	switch s.phase {
	case PhaseShareKeys:
		return []Outgoing{{Msg: &KeyList{Session: s.session, Sites: slices.Clone(s.keys)}}}
	case PhaseMasked:
		g := s.graph()
		var out []Outgoing
		for v, in := range s.inU2 {
			if !in {
				continue
			}
			sl := &ShareList{Session: s.session, To: s.keys[v].ID}
			for _, u := range g.of(v) {
				if !s.inU2[u] {
					continue
				}
				k, _ := slices.BinarySearchFunc(s.boxes[u], sl.To, func(e EncryptedShare, id string) int { return strings.Compare(e.Peer, id) })
				sl.Boxes = append(sl.Boxes, EncryptedShare{Peer: s.keys[u].ID, Box: s.boxes[u][k].Box})
			}
			out = append(out, Outgoing{To: sl.To, Msg: sl})
		}
		return out
	case PhaseUnmask:
		return []Outgoing{{Msg: &UnmaskRequest{Session: s.session, Survivors: s.ids(s.inU3)}}}
	}
	return nil
}

func (s *Server) ids(in []bool) []string {
	var out []string
	for i, b := range in {
		if b {
			out = append(out, s.keys[i].ID)
		}
	}
	return out
}

// Survivors returns U3, the sites whose inputs the sum holds (from
// PhaseUnmask on).
func (s *Server) Survivors() []string {
	if s.inU3 == nil || s.phase == PhaseAborted {
		return nil
	}
	return s.ids(s.inU3)
}

// Sum returns the sum in Z_{2^32} of the survivors' inputs once the session
// is done.
func (s *Server) Sum() ([]uint32, error) {
	switch s.phase {
	case PhaseDone:
		return slices.Clone(s.sum), nil
	case PhaseAborted:
		return nil, fmt.Errorf("%w: %s", ErrAborted, s.reason)
	}
	return nil, fmt.Errorf("secagg: no sum in phase %v", s.phase)
}

// reconstructor combines shares, reusing the Lagrange coefficients of a set
// of x coordinates (with the complete graph every secret has the same).
type reconstructor struct{ cache map[string][]*big.Int }

func (r *reconstructor) combine(xs []uint32, ys [][ShareSize]byte) ([]byte, error) {
	key := string(appendVector(nil, xs))
	coef, ok := r.cache[key]
	if !ok {
		var err error
		if coef, err = lagrangeAtZero(xs); err != nil {
			return nil, err
		}
		r.cache[key] = coef
	}
	return combineShares(coef, ys)
}

// unmask reconstructs every survivor's self-mask seed and every dropped
// site's mask key from the responses, checks each against what the site
// advertised, and removes the masks from the sum.
func (s *Server) unmask() error {
	var responders []bool
	for _, r := range s.resp {
		responders = append(responders, r != nil)
	}
	if n := countTrue(responders); n < s.cfg.Threshold {
		return fmt.Errorf("%w: %d unmask responses, threshold %d", ErrTooFewSites, n, s.cfg.Threshold)
	}
	g := s.graph()
	rc := &reconstructor{cache: map[string][]*big.Int{}}
	var mk masker
	for v := range s.keys {
		if !s.inU2[v] {
			continue
		}
		nbr := g.of(v)
		if !s.inU3[v] && countIn(nbr, s.inU3) == 0 {
			continue // dropped, and no survivor masked with it
		}
		secret, err := s.reconstruct(rc, v, nbr)
		if err != nil {
			return err
		}
		site := s.keys[v]
		if s.inU3[v] {
			seed := [KeySize]byte(secret)
			if c, err := commitSelf(seed, s.session); err != nil || c != site.Commit {
				return fmt.Errorf("%w: the self-mask seed of %s does not match its commitment", ErrTampered, site.ID)
			}
			k, err := derive(seed[:], s.session, labelSelfMask)
			if err != nil {
				return err
			}
			mk.apply(s.sum, k, -1)
			continue
		}
		priv := privateKey([KeySize]byte(secret))
		if [KeySize]byte(priv.PublicKey().Bytes()) != site.MaskKey {
			return fmt.Errorf("%w: the mask key of dropped site %s does not match its advertised key", ErrTampered, site.ID)
		}
		for _, w := range nbr {
			if !s.inU3[w] {
				continue
			}
			k, err := agree(priv, s.keys[w].MaskKey, s.session, labelPairMask)
			if err != nil {
				return err
			}
			// survivor w added pairSign(w, v) * PRG(k); take it away.
			mk.apply(s.sum, k, -pairSign(s.keys[w].ID, site.ID))
		}
	}
	return nil
}

// reconstruct combines the first t shares of site v's secret (self-mask
// seed if v survived, mask key if not) that its holders revealed.
func (s *Server) reconstruct(rc *reconstructor, v int, nbr []int) ([]byte, error) {
	holders := append(slices.Clone(nbr), v)
	slices.Sort(holders)
	id := s.keys[v].ID
	var xs []uint32
	var ys [][ShareSize]byte
	for _, h := range holders {
		r := s.resp[h]
		if r == nil {
			continue
		}
		k, ok := slices.BinarySearchFunc(r.Shares, id, func(e RevealedShare, id string) int { return strings.Compare(e.Of, id) })
		if !ok {
			continue
		}
		xs = append(xs, uint32(h)+1)
		ys = append(ys, r.Shares[k].Value)
		if len(xs) == s.cfg.Threshold {
			secret, err := rc.combine(xs, ys)
			if err != nil {
				return nil, fmt.Errorf("%w: site %s: %w", ErrTampered, id, err)
			}
			return secret, nil
		}
	}
	return nil, fmt.Errorf("%w: %d holders revealed a share of %s, threshold %d", ErrTooFewSites, len(xs), id, s.cfg.Threshold)
}

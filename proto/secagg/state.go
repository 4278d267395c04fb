package secagg

import (
	"errors"
	"fmt"
)

// Persisted state: the same encoding as the messages, under its own magic,
// with a version byte and a CRC-32C. UnmarshalClient and UnmarshalServer
// treat their input as hostile (a damaged file): they check every length
// and every invariant the state machines rely on, and never panic.

const stateVersion = 1

var (
	clientMagic = [4]byte{'E', 'F', 'S', 'C'}
	serverMagic = [4]byte{'E', 'F', 'S', 'S'}
)

func appendConfig(b []byte, c Config) []byte {
	b = appendUvarint(b, uint64(c.Threshold))
	b = appendUvarint(b, uint64(c.Degree))
	b = append(b, c.GraphSeed[:]...)
	return appendUvarint(b, uint64(c.Dim))
}

func (r *reader) config() Config {
	c := Config{Threshold: int(r.uvarint() & 0xffffff), Degree: int(r.uvarint() & 0xffffff), GraphSeed: r.key()}
	c.Dim = int(r.uvarint() & (1<<30 - 1))
	if r.err == nil {
		if err := c.Validate(); err != nil {
			r.err = err
		}
	}
	return c
}

func appendKeyList(b []byte, keys []PublicKeys) []byte {
	return (&KeyList{Sites: keys}).appendBody(b)
}

func (r *reader) keyList() []PublicKeys {
	var kl KeyList
	kl.readSites(r)
	return kl.Sites
}

func appendBools(b []byte, v []bool) []byte {
	b = appendUvarint(b, uint64(len(v)))
	for _, x := range v {
		if x {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
	}
	return b
}

func (r *reader) bools(n int) []bool {
	m := r.count(1, uint64(n), "flag")
	if r.err != nil || m == 0 {
		return nil
	}
	if m != n {
		r.fail("%d flags for %d sites", m, n)
		return nil
	}
	out := make([]bool, m)
	for i, x := range r.raw(m) {
		out[i] = x == 1
	}
	return out
}

func frameHead(magic [4]byte) []byte {
	return append(append(make([]byte, 0, 256), magic[:]...), stateVersion)
}

func openState(b []byte, magic [4]byte) (*reader, error) {
	body, err := openFrame(b)
	if err != nil {
		return nil, err
	}
	if len(body) < 5 || [4]byte(body[:4]) != magic {
		return nil, errors.New("secagg: not a secagg state")
	}
	if body[4] != stateVersion {
		return nil, fmt.Errorf("secagg: state version %d, want %d", body[4], stateVersion)
	}
	return &reader{b: body[5:]}, nil
}

// MarshalBinary returns the site's whole state, private keys included.
func (c *Client) MarshalBinary() ([]byte, error) {
	b := appendConfig(frameHead(clientMagic), c.cfg)
	b = appendBytes(b, c.session)
	b = appendString(b, c.id)
	b = append(b, byte(c.phase))
	b = append(append(append(b, c.encPriv[:]...), c.maskPriv[:]...), c.seed[:]...)
	b = appendKeyList(b, c.keys)
	b = appendUvarint(b, uint64(len(c.held)))
	for _, h := range c.held {
		b = appendString(b, h.of)
		b = append(append(append(b, h.key[:]...), h.self[:]...), byte(h.revealed))
	}
	for _, d := range c.inDigest {
		b = append(b, d[:]...)
	}
	for _, o := range c.out {
		b = appendBytes(b, o)
	}
	return sealFrame(b), nil
}

// UnmarshalClient reads what Client.MarshalBinary wrote.
func UnmarshalClient(b []byte) (*Client, error) {
	r, err := openState(b, clientMagic)
	if err != nil {
		return nil, err
	}
	c := &Client{cfg: r.config(), session: r.session(), id: r.id(), phase: ClientPhase(r.byte1())}
	c.encPriv, c.maskPriv, c.seed = r.key(), r.key(), r.key()
	c.keys = r.keyList()
	n := r.count(2+2*ShareSize+1, MaxSites, "held share")
	for i := 0; i < n && r.err == nil; i++ {
		h := heldShare{of: r.id(), key: r.shareValue(), self: r.shareValue(), revealed: ShareKind(r.byte1())}
		if h.revealed > ShareMaskKey || len(c.held) > 0 && h.of <= c.held[len(c.held)-1].of {
			r.fail("bad held share")
		}
		c.held = append(c.held, h)
	}
	for i := range c.inDigest {
		copy(c.inDigest[i][:], r.raw(32))
	}
	for i := range c.out {
		c.out[i] = r.bytes(1<<30, "message")
	}
	if err := r.done(); err != nil {
		return nil, wrapErr("secagg: client state", err)
	}
	if err := c.check(); err != nil {
		return nil, wrapErr("secagg: client state", err)
	}
	return c, nil
}

// check verifies the invariants the methods rely on.
func (c *Client) check() error {
	if c.phase > ClientUnmasked || len(c.session) == 0 {
		return errors.New("bad phase or session")
	}
	want := []Kind{KindAdvertiseKeys, KindShareKeys, KindMaskedInput, KindUnmaskResponse}
	for r, o := range c.out {
		if r > int(c.phase) {
			if len(o) != 0 {
				return fmt.Errorf("an answer to round %d in phase %d", r, c.phase)
			}
			continue
		}
		m, err := Decode(o)
		if err != nil || m.Kind() != want[r] {
			return fmt.Errorf("round %d's answer does not decode as %v", r, want[r])
		}
	}
	if a := mustDecode(c.out[0]).(*AdvertiseKeys); a.Keys.ID != c.id {
		return errors.New("advertised id differs")
	}
	if c.phase >= ClientShared {
		if err := checkKeyList(c.cfg, c.keys); err != nil {
			return err
		}
		if index(c.keys, c.id) < 0 {
			return errors.New("the site is not in its key list")
		}
		if len(c.held) == 0 {
			return errors.New("no held shares")
		}
	}
	return nil
}

// MarshalBinary returns the server's whole state.
func (s *Server) MarshalBinary() ([]byte, error) {
	b := appendConfig(frameHead(serverMagic), s.cfg)
	b = appendBytes(b, s.session)
	b = append(b, byte(s.phase))
	b = appendString(b, s.reason)
	b = appendKeyList(b, s.keys)
	b = appendUvarint(b, uint64(len(s.boxes)))
	for _, bx := range s.boxes {
		if bx == nil {
			b = append(b, 0)
			continue
		}
		b = appendBoxes(append(b, 1), bx)
	}
	b = appendBools(b, s.inU2)
	b = appendUvarint(b, uint64(len(s.digests)))
	for _, d := range s.digests {
		b = append(b, d[:]...)
	}
	b = appendBools(b, s.inU3)
	b = appendVector(b, s.sum)
	b = appendUvarint(b, uint64(len(s.resp)))
	for _, m := range s.resp {
		if m == nil {
			b = appendBytes(b, nil)
			continue
		}
		b = appendBytes(b, Encode(m))
	}
	return sealFrame(b), nil
}

// UnmarshalServer reads what Server.MarshalBinary wrote.
func UnmarshalServer(b []byte) (*Server, error) {
	r, err := openState(b, serverMagic)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: r.config(), session: r.session(), phase: Phase(r.byte1())}
	s.reason = r.string(1<<16, "reason")
	s.keys = r.keyList()
	n := len(s.keys)
	if m := r.count(1, uint64(n), "box list"); m > 0 {
		s.boxes = make([][]EncryptedShare, m)
		for i := range s.boxes {
			if r.byte1() == 1 {
				s.boxes[i] = r.boxes()
				if s.boxes[i] == nil {
					s.boxes[i] = []EncryptedShare{}
				}
			}
		}
	}
	s.inU2 = r.bools(n)
	if m := r.count(32, uint64(n), "digest"); m > 0 {
		s.digests = make([][32]byte, m)
		for i := range s.digests {
			copy(s.digests[i][:], r.raw(32))
		}
	}
	s.inU3 = r.bools(n)
	if s.sum = r.vector(); len(s.sum) == 0 {
		s.sum = nil
	}
	if m := r.count(1, uint64(n), "response"); m > 0 {
		s.resp = make([]*UnmaskResponse, m)
		for i := range s.resp {
			raw := r.bytes(1<<30, "response")
			if r.err != nil || len(raw) == 0 {
				continue
			}
			msg, err := Decode(raw)
			if err != nil {
				r.fail("response %d: %v", i, err)
				break
			}
			um, ok := msg.(*UnmaskResponse)
			if !ok {
				r.fail("response %d is a %v", i, msg.Kind())
				break
			}
			s.resp[i] = um
		}
	}
	if err := r.done(); err != nil {
		return nil, wrapErr("secagg: server state", err)
	}
	if err := s.check(); err != nil {
		return nil, wrapErr("secagg: server state", err)
	}
	return s, nil
}

// check verifies the invariants the methods rely on for the state's phase.
func (s *Server) check() error {
	if len(s.session) == 0 {
		return errors.New("no session")
	}
	if s.phase > PhaseAdvertise && s.phase != PhaseAborted {
		if err := checkKeyList(s.cfg, s.keys); err != nil {
			return err
		}
	}
	if s.phase == PhaseAdvertise || s.phase == PhaseAborted {
		return nil
	}
	if err := s.checkPhaseState(); err != nil {
		return err
	}
	return s.checkSites()
}

// checkPhaseState checks the state the phase needs is there: the boxes,
// the U2 and U3 sets, the digests, the responses and the sum.
func (s *Server) checkPhaseState() error {
	n := len(s.keys)
	has := func(ok bool, what string) error {
		if !ok {
			return fmt.Errorf("phase %v without %s", s.phase, what)
		}
		return nil
	}
	var errs []error
	switch s.phase {
	case PhaseShareKeys:
		errs = append(errs, has(len(s.boxes) == n, "boxes"))
	case PhaseMasked:
		errs = append(errs, has(len(s.boxes) == n && len(s.inU2) == n && len(s.digests) == n && len(s.sum) == s.cfg.Dim, "boxes, U2, digests and sum"))
	case PhaseUnmask:
		errs = append(errs, has(len(s.inU2) == n && len(s.inU3) == n && len(s.resp) == n && len(s.sum) == s.cfg.Dim, "U2, U3, responses and sum"))
	case PhaseDone:
		errs = append(errs, has(len(s.sum) == s.cfg.Dim, "sum"))
	default:
		return fmt.Errorf("phase %d", s.phase)
	}
	return errors.Join(errs...)
}

// checkSites checks each site's boxes and response, and that the sites in
// U2 (while masked) sent boxes and the sites in U3 are in U2.
func (s *Server) checkSites() error {
	g := s.graph()
	for i, bx := range s.boxes {
		if bx != nil {
			if err := s.checkBoxes(i, bx, g.of(i)); err != nil {
				return err
			}
		}
	}
	if s.phase == PhaseMasked {
		for i, in := range s.inU2 {
			if in && s.boxes[i] == nil {
				return fmt.Errorf("site %d in U2 without boxes", i)
			}
		}
	}
	for i, m := range s.resp {
		if m != nil {
			if !s.inU3[i] {
				return fmt.Errorf("a response from site %d outside U3", i)
			}
			if err := s.checkResponse(i, m, g.of(i)); err != nil {
				return err
			}
		}
	}
	if s.inU3 != nil {
		for i := range s.inU3 {
			if s.inU3[i] && !s.inU2[i] {
				return fmt.Errorf("site %d in U3 but not U2", i)
			}
		}
	}
	return nil
}

package secagg

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"slices"
	"sort"
)

// ClientPhase is how far a site has gone in one session.
type ClientPhase uint8

// The site's phases: each is entered by sending that round's message.
const (
	ClientAdvertised ClientPhase = 0 // keys made, AdvertiseKeys ready
	ClientShared     ClientPhase = 1 // ShareKeys sent
	ClientMasked     ClientPhase = 2 // MaskedInput sent
	ClientUnmasked   ClientPhase = 3 // UnmaskResponse sent
)

// Client is one site's side of a session, a pure state machine: each round's
// method takes the server's message and returns the site's answer, having
// changed the state, which MarshalBinary captures whole (it holds the site's
// private keys and self-mask seed: store it as a secret). A method called
// again with the same server message returns the same answer, so a site that
// restarts from its stored state re-sends rather than recomputes.
type Client struct {
	cfg      Config
	session  []byte
	id       string
	phase    ClientPhase
	encPriv  [KeySize]byte // c_u^SK
	maskPriv [KeySize]byte // s_u^SK
	seed     [KeySize]byte // b_u
	keys     []PublicKeys  // U1, sorted, from the KeyList
	held     []heldShare   // shares this site holds, sorted by site (its own included)
	inDigest [3][32]byte   // digest of the server message each round answered
	out      [4][]byte     // the encoded answer of each round
}

// heldShare is a pair of shares this site holds of site Of's secrets, and
// which of them it has revealed (0 = neither).
type heldShare struct {
	of       string
	key      [ShareSize]byte
	self     [ShareSize]byte
	revealed ShareKind
}

// NewClient makes site id's keys and self-mask seed for session, drawing
// them from rnd (crypto/rand in production).
func NewClient(cfg Config, session []byte, id string, rnd io.Reader) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkSession(session); err != nil {
		return nil, err
	}
	if id == "" || len(id) > MaxIDLen {
		return nil, fmt.Errorf("secagg: site id %q: empty or longer than %d bytes", id, MaxIDLen)
	}
	c := &Client{cfg: cfg, session: bytes.Clone(session), id: id}
	var err error
	for _, k := range []*[KeySize]byte{&c.encPriv, &c.maskPriv, &c.seed} {
		if *k, err = newPrivateKey(rnd); err != nil {
			return nil, err
		}
	}
	commit, err := commitSelf(c.seed, c.session)
	if err != nil {
		return nil, err
	}
	c.out[0] = Encode(&AdvertiseKeys{Session: c.session, Keys: PublicKeys{
		ID: id, EncKey: publicKey(c.encPriv), MaskKey: publicKey(c.maskPriv), Commit: commit}})
	return c, nil
}

func checkSession(s []byte) error {
	if len(s) == 0 || len(s) > maxSession {
		return fmt.Errorf("secagg: session of %d bytes, want 1..%d", len(s), maxSession)
	}
	return nil
}

// ID returns the site's id.
func (c *Client) ID() string { return c.id }

// Threshold returns the session's threshold t (the site's own
// configuration, not what a later announcement says).
func (c *Client) Threshold() int { return c.cfg.Threshold }

// Phase returns the last round the site has answered.
func (c *Client) Phase() ClientPhase { return c.phase }

// Pending returns the site's last answer (the message of the round it is
// in), to re-send after a restart until the server acknowledges it.
func (c *Client) Pending() Message { return mustDecode(c.out[c.phase]) }

// Advertise returns round 0's message.
// View is what this site saw of the session once it has sent its masked
// input (ok false before): the SHA-256 of the KeyList it answered, and the
// sites whose shares it holds (itself and the senders of its ShareList, its
// neighbours in U2), sorted, with the complete graph, where that is U2 and
// the same for every site; nil with the sparse graph, where each site holds
// its own neighbours'. Signed secure aggregation's consistency check
// compares it between sites (uplink.SecAggViewDigest).
func (c *Client) View() (keyList [32]byte, holders []string, ok bool) {
	if c.phase < ClientMasked {
		return keyList, nil, false
	}
	if c.cfg.Degree > 0 {
		return c.inDigest[0], nil, true
	}
	for _, h := range c.held {
		holders = append(holders, h.of)
	}
	return c.inDigest[0], holders, true
}

func (c *Client) Advertise() *AdvertiseKeys { return mustDecode(c.out[0]).(*AdvertiseKeys) }

func mustDecode(b []byte) Message {
	m, err := Decode(b)
	if err != nil {
		panic(fmt.Sprintf("secagg: own message does not decode: %v", err))
	}
	return m
}

// replay returns the stored answer to round r if in is the message it
// answered, ErrConflict if it is another one, and nil, nil if round r has
// not been answered yet.
func (c *Client) replay(r ClientPhase, in Message) (Message, error) {
	if !bytes.Equal(in.SessionID(), c.session) {
		return nil, fmt.Errorf("%w: %v for another session", ErrPhase, in.Kind())
	}
	if c.phase < r {
		if c.phase+1 < r {
			return nil, fmt.Errorf("%w: %v while the site has answered round %d", ErrPhase, in.Kind(), c.phase)
		}
		return nil, nil
	}
	if sha256.Sum256(Encode(in)) != c.inDigest[r-1] {
		return nil, fmt.Errorf("%w: a different %v after the site answered one", ErrConflict, in.Kind())
	}
	return mustDecode(c.out[r]), nil
}

// index returns the position of id in the sorted key list, or -1.
func index(keys []PublicKeys, id string) int {
	i := sort.Search(len(keys), func(i int) bool { return keys[i].ID >= id })
	if i < len(keys) && keys[i].ID == id {
		return i
	}
	return -1
}

// ShareKeys answers the KeyList (U1): it checks the list (own keys present
// and unchanged, enough sites, threshold above half the holders, no key used
// twice), shares s_u^SK and b_u among the site's neighbours with threshold t
// (coefficients from rnd) and seals each neighbour's pair of shares in an
// AES-GCM box under the X25519 key agreed with that neighbour.
func (c *Client) ShareKeys(kl *KeyList, rnd io.Reader) (*ShareKeys, error) {
	if m, err := c.replay(ClientShared, kl); m != nil || err != nil {
		return asShareKeys(m), err
	}
	if err := checkKeyList(c.cfg, kl.Sites); err != nil {
		return nil, err
	}
	me := index(kl.Sites, c.id)
	if me < 0 || kl.Sites[me] != c.Advertise().Keys {
		return nil, fmt.Errorf("secagg: the key list does not carry site %s's advertised keys", c.id)
	}
	nbr := newGraph(len(kl.Sites), c.cfg.Degree, c.cfg.GraphSeed, c.session).of(me)
	holders := append(slices.Clone(nbr), me)
	slices.Sort(holders)
	xs := make([]uint32, len(holders))
	for i, h := range holders {
		xs[i] = uint32(h) + 1
	}
	keyShares, err := splitSecret(c.maskPriv[:], xs, c.cfg.Threshold, rnd)
	if err != nil {
		return nil, err
	}
	selfShares, err := splitSecret(c.seed[:], xs, c.cfg.Threshold, rnd)
	if err != nil {
		return nil, err
	}
	msg := &ShareKeys{Session: c.session, ID: c.id}
	encPriv := privateKey(c.encPriv)
	var own heldShare
	for i, h := range holders {
		if h == me {
			own = heldShare{of: c.id, key: keyShares[i], self: selfShares[i]}
			continue
		}
		peer := kl.Sites[h]
		box, err := sealShares(encPriv, peer.EncKey, c.session, c.id, peer.ID, keyShares[i], selfShares[i])
		if err != nil {
			return nil, fmt.Errorf("secagg: box for %s: %w", peer.ID, err)
		}
		msg.Boxes = append(msg.Boxes, EncryptedShare{Peer: peer.ID, Box: box})
	}
	c.keys = slices.Clone(kl.Sites)
	c.held = []heldShare{own}
	c.commit(ClientShared, kl, msg)
	return msg, nil
}

func asShareKeys(m Message) *ShareKeys {
	if m == nil {
		return nil
	}
	return m.(*ShareKeys)
}

// commit records the answer to round r.
func (c *Client) commit(r ClientPhase, in, out Message) {
	c.inDigest[r-1] = sha256.Sum256(Encode(in))
	c.out[r] = Encode(out)
	c.phase = r
}

// checkKeyList checks U1 as any party sees it: sorted unique ids (Decode
// already ensures it for received lists), no key used by two sites, and the
// threshold rules.
func checkKeyList(cfg Config, sites []PublicKeys) error {
	if len(sites) > MaxSites {
		return fmt.Errorf("secagg: %d sites in the key list, at most %d", len(sites), MaxSites)
	}
	seen := make(map[[KeySize]byte]bool, 2*len(sites))
	for i, s := range sites {
		if i > 0 && s.ID <= sites[i-1].ID {
			return fmt.Errorf("secagg: key list not sorted by id")
		}
		if seen[s.EncKey] || seen[s.MaskKey] {
			return fmt.Errorf("secagg: site %s reuses a public key of another site", s.ID)
		}
		seen[s.EncKey], seen[s.MaskKey] = true, true
	}
	return cfg.checkSites(len(sites))
}

// MaskInput answers the ShareList: it opens every box (a box that fails
// authentication is an error, ErrTampered), keeps the shares, and returns
// input + PRG(b_u) + sum over its neighbours v in U2 of +-PRG(s_{u,v}) (plus
// when u < v, minus otherwise) in Z_{2^32}. input is the site's quantised
// vector (Quantizer.Quantize); a call repeated with the same ShareList
// returns the first answer whatever input says.
func (c *Client) MaskInput(sl *ShareList, input []uint32) (*MaskedInput, error) {
	if m, err := c.replay(ClientMasked, sl); m != nil || err != nil {
		if m == nil {
			return nil, err
		}
		return m.(*MaskedInput), err
	}
	if sl.To != c.id {
		return nil, fmt.Errorf("secagg: share list for %s, not %s", sl.To, c.id)
	}
	if len(input) != c.cfg.Dim {
		return nil, fmt.Errorf("secagg: input of length %d, want %d", len(input), c.cfg.Dim)
	}
	me := index(c.keys, c.id)
	nbr := newGraph(len(c.keys), c.cfg.Degree, c.cfg.GraphSeed, c.session).of(me)
	if len(sl.Boxes)+1 < c.cfg.Threshold {
		return nil, fmt.Errorf("%w: %d neighbours sent shares, threshold %d", ErrTooFewSites, len(sl.Boxes), c.cfg.Threshold)
	}
	held := slices.Clone(c.held)
	masked := slices.Clone(input)
	var mk masker
	encPriv, maskPriv := privateKey(c.encPriv), privateKey(c.maskPriv)
	for _, b := range sl.Boxes {
		j := index(c.keys, b.Peer)
		if j < 0 || !slices.Contains(nbr, j) {
			return nil, fmt.Errorf("secagg: share box from %s, not a neighbour of %s", b.Peer, c.id)
		}
		peer := c.keys[j]
		key, self, err := openShares(encPriv, peer.EncKey, c.session, peer.ID, c.id, b.Box)
		if err != nil {
			return nil, fmt.Errorf("%w: from %s: %w", ErrTampered, peer.ID, err)
		}
		held = append(held, heldShare{of: peer.ID, key: key, self: self})
		pk, err := agree(maskPriv, peer.MaskKey, c.session, labelPairMask)
		if err != nil {
			return nil, fmt.Errorf("secagg: mask with %s: %w", peer.ID, err)
		}
		mk.apply(masked, pk, pairSign(c.id, peer.ID))
	}
	sk, err := derive(c.seed[:], c.session, labelSelfMask)
	if err != nil {
		return nil, err
	}
	mk.apply(masked, sk, +1)
	// sort.Slice, not slices.SortFunc: the generic sort, instantiated for
	// this 90-byte struct, cost edge-agent 10 kB of text; sort's is shared.
	sort.Slice(held, func(i, j int) bool { return held[i].of < held[j].of })
	c.held = held
	msg := &MaskedInput{Session: c.session, ID: c.id, Masked: masked}
	c.commit(ClientMasked, sl, msg)
	return msg, nil
}

// pairSign is the sign with which site u adds the mask it shares with v:
// +1 if u's id sorts first, -1 otherwise, so the pair's masks cancel.
func pairSign(u, v string) int {
	if u < v {
		return +1
	}
	return -1
}

// Unmask answers the UnmaskRequest (U3): for every site whose shares it
// holds, the share of its self-mask seed if it is in U3, of its mask key if
// not. It refuses (ErrPrivacy), before revealing anything, a request that
// would reveal the other kind for a site than an earlier answer did, or
// whose survivors do not form one connected part of the neighbour graph (the
// server would learn partial sums); and a request that does not list the
// site itself or lists fewer than t sites.
func (c *Client) Unmask(req *UnmaskRequest) (*UnmaskResponse, error) {
	if !bytes.Equal(req.Session, c.session) {
		return nil, fmt.Errorf("%w: UnmaskRequest for another session", ErrPhase)
	}
	if c.phase < ClientMasked {
		return nil, fmt.Errorf("%w: UnmaskRequest before the site sent its masked input", ErrPhase)
	}
	if !slices.IsSorted(req.Survivors) || len(slices.Compact(slices.Clone(req.Survivors))) != len(req.Survivors) {
		return nil, fmt.Errorf("secagg: survivors not sorted and unique")
	}
	if _, ok := slices.BinarySearch(req.Survivors, c.id); !ok {
		return nil, fmt.Errorf("secagg: site %s is not among the survivors it is asked to unmask", c.id)
	}
	if len(req.Survivors) < c.cfg.Threshold {
		return nil, fmt.Errorf("%w: %d survivors, threshold %d", ErrTooFewSites, len(req.Survivors), c.cfg.Threshold)
	}
	inU3 := make([]bool, len(c.keys))
	for _, s := range req.Survivors {
		i := index(c.keys, s)
		if i < 0 {
			return nil, fmt.Errorf("secagg: survivor %s never advertised keys", s)
		}
		inU3[i] = true
	}
	if !newGraph(len(c.keys), c.cfg.Degree, c.cfg.GraphSeed, c.session).connected(inU3) {
		return nil, fmt.Errorf("%w: the survivors' mask graph is not connected, so the sum would reveal partial sums", ErrPrivacy)
	}
	kinds := make([]ShareKind, len(c.held))
	for i, h := range c.held {
		kinds[i] = ShareMaskKey
		if _, ok := slices.BinarySearch(req.Survivors, h.of); ok {
			kinds[i] = ShareSelf
		}
		if h.revealed != 0 && h.revealed != kinds[i] {
			return nil, fmt.Errorf("%w: site %s", ErrPrivacy, h.of)
		}
	}
	msg := &UnmaskResponse{Session: c.session, ID: c.id}
	for i := range c.held {
		h := &c.held[i]
		h.revealed = kinds[i]
		v := h.key
		if kinds[i] == ShareSelf {
			v = h.self
		}
		msg.Shares = append(msg.Shares, RevealedShare{Of: h.of, Kind: kinds[i], Value: v})
	}
	c.out[ClientUnmasked] = Encode(msg)
	c.phase = ClientUnmasked
	return msg, nil
}

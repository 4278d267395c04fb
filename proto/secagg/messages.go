package secagg

import (
	"errors"
	"fmt"
)

// Kind identifies a message type on the wire.
type Kind uint8

// The message kinds, in protocol order. Odd kinds go from a site to the
// server, even kinds from the server to sites.
const (
	KindAdvertiseKeys  Kind = 1 // site -> server, round 0
	KindKeyList        Kind = 2 // server -> every site in U1
	KindShareKeys      Kind = 3 // site -> server, round 1
	KindShareList      Kind = 4 // server -> one site of U2
	KindMaskedInput    Kind = 5 // site -> server, round 2
	KindUnmaskRequest  Kind = 6 // server -> every site in U3
	KindUnmaskResponse Kind = 7 // site -> server, round 3
)

func (k Kind) String() string {
	switch k {
	case KindAdvertiseKeys:
		return "AdvertiseKeys"
	case KindKeyList:
		return "KeyList"
	case KindShareKeys:
		return "ShareKeys"
	case KindShareList:
		return "ShareList"
	case KindMaskedInput:
		return "MaskedInput"
	case KindUnmaskRequest:
		return "UnmaskRequest"
	case KindUnmaskResponse:
		return "UnmaskResponse"
	case 9:
		// Not this package's: signed secure aggregation's survivor set
		// (uplink.SecAggKindSurvivors), named for the logs.
		return "SurvivorsSigned"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// FormatVersion is the version byte of every encoded message.
const FormatVersion = 1

var magic = [4]byte{'E', 'F', 'S', 'A'}

// boxSize is the size of one sealed pair of shares: two share values and
// the GCM tag.
const boxSize = 2*ShareSize + 16

// Message is one protocol message. Encode gives its bytes, Decode reads them
// back.
type Message interface {
	Kind() Kind
	// SessionID returns the session the message belongs to.
	SessionID() []byte
	appendBody(b []byte) []byte // after the session, which Encode writes
	readBody(r *reader)         // the session first
}

// PublicKeys is what a site advertises: its id, its X25519 key for the
// share boxes (c_u^PK), its X25519 masking key (s_u^PK) and a commitment to
// its self-mask seed b_u (checked when the server reconstructs b_u).
type PublicKeys struct {
	ID      string
	EncKey  [KeySize]byte
	MaskKey [KeySize]byte
	Commit  [KeySize]byte
}

// AdvertiseKeys is round 0's message from a site.
type AdvertiseKeys struct {
	Session []byte
	Keys    PublicKeys
}

// KeyList is the server's answer to round 0: the keys of U1, sorted by id.
type KeyList struct {
	Session []byte
	Sites   []PublicKeys
}

// EncryptedShare is one AES-GCM box holding the sender's shares of its mask
// key and self-mask seed for one holder. Peer is the holder in ShareKeys and
// the sender in ShareList.
type EncryptedShare struct {
	Peer string
	Box  []byte
}

// ShareKeys is round 1's message from a site: one box per neighbour, sorted
// by holder.
type ShareKeys struct {
	Session []byte
	ID      string
	Boxes   []EncryptedShare
}

// ShareList is what the server forwards to site To after round 1: the boxes
// addressed to it by the sites of U2, sorted by sender. Its senders are the
// site's neighbours in U2, the sites it masks with.
type ShareList struct {
	Session []byte
	To      string
	Boxes   []EncryptedShare
}

// MaskedInput is round 2's message from a site: its quantised vector plus
// its masks, in Z_{2^32}.
type MaskedInput struct {
	Session []byte
	ID      string
	Masked  []uint32
}

// UnmaskRequest tells the sites of U3 (sorted) who sent a masked input;
// every other site of U2 dropped out.
type UnmaskRequest struct {
	Session   []byte
	Survivors []string
}

// ShareKind says which secret a revealed share is of.
type ShareKind uint8

const (
	// ShareSelf is a share of a surviving site's self-mask seed b_u.
	ShareSelf ShareKind = 1
	// ShareMaskKey is a share of a dropped site's mask private key s_u^SK.
	ShareMaskKey ShareKind = 2
)

// RevealedShare is one share a site gives the server in round 3.
type RevealedShare struct {
	Of    string
	Kind  ShareKind
	Value [ShareSize]byte
}

// UnmaskResponse is round 3's message from a site, sorted by Of.
type UnmaskResponse struct {
	Session []byte
	ID      string
	Shares  []RevealedShare
}

func (*AdvertiseKeys) Kind() Kind  { return KindAdvertiseKeys }
func (*KeyList) Kind() Kind        { return KindKeyList }
func (*ShareKeys) Kind() Kind      { return KindShareKeys }
func (*ShareList) Kind() Kind      { return KindShareList }
func (*MaskedInput) Kind() Kind    { return KindMaskedInput }
func (*UnmaskRequest) Kind() Kind  { return KindUnmaskRequest }
func (*UnmaskResponse) Kind() Kind { return KindUnmaskResponse }

func (m *AdvertiseKeys) SessionID() []byte  { return m.Session }
func (m *KeyList) SessionID() []byte        { return m.Session }
func (m *ShareKeys) SessionID() []byte      { return m.Session }
func (m *ShareList) SessionID() []byte      { return m.Session }
func (m *MaskedInput) SessionID() []byte    { return m.Session }
func (m *UnmaskRequest) SessionID() []byte  { return m.Session }
func (m *UnmaskResponse) SessionID() []byte { return m.Session }

// Encode returns m's bytes: magic "EFSA", FormatVersion, kind, the session,
// the body, and a CRC-32C of all of it.
func Encode(m Message) []byte {
	b := append(make([]byte, 0, 64), magic[:]...)
	b = append(b, FormatVersion, byte(m.Kind()))
	b = appendBytes(b, m.SessionID())
	return sealFrame(m.appendBody(b))
}

// Decode reads one message, checking its frame, version, kind and every
// field's structure (lengths, sorted unique ids, sizes). It never panics and
// never returns a message that fails these checks; the protocol checks
// (is this id in U1, does the box open) are the state machines'.
func Decode(b []byte) (Message, error) {
	body, err := openFrame(b)
	if err != nil {
		return nil, err
	}
	if len(body) < 6 || [4]byte(body[:4]) != magic {
		return nil, errors.New("secagg: not a secagg message")
	}
	if body[4] != FormatVersion {
		return nil, fmt.Errorf("secagg: message format version %d, want %d", body[4], FormatVersion)
	}
	var m Message
	switch Kind(body[5]) {
	case KindAdvertiseKeys:
		m = &AdvertiseKeys{}
	case KindKeyList:
		m = &KeyList{}
	case KindShareKeys:
		m = &ShareKeys{}
	case KindShareList:
		m = &ShareList{}
	case KindMaskedInput:
		m = &MaskedInput{}
	case KindUnmaskRequest:
		m = &UnmaskRequest{}
	case KindUnmaskResponse:
		m = &UnmaskResponse{}
	default:
		return nil, fmt.Errorf("secagg: unknown message kind %d", body[5])
	}
	r := &reader{b: body[6:]}
	m.readBody(r) // the session first, as Encode wrote it
	if err := r.done(); err != nil {
		return nil, fmt.Errorf("secagg: decode %v: %w", Kind(body[5]), err)
	}
	return m, nil
}

func appendKeys(b []byte, k PublicKeys) []byte {
	b = appendString(b, k.ID)
	b = append(b, k.EncKey[:]...)
	b = append(b, k.MaskKey[:]...)
	return append(b, k.Commit[:]...)
}

func (r *reader) publicKeys() PublicKeys {
	return PublicKeys{ID: r.id(), EncKey: r.key(), MaskKey: r.key(), Commit: r.key()}
}

func appendBoxes(b []byte, v []EncryptedShare) []byte {
	b = appendUvarint(b, uint64(len(v)))
	for _, e := range v {
		b = appendBytes(appendString(b, e.Peer), e.Box)
	}
	return b
}

func (r *reader) boxes() []EncryptedShare {
	n := r.count(2+boxSize, MaxSites, "box")
	out := make([]EncryptedShare, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		e := EncryptedShare{Peer: r.id(), Box: r.bytes(boxSize, "box")}
		if r.err == nil && len(e.Box) != boxSize {
			r.fail("box of %d bytes, want %d", len(e.Box), boxSize)
		}
		if len(out) > 0 && e.Peer <= out[len(out)-1].Peer {
			r.fail("boxes not sorted by peer")
		}
		out = append(out, e)
	}
	return out
}

func (m *AdvertiseKeys) appendBody(b []byte) []byte { return appendKeys(b, m.Keys) }
func (m *AdvertiseKeys) readBody(r *reader)         { m.Session, m.Keys = r.session(), r.publicKeys() }

func (m *KeyList) appendBody(b []byte) []byte {
	b = appendUvarint(b, uint64(len(m.Sites)))
	for _, k := range m.Sites {
		b = appendKeys(b, k)
	}
	return b
}

func (m *KeyList) readBody(r *reader) {
	m.Session = r.session()
	m.readSites(r)
}

func (m *KeyList) readSites(r *reader) {
	n := r.count(2+3*KeySize, MaxSites, "site")
	m.Sites = make([]PublicKeys, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		k := r.publicKeys()
		if len(m.Sites) > 0 && k.ID <= m.Sites[len(m.Sites)-1].ID {
			r.fail("sites not sorted by id")
		}
		m.Sites = append(m.Sites, k)
	}
}

func (m *ShareKeys) appendBody(b []byte) []byte { return appendBoxes(appendString(b, m.ID), m.Boxes) }
func (m *ShareKeys) readBody(r *reader)         { m.Session, m.ID, m.Boxes = r.session(), r.id(), r.boxes() }

func (m *ShareList) appendBody(b []byte) []byte { return appendBoxes(appendString(b, m.To), m.Boxes) }
func (m *ShareList) readBody(r *reader)         { m.Session, m.To, m.Boxes = r.session(), r.id(), r.boxes() }

func (m *MaskedInput) appendBody(b []byte) []byte {
	return appendVector(appendString(b, m.ID), m.Masked)
}
func (m *MaskedInput) readBody(r *reader) {
	m.Session, m.ID, m.Masked = r.session(), r.id(), r.vector()
}

func (m *UnmaskRequest) appendBody(b []byte) []byte { return appendStrings(b, m.Survivors) }
func (m *UnmaskRequest) readBody(r *reader)         { m.Session, m.Survivors = r.session(), r.ids() }

func (m *UnmaskResponse) appendBody(b []byte) []byte {
	b = appendString(b, m.ID)
	b = appendUvarint(b, uint64(len(m.Shares)))
	for _, s := range m.Shares {
		b = append(appendString(b, s.Of), byte(s.Kind))
		b = append(b, s.Value[:]...)
	}
	return b
}

func (m *UnmaskResponse) readBody(r *reader) {
	m.Session, m.ID = r.session(), r.id()
	n := r.count(3+ShareSize, MaxSites, "share")
	m.Shares = make([]RevealedShare, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		s := RevealedShare{Of: r.id(), Kind: ShareKind(r.byte1()), Value: r.shareValue()}
		if r.err == nil && s.Kind != ShareSelf && s.Kind != ShareMaskKey {
			r.fail("share kind %d", s.Kind)
		}
		if len(m.Shares) > 0 && s.Of <= m.Shares[len(m.Shares)-1].Of {
			r.fail("shares not sorted by site")
		}
		m.Shares = append(m.Shares, s)
	}
}

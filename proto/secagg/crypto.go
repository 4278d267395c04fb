package secagg

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
)

// Every primitive here is the standard library's: X25519 (crypto/ecdh), HKDF
// with SHA-256 (crypto/hkdf), AES-256 in CTR mode as the mask PRG and AES-256-GCM
// for the shares (crypto/aes, crypto/cipher). The labels below separate the
// keys each HKDF call derives; the session bytes (salt) bind every key to one
// round.

const (
	labelPairMask = "edgefl secagg v1 pairwise mask"
	labelSelfMask = "edgefl secagg v1 self mask"
	labelCommit   = "edgefl secagg v1 self-mask commitment"
	labelShareBox = "edgefl secagg v1 share box"
	labelGraph    = "edgefl secagg v1 neighbour graph"
)

// KeySize is the size of an X25519 key, a seed and a commitment.
const KeySize = 32

// newPrivateKey reads an X25519 private key from rnd. (ecdh's GenerateKey
// ignores its reader since Go 1.26; reading the 32 bytes ourselves keeps the
// package deterministic given rnd.)
func newPrivateKey(rnd io.Reader) ([KeySize]byte, error) {
	var k [KeySize]byte
	if _, err := io.ReadFull(rnd, k[:]); err != nil {
		return k, wrapErr("secagg: randomness", err)
	}
	return k, nil
}

// publicKey returns the X25519 public key of priv.
func publicKey(priv [KeySize]byte) [KeySize]byte {
	var out [KeySize]byte
	copy(out[:], privateKey(priv).PublicKey().Bytes())
	return out
}

// privateKey returns the X25519 key of priv (computing its public key once:
// make one per method call, not per agreement).
func privateKey(priv [KeySize]byte) *ecdh.PrivateKey {
	k, err := ecdh.X25519().NewPrivateKey(priv[:])
	if err != nil { // only a wrong length fails
		panic(err)
	}
	return k
}

// agree returns the HKDF-SHA256 key of the X25519 agreement between priv and
// peer, for label and session. A low-order peer key (an all-zero shared
// secret) is an error.
func agree(priv *ecdh.PrivateKey, peer [KeySize]byte, session []byte, label string) ([KeySize]byte, error) {
	var out [KeySize]byte
	p, err := ecdh.X25519().NewPublicKey(peer[:])
	if err != nil {
		return out, wrapErr("secagg: public key", err)
	}
	shared, err := priv.ECDH(p)
	if err != nil {
		return out, wrapErr("secagg: key agreement", err)
	}
	return derive(shared, session, label)
}

// checkPublicKey refuses a low-order X25519 public key: every agreement
// with it gives the all-zero secret, which ecdh reports as an error. A site
// advertising one would make every other site's ShareKeys fail, so the
// server turns it away at round 0.
func checkPublicKey(k [KeySize]byte) error {
	probe := privateKey([KeySize]byte{9: 1, 31: 0x40})
	_, err := agree(probe, k, nil, labelPairMask)
	return err
}

// derive is HKDF-SHA256(secret, salt = session, info = label), 32 bytes.
func derive(secret, session []byte, label string) ([KeySize]byte, error) {
	var out [KeySize]byte
	k, err := hkdf.Key(sha256.New, secret, session, label, KeySize)
	if err != nil {
		return out, wrapErr("secagg: hkdf", err)
	}
	copy(out[:], k)
	return out, nil
}

// commitSelf is the commitment to a self-mask seed that a site advertises:
// an HKDF output under its own label, so it reveals nothing of the mask key.
func commitSelf(seed [KeySize]byte, session []byte) ([KeySize]byte, error) {
	return derive(seed[:], session, labelCommit)
}

// masker expands mask keys with AES-256-CTR (zero IV: every key is used for
// one stream only) and adds or subtracts the stream, read as little-endian
// uint32s, into a vector. It reuses one scratch buffer.
type masker struct{ buf []byte }

// apply adds (sign +1) or subtracts (sign -1) the mask of key into dst.
func (m *masker) apply(dst []uint32, key [KeySize]byte, sign int) {
	block, err := aes.NewCipher(key[:])
	if err != nil { // only a wrong key length fails
		panic(err)
	}
	var iv [aes.BlockSize]byte
	stream := cipher.NewCTR(block, iv[:])
	const chunk = 4096
	if len(m.buf) < 4*chunk {
		m.buf = make([]byte, 4*chunk)
	}
	for off := 0; off < len(dst); off += chunk {
		n := min(chunk, len(dst)-off)
		b := m.buf[:4*n]
		clear(b)
		stream.XORKeyStream(b, b)
		d := dst[off : off+n]
		if sign > 0 {
			for i := range d {
				d[i] += binary.LittleEndian.Uint32(b[4*i:])
			}
		} else {
			for i := range d {
				d[i] -= binary.LittleEndian.Uint32(b[4*i:])
			}
		}
	}
}

// boxAEAD derives the AES-256-GCM key for shares sent from -> to: one key per
// direction, used for one message, so the nonce can be fixed (zero).
func boxAEAD(encPriv *ecdh.PrivateKey, peerEnc [KeySize]byte, session []byte, from, to string) (cipher.AEAD, []byte, error) {
	ad := appendString(appendString(appendBytes(nil, session), from), to)
	k, err := agree(encPriv, peerEnc, ad, labelShareBox)
	if err != nil {
		return nil, nil, err
	}
	block, err := aes.NewCipher(k[:])
	if err != nil {
		return nil, nil, err
	}
	g, err := cipher.NewGCM(block)
	if err != nil {
		return nil, nil, err
	}
	return g, ad, nil
}

// sealShares encrypts a holder's two shares (of the sender's mask key and of
// its self-mask seed) for the holder.
func sealShares(encPriv *ecdh.PrivateKey, peerEnc [KeySize]byte, session []byte, from, to string, key, self [ShareSize]byte) ([]byte, error) {
	g, ad, err := boxAEAD(encPriv, peerEnc, session, from, to)
	if err != nil {
		return nil, err
	}
	pt := make([]byte, 0, 2*ShareSize)
	pt = append(append(pt, key[:]...), self[:]...)
	return g.Seal(nil, make([]byte, g.NonceSize()), pt, ad), nil
}

var errBox = errors.New("secagg: share box fails authentication (tampered, or not for this site and round)")

// openShares decrypts and authenticates what sealShares made.
func openShares(encPriv *ecdh.PrivateKey, peerEnc [KeySize]byte, session []byte, from, to string, box []byte) (key, self [ShareSize]byte, err error) {
	g, ad, err := boxAEAD(encPriv, peerEnc, session, from, to)
	if err != nil {
		return key, self, err
	}
	pt, err := g.Open(nil, make([]byte, g.NonceSize()), box, ad)
	if err != nil || len(pt) != 2*ShareSize {
		return key, self, errBox
	}
	copy(key[:], pt)
	copy(self[:], pt[ShareSize:])
	return key, self, nil
}

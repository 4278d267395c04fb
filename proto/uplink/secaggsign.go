package uplink

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/edgefl/edgefl/proto/secagg"
)

// Signed secure aggregation (docs/privacy.md, "Threat model per mode"): a
// site whose federation has a site PKI (mutual TLS, certificates issued by
// `broker-agg pki`, CN = site id) signs its AdvertiseKeys with its client
// certificate's key, and before it shares its keys checks that every key of
// the KeyList carries a valid signature by a certificate of the federation
// CA whose CN is the site the key is listed for. An aggregator (or broker)
// that substitutes a key, or invents a site, is then detected by every site
// that would have shared with it, and that site refuses the session. The
// rule is here, once: the agent signs and checks, the aggregator relays.

// SecAggIdentity is a site's signing identity: its client certificate
// (DER), that certificate's private key, and the federation CA's
// certificates that every other site's certificate must chain to.
type SecAggIdentity struct {
	Cert   []byte
	Signer crypto.Signer
	Roots  *x509.CertPool
}

// SignedKey is one site's signed advertisement as the aggregator relays it
// with the KeyList: the site's certificate (DER) and its signature of
// SecAggAdvertDigest.
type SignedKey struct {
	ID   string
	Cert []byte
	Sig  []byte
}

// Limits of an encoded list of signed keys (DecodeSignedKeys).
const (
	maxSignedCert = 8 << 10
	maxSignedSig  = 1 << 10
	maxSignedID   = 256
)

// ErrSecAggSignature is the error of a key list a site refuses: a key
// without a valid signature by its site's certificate.
var ErrSecAggSignature = errors.New("uplink: secure aggregation: the key list is not signed by its sites")

// SecAggAdvertDigest is what a site signs of its advertisement: SHA-256 of
// a domain, the session and the site's public keys (id, encryption and
// masking keys, self-mask commitment).
func SecAggAdvertDigest(session []byte, k secagg.PublicKeys) [32]byte {
	h := sha256.New()
	h.Write([]byte("edgefl secagg advertise v1\x00"))
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(session)))])
	h.Write(session)
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(k.ID)))])
	h.Write([]byte(k.ID))
	h.Write(k.EncKey[:])
	h.Write(k.MaskKey[:])
	h.Write(k.Commit[:])
	var d [32]byte
	h.Sum(d[:0])
	return d
}

// Sign signs digest with the identity's key: ECDSA and RSA (PKCS #1 v1.5)
// over the SHA-256 digest, Ed25519 over the digest's bytes.
func (id *SecAggIdentity) Sign(digest [32]byte, rnd io.Reader) ([]byte, error) {
	if id == nil || id.Signer == nil {
		return nil, errors.New("uplink: no signing key")
	}
	switch id.Signer.Public().(type) {
	case ed25519.PublicKey:
		return id.Signer.Sign(rnd, digest[:], crypto.Hash(0))
	case *ecdsa.PublicKey, *rsa.PublicKey:
		return id.Signer.Sign(rnd, digest[:], crypto.SHA256)
	}
	return nil, fmt.Errorf("uplink: a %T signing key: want ECDSA, Ed25519 or RSA", id.Signer.Public())
}

// VerifySigned checks that cert (DER) chains to roots for client
// authentication at now, that its CN is id, and that sig is its key's
// signature of digest.
func VerifySigned(roots *x509.CertPool, now time.Time, id string, certDER, sig []byte, digest [32]byte) error {
	cert, err := x509.ParseCertificate(certDER)
	if err != nil {
		return fmt.Errorf("site %s: its certificate does not parse: %w", id, err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("site %s: its certificate is not the federation CA's: %w", id, err)
	}
	if cert.Subject.CommonName != id {
		return fmt.Errorf("site %s: the certificate is %q's", id, cert.Subject.CommonName)
	}
	ok := false
	switch pub := cert.PublicKey.(type) {
	case *ecdsa.PublicKey:
		ok = ecdsa.VerifyASN1(pub, digest[:], sig)
	case ed25519.PublicKey:
		ok = ed25519.Verify(pub, digest[:], sig)
	case *rsa.PublicKey:
		ok = rsa.VerifyPKCS1v15(pub, crypto.SHA256, digest[:], sig) == nil
	}
	if !ok {
		return fmt.Errorf("site %s: the signature is not its certificate's", id)
	}
	return nil
}

// CheckKeyList verifies, for a site with a signing identity, every key of
// kl against the signed advertisements relayed with it: exactly one per
// listed site, each by a certificate of the federation CA (roots) whose CN
// is that site. The error wraps ErrSecAggSignature and names the first
// site whose key fails.
func CheckKeyList(roots *x509.CertPool, now time.Time, kl *secagg.KeyList, signed []SignedKey) error {
	by := make(map[string]SignedKey, len(signed))
	for _, s := range signed {
		if _, dup := by[s.ID]; dup {
			return fmt.Errorf("%w: site %s is signed for twice", ErrSecAggSignature, s.ID)
		}
		by[s.ID] = s
	}
	for _, k := range kl.Sites {
		s, ok := by[k.ID]
		if !ok {
			return fmt.Errorf("%w: site %s's key carries no signature", ErrSecAggSignature, k.ID)
		}
		if err := VerifySigned(roots, now, k.ID, s.Cert, s.Sig, SecAggAdvertDigest(kl.Session, k)); err != nil {
			return fmt.Errorf("%w: %w", ErrSecAggSignature, err)
		}
	}
	return nil
}

const signedKeysVersion = 1

// EncodeSignedKeys is the announcement's secagg_signed_keys.
func EncodeSignedKeys(ks []SignedKey) []byte {
	b := []byte{signedKeysVersion}
	b = binary.AppendUvarint(b, uint64(len(ks)))
	for _, k := range ks {
		for _, f := range [][]byte{[]byte(k.ID), k.Cert, k.Sig} {
			b = binary.AppendUvarint(b, uint64(len(f)))
			b = append(b, f...)
		}
	}
	return b
}

// DecodeSignedKeys reads EncodeSignedKeys' bytes, checking every length
// (at most secagg.MaxSites entries, minimal varints: one list has one
// encoding); it never panics.
func DecodeSignedKeys(b []byte) ([]SignedKey, error) {
	bad := func(what string) ([]SignedKey, error) {
		return nil, fmt.Errorf("uplink: signed keys: %s", what)
	}
	if len(b) == 0 || b[0] != signedKeysVersion {
		return bad("unknown version")
	}
	b = b[1:]
	n, k := canonUvarint(b)
	if k <= 0 || n > secagg.MaxSites {
		return bad("bad count")
	}
	b = b[k:]
	field := func(max int) ([]byte, bool) {
		l, k := canonUvarint(b)
		if k <= 0 || l > uint64(max) || l > uint64(len(b)-k) {
			return nil, false
		}
		f := b[k : k+int(l)]
		b = b[k+int(l):]
		return f, true
	}
	out := make([]SignedKey, 0, min(n, 1024))
	for range n {
		id, ok1 := field(maxSignedID)
		cert, ok2 := field(maxSignedCert)
		sig, ok3 := field(maxSignedSig)
		if !ok1 || !ok2 || !ok3 {
			return bad("truncated or oversized entry")
		}
		out = append(out, SignedKey{ID: string(id), Cert: cert, Sig: sig})
	}
	if len(b) != 0 {
		return bad("trailing bytes")
	}
	return out, nil
}

// Signed secure aggregation's consistency check (after Bonawitz et al.
// 2017's ConsistencyCheck, folded into the existing phases): each site signs
// its view of the session with its masked input, and before it reveals any
// share it checks that every site of the UnmaskRequest's survivors U3
// signed the same view. The view is the KeyList it answered and, with the
// complete graph, U2 (the sites whose shares it holds): two sites that were
// shown different key lists, or different share-key survivors, hold
// different views, and a survivor that sent no signed masked input in the
// session has none. What it does not bind is U3 itself: U3 is known only
// after the masked inputs (signing it needs one more round); the privacy
// rule (t above half of each secret's holders) bounds what different U3
// sets can yield (docs/privacy.md).

// ErrSecAggView is the error of an UnmaskRequest a site refuses: a survivor
// without a valid signature of this site's view of the session.
var ErrSecAggView = errors.New("uplink: secure aggregation: the survivors did not sign this site's view of the session")

// SecAggViewDigest is what a site signs with its masked input: SHA-256 of
// a domain, the session, the digest of the KeyList it answered and, with
// the complete graph, the sorted sites whose shares it holds (U2); nil
// holders with the sparse graph, whose neighbourhoods differ between sites.
func SecAggViewDigest(session []byte, keyList [32]byte, holders []string) [32]byte {
	h := sha256.New()
	h.Write([]byte("edgefl secagg view v1\x00"))
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(session)))])
	h.Write(session)
	h.Write(keyList[:])
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(holders)))])
	for _, id := range holders {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(id)))])
		h.Write([]byte(id))
	}
	var d [32]byte
	h.Sum(d[:0])
	return d
}

// CheckViews verifies that every survivor signed view: exactly one signed
// entry per survivor (certificate of the federation CA, CN = the survivor,
// signature of view). The error wraps ErrSecAggView and names the first
// survivor that fails.
func CheckViews(roots *x509.CertPool, now time.Time, survivors []string, view [32]byte, signed []SignedKey) error {
	by := make(map[string]SignedKey, len(signed))
	for _, s := range signed {
		if _, dup := by[s.ID]; dup {
			return fmt.Errorf("%w: site %s's view is listed twice", ErrSecAggView, s.ID)
		}
		by[s.ID] = s
	}
	for _, id := range survivors {
		s, ok := by[id]
		if !ok {
			return fmt.Errorf("%w: survivor %s signed no view", ErrSecAggView, id)
		}
		if err := VerifySigned(roots, now, id, s.Cert, s.Sig, view); err != nil {
			return fmt.Errorf("%w: %w (it saw another key list or other survivors, or did not sign)", ErrSecAggView, err)
		}
	}
	return nil
}

// canonUvarint is binary.Uvarint refusing a non-minimal encoding (k = 0).
func canonUvarint(b []byte) (uint64, int) {
	v, k := binary.Uvarint(b)
	if k <= 0 || k != len(binary.AppendUvarint(nil, v)) {
		return 0, 0
	}
	return v, k
}

// Signed secure aggregation's consistency round (Bonawitz et al. 2017's
// ConsistencyCheck, their round 3): the views above are signed before the
// survivor set U3 is known, so they cannot bind it. When every key of the
// KeyList is signed, the aggregator announces U3 in a phase of its own
// (SECAGG_PHASE_CONSISTENCY) before the unmask; each survivor signs U3 with
// its view (SecAggSurvivorsDigest) and remembers it, signing one U3 per
// session; the aggregator relays the signatures with the UnmaskRequest, and
// a site reveals nothing unless at least the threshold of survivors signed
// the very U3 and view it holds, and every relayed signature verifies
// (CheckSurvivors). An aggregator that tells different survivors different
// U3 sets (to collect the self-mask seed of a site from some and its mask
// key from others, which would open its input) then needs the threshold of
// signatures on each set: honest sites sign one, so with t above half of
// the holders it needs at least 2t - n of them to sign two.

// SecAggKindSurvivors is the kind of a site's signed survivor set on the
// wire (wire.SecAggKindSurvivors): its payload is the secagg encoding of the
// UnmaskRequest it answers, its survivors_signature the signature.
const SecAggKindSurvivors = 9

// ErrSecAggSurvivors is the error of an UnmaskRequest a site refuses in the
// consistency round: too few signatures of its survivor set, a signature
// of another set or view, or a second survivor set in one session.
var ErrSecAggSurvivors = errors.New("uplink: secure aggregation: the survivor set is not consistent")

// SecAggSurvivorsDigest is what a site signs in the consistency round:
// SHA-256 of a domain, the session, its view (SecAggViewDigest: the KeyList
// and, with the complete graph, U2) and the sorted survivor set U3.
func SecAggSurvivorsDigest(session []byte, view [32]byte, survivors []string) [32]byte {
	h := sha256.New()
	h.Write([]byte("edgefl secagg survivors v1\x00"))
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(session)))])
	h.Write(session)
	h.Write(view[:])
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(survivors)))])
	for _, id := range survivors {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(id)))])
		h.Write([]byte(id))
	}
	var d [32]byte
	h.Sum(d[:0])
	return d
}

// CheckSurvivorSet is the site's rule before it signs a survivor set:
// digest is the set it is shown, signed (with has) the one it signed
// before in the session, if any. A second, different set is the
// aggregator telling this site two survivor sets: refused.
func CheckSurvivorSet(signed [32]byte, has bool, digest [32]byte) error {
	if has && signed != digest {
		return fmt.Errorf("%w: shown a second survivor set in the session (it signed another)", ErrSecAggSurvivors)
	}
	return nil
}

// CheckSurvivors verifies the consistency round's signatures relayed with
// an UnmaskRequest: every entry is a survivor's (listed once) and its
// signature, by a certificate of the federation CA whose CN is that
// survivor, is of digest (this site's view and survivor set); and at least
// threshold survivors signed. A signature of anything else is evidence
// that some survivor was shown another survivor set or view: refused, as
// Bonawitz et al. abort. The error wraps ErrSecAggSurvivors.
func CheckSurvivors(roots *x509.CertPool, now time.Time, threshold int, survivors []string, digest [32]byte, signed []SignedKey) error {
	in := make(map[string]bool, len(survivors))
	for _, id := range survivors {
		in[id] = true
	}
	seen := make(map[string]bool, len(signed))
	for _, s := range signed {
		switch {
		case seen[s.ID]:
			return fmt.Errorf("%w: site %s signed twice", ErrSecAggSurvivors, s.ID)
		case !in[s.ID]:
			return fmt.Errorf("%w: site %s signed but is not a survivor", ErrSecAggSurvivors, s.ID)
		}
		seen[s.ID] = true
	}
	for _, s := range signed {
		if err := VerifySigned(roots, now, s.ID, s.Cert, s.Sig, digest); err != nil {
			return fmt.Errorf("%w: %w (it was shown another survivor set or view)", ErrSecAggSurvivors, err)
		}
	}
	if len(seen) < threshold || threshold < 1 {
		return fmt.Errorf("%w: %d of %d survivors signed the survivor set, threshold %d", ErrSecAggSurvivors, len(seen), len(survivors), threshold)
	}
	return nil
}

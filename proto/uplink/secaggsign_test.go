package uplink_test

import (
	crand "crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/proto/secagg"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/testkit/secaggid"
)

// signedSession is a KeyList of ids' advertisements and their signed keys.
func signedSession(t *testing.T, fed *secaggid.Federation, ids []string) (*secagg.KeyList, []uplink.SignedKey) {
	t.Helper()
	session := uplink.SecAggSession("run", 1, 0)
	kl := &secagg.KeyList{Session: session}
	var signed []uplink.SignedKey
	for _, id := range ids {
		c, err := secagg.NewClient(secagg.Config{Threshold: 2, Dim: 4}, session, id, crand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		a := c.Advertise()
		kl.Sites = append(kl.Sites, a.Keys)
		ident := fed.Get(id)
		sig, err := ident.Sign(uplink.SecAggAdvertDigest(session, a.Keys), crand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		signed = append(signed, uplink.SignedKey{ID: id, Cert: ident.Cert, Sig: sig})
	}
	return kl, signed
}

// TestCheckKeyList: a key list whose every key carries its site's
// signature by a certificate of the federation CA passes; a substituted
// key, a missing or duplicated signature, an invented site signed by
// another CA, a certificate of another site, an advertisement of another
// session are refused with ErrSecAggSignature and the site named.
func TestCheckKeyList(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ids := []string{"site-a", "site-b", "site-c"}
	fed := secaggid.New(t, now, ids...)
	rogue := secaggid.New(t, now, "site-x", "site-b") // the operator's own CA
	for _, tc := range []struct {
		name   string
		tamper func(kl *secagg.KeyList, s []uplink.SignedKey) []uplink.SignedKey
		want   string // "" = valid
	}{
		{"genuine", func(_ *secagg.KeyList, s []uplink.SignedKey) []uplink.SignedKey { return s }, ""},
		{"forged key for one site", func(kl *secagg.KeyList, s []uplink.SignedKey) []uplink.SignedKey {
			kl.Sites[1].EncKey[0] ^= 1
			return s
		}, "site site-b: the signature"},
		{"forged mask key", func(kl *secagg.KeyList, s []uplink.SignedKey) []uplink.SignedKey {
			kl.Sites[2].MaskKey[31] ^= 0x80
			return s
		}, "site site-c: the signature"},
		{"no signature", func(_ *secagg.KeyList, s []uplink.SignedKey) []uplink.SignedKey { return s[:2] }, "site-c's key carries no signature"},
		{"none signed", func(_ *secagg.KeyList, _ []uplink.SignedKey) []uplink.SignedKey { return nil }, "site-a's key carries no signature"},
		{"signed twice", func(_ *secagg.KeyList, s []uplink.SignedKey) []uplink.SignedKey { return append(s, s[0]) }, "signed for twice"},
		{"certificate of another CA", func(kl *secagg.KeyList, s []uplink.SignedKey) []uplink.SignedKey {
			// The operator re-signs a substituted key with a certificate
			// of its own CA for the same site id.
			kl.Sites[1].EncKey[0] ^= 1
			id := rogue.Get("site-b")
			sig, _ := id.Sign(uplink.SecAggAdvertDigest(kl.Session, kl.Sites[1]), crand.Reader)
			s[1] = uplink.SignedKey{ID: "site-b", Cert: id.Cert, Sig: sig}
			return s
		}, "not the federation CA's"},
		{"certificate of another site", func(kl *secagg.KeyList, s []uplink.SignedKey) []uplink.SignedKey {
			// site-a's genuine certificate and signature offered for
			// site-b's slot.
			kl.Sites[1] = kl.Sites[0]
			kl.Sites[1].ID = "site-b"
			s[1] = uplink.SignedKey{ID: "site-b", Cert: s[0].Cert, Sig: s[0].Sig}
			return s
		}, `the certificate is "site-a"'s`},
		{"another session's advertisement", func(kl *secagg.KeyList, s []uplink.SignedKey) []uplink.SignedKey {
			kl.Session = uplink.SecAggSession("run", 1, 1)
			return s
		}, "site site-a: the signature"},
		{"garbage certificate", func(_ *secagg.KeyList, s []uplink.SignedKey) []uplink.SignedKey {
			s[2].Cert = []byte("not DER")
			return s
		}, "does not parse"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kl, signed := signedSession(t, fed, ids)
			signed = tc.tamper(kl, signed)
			// Through the announcement's encoding, as the sites read it.
			var dec []uplink.SignedKey
			if len(signed) > 0 {
				var err error
				if dec, err = uplink.DecodeSignedKeys(uplink.EncodeSignedKeys(signed)); err != nil {
					t.Fatal(err)
				}
			}
			err := uplink.CheckKeyList(fed.Roots, now, kl, dec)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("CheckKeyList = %v, want nil", err)
			case tc.want != "" && (!errors.Is(err, uplink.ErrSecAggSignature) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("CheckKeyList = %v, want an ErrSecAggSignature naming %q", err, tc.want)
			}
		})
	}
	// An expired certificate: checked at the site's clock.
	kl, signed := signedSession(t, fed, ids)
	if err := uplink.CheckKeyList(fed.Roots, now.Add(365*24*time.Hour), kl, signed); !errors.Is(err, uplink.ErrSecAggSignature) {
		t.Fatalf("a year later: %v, want a refusal", err)
	}
}

// TestDecodeSignedKeys: every truncation or damage of an encoded list is
// an error, never a panic or a wrong list.
func TestDecodeSignedKeys(t *testing.T) {
	ks := []uplink.SignedKey{{ID: "site-a", Cert: []byte{1, 2, 3}, Sig: []byte{4, 5}}, {ID: "site-b", Cert: []byte{6}, Sig: []byte{7}}}
	b := uplink.EncodeSignedKeys(ks)
	got, err := uplink.DecodeSignedKeys(b)
	if err != nil || len(got) != 2 || got[1].ID != "site-b" || string(got[0].Sig) != "\x04\x05" {
		t.Fatalf("round trip: %v, %v", got, err)
	}
	for i := range b {
		if _, err := uplink.DecodeSignedKeys(b[:i]); err == nil {
			t.Fatalf("a truncation to %d bytes decodes", i)
		}
	}
	for _, bad := range [][]byte{nil, {2, 0}, append(append([]byte{}, b...), 0), {1, 0xff, 0xff, 0xff, 0xff, 0x0f}} {
		if _, err := uplink.DecodeSignedKeys(bad); err == nil {
			t.Fatalf("%x decodes", bad)
		}
	}
}

// TestCheckViewsEquivocation: the consistency check against a malicious
// server that the key signatures cannot catch. Four sites; the server
// shows the victim a KeyList without site-d (every key in it genuine and
// signed, so CheckKeyList passes) and forwards consistent ShareLists, so
// that the victim masks with site-b and site-c only. Each site signs its
// view with its masked input; before revealing, every site checks that
// all survivors signed its own view: the victim's view differs from the
// others', and every survivor refuses. Without the equivocation, every
// site's check passes.
func TestCheckViewsEquivocation(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ids := []string{"site-a", "site-b", "site-c", "site-d"}
	fed := secaggid.New(t, now, ids...)
	for _, equivocate := range []bool{false, true} {
		session := uplink.SecAggSession("run", 1, 0)
		cfg := secagg.Config{Threshold: 3, Dim: 4}
		clients := map[string]*secagg.Client{}
		full := &secagg.KeyList{Session: session}
		var signed []uplink.SignedKey
		for _, id := range ids {
			c, err := secagg.NewClient(cfg, session, id, crand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			clients[id] = c
			k := c.Advertise().Keys
			full.Sites = append(full.Sites, k)
			sig, _ := fed.Get(id).Sign(uplink.SecAggAdvertDigest(session, k), crand.Reader)
			signed = append(signed, uplink.SignedKey{ID: id, Cert: fed.Get(id).Cert, Sig: sig})
		}
		// The victim's KeyList.
		shown := full
		if equivocate {
			shown = &secagg.KeyList{Session: session, Sites: full.Sites[:3]}
		}
		if err := uplink.CheckKeyList(fed.Roots, now, shown, signed); err != nil {
			t.Fatalf("the victim's key list: %v (the signatures cannot see an omission)", err)
		}
		boxes := map[string][]secagg.EncryptedShare{} // by recipient
		for _, id := range ids {
			kl := full
			if id == "site-a" {
				kl = shown
			}
			sk, err := clients[id].ShareKeys(kl, crand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range sk.Boxes {
				if equivocate && id == "site-d" && b.Peer == "site-a" {
					continue // kept from the victim, which does not know site-d
				}
				boxes[b.Peer] = append(boxes[b.Peer], secagg.EncryptedShare{Peer: id, Box: b.Box})
			}
		}
		views := map[string][32]byte{}
		var viewSigs []uplink.SignedKey
		for _, id := range ids {
			if _, err := clients[id].MaskInput(&secagg.ShareList{Session: session, To: id, Boxes: boxes[id]}, make([]uint32, 4)); err != nil {
				t.Fatal(err)
			}
			kl, holders, ok := clients[id].View()
			if !ok {
				t.Fatal("no view after the masked input")
			}
			views[id] = uplink.SecAggViewDigest(session, kl, holders)
			sig, _ := fed.Get(id).Sign(views[id], crand.Reader)
			viewSigs = append(viewSigs, uplink.SignedKey{ID: id, Cert: fed.Get(id).Cert, Sig: sig})
		}
		for _, id := range ids {
			err := uplink.CheckViews(fed.Roots, now, ids, views[id], viewSigs)
			switch {
			case !equivocate && err != nil:
				t.Fatalf("%s, no equivocation: %v", id, err)
			case equivocate && !errors.Is(err, uplink.ErrSecAggView):
				t.Fatalf("%s, the victim shown another key list: CheckViews = %v, want a refusal", id, err)
			}
		}
	}
}

// FuzzDecodeSignedKeys: any bytes decode to a list or an error, never a
// panic, and a decoded list encodes back to the same bytes.
func FuzzDecodeSignedKeys(f *testing.F) {
	f.Add(uplink.EncodeSignedKeys([]uplink.SignedKey{{ID: "site-a", Cert: []byte{1, 2}, Sig: []byte{3}}}))
	f.Add(uplink.EncodeSignedKeys(nil))
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		ks, err := uplink.DecodeSignedKeys(b)
		if err != nil {
			return
		}
		if got := uplink.EncodeSignedKeys(ks); string(got) != string(b) {
			t.Fatalf("%x decodes to %d entries that encode to %x", b, len(ks), got)
		}
	})
}

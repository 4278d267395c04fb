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

// TestCheckSurvivors: signed secure aggregation's consistency round. Four
// sites (threshold 3) mask honestly, so every view matches; the server
// then announces a survivor set U3 to each site (possibly a different one:
// a live site-d claimed dropped to some, so that they reveal its mask key
// while the others reveal its self-mask seed) and relays a list of the
// signatures it collected. Each site checks the list against its own view
// and U3 before revealing. Every view check passes in every case (the
// views are signed before U3 exists); the survivor check refuses every
// lie.
func TestCheckSurvivors(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ids := []string{"site-a", "site-b", "site-c", "site-d"}
	fed := secaggid.New(t, now, ids...)
	rogue := secaggid.New(t, now, "site-b")
	session := uplink.SecAggSession("run", 1, 0)
	cfg := secagg.Config{Threshold: 3, Dim: 4}
	clients := map[string]*secagg.Client{}
	kl := &secagg.KeyList{Session: session}
	for _, id := range ids {
		c, err := secagg.NewClient(cfg, session, id, crand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		clients[id] = c
		kl.Sites = append(kl.Sites, c.Advertise().Keys)
	}
	boxes := map[string][]secagg.EncryptedShare{}
	for _, id := range ids {
		sk, err := clients[id].ShareKeys(kl, crand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range sk.Boxes {
			boxes[b.Peer] = append(boxes[b.Peer], secagg.EncryptedShare{Peer: id, Box: b.Box})
		}
	}
	views := map[string][32]byte{}
	var viewSigs []uplink.SignedKey
	for _, id := range ids {
		if _, err := clients[id].MaskInput(&secagg.ShareList{Session: session, To: id, Boxes: boxes[id]}, make([]uint32, 4)); err != nil {
			t.Fatal(err)
		}
		k, holders, _ := clients[id].View()
		views[id] = uplink.SecAggViewDigest(session, k, holders)
		sig, _ := fed.Get(id).Sign(views[id], crand.Reader)
		viewSigs = append(viewSigs, uplink.SignedKey{ID: id, Cert: fed.Get(id).Cert, Sig: sig})
	}
	all, noD := ids, ids[:3]
	digest := func(id string, u3 []string) [32]byte { return uplink.SecAggSurvivorsDigest(session, views[id], u3) }
	sign := func(id string, u3 []string) uplink.SignedKey {
		sig, err := fed.Get(id).Sign(digest(id, u3), crand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return uplink.SignedKey{ID: id, Cert: fed.Get(id).Cert, Sig: sig}
	}
	// honest: every site is shown u3 and signs it; the server relays all.
	honest := func(u3 []string) func(string) ([]string, []uplink.SignedKey) {
		return func(string) ([]string, []uplink.SignedKey) {
			var s []uplink.SignedKey
			for _, id := range u3 {
				s = append(s, sign(id, u3))
			}
			return u3, s
		}
	}
	for _, tc := range []struct {
		name string
		// shown is the U3 the server shows site id and the signatures it
		// relays to it.
		shown  func(id string) ([]string, []uplink.SignedKey)
		refuse map[string]string // site -> the refusal's text; absent = passes
	}{
		{"honest, every site survives", honest(all), nil},
		{"honest, site-d dropped", honest(noD), nil},
		{"a live site claimed dropped to site-a only, every signature relayed", func(id string) ([]string, []uplink.SignedKey) {
			shown := map[string][]string{"site-a": noD}
			var s []uplink.SignedKey
			for _, j := range ids {
				u := all
				if shown[j] != nil {
					u = shown[j]
				}
				s = append(s, sign(j, u))
			}
			if shown[id] != nil {
				return shown[id], s[:3]
			}
			return all, s
		}, map[string]string{"site-a": "site site-b: the signature", "site-b": "site site-a: the signature", "site-c": "site site-a", "site-d": "site site-a"}},
		{"two survivor sets, each site relayed only the signatures of its own", func(id string) ([]string, []uplink.SignedKey) {
			if id == "site-a" || id == "site-b" {
				return noD, []uplink.SignedKey{sign("site-a", noD), sign("site-b", noD)}
			}
			return all, []uplink.SignedKey{sign("site-c", all), sign("site-d", all)}
		}, map[string]string{"site-a": "2 of 3 survivors signed", "site-b": "2 of 3", "site-c": "2 of 4", "site-d": "2 of 4"}},
		{"fewer than the threshold relayed", func(string) ([]string, []uplink.SignedKey) {
			return all, []uplink.SignedKey{sign("site-a", all), sign("site-b", all)}
		}, map[string]string{"site-a": "2 of 4 survivors signed the survivor set, threshold 3", "site-b": "2 of 4", "site-c": "2 of 4", "site-d": "2 of 4"}},
		{"no signatures (the consistency round skipped)", func(string) ([]string, []uplink.SignedKey) { return all, nil },
			map[string]string{"site-a": "0 of 4", "site-b": "0 of 4", "site-c": "0 of 4", "site-d": "0 of 4"}},
		{"a signature of a site outside U3", func(string) ([]string, []uplink.SignedKey) {
			_, s := honest(all)("")
			return noD, s
		}, map[string]string{"site-a": "site site-d signed but is not a survivor", "site-b": "site-d signed", "site-c": "site-d signed"}},
		{"one site signed twice", func(string) ([]string, []uplink.SignedKey) {
			_, s := honest(all)("")
			return all, append(s, s[0])
		}, map[string]string{"site-a": "site-a signed twice", "site-b": "signed twice", "site-c": "signed twice", "site-d": "signed twice"}},
		{"a signer's certificate of another CA", func(string) ([]string, []uplink.SignedKey) {
			_, s := honest(all)("")
			sig, _ := rogue.Get("site-b").Sign(digest("site-a", all), crand.Reader)
			s[1] = uplink.SignedKey{ID: "site-b", Cert: rogue.Get("site-b").Cert, Sig: sig}
			return all, s
		}, map[string]string{"site-a": "not the federation CA's", "site-b": "not the federation CA's", "site-c": "not the federation CA's", "site-d": "not the federation CA's"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, id := range ids {
				u3, relayed := tc.shown(id)
				if !contains(u3, id) {
					continue
				}
				if err := uplink.CheckViews(fed.Roots, now, u3, views[id], viewSigs); err != nil {
					t.Fatalf("%s: the view check: %v (it cannot see U3)", id, err)
				}
				err := uplink.CheckSurvivors(fed.Roots, now, cfg.Threshold, u3, digest(id, u3), relayed)
				want, refuse := tc.refuse[id]
				switch {
				case !refuse && err != nil:
					t.Errorf("%s: %v, want it to pass", id, err)
				case refuse && (!errors.Is(err, uplink.ErrSecAggSurvivors) || !strings.Contains(err.Error(), want)):
					t.Errorf("%s: %v, want ErrSecAggSurvivors with %q", id, err, want)
				}
			}
		})
	}
}

// TestCheckSurvivorSet: a site signs one survivor set per session.
func TestCheckSurvivorSet(t *testing.T) {
	session := uplink.SecAggSession("run", 1, 0)
	var view [32]byte
	a := uplink.SecAggSurvivorsDigest(session, view, []string{"site-a", "site-b", "site-c"})
	b := uplink.SecAggSurvivorsDigest(session, view, []string{"site-a", "site-b"})
	other := uplink.SecAggSurvivorsDigest(uplink.SecAggSession("run", 1, 1), view, []string{"site-a", "site-b", "site-c"})
	for _, tc := range []struct {
		name      string
		signed    [32]byte
		has       bool
		shown     [32]byte
		wantError bool
	}{
		{"first set", [32]byte{}, false, a, false},
		{"the same set again", a, true, a, false},
		{"a second set", a, true, b, true},
		{"another session's digest differs", a, true, other, true},
	} {
		err := uplink.CheckSurvivorSet(tc.signed, tc.has, tc.shown)
		if (err != nil) != tc.wantError || (err != nil && !errors.Is(err, uplink.ErrSecAggSurvivors)) {
			t.Errorf("%s: %v, want error %v", tc.name, err, tc.wantError)
		}
	}
}

func contains(v []string, s string) bool {
	for _, x := range v {
		if x == s {
			return true
		}
	}
	return false
}

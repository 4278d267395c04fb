package secagg

import (
	"bytes"
	"slices"
	"testing"
)

// fuzzSeeds returns one encoded message of every kind from a real session.
func fuzzSeeds(t testing.TB) [][]byte {
	st := stage(t, 3)
	r, err := st.cls[0].Unmask(st.req)
	must(t, err)
	sk, err := st.cls[0].ShareKeys(st.kl, seeded(1))
	must(t, err)
	mi, err := st.cls[0].MaskInput(st.sls[0], st.inputs[0])
	must(t, err)
	msgs := []Message{st.cls[0].Advertise(), st.kl, sk, st.sls[0], mi, st.req, r}
	var out [][]byte
	for _, m := range msgs {
		out = append(out, Encode(m))
	}
	return out
}

// FuzzDecodeMessage: Decode never panics, and what it accepts encodes to
// bytes it decodes again to the same bytes.
func FuzzDecodeMessage(f *testing.F) {
	for _, b := range fuzzSeeds(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// As it is, and resealed with a correct checksum so that mutations
		// reach the structure behind it.
		checkDecode(t, b)
		checkDecode(t, sealFrame(b[:max(0, len(b)-4)]))
	})
}

func checkDecode(t *testing.T, b []byte) {
	m, err := Decode(b)
	if err != nil {
		return
	}
	{
		e := Encode(m)
		m2, err := Decode(e)
		if err != nil {
			t.Fatalf("re-encoded %v does not decode: %v", m.Kind(), err)
		}
		if !bytes.Equal(Encode(m2), e) {
			t.Fatalf("%v does not round-trip", m.Kind())
		}
	}
}

// FuzzDecodeState: the state readers never panic on damaged files, and a
// state they accept can take the next step without panicking.
func FuzzDecodeState(f *testing.F) {
	st := stage(f, 3, 1)
	cb, _ := st.cls[0].MarshalBinary()
	sb, _ := st.srv.MarshalBinary()
	f.Add(cb)
	f.Add(sb)
	f.Fuzz(func(t *testing.T, b []byte) {
		checkState(b)
		checkState(sealFrame(b[:max(0, len(b)-4)]))
	})
}

func checkState(b []byte) {
	{
		if c, err := UnmarshalClient(b); err == nil {
			_, _ = c.Unmask(&UnmaskRequest{Session: c.session, Survivors: []string{"site-000", "site-002"}})
			_, _ = c.MarshalBinary() // must not panic; errors are fine on hostile input
		}
		if s, err := UnmarshalServer(b); err == nil {
			s.Pending()
			_, _ = s.Advance()
			_, _ = s.MarshalBinary()
		}
	}
}

// FuzzServerUnmask feeds one hostile unmask response (in place of site 0's)
// to a server holding the others: whatever it is, the session ends with
// the exact sum or an error, never a wrong sum.
func FuzzServerUnmask(f *testing.F) {
	st := stage(f, 4)
	var resp [][]byte
	for _, c := range st.cls {
		r, err := c.Unmask(st.req)
		must(f, err)
		resp = append(resp, Encode(r))
	}
	want := make([]uint32, 8)
	for _, in := range st.inputs {
		AddRing(want, in)
	}
	state, _ := st.srv.MarshalBinary()
	f.Add(resp[0])
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, in := range [][]byte{b, sealFrame(b[:max(0, len(b)-4)])} {
			srv, err := UnmarshalServer(state)
			must(t, err)
			m, err := Decode(in)
			if err != nil || srv.Receive(m) != nil {
				continue // refused: the honest path alone is tested elsewhere
			}
			for _, r := range resp[1:] {
				m, _ := Decode(r)
				_ = srv.Receive(m) // hostile responses may be refused; the check is on Sum below
			}
			if _, err := srv.Advance(); err != nil {
				continue
			}
			if sum, _ := srv.Sum(); !slices.Equal(sum, want) {
				t.Fatalf("wrong sum %v, want %v", sum, want)
			}
		}
	})
}

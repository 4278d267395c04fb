package secagg

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"testing"
)

// seeded returns a deterministic io.Reader for tests.
func seeded(seed uint64) io.Reader {
	var s [32]byte
	for i := range 8 {
		s[i] = byte(seed >> (8 * i))
	}
	return rand.NewChaCha8(s)
}

func siteID(i int) string { return fmt.Sprintf("site-%03d", i) }

// session describes one simulated run. dropAt[i] is the round (0..3) from
// which site i sends nothing; 4 or more = never drops.
type session struct {
	cfg     Config
	k       int
	dropAt  []int
	persist bool // marshal and unmarshal every party after every step
	seed    uint64
	// tamper, if set, may change a message the server is about to receive
	// or a site is about to handle.
	tamper func(m Message)
}

type outcome struct {
	server   *Server
	inputs   [][]uint32
	sum      []uint32
	err      error    // the server's abort, if any
	siteErrs []error  // each site's first error
	received [][]byte // every message the server received, encoded
	states   [][]byte // the server's state after every step
}

// run plays one session with real Client and Server values.
func (s session) run(t testing.TB) outcome {
	t.Helper()
	rnd := seeded(s.seed)
	sess := []byte(fmt.Sprintf("run-%d", s.seed))
	var o outcome
	srv, err := NewServer(s.cfg, sess)
	if err != nil {
		t.Fatal(err)
	}
	clients := make([]*Client, s.k)
	o.siteErrs = make([]error, s.k)
	o.inputs = make([][]uint32, s.k)
	q := Quantizer{Clip: 1, ScaleBits: 16, MaxSites: 64}
	for i := range clients {
		x := make([]float64, s.cfg.Dim)
		for j := range x {
			x[j] = 2*float64(j%7)/7 - 1 + float64(i)/1000
		}
		in, err := q.Quantize(x, rnd)
		if err != nil {
			t.Fatal(err)
		}
		o.inputs[i] = in
		if clients[i], err = NewClient(s.cfg, sess, siteID(i), rnd); err != nil {
			t.Fatal(err)
		}
	}
	persist := func() {
		if !s.persist {
			return
		}
		for i, c := range clients {
			b, _ := c.MarshalBinary()
			if clients[i], err = UnmarshalClient(b); err != nil {
				t.Fatalf("client %d state: %v", i, err)
			}
		}
	}
	alive := func(i, round int) bool { return s.dropAt[i] > round && o.siteErrs[i] == nil }
	deliver := func(m Message) {
		if s.tamper != nil {
			s.tamper(m)
		}
		b := Encode(m)
		o.received = append(o.received, b)
		d, err := Decode(b)
		if err != nil {
			t.Fatalf("decode %v: %v", m.Kind(), err)
		}
		if err := srv.Receive(d); err != nil && !errors.Is(err, ErrAborted) {
			t.Logf("server refuses %v: %v", m.Kind(), err)
		}
	}
	// answer lets site i handle the server message in (after tampering,
	// if the session does) and delivers its answer.
	answer := func(i int, in Message, step func() (Message, error)) {
		if s.tamper != nil {
			s.tamper(in)
		}
		m, err := step()
		if err != nil {
			o.siteErrs[i] = err
			return
		}
		deliver(m)
	}
	advance := func() []Outgoing {
		out, err := srv.Advance()
		o.server = srv
		st, _ := srv.MarshalBinary()
		o.states = append(o.states, st)
		if s.persist {
			var err2 error
			if srv, err2 = UnmarshalServer(st); err2 != nil {
				t.Fatalf("server state: %v", err2)
			}
			o.server = srv
			if err == nil {
				// The restarted server re-sends exactly what Advance gave.
				again := srv.Pending()
				if !slices.EqualFunc(out, again, func(a, b Outgoing) bool {
					return a.To == b.To && bytes.Equal(Encode(a.Msg), Encode(b.Msg))
				}) {
					t.Fatal("Pending after a restart differs from Advance's messages")
				}
			}
		}
		if err != nil {
			o.err = err
			return nil
		}
		return out
	}
	for i, c := range clients {
		if alive(i, 0) {
			deliver(c.Advertise())
		}
	}
	out := advance()
	persist()
	if o.err != nil {
		return o
	}
	kl := decodeAs[*KeyList](t, out[0].Msg)
	for i, c := range clients {
		if !alive(i, 1) || index(kl.Sites, c.ID()) < 0 {
			continue
		}
		answer(i, kl, func() (Message, error) { return c.ShareKeys(kl, rnd) })
	}
	out = advance()
	persist()
	if o.err != nil {
		return o
	}
	for _, g := range out {
		var i int
		if _, err := fmt.Sscanf(g.To, "site-%d", &i); err != nil {
			t.Fatalf("recipient %q: %v", g.To, err)
		}
		if !alive(i, 2) {
			continue
		}
		sl := decodeAs[*ShareList](t, g.Msg)
		answer(i, sl, func() (Message, error) { return clients[i].MaskInput(sl, o.inputs[i]) })
	}
	out = advance()
	persist()
	if o.err != nil {
		return o
	}
	req := decodeAs[*UnmaskRequest](t, out[0].Msg)
	for _, id := range req.Survivors {
		var i int
		if _, err := fmt.Sscanf(id, "site-%d", &i); err != nil {
			t.Fatalf("survivor %q: %v", id, err)
		}
		if !alive(i, 3) {
			continue
		}
		answer(i, req, func() (Message, error) { return clients[i].Unmask(req) })
	}
	advance()
	o.server = srv
	if o.err == nil {
		o.sum, o.err = srv.Sum()
	}
	return o
}

// decodeAs round-trips m through its encoding, as a network would.
func decodeAs[M Message](t testing.TB, m Message) M {
	t.Helper()
	d, err := Decode(Encode(m))
	if err != nil {
		t.Fatalf("decode %v: %v", m.Kind(), err)
	}
	return d.(M)
}

// plainSum is the ring sum of the inputs of the sites that sent a masked
// input.
func plainSum(inputs [][]uint32, dropAt []int) []uint32 {
	sum := make([]uint32, len(inputs[0]))
	for i, in := range inputs {
		if dropAt[i] > 2 {
			AddRing(sum, in)
		}
	}
	return sum
}

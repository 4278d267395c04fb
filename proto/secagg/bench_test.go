package secagg

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkSecAgg runs whole sessions and reports, per session: the bytes
// one site sends (up) and receives (down) in each round, the CPU time of
// one site (all its rounds) and of the server (every Decode, Receive and
// Advance; thread CPU time on Linux, so a loaded machine does not inflate it),
// for docs/results.md's two models: Fashion-MNIST multinomial logistic
// regression (784 x 10 + 10 = 7,850 parameters) and the breast-cancer
// binary logistic regression (30 + 1). drop is the share of sites that
// shared their keys and then sent no masked input (the costly case for the
// server: it reconstructs each one's mask key and removes its pairwise
// masks from every survivor). Degree > 0 is SecAgg+'s sparse graph.
//
//	go test -run '^$' -bench SecAgg -benchtime 2x ./proto/secagg/
//
// (the figures are the last session's, after a warm-up one).
func BenchmarkSecAgg(b *testing.B) {
	type bc struct{ k, dim, degree, t int }
	cases := []bc{}
	for _, k := range []int{10, 100} {
		for _, dim := range []int{7850, 31} {
			cases = append(cases, bc{k, dim, 0, DefaultThreshold(k)})
		}
	}
	cases = append(cases, bc{100, 7850, 40, 21}, bc{100, 31, 40, 21})
	for _, c := range cases {
		for _, drop := range []int{0, 10, 30} {
			name := fmt.Sprintf("K=%d/dim=%d/drop=%d%%", c.k, c.dim, drop)
			if c.degree > 0 {
				name = fmt.Sprintf("K=%d/dim=%d/degree=%d/drop=%d%%", c.k, c.dim, c.degree, drop)
			}
			b.Run(name, func(b *testing.B) {
				cfg := Config{Threshold: c.t, Degree: c.degree, GraphSeed: [32]byte{7}, Dim: c.dim}
				var m benchMetrics
				for i := 0; b.Loop(); i++ {
					m = benchSession(b, cfg, c.k, drop, uint64(i))
				}
				up, down := 0, 0
				for r := range 4 {
					up += m.up[r]
					b.ReportMetric(float64(m.up[r]), fmt.Sprintf("r%d-up-B/site", r))
					if r < 3 {
						down += m.down[r]
						b.ReportMetric(float64(m.down[r]), fmt.Sprintf("r%d-down-B/site", r))
					}
				}
				b.ReportMetric(float64(up), "up-B/site")
				b.ReportMetric(float64(down), "down-B/site")
				b.ReportMetric(m.site.Seconds()*1e3, "site-ms")
				b.ReportMetric(m.server.Seconds()*1e3, "server-ms")
			})
		}
	}
}

type benchMetrics struct {
	up, down     [4]int        // mean bytes per site and round
	site, server time.Duration // mean per site that took part in every round; total of the server
}

// benchSession runs one session; drop% of the sites (spread over the ids)
// send no masked input.
func benchSession(b *testing.B, cfg Config, k, drop int, seed uint64) benchMetrics {
	rnd := seeded(seed)
	sess := []byte("bench")
	var m benchMetrics
	siteTime := make([]time.Duration, k)
	srv, err := NewServer(cfg, sess)
	if err != nil {
		b.Fatal(err)
	}
	clients := make([]*Client, k)
	inputs := make([][]uint32, k)
	dropped := func(i int) bool { return i*drop/100 != (i+1)*drop/100 } // exactly k*drop/100, spread
	ndrop := 0
	for i := range k {
		if dropped(i) {
			ndrop++
		}
		inputs[i] = make([]uint32, cfg.Dim)
		for j := range inputs[i] {
			inputs[i][j] = uint32(i*j) % 1000
		}
	}
	defer lockThread()()
	timed := func(d *time.Duration, f func() error) {
		t0 := threadCPU()
		err := f()
		*d += threadCPU() - t0
		if err != nil {
			b.Fatal(err)
		}
	}
	send := func(r int, msg Message) {
		e := Encode(msg)
		m.up[r] += len(e)
		var d Message
		timed(&m.server, func() (err error) {
			if d, err = Decode(e); err == nil {
				err = srv.Receive(d)
			}
			return err
		})
	}
	advance := func(r int) []Outgoing {
		var out []Outgoing
		timed(&m.server, func() (err error) { out, err = srv.Advance(); return err })
		for _, o := range out {
			m.down[r] += len(Encode(o.Msg))
		}
		m.down[r] /= max(1, len(out)) // one broadcast, or one ShareList per site
		return out
	}
	for i := range k {
		timed(&siteTime[i], func() (err error) { clients[i], err = NewClient(cfg, sess, siteID(i), rnd); return err })
		send(0, clients[i].Advertise())
	}
	kl := advance(0)[0].Msg.(*KeyList)
	for i, c := range clients {
		var sk *ShareKeys
		timed(&siteTime[i], func() (err error) { sk, err = c.ShareKeys(kl, rnd); return err })
		send(1, sk)
	}
	for i, o := range advance(1) {
		if dropped(i) {
			continue
		}
		var mi *MaskedInput
		timed(&siteTime[i], func() (err error) { mi, err = clients[i].MaskInput(o.Msg.(*ShareList), inputs[i]); return err })
		send(2, mi)
	}
	req := advance(2)[0].Msg.(*UnmaskRequest)
	for i, c := range clients {
		if dropped(i) {
			continue
		}
		var r *UnmaskResponse
		timed(&siteTime[i], func() (err error) { r, err = c.Unmask(req); return err })
		send(3, r)
	}
	advance(3)
	if _, err := srv.Sum(); err != nil {
		b.Fatal(err)
	}
	// Means per site: rounds 0 and 1 over all sites, rounds 2 and 3 over
	// the sites that took part.
	for r := range 4 {
		m.up[r] /= map[bool]int{true: k - ndrop, false: k}[r >= 2]
	}
	for i, d := range siteTime {
		if !dropped(i) {
			m.site += d
		}
	}
	m.site /= time.Duration(k - ndrop)
	return m
}

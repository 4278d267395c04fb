package e2e

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/node/storage"
)

// TestScaffoldStraggler: SCAFFOLD under a quorum below 1, with a straggler
// whose round 1 update is rejected. site-3 reaches the broker through a
// TCP relay that stops passing what the site sends (the aggregator's
// announcements still reach it) once the aggregator knows it: site-3
// solves round 1 and commits its c_i with the update, which waits in the
// relay while round 1 closes at its deadline on the quorum of the other
// two. Round 2's announcement finds that update unreceipted, site-3 is
// killed with SIGKILL there (its c_i and the update committed, no
// receipt), the relay opens and site-3 restarts: the update reaches the
// aggregator after its round closed and is rejected (STALE_ROUND), so it
// is never counted, and site-3 must take its delta c back out of c_i. The
// aggregator is killed once as well, with a later round's first update in.
// Then, from the state files: every site's c_i is the sum of its own
// counted control deltas, bit for bit, and c after the last round is the
// mean of the sites' c_i (the invariant SCAFFOLD's correction needs).
func TestScaffoldStraggler(t *testing.T) {
	e2eTest(t)
	const (
		sites     = 3
		rounds    = 5
		straggler = "site-3"
	)
	dir := t.TempDir()
	federation := "scafstrag"
	passwd := filepath.Join(dir, "passwd")
	setPasswords(t, dir, passwd, siteIDs(sites)...)
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	agg := newAggregator(t, dir, aggDefaults(federation).with(kv{
		{"per_round", fmt.Sprint(sites)}, {"rounds", fmt.Sprint(rounds)}, {"quorum_fraction", "0.6"},
		{"round_timeout", "4s"}, {"settle", "3s"}, {"log_level", "debug"},
		{"algorithm", "scaffold"}, {"codec", "fp32"},
		{"listen", listen}, {"password_file", passwd},
	}))
	relay := newRelay(t, listen)
	var edges []*edge
	for i, id := range siteIDs(sites) {
		broker := "tcp://" + listen
		extra := kv{}
		if id == straggler {
			// The relay holds its sends for seconds: no publish timeout
			// in between (a reconnect would wait in the relay too).
			broker, extra = "tcp://"+relay.addr(), kv{{"publish_timeout", "60s"}}
		}
		c := agentConf(federation, broker, id, passwordFile(dir, id), i, sites, 80).with(extra)
		edges = append(edges, newEdge(t, dir, id, c))
	}
	v := edges[2]
	agg.p.waitLine(20*time.Second, straggler+" online", msgIs("client online", "client", straggler))
	relay.hold()
	agg.p.waitLine(20*time.Second, "round 1 announced", msgIs("round announced", "round", 1))
	agg.p.waitLine(30*time.Second, "round 1 closed without "+straggler, msgIs("round aggregated", "round", 1))
	// Round 2 finds round 1's update unreceipted: the site waits for its
	// receipt (or, without that rule, solves round 2 on top of it).
	v.p.waitLine(30*time.Second, straggler+" at round 2", func(l logLine) bool {
		return msgIs("round solved", "round", 2)(l) || (l.num("round") == 2 && l.msg() == "this site's previous update awaits its receipt (FedSplit sum mode, SCAFFOLD); the round is answered when it comes")
	})
	v.p.kill()
	relay.release()
	v.start()
	agg.p.waitLine(60*time.Second, "round 3 announced", msgIs("round announced", "round", 3))
	agg.p.waitLine(60*time.Second, "an update of round 3", msgIs("update accepted", "round", 3))
	agg.p.kill()
	agg.start()
	agg.waitFinished(90 * time.Second)
	waitReceipted(t, edges)
	stopFederation(t, agg, edges...)
	if n := len(v.lines(msgIs("update rejected by the aggregator; dropped", "round", 1))); n == 0 {
		t.Fatalf("%s's round 1 update was not rejected: the test did not make a straggler", straggler)
	}

	st := readAggState(t, agg.state)
	if st.phase != "finished" || st.coordRnd != rounds {
		t.Fatalf("aggregator state: phase %s round %d", st.phase, st.coordRnd)
	}
	if _, in := st.updates[1][straggler]; in {
		t.Fatalf("round 1 stored %s's update: the test did not make a straggler", straggler)
	}
	fp32, err := quant.Parse("fp32")
	if err != nil {
		t.Fatal(err)
	}
	c, ci := scaffoldFromLog(t, agg.state, st, fp32, rounds, sites)
	mean := make([]float64, len(c))
	for _, e := range edges {
		es, err := edgestore.OpenEdge(copyState(t, e.state), storage.Options{LockTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		got, err := es.Residual(edgestore.ResidualControl)
		es.Close()
		if errors.Is(err, storage.ErrNotFound) && ci[e.id] == nil {
			continue // never counted: c_i = 0
		}
		if err != nil {
			t.Fatalf("%s: c_i: %v", e.id, err)
		}
		if !slices.Equal(got, ci[e.id]) {
			t.Fatalf("%s: its c_i is not the sum of its counted control deltas, bit for bit (max |c_i| %g, counted %g)", e.id, maxAbs(got), maxAbs(ci[e.id]))
		}
		for k, x := range got {
			mean[k] += x / sites
		}
	}
	var off float64
	for k := range c {
		off = max(off, math.Abs(c[k]-mean[k]))
	}
	if off > 1e-6*max(1, maxAbs(c)) {
		t.Fatalf("after the last round c is off the mean of the sites' c_i by %g (max |c| %g)", off, maxAbs(c))
	}
	t.Logf("%s's round 1 update rejected; c is the mean of the sites' c_i after %d rounds (off by %.1e, fp32 downlink; max |c| %.3g); rounds %s took part in: %v",
		straggler, rounds, off, maxAbs(c), straggler, roundsOf(st, straggler, rounds))
}

// scaffoldFromLog replays the round log: each round's stored c must be
// the previous round's plus (1/sites) times the sum of that round's
// decoded control deltas (in id order, through the fp32 downlink), bit for
// bit; it returns c after the last round and each site's sum of its own
// counted deltas.
func scaffoldFromLog(t *testing.T, path string, st aggState, codec *quant.Codec, rounds uint64, sites int) ([]float64, map[string][]float64) {
	t.Helper()
	s, err := aggstore.OpenAgg(copyState(t, path), storage.Options{LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	down, err := quant.Parse("fp32")
	if err != nil {
		t.Fatal(err)
	}
	var c []float64
	ci := map[string][]float64{}
	for r := uint64(1); r <= rounds; r++ {
		rec, err := s.Round(r)
		if err != nil {
			t.Fatal(err)
		}
		if r > 1 && !slices.Equal(decodeControl(t, rec.Control), c) {
			t.Fatalf("round %d: the stored c is not the round log's, bit for bit", r)
		}
		_, c = replayControl(t, r, st.updates[r], slices.Sorted(maps.Keys(st.updates[r])), codec, down, c, ci, sites)
	}
	return c, ci
}

func decodeControl(t *testing.T, b []byte) []float64 {
	t.Helper()
	c, err := storage.DecodeFloats(b, "control")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// roundsOf lists the rounds whose log holds id's update.
func roundsOf(st aggState, id string, rounds uint64) []uint64 {
	var out []uint64
	for r := uint64(1); r <= rounds; r++ {
		if _, ok := st.updates[r][id]; ok {
			out = append(out, r)
		}
	}
	return out
}

// relay is a TCP relay to a broker whose site-to-broker direction can be
// held (hold, release): what the site sends meanwhile waits in the relay,
// as on a link that delivers downstream only, and then arrives late, in
// order.
type relay struct {
	ln     net.Listener
	target string
	gate   sync.RWMutex
	mu     sync.Mutex
	held   bool
	conns  []net.Conn
}

func newRelay(t *testing.T, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, target: target}
	t.Cleanup(func() {
		ln.Close()
		r.release()
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, c := range r.conns {
			c.Close()
		}
	})
	go r.serve()
	return r
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) hold() {
	r.gate.Lock()
	r.mu.Lock()
	r.held = true
	r.mu.Unlock()
}

func (r *relay) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held {
		r.held = false
		r.gate.Unlock()
	}
}

func (r *relay) serve() {
	for {
		site, err := r.ln.Accept()
		if err != nil {
			return
		}
		broker, err := net.Dial("tcp", r.target)
		if err != nil {
			site.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, site, broker)
		r.mu.Unlock()
		go func() { // broker -> site: always open
			_, _ = io.Copy(site, broker)
			site.Close()
		}()
		go func() { // site -> broker: through the gate
			defer broker.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := site.Read(buf)
				if n > 0 {
					r.gate.RLock()
					_, werr := broker.Write(buf[:n])
					r.gate.RUnlock()
					if werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

package aggregator

import (
	"errors"
	"github.com/edgefl/edgefl/node/aggstore"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/learn/aggregate"

	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// A round closes as soon as every selected client has reported: FedAvg
// weights by sample count, the next round carries the new model.
func TestServerRoundClosesWhenAllReport(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.Rounds = 2
	cfg.BrokerURL, cfg.Username, cfg.Password = "", "", ""
	cfg.Dial = f.brk.Dial // the embedded broker's in-process connection
	r := f.start(cfg)
	samples := map[string]uint64{"site-a": 10, "site-b": 30, "site-c": 60}
	agents := map[string]*fakeAgent{}
	for id, n := range samples {
		agents[id] = f.agent(id, n)
	}
	ann := agents["site-a"].nextRound(t, 1)
	if !slices.Equal(ann.Selected, []string{"site-a", "site-b", "site-c"}) || ann.Algorithm != AlgoFedAvg ||
		ann.Aggregator != "fedavg" || ann.Global.Dimension != 6 || ann.UplinkCodec != "fp32" || ann.Federation != testFed {
		t.Fatalf("announcement %v", ann)
	}
	if got := decodeGlobal(t, ann); !slices.Equal(got, make([]float64, 6)) {
		t.Fatalf("initial model %v", got)
	}
	if ann.DeadlineUnixMs != start0.Add(time.Minute).UnixMilli() {
		t.Errorf("deadline %d", ann.DeadlineUnixMs)
	}
	want := make([]float64, 6)
	for i, id := range []string{"site-a", "site-b", "site-c"} {
		v := vec(float64(i + 1))
		agents[id].send(t, update(t, id, 1, v, samples[id]))
		wantReceipt(t, agents[id].receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
		for j := range want {
			want[j] += v[j] * float64(samples[id]) / 100
		}
	}
	rr := r.round(t)
	if rr.Round != 1 || len(rr.Contributors) != 3 || len(rr.Stragglers) != 0 {
		t.Fatalf("round report %+v", rr)
	}
	if err := closeTo(rr.Global, want, 1e-12); err != nil {
		t.Fatalf("FedAvg: %v", err)
	}
	ann2 := agents["site-b"].nextRound(t, 2)
	if err := closeTo(decodeGlobal(t, ann2), want, 1e-6); err != nil {
		t.Fatalf("round 2 global: %v", err)
	}
	v := waitView(t, r.s, "round 2 collecting", func(v ServerView) bool { return v.Round == 2 && v.Phase == coordinator.PhaseCollecting })
	if v.LastParticipants != 3 || v.Counters.Accepted != 3 {
		t.Errorf("view %+v", v)
	}
	// The last round finishes the federation.
	for id, n := range samples {
		agents[id].send(t, update(t, id, 2, vec(1), n))
	}
	select {
	case <-r.s.Finished():
	case <-time.After(waitLong):
		t.Fatal("not finished")
	}
	if x, round := r.s.Global(); round != 3 || closeTo(x, vec(1), 1e-12) != nil {
		t.Errorf("final model %v (round %d)", x, round)
	}
}

// At the deadline a round closes with a quorum; the missing client is a
// straggler.
func TestServerDeadlineClosesOnQuorum(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.QuorumFraction = 2.0 / 3
	cfg.Settle = time.Second
	cfg.Algorithm = AlgoFedProx // uniform mean
	r := f.start(cfg)
	a, b, c := f.agent("site-a", 10), f.agent("site-b", 10), f.agent("site-c", 10)
	waitView(t, r.s, "3 online", func(v ServerView) bool { return v.Online == 3 })
	f.clock.Advance(time.Second) // Settle
	ann := a.nextRound(t, 1)
	if len(ann.Selected) != 3 || ann.Aggregator != "mean" {
		t.Fatalf("announcement %v", ann)
	}
	a.send(t, update(t, "site-a", 1, vec(1), 10))
	b.send(t, update(t, "site-b", 1, vec(3), 10))
	a.receipt(t)
	b.receipt(t)
	waitView(t, r.s, "2 received", func(v ServerView) bool { return len(v.Received) == 2 })
	f.clock.Advance(time.Minute)
	rr := r.round(t)
	if !slices.Equal(rr.Contributors, []string{"site-a", "site-b"}) || !slices.Equal(rr.Stragglers, []string{"site-c"}) {
		t.Fatalf("round report %+v", rr)
	}
	if err := closeTo(rr.Global, vec(2), 1e-12); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(time.Second) // Settle before the next draw
	c.nextRound(t, 2)
	// The straggler's update for the closed round is refused (FedProx
	// keeps no late updates).
	c.send(t, update(t, "site-c", 1, vec(9), 10))
	wantReceipt(t, c.receipt(t), 1, false, wire.ReceiptCode_RECEIPT_CODE_STALE_ROUND)
	v := waitView(t, r.s, "counters", func(v ServerView) bool { return v.Counters.Stragglers == 1 && v.Rejected["stale_round"] == 1 })
	if v.LastStragglers != 1 {
		t.Errorf("view %+v", v)
	}
}

// Every kind of bad update is rejected with a counter (and a receipt when
// its round is known) and leaves the model alone.
func TestServerBadUpdates(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.K = 2
	cfg.MaxMessageBytes = 2048
	cfg.MetricsAddr = "127.0.0.1:0"
	r := f.start(cfg)
	a, b := f.agent("site-a", 10), f.agent("site-b", 30)
	x := f.agent("site-x", 0) // connected, never sent a status
	inj := f.agent("injector", 0)
	a.nextRound(t, 1)

	good := func() *wire.ClientUpdate { return update(t, "site-a", 1, vec(1), 10) }
	enc := func(u *wire.ClientUpdate) []byte {
		bts, err := wire.Encode(u)
		if err != nil {
			t.Fatal(err)
		}
		return bts
	}
	nan := vec(1)
	nan[2] = math.NaN()
	inf := vec(1)
	inf[0] = math.Inf(-1)
	withPayload := func(p []byte) *wire.ClientUpdate { u := good(); u.Vector.Payload = p; return u }
	frame := fp32(t, vec(1))
	tests := []struct {
		name    string
		from    *fakeAgent
		topicID string // "" = the sender's own topic
		payload []byte
		reason  string
		code    wire.ReceiptCode // UNSPECIFIED = no receipt expected
	}{
		{"wrong dimension", a, "", enc(update(t, "site-a", 1, []float64{1, 2, 3}, 10)), "wrong_dimension", wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE},
		{"frame dimension differs from header", a, "", enc(func() *wire.ClientUpdate { u := good(); u.Vector.Payload = fp32(t, []float64{1, 2, 3}); return u }()), "wrong_dimension", wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE},
		{"NaN", a, "", enc(withPayload(rawFP32(nan))), "non_finite", wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE},
		{"Inf", a, "", enc(withPayload(rawFP32(inf))), "non_finite", wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE},
		{"truncated frame", a, "", enc(withPayload(frame[:len(frame)-7])), "truncated_payload", wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE},
		{"bad checksum", a, "", enc(withPayload(flip(frame, len(frame)-1))), "bad_checksum", wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE},
		{"not a frame", a, "", enc(withPayload([]byte("hello"))), "bad_frame", wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE},
		{"z-delta kind in a fedprox federation", a, "", enc(func() *wire.ClientUpdate { u := good(); u.Kind = wire.UpdateKind_UPDATE_KIND_Z_DELTA; return u }()), "unsupported_kind", wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE},
		{"control delta outside scaffold", a, "", enc(func() *wire.ClientUpdate {
			u := good()
			u.ControlDelta = &wire.Vector{Codec: "fp32", Dimension: 6, Payload: frame}
			return u
		}()), "unexpected_control", wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE},
		{"truncated envelope", a, "", enc(good())[:40], "malformed", 0},
		{"oversized", a, "", enc(withPayload(make([]byte, 4096))), "too_large", 0},
		{"unknown envelope version", a, "", withVersion(enc(good()), 9), "unsupported_version", 0},
		{"garbage", a, "", []byte{0xff, 0xff, 0xff}, "malformed", 0},
		{"topic/client id mismatch", inj, "site-a", enc(update(t, "site-b", 1, vec(5), 30)), "topic_mismatch", 0},
		{"future round", a, "", enc(update(t, "site-a", 5, vec(1), 10)), "future_round", wire.ReceiptCode_RECEIPT_CODE_FUTURE_ROUND},
		{"unknown client", x, "", enc(update(t, "site-x", 1, vec(1), 10)), "unknown_client", wire.ReceiptCode_RECEIPT_CODE_UNKNOWN_CLIENT},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, _ := r.s.Watch()
			topicID := tt.topicID
			if topicID == "" {
				topicID = tt.from.id
			}
			topic, _ := tt.from.topics.Update(topicID)
			tt.from.pub(t, topic, false, tt.payload)
			if tt.code != 0 {
				round := uint64(1)
				if tt.reason == "future_round" {
					round = 5
				}
				wantReceipt(t, tt.from.receipt(t), round, false, tt.code)
			}
			waitView(t, r.s, "rejection "+tt.reason, func(v ServerView) bool { return v.Rejected[tt.reason] == before.Rejected[tt.reason]+1 })
			if v, _ := r.s.Watch(); v.Counters.Accepted != 0 || len(v.Received) != 0 {
				t.Fatalf("a bad update was accepted: %+v", v)
			}
		})
	}
	// Nothing above reached the round: the valid updates alone make the
	// model, and a duplicate gets an accepted receipt again.
	a.send(t, good())
	wantReceipt(t, a.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	a.send(t, good())
	wantReceipt(t, a.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_DUPLICATE)
	waitView(t, r.s, "duplicate counted", func(v ServerView) bool { return v.Rejected["duplicate"] == 1 })
	b.send(t, update(t, "site-b", 1, vec(5), 30))
	wantReceipt(t, b.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	rr := r.round(t)
	if err := closeTo(rr.Global, vec(4), 1e-12); err != nil { // (10*1 + 30*5)/40 = 4
		t.Fatalf("model affected by bad updates: %v", err)
	}
	// A stale update (round 1 after it closed) and a late duplicate.
	a.nextRound(t, 2)
	a.send(t, update(t, "site-a", 1, vec(7), 10))
	wantReceipt(t, a.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_DUPLICATE)
	x.status(t, true, 5)
	waitView(t, r.s, "site-x online", func(v ServerView) bool { return v.Online == 3 })
	x.send(t, update(t, "site-x", 1, vec(7), 10))
	wantReceipt(t, x.receipt(t), 1, false, wire.ReceiptCode_RECEIPT_CODE_STALE_ROUND)
	waitView(t, r.s, "stale counted", func(v ServerView) bool { return v.Rejected["stale_round"] == 1 })
	if x, _ := r.s.Global(); closeTo(x, vec(4), 1e-12) != nil {
		t.Fatalf("model changed: %v", x)
	}

	// The metrics endpoint shows the counters.
	resp, err := http.Get("http://" + r.s.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`edgefl_aggregator_updates_rejected_total{reason="wrong_dimension"} 2`,
		`edgefl_aggregator_updates_rejected_total{reason="non_finite"} 2`,
		`edgefl_aggregator_updates_rejected_total{reason="topic_mismatch"} 1`,
		`edgefl_aggregator_updates_rejected_total{reason="unsupported_version"} 1`,
		`edgefl_aggregator_updates_rejected_total{reason="too_large"} 1`,
		`edgefl_aggregator_updates_rejected_total{reason="duplicate"} 2`,
		`edgefl_aggregator_updates_rejected_total{reason="unknown_client"} 1`,
		`edgefl_aggregator_updates_rejected_total{reason="future_round"} 1`,
		`edgefl_aggregator_updates_rejected_total{reason="stale_round"} 1`,
		`edgefl_aggregator_updates_rejected_total{reason="not_selected"} 0`,
		`edgefl_aggregator_updates_accepted_total 2`,
		`edgefl_aggregator_round 2`,
		`edgefl_aggregator_participants 2`,
		`edgefl_aggregator_rounds_closed_total 1`,
		`edgefl_aggregator_aggregation_seconds_count 1`,
		`edgefl_aggregator_received_bytes_total{kind="update"}`,
		`# TYPE edgefl_aggregator_updates_rejected_total counter`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if t.Failed() {
		t.Log(string(body))
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("content type %q", ct)
	}
}

// rawFP32 builds an fp32 frame of v without Encode's finiteness check, by
// patching a valid frame's values and checksum.
func rawFP32(v []float64) []byte {
	return rawFrameFP32(v)
}

func flip(b []byte, i int) []byte {
	c := slices.Clone(b)
	c[i] ^= 0x01
	return c
}

// withVersion rewrites the envelope version varint (field 1, first byte
// pair 0x08 0x01 in an encoded envelope).
func withVersion(b []byte, v byte) []byte {
	c := slices.Clone(b)
	if c[0] == 0x08 {
		c[1] = v
	}
	return c
}

// A restarted server resumes the open round from the state file: the
// update received before the restart counts, and the round closes when the
// other selected client reports.
func TestServerRestartResumesOpenRound(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.K = 2
	r1 := f.start(cfg)
	a, b := f.agent("site-a", 10), f.agent("site-b", 10)
	ann := a.nextRound(t, 1)
	a.send(t, update(t, "site-a", 1, vec(1), 10))
	wantReceipt(t, a.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	r1.stop(t)
	b.nextRound(t, 1) // drain

	// While the aggregator is down, site-b's update waits in the broker
	// (the aggregator's persistent session).
	b.send(t, update(t, "site-b", 1, vec(3), 10))
	r2 := f.start(cfg)
	ann2 := a.nextRound(t, 1) // re-announced on resume
	if !slices.Equal(ann2.Selected, ann.Selected) || ann2.DeadlineUnixMs != ann.DeadlineUnixMs {
		t.Fatalf("resumed announcement %v, was %v", ann2, ann)
	}
	wantReceipt(t, b.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	rr := r2.round(t)
	if rr.Round != 1 || len(rr.Contributors) != 2 {
		t.Fatalf("round report %+v", rr)
	}
	if err := closeTo(rr.Global, vec(2), 1e-12); err != nil {
		t.Fatal(err)
	}
	a.nextRound(t, 2)
	// A re-send of the update accepted before the restart is a duplicate.
	a.send(t, update(t, "site-a", 1, vec(1), 10))
	wantReceipt(t, a.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_DUPLICATE)
	r2.stop(t)

	// status reads the file once the daemon is gone.
	st, err := aggstore.OpenAgg(cfg.StatePath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s, err := ReadStatus(st)
	if err != nil {
		t.Fatal(err)
	}
	if s.Round != 2 || s.Federation != testFed || len(s.Clients) != 2 || s.Clients[0].Participation != 1 || s.Clients[0].LastSeen == nil {
		t.Fatalf("status %+v", s)
	}
}

// The same restart, at the moment between the checkpoint of an aggregated
// round and the next announcement: the round is not aggregated twice.
func TestServerRestartAfterCheckpoint(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.K = 1
	cfg.Rounds = 1
	r1 := f.start(cfg)
	a := f.agent("site-a", 10)
	a.nextRound(t, 1)
	a.send(t, update(t, "site-a", 1, vec(1), 10))
	a.receipt(t)
	r1.round(t)
	<-r1.s.Finished()
	r1.stop(t)
	r2 := f.start(cfg)
	select {
	case <-r2.s.Finished():
	case <-time.After(waitLong):
		t.Fatal("a finished federation did not resume as finished")
	}
	if x, round := r2.s.Global(); round != 2 || closeTo(x, vec(1), 1e-12) != nil {
		t.Fatalf("global %v round %d", x, round)
	}
}

// FedSplit: a straggler's late update for a closed round becomes its
// latest z and enters the next mean.
func TestServerLateFedSplitUpdate(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.K = 2
	cfg.QuorumFraction = 0.5
	cfg.Algorithm = AlgoFedSplit
	cfg.Params.Step = 0.5
	cfg.Params.Relax = 1
	cfg.Settle = time.Second
	r := f.start(cfg)
	a, b := f.agent("site-a", 10), f.agent("site-b", 10)
	waitView(t, r.s, "2 online", func(v ServerView) bool { return v.Online == 2 })
	f.clock.Advance(time.Second)
	ann := a.nextRound(t, 1)
	if len(ann.Selected) != 2 || ann.Aggregator != "" || ann.Params.Step != 0.5 {
		t.Fatalf("announcement %v", ann)
	}
	a.send(t, update(t, "site-a", 1, vec(2), 10))
	a.receipt(t)
	waitView(t, r.s, "1 received", func(v ServerView) bool { return len(v.Received) == 1 })
	f.clock.Advance(time.Minute)
	rr := r.round(t)
	if err := closeTo(rr.Global, vec(2), 1e-12); err != nil { // mean of the only z
		t.Fatal(err)
	}
	f.clock.Advance(time.Second)
	b.nextRound(t, 2)
	// site-b's late round-1 update: stored as its latest z.
	b.send(t, update(t, "site-b", 1, vec(4), 10))
	r1 := b.receipt(t)
	wantReceipt(t, r1, 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	waitView(t, r.s, "late accepted", func(v ServerView) bool { return v.Counters.AcceptedLate == 1 })
	// Round 2 closes at its deadline with site-a only: x3 = mean(z_a2, z_b1).
	a.send(t, update(t, "site-a", 2, vec(6), 10))
	a.receipt(t)
	waitView(t, r.s, "round 2 received", func(v ServerView) bool { return v.Round == 2 && len(v.Received) == 1 })
	f.clock.Advance(time.Minute)
	rr = r.round(t)
	if err := closeTo(rr.Global, vec(5), 1e-12); err != nil {
		t.Fatalf("late z not in the mean: %v", err)
	}
	if rr.Late != 1 {
		t.Errorf("late = %d", rr.Late)
	}
	// A second copy of the late update is a duplicate; an older one stale.
	b.send(t, update(t, "site-b", 1, vec(4), 10))
	wantReceipt(t, b.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_DUPLICATE)
}

// A retained status offline makes the client unselectable; the status
// endpoint and the healthz answer.
func TestServerStatusEndpoint(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.K = 1
	cfg.MetricsAddr = "127.0.0.1:0"
	r := f.start(cfg)
	a := f.agent("site-a", 10)
	a.nextRound(t, 1)
	for _, path := range []string{"/status", "/healthz"} {
		resp, err := http.Get("http://" + r.s.MetricsAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: %d %s", path, resp.StatusCode, body)
		}
		if path == "/status" && (!strings.Contains(string(body), `"id": "site-a"`) || !strings.Contains(string(body), `"phase": "collecting"`)) {
			t.Errorf("status body %s", body)
		}
	}
	a.status(t, false, 10)
	waitView(t, r.s, "offline", func(v ServerView) bool { return v.Online == 0 })
}

// Bad configurations are refused before anything runs.
func TestNewServerBadConfig(t *testing.T) {
	f := newFixture(t)
	tests := []struct {
		name string
		mod  func(*ServerConfig)
	}{
		{"no federation", func(c *ServerConfig) { c.Federation = "" }},
		{"bad federation", func(c *ServerConfig) { c.Federation = "a/b" }},
		{"K zero", func(c *ServerConfig) { c.K = 0 }},
		{"quorum above one", func(c *ServerConfig) { c.QuorumFraction = 1.5 }},
		{"unknown algorithm", func(c *ServerConfig) { c.Algorithm = "fedfoo" }},
		{"fedsplit without step", func(c *ServerConfig) { c.Algorithm = AlgoFedSplit; c.Params.Step = 0 }},
		{"bad aggregator", func(c *ServerConfig) { c.Aggregator = "nope" }},
		{"bad selector", func(c *ServerConfig) { c.Selector = "nope" }},
		{"bad model", func(c *ServerConfig) { c.Model.Kind = "cnn" }},
		{"bad codec", func(c *ServerConfig) { c.Codec = "q9" }},
		{"codec dct beyond the model", func(c *ServerConfig) { c.Codec = "dct:28x28x10+q8" }},
		{"NaN mu", func(c *ServerConfig) { c.Algorithm = AlgoFedProx; c.Params.Mu = math.NaN() }},
		{"no state", func(c *ServerConfig) { c.StatePath = "" }},
		{"no broker", func(c *ServerConfig) { c.BrokerURL = "" }},
		{"eval data of another shape", func(c *ServerConfig) { c.Eval = evalData(3) }},
		{"bad init", func(c *ServerConfig) { c.Init = "ones" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := f.config()
			tt.mod(&cfg)
			s, err := NewServer(cfg)
			if err == nil {
				s.Close()
				t.Fatal("accepted")
			}
		})
	}
	// A state file of another model is refused.
	cfg := f.config()
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	cfg.Model.Classes = 3
	if s, err := NewServer(cfg); err == nil {
		s.Close()
		t.Fatal("state file of another model accepted")
	}
}

// zDelta is a Z_DELTA update of d against the copy set by round base.
func zDelta(t *testing.T, id string, round, base uint64, d []float64) *wire.ClientUpdate {
	u := update(t, id, round, d, 10)
	u.Kind, u.BaseRound = wire.UpdateKind_UPDATE_KIND_Z_DELTA, base
	return u
}

// FedSplit deltas: base round 0 is against the round's global model, later
// ones against the copy the client's previous update set; a delta against a
// copy the server does not hold is refused (BASE_MISMATCH, counted) and
// changes nothing, and the client's reset (base 0) is taken.
func TestServerFedSplitZDeltas(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.K, cfg.Algorithm, cfg.Params.Step, cfg.Params.Relax = 1, AlgoFedSplit, 0.5, 1
	cfg.Init, cfg.InitSeed = InitModel, 3
	r := f.start(cfg)
	a := f.agent("site-a", 10)
	x1 := decodeGlobal(t, a.nextRound(t, 1))
	a.send(t, zDelta(t, "site-a", 1, 0, vec(1)))
	wantReceipt(t, a.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	z1 := make([]float64, 6)
	for i := range z1 {
		z1[i] = x1[i] + vec(1)[i]
	}
	if rr := r.round(t); !slices.Equal(rr.Global, f32s(z1)) { // one client: x2 = z_1, as fp32
		t.Fatalf("x2 = %v, want x1 + delta = %v", rr.Global, f32s(z1))
	}
	a.nextRound(t, 2)
	a.send(t, zDelta(t, "site-a", 2, 1, vec(2))) // against round 1's copy
	wantReceipt(t, a.receipt(t), 2, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	z2 := make([]float64, 6)
	for i := range z2 {
		z2[i] = z1[i] + vec(2)[i]
	}
	if rr := r.round(t); !slices.Equal(rr.Global, f32s(z2)) {
		t.Fatalf("x3 = %v, want the copy + delta %v (as fp32)", rr.Global, f32s(z2))
	}
	x3 := decodeGlobal(t, a.nextRound(t, 3))
	a.send(t, zDelta(t, "site-a", 3, 1, vec(3))) // round 1's copy: replaced by round 2's
	wantReceipt(t, a.receipt(t), 3, false, wire.ReceiptCode_RECEIPT_CODE_BASE_MISMATCH)
	v := waitView(t, r.s, "mismatch counted", func(v ServerView) bool { return v.Rejected["base_mismatch"] == 1 })
	if len(v.Received) != 0 {
		t.Fatalf("a refused delta was counted as received: %v", v.Received)
	}
	a.send(t, zDelta(t, "site-a", 3, 0, vec(3))) // the client's reset: against x3
	wantReceipt(t, a.receipt(t), 3, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	z3 := make([]float64, 6)
	for i := range z3 {
		z3[i] = x3[i] + vec(3)[i]
	}
	if rr := r.round(t); !slices.Equal(rr.Global, f32s(z3)) {
		t.Fatalf("x4 = %v, want x3 + delta %v (as fp32)", rr.Global, f32s(z3))
	}
}

// FedProx deltas are against the round's global model; with an fp16
// downlink the server keeps the global model as the sites decode it.
func TestServerDeltaAndFP16Downlink(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.K, cfg.Rounds, cfg.Algorithm, cfg.Downlink = 1, 2, AlgoFedProx, "fp16"
	cfg.Init, cfg.InitSeed = InitModel, 3
	r := f.start(cfg)
	a := f.agent("site-a", 10)
	ann := a.nextRound(t, 1)
	x1 := decodeGlobal(t, ann)
	if ann.Global.Codec != "fp16" {
		t.Fatalf("global model codec %q", ann.Global.Codec)
	}
	if x, _ := r.s.Global(); !slices.Equal(x, x1) {
		t.Fatalf("server's model %v, the sites decode %v", x, x1)
	}
	u := update(t, "site-a", 1, vec(1), 10)
	u.Kind = wire.UpdateKind_UPDATE_KIND_DELTA
	a.send(t, u)
	wantReceipt(t, a.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
	rr := r.round(t)
	x2 := decodeGlobal(t, a.nextRound(t, 2))
	if !slices.Equal(rr.Global, x2) {
		t.Fatalf("round 2: server's model %v, the sites decode %v", rr.Global, x2)
	}
	for i := range x2 {
		if want := x1[i] + vec(1)[i]; math.Abs(x2[i]-want) > 1e-3*max(1, math.Abs(want)) {
			t.Fatalf("x2[%d] = %v, want x1 + delta = %v to fp16 precision", i, x2[i], want)
		}
	}
}

func f32s(x []float64) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(float32(v))
	}
	return out
}

// SimProx remembers each client's previous model; a restart rebuilds that
// memory from the round log, so round 3 aggregates exactly as without it.
func TestServerRestartKeepsSimProxHistory(t *testing.T) {
	sends := map[uint64][2][]float64{1: {vec(1), vec(3)}, 2: {vec(2), vec(-1)}, 3: {vec(5), vec(2)}}
	run := func(restart bool) (x3, final []float64) {
		f := newFixture(t)
		cfg := f.config()
		cfg.K, cfg.Rounds, cfg.Algorithm, cfg.Aggregator = 2, 3, AlgoFedProx, "simprox"
		r := f.start(cfg)
		a, b := f.agent("site-a", 10), f.agent("site-b", 10)
		for round := uint64(1); round <= 3; round++ {
			if restart && round == 3 {
				r.stop(t)
				r = f.start(cfg)
			}
			a.nextRound(t, round)
			b.nextRound(t, round)
			a.send(t, update(t, "site-a", round, sends[round][0], 10))
			b.send(t, update(t, "site-b", round, sends[round][1], 10))
			for _, ag := range []*fakeAgent{a, b} {
				rc := ag.receipt(t)
				for rc.Round < round { // a redelivery across the restart: a duplicate
					rc = ag.receipt(t)
				}
				wantReceipt(t, rc, round, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
			}
			rr := r.round(t)
			if round == 2 {
				x3 = rr.Global
			}
			final = rr.Global
		}
		return x3, final
	}
	x3, straight := run(false)
	_, restarted := run(true)
	if !slices.Equal(straight, restarted) {
		t.Fatalf("round 3 after a restart\n%v\nwithout one\n%v", restarted, straight)
	}
	// The history matters: SimProx without memory weighs round 3 otherwise.
	fresh, err := aggregate.NewAggregator("simprox", 7)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float64, len(x3))
	ups := []aggregate.Update{{Client: "site-a", Params: sends[3][0], Samples: 10}, {Client: "site-b", Params: sends[3][1], Samples: 10}}
	if _, err := fresh.Aggregate(x3, ups, out); err != nil {
		t.Fatal(err)
	}
	if slices.Equal(f32s(out), straight) {
		t.Fatal("round 3 does not depend on SimProx's memory: the test shows nothing")
	}
}

// A FedSplit delta stored just before a crash, whose coordinator state was
// not (the two are separate transactions), comes back as a re-send after
// the restart: it is taken as stored, not refused because the copy of z_j
// it set has moved past its base round.
func TestServerStoreUpdateResentAfterCrash(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.K, cfg.Algorithm, cfg.Params.Step, cfg.Params.Relax = 1, AlgoFedSplit, 0.5, 1
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	in := func(m *wire.ClientUpdate, d []float64) *inUpdate {
		raw, err := wire.Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		return &inUpdate{msg: m, raw: raw, vec: d}
	}
	now := f.clock.Now()
	if _, err := s.storeUpdate(in(zDelta(t, "site-a", 1, 0, vec(1)), vec(1)), now); err != nil {
		t.Fatalf("round 1 (base 0): %v", err)
	}
	if err := s.store.OpenRound(aggstore.Round{Number: 2, OpenedAt: now, Config: s.conf, State: []byte("{}")}, make([]float64, 6)); err != nil {
		t.Fatal(err)
	}
	u2 := in(zDelta(t, "site-a", 2, 1, vec(2)), vec(2))
	if _, err := s.storeUpdate(u2, now); err != nil {
		t.Fatalf("round 2 (base 1): %v", err)
	}
	r, want, err := s.store.ClientZ("site-a")
	if err != nil || r != 2 {
		t.Fatalf("copy after round 2: round %d, %v", r, err)
	}
	if idx, err := s.storeUpdate(u2, now); err != nil || idx != 0 {
		t.Fatalf("the same round-2 update again: %d, %v, want it taken as stored", idx, err)
	}
	if r, got, err := s.store.ClientZ("site-a"); err != nil || r != 2 || !slices.Equal(got, want) {
		t.Fatalf("copy after the re-send: round %d %v, %v; want round 2 %v", r, got, err, want)
	}
	// A delta of a round not stored yet is still checked against the copy.
	if err := s.store.OpenRound(aggstore.Round{Number: 3, OpenedAt: now, Config: s.conf, State: []byte("{}")}, make([]float64, 6)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.storeUpdate(in(zDelta(t, "site-a", 3, 1, vec(3)), vec(3)), now); !errors.Is(err, uplink.ErrBaseMismatch) {
		t.Fatalf("round 3 against round 1's copy: %v, want uplink.ErrBaseMismatch", err)
	}
}

// A site that goes offline after the last round is shown
// offline by status (the coordinator's table, which status prefers, used
// to ignore statuses once finished).
func TestStatusAfterFinishTracksPresence(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.K, cfg.Rounds = 1, 1
	r := f.start(cfg)
	a := f.agent("site-a", 10)
	a.nextRound(t, 1)
	a.send(t, update(t, "site-a", 1, vec(1), 10))
	a.receipt(t)
	<-r.s.Finished()
	a.status(t, false, 10)
	waitView(t, r.s, "site-a offline", func(v ServerView) bool { return v.Online == 0 })
	r.stop(t)
	st, err := aggstore.OpenAgg(cfg.StatePath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s, err := ReadStatus(st)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Clients) != 1 || s.Clients[0].Online {
		t.Fatalf("status after the run: %+v, want site-a offline", s.Clients)
	}
}

// encMsg encodes any wire message.
func encMsg(t *testing.T, m wire.Message) []byte {
	t.Helper()
	b, err := wire.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A run without a federation schema answers statistics and evaluation
// reports on the update topic with a BAD_UPDATE receipt of their subject
// and counts them; it did panic on them once (a type assertion on the
// update topic's body).
func TestServerWithoutSchemaRefusesSiteReports(t *testing.T) {
	f := newFixture(t)
	cfg := f.config()
	cfg.K = 1
	r := f.start(cfg)
	a := f.agent("site-a", 10)
	a.nextRound(t, 1)
	topic, _ := a.topics.Update("site-a")
	for _, tt := range []struct {
		msg     wire.Message
		subject wire.ReceiptSubject
		counted func(ServerView) uint64
	}{
		{&wire.SiteStatistics{ClientId: "site-a", SchemaDigest: strings.Repeat("ab", 32), Stats: []byte("{}")},
			wire.ReceiptSubject_RECEIPT_SUBJECT_STATISTICS, func(v ServerView) uint64 { return v.StatsRejected["no_schema"] }},
		{&wire.EvalReport{ClientId: "site-a", Round: 1, Report: []byte("{}")},
			wire.ReceiptSubject_RECEIPT_SUBJECT_EVALUATION, func(v ServerView) uint64 { return v.EvalsRejected["no_schema"] }},
	} {
		a.pub(t, topic, false, encMsg(t, tt.msg))
		rc := a.receipt(t)
		if rc.Accepted || rc.Code != wire.ReceiptCode_RECEIPT_CODE_BAD_UPDATE || rc.Subject != tt.subject {
			t.Fatalf("receipt %v, want a BAD_UPDATE of subject %v", rc, tt.subject)
		}
		waitView(t, r.s, "counted", func(v ServerView) bool { return tt.counted(v) == 1 })
	}
	// The round goes on: the site's update is stored.
	a.send(t, update(t, "site-a", 1, vec(1), 10))
	wantReceipt(t, a.receipt(t), 1, true, wire.ReceiptCode_RECEIPT_CODE_STORED)
}

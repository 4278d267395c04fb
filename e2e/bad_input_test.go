package e2e

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/proto/wire"
)

// TestBadInputOnUpdateTopic publishes hostile updates with mosquitto_pub
// through Mosquitto (the shipped ACL: each as a site allowed to publish on
// that topic) into a running federation, while one site is held
// (SIGSTOP) so that the open round, and with it the expected verdict of
// every message, is fixed. Each is rejected with its reason's log line and
// counter (edgefl_aggregator_updates_rejected_total{reason}), nothing
// panics, the aggregator stays healthy, and after the held site is
// released the run ends on exactly the global model of the same
// federation run without the bad input, bit for bit.
func TestBadInputOnUpdateTopic(t *testing.T) {
	needMosquitto(t)
	ref := runBadInputFederation(t, "reference", false)
	if bitsEqual(ref, make([]float64, len(ref))) {
		t.Fatal("the reference run did not move the model off its zero initialisation")
	}
	got := runBadInputFederation(t, "injected", true)
	if !bitsEqual(ref, got) {
		var maxd float64
		for i := range ref {
			maxd = max(maxd, math.Abs(ref[i]-got[i]))
		}
		t.Fatalf("the final global model differs from the run without bad input (max |diff| %g)", maxd)
	}
}

const badRounds = 6

// runBadInputFederation runs three sites and returns the final global
// model; with inject, the bad input goes in mid-run.
func runBadInputFederation(t *testing.T, name string, inject bool) []float64 {
	const sites = 3
	dir := filepath.Join(t.TempDir(), name)
	if err := mkdir(dir); err != nil {
		t.Fatal(err)
	}
	federation := "hostile"
	pw := setPasswords(t, dir, filepath.Join(dir, "passwd"), append(siteIDs(sites), "aggregator", "observer", "ghost")...)
	m := newMosquitto(t, dir, federation)
	obs := newObserver(t, m.url(), federation, pw["observer"])
	agg := newAggregator(t, dir, aggDefaults(federation).with(kv{
		{"broker", m.url()}, {"username", "aggregator"}, {"broker_password_file", passwordFile(dir, "aggregator")},
		{"per_round", fmt.Sprint(sites)}, {"rounds", fmt.Sprint(badRounds)},
		// Epoch-bound solves and a far deadline: the model does not
		// depend on timing, so two runs must agree bit for bit.
		{"max_epochs", "2"}, {"max_seconds", "0"}, {"round_timeout", "60s"},
		{"max_message_bytes", "1048576"},
	}))
	edges := startEdges(t, dir, federation, m.url(), sites, 60, nil)
	if inject {
		injectBadInput(t, agg, m, obs, edges, pw)
	}
	agg.waitFinished(60 * time.Second)
	waitReceipted(t, edges)
	stopFederation(t, agg, edges...)
	st := readAggState(t, agg.state)
	if st.phase != "finished" || st.coordRnd != badRounds || st.finalR != badRounds+1 || !allFinite(st.final) {
		t.Fatalf("%s: phase %s round %d checkpoint %d finite %v", name, st.phase, st.coordRnd, st.finalR, allFinite(st.final))
	}
	for r := uint64(1); r <= badRounds; r++ {
		if got := st.contributors(r); !slices.Equal(got, siteIDs(sites)) {
			t.Errorf("%s: round %d stored updates from %v, want exactly the sites", name, r, got)
		}
	}
	return st.final
}

// badCase is one hostile publish and the rejection it must get ("" = the
// aggregator must never see it).
type badCase struct {
	name, user, topicID string
	payload             []byte
	reason              string
}

func injectBadInput(t *testing.T, agg *aggregator, m *mosquitto, obs *observer, edges []*edge, pw map[string]string) {
	t.Helper()
	held := edges[2]
	agg.waitMetrics(30*time.Second, "round 3", func(m metrics) bool { return m.round() >= 3 })
	held.p.signal(syscall.SIGSTOP)
	t.Cleanup(func() {
		if held.p.alive() {
			held.p.cmd.Process.Signal(syscall.SIGCONT)
		}
	})
	// Frozen: a round after the last one the held site solved before the
	// stop can never get its update. (Rounds follow each other at once when
	// every site is online, so the round open at the stop may still close:
	// the held site's update for it can be on its way.)
	var lastSolved uint64
	for _, l := range held.p.all() {
		if l.msg() == "round solved" {
			lastSolved = max(lastSolved, uint64(l.num("round")))
		}
	}
	// The open round has the other two sites' updates, not the held one's.
	var r uint64
	waitFor(t, 30*time.Second, "the open round to wait for the held site only", func() (bool, error) {
		mm, err := agg.scrape()
		if err != nil {
			return false, err
		}
		if mm.phase() != "collecting" || mm["edgefl_aggregator_round_received"] != 2 {
			return false, nil
		}
		st, err := statusOf(agg.metrics)
		if err != nil {
			return false, err
		}
		r = uint64(st.Round)
		_, have := obs.update("site-1", r)
		return uint64(st.Round) > lastSolved && st.Round == mm.round() && !slices.Contains(st.Received, held.id) && len(st.Received) == 2 && have, nil
	})
	real1, _ := obs.update("site-1", r)
	t.Logf("round %d open, %s held; injecting", r, held.id)

	good := func(client string, round uint64) *wire.ClientUpdate {
		return validUpdate(t, client, round, constVec(dim, 0.25))
	}
	enc := func(u *wire.ClientUpdate) []byte {
		b, err := wire.Encode(u)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	withFrame := func(u *wire.ClientUpdate, frame []byte, d uint32) []byte {
		u.Vector.Payload, u.Vector.Dimension = frame, d
		return enc(u)
	}
	v2, err := wire.EncodeVersion(good("site-1", r), 2)
	if err != nil {
		t.Fatal(err)
	}
	status, err := wire.Encode(&wire.ClientStatus{ClientId: "site-1", Online: true, SampleCount: 5})
	if err != nil {
		t.Fatal(err)
	}
	big := good("site-1", r)
	big.AnchorGrad = constVec(200_000, 1e-3) // 1.6 MB, over the aggregator's 1 MiB
	nanFrame := rawFrame(t, constVec(dim, 0.25), 5, math.NaN())
	infFrame := rawFrame(t, constVec(dim, 0.25), 7, math.Inf(1))
	okFrame := rawFrame(t, constVec(dim, 0.25), -1, 0)
	badCRC := slices.Clone(okFrame)
	badCRC[40] ^= 0x55
	valid := enc(good("site-1", r))
	garbage := make([]byte, 777)
	rng := rand.New(rand.NewPCG(9, 9))
	for i := range garbage {
		garbage[i] = byte(rng.Uint32())
	}

	cases := []badCase{
		{"lower dimension", "site-1", "site-1", withFrame(good("site-1", r), fp32Frame(t, constVec(dim-1, 0.25)), dim-1), "wrong_dimension"},
		{"frame of another dimension than the envelope", "site-1", "site-1", withFrame(good("site-1", r), fp32Frame(t, constVec(dim+1, 0.25)), dim), "wrong_dimension"},
		{"dimension beyond the model", "site-1", "site-1", withFrame(good("site-1", r), fp32Frame(t, constVec(dim+1, 0.25)), dim+1), "invalid"},
		{"NaN", "site-1", "site-1", withFrame(good("site-1", r), nanFrame, dim), "non_finite"},
		{"+Inf", "site-1", "site-1", withFrame(good("site-1", r), infFrame, dim), "non_finite"},
		{"bad checksum", "site-1", "site-1", withFrame(good("site-1", r), badCRC, dim), "bad_checksum"},
		{"truncated frame", "site-1", "site-1", withFrame(good("site-1", r), okFrame[:len(okFrame)/2], dim), "truncated_payload"},
		{"truncated envelope", "site-1", "site-1", valid[:len(valid)/2], "malformed"},
		{"garbage", "site-1", "site-1", garbage, "malformed"},
		{"a status on the update topic", "site-1", "site-1", status, "malformed"},
		{"oversized (over the aggregator's limit)", "site-1", "site-1", enc(big), "too_large"},
		{"oversized (over the broker's packet cap)", "site-1", "site-1", bytes.Repeat([]byte{1}, 17<<20), ""},
		{"unknown envelope version", "site-1", "site-1", v2, "unsupported_version"},
		{"client id not the topic's", "site-1", "site-1", enc(good("site-2", r)), "topic_mismatch"},
		{"unknown client", "ghost", "ghost", enc(good("ghost", r)), "unknown_client"},
		{"stale round", "site-1", "site-1", enc(good("site-1", r-2)), "stale_round"},
		{"future round", "site-1", "site-1", enc(good("site-1", r+1)), "future_round"},
		{"far future round", "site-1", "site-1", enc(good("site-1", r+1_000_000)), "future_round"},
		{"duplicate of the real update", "site-1", "site-1", real1, "duplicate"},
		{"duplicate again", "site-1", "site-1", real1, "duplicate"},
	}
	before := agg.mustScrape()
	want := map[string]float64{}
	for _, c := range cases {
		topic := fmt.Sprintf("edgefl/hostile/updates/%s", c.topicID)
		out, err := mosquittoPub(t, m.port, c.user, pw[c.user], "inject-"+c.user, topic, c.payload)
		if c.reason != "" && err != nil {
			t.Fatalf("%s: mosquitto_pub: %v\n%s", c.name, err, out)
		}
		if c.reason != "" {
			want[c.reason]++
		}
	}
	var after metrics
	waitFor(t, 30*time.Second, "every rejection counted", func() (bool, error) {
		mm, err := agg.scrape()
		if err != nil {
			return false, err
		}
		after = mm
		var missing []string
		for reason, n := range want {
			if d := mm.rejected(reason) - before.rejected(reason); d < n {
				missing = append(missing, fmt.Sprintf("%s %v/%v", reason, d, n))
			}
		}
		return len(missing) == 0, fmt.Errorf("missing %v", missing)
	})
	// Exactly these counts, and nothing else rejected or accepted.
	for reason := range reasonsIn(after) {
		if d := after.rejected(reason) - before.rejected(reason); d != want[reason] {
			t.Errorf("rejected{reason=%q} rose by %v, want %v", reason, d, want[reason])
		}
	}
	if a, b := after["edgefl_aggregator_updates_accepted_total"], before["edgefl_aggregator_updates_accepted_total"]; a != b {
		t.Errorf("accepted updates rose from %v to %v during the injection", b, a)
	}
	if mm := after; mm.round() != int(r) || mm["edgefl_aggregator_round_received"] != 2 {
		t.Errorf("after the injection: round %d with %v received, want round %d with 2", mm.round(), mm["edgefl_aggregator_round_received"], r)
	}
	// A log line per rejection, naming its reason. A rejection is counted
	// before it is logged, and the log reaches this test through a pipe:
	// wait for the lines, then check there are no more.
	linesOf := func(reason string) []logLine {
		if reason == "duplicate" {
			return slices.DeleteFunc(slices.Clone(agg.p.all()), func(l logLine) bool { return !msgIs("duplicate update ignored", "client", "site-1", "round", r)(l) })
		}
		return slices.DeleteFunc(slices.Clone(agg.p.all()), func(l logLine) bool {
			return l.str("reason") != reason || !strings.HasPrefix(l.msg(), "update rejected")
		})
	}
	waitFor(t, 10*time.Second, "a log line per rejection", func() (bool, error) {
		for reason, n := range want {
			if float64(len(linesOf(reason))) < n {
				return false, fmt.Errorf("%d log lines for reason %s, want %v", len(linesOf(reason)), reason, n)
			}
		}
		return true, nil
	})
	for reason, n := range want {
		if lines := linesOf(reason); float64(len(lines)) != n {
			t.Errorf("%d log lines for reason %s, want %v", len(lines), reason, n)
		}
	}
	if code, body, err := httpGet(agg.metrics, "/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("/healthz after the injection: %d %q %v", code, body, err)
	}
	if _, ok := agg.p.panicked(); ok || !agg.p.alive() {
		t.Fatalf("the aggregator died or panicked:\n%s", agg.p.tail(20))
	}
	for _, reason := range slices.Sorted(mapKeys(want)) {
		t.Logf("rejected %-20s x%v", reason, want[reason])
	}
	held.p.signal(syscall.SIGCONT)
}

func reasonsIn(m metrics) map[string]bool {
	out := map[string]bool{}
	for k := range m {
		if r, ok := strings.CutPrefix(k, `edgefl_aggregator_updates_rejected_total{reason="`); ok {
			out[strings.TrimSuffix(r, `"}`)] = true
		}
	}
	return out
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// validUpdate is a well-formed update of vec (fp32 + zstd), as a site
// would send it.
func validUpdate(t *testing.T, client string, round uint64, vec []float64) *wire.ClientUpdate {
	t.Helper()
	return &wire.ClientUpdate{
		ClientId: client, Round: round, Kind: wire.UpdateKind_UPDATE_KIND_FULL,
		Vector:      &wire.Vector{Codec: "fp32", Dimension: uint32(len(vec)), Payload: fp32Frame(t, vec)},
		SampleCount: 40,
		Report: &wire.WorkReport{AchievedGamma: 0.5, Epochs: 2, GradEvals: 8, Seconds: 0.01, LocalLoss: 1.1, AnchorLoss: 1.3,
			StopReason: wire.StopReason_STOP_REASON_MAX_EPOCHS, Partial: true},
		SentAtUnixMs: time.Now().UnixMilli(),
		Seq:          round,
	}
}

func fp32Frame(t *testing.T, vec []float64) []byte {
	t.Helper()
	c, err := quant.ParseWithLimits("fp32", quant.Limits{MaxDim: len(vec)})
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.Encode(nil, vec, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// rawFrame is an uncompressed fp32 frame of vec with value i replaced by x
// (i < 0: unchanged) and a correct checksum: the codec refuses to encode a
// non-finite value, a hostile sender does not ask it (see the frame layout
// in package quant).
func rawFrame(t *testing.T, vec []float64, i int, x float64) []byte {
	t.Helper()
	c, err := quant.ParseWithLimits("fp32+raw", quant.Limits{MaxDim: len(vec)})
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.Encode(nil, vec, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	const header = 32
	n := len(vec)
	if len(f) != header+4*n+4 || f[5] != 0 || f[7] != 1 {
		t.Fatalf("unexpected fp32+raw frame layout: %d bytes, flags %d, coder %d", len(f), f[5], f[7])
	}
	if i >= 0 {
		bits := math.Float32bits(float32(x))
		for b := range 4 { // byte planes: all byte 0s, then all byte 1s...
			f[header+b*n+i] = byte(bits >> (8 * b))
		}
	}
	binary.LittleEndian.PutUint32(f[header+4*n:], crc32.Checksum(f[:header+4*n], crc32.MakeTable(crc32.Castagnoli)))
	return f
}

func constVec(n int, x float64) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = x
	}
	return v
}

// statusOf reads the running aggregator's /status.
func statusOf(addr string) (struct {
	Round    int      `json:"round"`
	Received []string `json:"received"`
}, error) {
	var st struct {
		Round    int      `json:"round"`
		Received []string `json:"received"`
	}
	code, body, err := httpGet(addr, "/status")
	if err != nil {
		return st, err
	}
	if code != http.StatusOK {
		return st, fmt.Errorf("/status: HTTP %d", code)
	}
	return st, json.Unmarshal([]byte(body), &st)
}

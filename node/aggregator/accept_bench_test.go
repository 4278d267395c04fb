package aggregator

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/proto/wire"
)

// quietClient is an MQTT client whose publishes complete at once: the
// shell's per-update path measured without a broker.
type quietClient struct{ mqtt.Client }

type doneToken struct{}

var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (doneToken) Wait() bool                     { return true }
func (doneToken) WaitTimeout(time.Duration) bool { return true }
func (doneToken) Done() <-chan struct{}          { return closedCh }
func (doneToken) Error() error                   { return nil }

func (quietClient) Publish(string, byte, bool, any) mqtt.Token { return doneToken{} }

// acceptBench is a server on a real bbolt file with clients sites online
// and round 1 announced to all of them, driven without MQTT.
type acceptBench struct {
	s   *Server
	ctx context.Context
	ups []*inUpdate
}

func newAcceptBench(tb testing.TB, sites int) *acceptBench {
	return newAcceptBenchAlgo(tb, sites, AlgoFedAvg)
}

// newAcceptBenchAlgo is newAcceptBench for algorithm algo (the FedSplit
// family's updates are FULL z_j).
func newAcceptBenchAlgo(tb testing.TB, sites int, algo string) *acceptBench {
	tb.Helper()
	clk := clock.NewFake(start0)
	cfg := ServerConfig{Federation: testFed, BrokerURL: "tcp://unused", K: sites, QuorumFraction: 1, RoundTimeout: time.Hour,
		Algorithm: algo, Model: testModel, StatePath: filepath.Join(tb.TempDir(), "state.db"), Clock: clk,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Params: Params{Solver: "sgd", LR: 0.1, MaxEpochs: 1, Gamma: 0.5, Step: 0.5}}
	s, err := NewServer(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.store.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	s.runCtx, s.client = ctx, quietClient{}
	b := &acceptBench{s: s, ctx: ctx}
	for i := range sites {
		id := fmt.Sprintf("site-%03d", i)
		if err := s.onStatus(ctx, &wire.ClientStatus{ClientId: id, Online: true, SampleCount: 10}); err != nil {
			tb.Fatal(err)
		}
		m := &wire.ClientUpdate{ClientId: id, Round: 1, Kind: wire.UpdateKind_UPDATE_KIND_FULL,
			Vector: &wire.Vector{Codec: "fp32", Dimension: 6, Payload: fp32Frame(tb, vec(1))}, SampleCount: 10,
			Report: &wire.WorkReport{AnchorLoss: 0.5, Epochs: 1, StopReason: wire.StopReason_STOP_REASON_MAX_EPOCHS}, Seq: 1}
		raw, err := wire.Encode(m)
		if err != nil {
			tb.Fatal(err)
		}
		b.ups = append(b.ups, &inUpdate{msg: m, raw: raw, vec: vec(1)})
	}
	if s.coord.Phase() != coordinator.PhaseCollecting {
		tb.Fatalf("round 1 not announced: phase %s", s.coord.Phase())
	}
	return b
}

// BenchmarkAcceptUpdates is the aggregator shell's cost of accepted
// updates: one op is 99 updates of a round of 100 sites (the round stays
// open), each proposed, stored in the round log and receipted as the event
// loop does, on a real bbolt file (fsync included). cpu-ns/op is the
// process's CPU time: steadier than the wall time on a loaded machine.
func BenchmarkAcceptUpdates(b *testing.B) {
	const sites = 100
	var cpu time.Duration
	defer func() { b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op") }()
	for range b.N {
		b.StopTimer()
		ab := newAcceptBench(b, sites)
		b.StartTimer()
		start := cpuNow()
		for _, u := range ab.ups[:sites-1] {
			if err := ab.s.onUpdate(ab.ctx, u); err != nil {
				b.Fatal(err)
			}
		}
		cpu += cpuNow() - start
		b.StopTimer()
		if n := ab.s.coord.Counters().Accepted; n != sites-1 {
			b.Fatalf("accepted %d, want %d", n, sites-1)
		}
		ab.s.store.Close()
		b.StartTimer()
	}
}

// BenchmarkIngest is durable ingest through the event loop, as the MQTT
// callbacks drive it: workers goroutines (the ingest workers,
// IngestWorkers) hand the updates of one round to the loop and each waits
// until its update is answered, which is after it is durable (receipted;
// the broker's acknowledgement follows). group=1 is one write transaction
// per update, the loop before group commit; group=256 the default. One op
// is one update; updates/s is the durable, receipted rate (the wall time
// of the submissions only: each round's statuses are set up outside it; a
// round holds sites-1 ops, so it stays open). The fedsplit rows are the
// FedSplit family's updates, each with its site's z_j. Run it with
// -benchtime=996x (four rounds of 250 sites, one of 1,000).
func BenchmarkIngest(b *testing.B) {
	for _, c := range []struct {
		sites, group, workers int
		algo                  string
	}{
		{250, 1, DefaultIngestWorkers, ""}, {250, defaultCommitGroup, 4, ""}, {250, defaultCommitGroup, 16, ""}, {250, defaultCommitGroup, DefaultIngestWorkers, ""},
		{1000, 1, DefaultIngestWorkers, ""}, {1000, defaultCommitGroup, DefaultIngestWorkers, ""},
		// The FedSplit family: each update also writes its site's z_j.
		{250, 1, DefaultIngestWorkers, AlgoFedSplit}, {250, defaultCommitGroup, DefaultIngestWorkers, AlgoFedSplit},
	} {
		sites := c.sites
		name := fmt.Sprintf("sites=%d/group=%d/workers=%d", sites, c.group, c.workers)
		algo := AlgoFedAvg
		if c.algo != "" {
			name, algo = c.algo+"/"+name, c.algo
		}
		b.Run(name, func(b *testing.B) {
			var wall, cpu time.Duration
			var txs uint64
			for left := b.N; left > 0; {
				n := min(left, sites-1) // the round stays open
				b.StopTimer()
				ab := newAcceptBenchAlgo(b, sites, algo)
				s := ab.s
				s.group = c.group
				ctx, cancel := context.WithCancel(ab.ctx)
				s.runCtx = ctx
				loopDone := make(chan error, 1)
				go func() { loopDone <- s.loop(ctx) }()
				work := make(chan *inUpdate, n)
				for _, u := range ab.ups[:n] {
					work <- u
				}
				close(work)
				tx0, err := s.store.Commits()
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				t0, c0 := time.Now(), cpuNow()
				var wg sync.WaitGroup
				for range c.workers {
					wg.Go(func() {
						for u := range work {
							if !s.submit(&request{update: u}) {
								b.Error("the loop stopped")
								return
							}
						}
					})
				}
				wg.Wait()
				wall += time.Since(t0)
				cpu += cpuNow() - c0
				b.StopTimer()
				cancel()
				if err := <-loopDone; err != nil {
					b.Fatal(err)
				}
				if got := s.coord.Counters().Accepted; got != uint64(n) {
					b.Fatalf("accepted %d, want %d", got, n)
				}
				tx1, err := s.store.Commits()
				if err != nil {
					b.Fatal(err)
				}
				txs += tx1 - tx0
				s.store.Close()
				left -= n
				b.StartTimer()
			}
			b.ReportMetric(float64(b.N)/wall.Seconds(), "updates/s")
			b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(b.N)/float64(txs), "updates/commit")
		})
	}
}

func fp32Frame(tb testing.TB, v []float64) []byte {
	tb.Helper()
	c, err := quant.Parse("fp32")
	if err != nil {
		tb.Fatal(err)
	}
	f, err := c.Encode(nil, v, nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

// cpuNow is the process's user and system CPU time.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

package aggregator

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/proto/wire"
)

// closeBench is a server on a real bbolt file whose round 1 holds sites
// stored updates of a 784x10 logistic regression (d = 7,850, fp32
// frames): FedAvg deltas, or FedSplit z deltas against the global model
// with each site's z, written straight into the round log (groups of
// 250), and the round's close.
type closeBench struct {
	s  *Server
	cr coordinator.CloseRound
}

func newCloseBench(tb testing.TB, algo string, sites int) *closeBench {
	return newCloseRound(tb, algo, sites, nil)
}

// newCloseRound is newCloseBench with site i's sample count count(i)
// (nil: drawn in [10, 100)).
func newCloseRound(tb testing.TB, algo string, sites int, count func(i int) uint64) *closeBench {
	tb.Helper()
	cfg := ServerConfig{Federation: testFed, BrokerURL: "tcp://unused", K: sites, QuorumFraction: 1, RoundTimeout: time.Hour,
		Algorithm: algo, Model: model.Spec{Kind: model.KindLogReg, Inputs: 784, Classes: 10},
		StatePath: filepath.Join(tb.TempDir(), "state.db"), Clock: clock.NewFake(start0),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Params: Params{Solver: "sgd", LR: 0.1, MaxEpochs: 1, Gamma: 0.5, Step: 0.5}}
	s, err := NewServer(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.store.Close() })
	rng := rand.New(rand.NewPCG(uint64(sites), 1))
	cr := coordinator.CloseRound{Round: 1}
	const chunk = 250
	for lo := 0; lo < sites; lo += chunk {
		var us []aggstore.Update
		var zs [][]float64
		for i := lo; i < min(lo+chunk, sites); i++ {
			id := fmt.Sprintf("site-%05d", i)
			d := make([]float64, s.dim)
			for j := range d {
				d[j] = 0.01 * rng.NormFloat64()
			}
			n := uint64(10 + rng.IntN(90))
			if count != nil {
				n = count(i)
			}
			kind := wire.UpdateKind_UPDATE_KIND_DELTA
			if isSplit(algo) {
				kind = wire.UpdateKind_UPDATE_KIND_Z_DELTA // against x: base round 0
				z := make([]float64, s.dim)
				for j := range z {
					z[j] = s.global[j] + d[j]
				}
				zs = append(zs, z)
			}
			m := &wire.ClientUpdate{ClientId: id, Round: 1, Kind: kind,
				Vector: &wire.Vector{Codec: "fp32", Dimension: uint32(s.dim), Payload: fp32Frame(tb, d)}, SampleCount: n, Seq: 1,
				Report: &wire.WorkReport{AnchorLoss: 0.5, Epochs: 1, StopReason: wire.StopReason_STOP_REASON_MAX_EPOCHS}}
			raw, err := wire.Encode(m)
			if err != nil {
				tb.Fatal(err)
			}
			us = append(us, aggstore.Update{Round: 1, ClientID: id, StoredAt: start0, SampleCount: n, Loss: 0.5, Msg: raw})
			cr.Contributors = append(cr.Contributors, id)
		}
		first, err := s.store.NextLogIndex()
		if err != nil {
			tb.Fatal(err)
		}
		if err := s.store.PutUpdatesZ(first, us, zs); err != nil {
			tb.Fatal(err)
		}
	}
	return &closeBench{s: s, cr: cr}
}

// heapPeak samples the heap's live and not yet swept objects while it
// runs: the peak above the level it started from.
type heapPeak struct {
	stop chan struct{}
	done sync.WaitGroup
	peak atomic.Uint64
	base uint64
}

const heapObjects = "/memory/classes/heap/objects:bytes"

func heapNow() uint64 {
	s := []metrics.Sample{{Name: heapObjects}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func startHeapPeak() *heapPeak {
	runtime.GC()
	h := &heapPeak{stop: make(chan struct{}), base: heapNow()}
	h.done.Go(func() {
		t := time.NewTicker(100 * time.Microsecond)
		defer t.Stop()
		for {
			if v := heapNow(); v > h.peak.Load() {
				h.peak.Store(v)
			}
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
		}
	})
	return h
}

// end stops the sampling and returns the peak above the start.
func (h *heapPeak) end() uint64 {
	if v := heapNow(); v > h.peak.Load() {
		h.peak.Store(v)
	}
	close(h.stop)
	h.done.Wait()
	return max(h.peak.Load(), h.base) - h.base
}

// BenchmarkCloseAggregate is the round close's aggregation (Server.aggregate:
// the round's stored updates read from the round log, decoded against the
// global model and aggregated) of K = 1,000 and 10,000 sites, 784x10
// logistic regression, FedAvg and FedSplit (its robust server step over
// every site's z). B/op is every byte allocated; peak-heap-MB the
// highest heap (live objects and garbage not yet swept) above the level
// before the close, sampled every 100 µs; cpu-ns/op the process's CPU
// time (steadier than the wall time on a loaded machine). Run it once:
//
//	go test ./node/aggregator/ -run '^$' -bench CloseAggregate -benchtime 3x
func BenchmarkCloseAggregate(b *testing.B) {
	for _, c := range []struct {
		algo  string
		sites int
	}{{AlgoFedAvg, 1000}, {AlgoFedAvg, 10000}, {AlgoFedSplit, 1000}, {AlgoFedSplit, 10000}} {
		b.Run(fmt.Sprintf("%s/K=%d", c.algo, c.sites), func(b *testing.B) {
			cb := newCloseBench(b, c.algo, c.sites)
			b.ReportAllocs()
			var peak uint64
			var cpu time.Duration
			for b.Loop() {
				b.StopTimer()
				h := startHeapPeak()
				b.StartTimer()
				c0 := cpuNow()
				next, _, err := cb.s.aggregate(cb.cr)
				cpu += cpuNow() - c0
				b.StopTimer()
				peak = max(peak, h.end())
				b.StartTimer()
				if err != nil || len(next) != cb.s.dim {
					b.Fatalf("aggregate: %d values, %v", len(next), err)
				}
			}
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MB")
			b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

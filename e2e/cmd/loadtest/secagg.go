package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/edgefl/edgefl/node/agent"
	"github.com/edgefl/edgefl/proto/wire"
	"github.com/edgefl/edgefl/sim/localfed"
)

// The per-round figures of scripts/bench-secagg.sh (`loadtest run
// [--secagg [--drop F]]`, the ROUNDS line): per round from the second on (the first warms up),
// the seconds from its announcement to its aggregation, broker-agg's CPU
// seconds in that span, and the bytes the aggregator received and sent for
// the round per selected site (its round history: every message on the
// site topics in, every announcement once per online site, receipts and
// ShareLists out). With --drop F, in every round from the second on, the
// first round(F K) sites stop (as at shutdown: their offline status goes
// out) once their masked input is stored, and are restarted once the round
// is aggregated: dropouts after the masked input, the costly case for the
// aggregator (each dropped site's self mask is reconstructed).

// dropper stops and restarts the dropped sites.
type dropper struct {
	set   map[string]bool
	ch    chan dropEvent
	mu    sync.Mutex
	seen  map[dropEvent]bool
	count map[int]int // round -> sites dropped
}

type dropEvent struct {
	site  string
	round int
}

func newDropper(o options, ids []string) *dropper {
	d := &dropper{set: map[string]bool{}, ch: make(chan dropEvent, len(ids)+1), seen: map[dropEvent]bool{}, count: map[int]int{}}
	n := int(math.Round(o.drop * float64(o.perRound)))
	for _, id := range ids[:min(n, len(ids))] {
		d.set[id] = true
	}
	return d
}

// observe is the agents' Observe hook: a dropped site's stored masked input
// (from round 2 on) stops it.
func (d *dropper) observe(site string, ev agent.Event) {
	if !d.set[site] || ev.Kind != agent.EventReceipt || !ev.Accepted || ev.Subject != wire.ReceiptSubject_RECEIPT_SUBJECT_SECAGG ||
		ev.SecAggKind != wire.SecAggKindMaskedInput || ev.Round < 2 {
		return
	}
	e := dropEvent{site, int(ev.Round)}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seen[e] {
		return
	}
	d.seen[e] = true
	d.count[e.round]++
	select {
	case d.ch <- e:
	default:
	}
}

// run stops each dropped site and restarts it once its round is
// aggregated, until ctx is done.
func (d *dropper) run(ctx context.Context, agents *localfed.Agents, agg *aggProc) {
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-d.ch:
			agents.StopSite(e.site)
			go func() {
				if agg.waitRound(ctx, "round aggregated", e.round) == nil {
					_ = agents.RestartSite(e.site) // ctx done: the run is over
				}
			}()
		}
	}
}

// waitRound waits for the log line msg of round.
func (a *aggProc) waitRound(ctx context.Context, msg string, round int) error {
	for {
		a.mu.Lock()
		for _, e := range a.events {
			if e.msg == msg && e.round == round {
				a.mu.Unlock()
				return nil
			}
		}
		a.mu.Unlock()
		select {
		case <-a.done:
			return fmt.Errorf("waiting for %q: broker-agg exited", msg)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// cpuSampler records broker-agg's CPU seconds every 10 ms.
type cpuSampler struct {
	mu      sync.Mutex
	samples []cpuSample
}

type cpuSample struct {
	at  time.Time
	cpu float64
}

func (c *cpuSampler) run(ctx context.Context, agg *aggProc) {
	for {
		if cpu, err := cpuSeconds(agg.cmd.Process.Pid); err == nil {
			c.mu.Lock()
			c.samples = append(c.samples, cpuSample{time.Now(), cpu})
			c.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// at is the CPU seconds of the last sample at or before t.
func (c *cpuSampler) at(t time.Time) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := 0.0
	for _, s := range c.samples {
		if s.at.After(t) {
			break
		}
		v = s.cpu
	}
	return v
}

// printSecAggResult prints the ROUNDS line: the figures of rounds 2..R.
func printSecAggResult(o options, agg *aggProc, cpu *cpuSampler, drops *dropper) error {
	code, body := httpGet(agg.metrics, "/status")
	if code != http.StatusOK {
		return fmt.Errorf("GET /status: %d", code)
	}
	var st struct {
		Live struct {
			History []struct {
				Round     int     `json:"round"`
				BytesUp   *uint64 `json:"bytes_up"`
				BytesDown *uint64 `json:"bytes_down"`
			} `json:"history"`
		} `json:"live"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		return fmt.Errorf("/status: %w", err)
	}
	aggregated, announced := agg.roundTimes()
	var secs, cpus, ups, downs []float64
	for _, h := range st.Live.History {
		r := h.Round
		if r < 2 || h.BytesUp == nil || h.BytesDown == nil {
			continue
		}
		b, e := announced[r], aggregated[r]
		if b.IsZero() || e.IsZero() {
			return fmt.Errorf("round %d: no announcement or aggregation in the log", r)
		}
		secs = append(secs, e.Sub(b).Seconds())
		cpus = append(cpus, cpu.at(e.Add(50*time.Millisecond))-cpu.at(b))
		ups = append(ups, float64(*h.BytesUp)/float64(o.perRound))
		downs = append(downs, float64(*h.BytesDown)/float64(o.perRound))
	}
	if len(secs) == 0 {
		return fmt.Errorf("no round after the first in the history")
	}
	mean := func(v []float64) float64 { m, _ := stats(v); return m }
	dropped := 0
	drops.mu.Lock()
	for _, n := range drops.count {
		dropped += n
	}
	drops.mu.Unlock()
	fmt.Printf("ROUNDS secagg=%v drop=%g per_round=%d rounds_measured=%d round_s_mean=%.3f aggregator_cpu_s_per_round=%.3f up_bytes_per_site=%.0f down_bytes_per_site=%.0f dropped_sites_total=%d\n",
		o.secagg, o.drop, o.perRound, len(secs), mean(secs), mean(cpus), mean(ups), mean(downs), dropped)
	return nil
}

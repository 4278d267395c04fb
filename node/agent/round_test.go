package agent

import (
	"context"
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/internal/streams"
	"github.com/edgefl/edgefl/learn/aggregate"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/split"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/wire"
)

func mustModel(t testing.TB) model.Model {
	t.Helper()
	m, err := model.New(model.Spec{Kind: model.KindLogReg, Inputs: testInputs, Classes: testClasses, L2: 1e-3})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// decodeUpdate checks the published bytes and returns the update and its
// decoded delta; kind and base round are checked against want and base.
func decodeUpdate(t testing.TB, msg []byte, kind wire.UpdateKind, base uint64) (*wire.ClientUpdate, []float64) {
	t.Helper()
	u, err := wire.DecodeUpdate(msg, wire.Limits{})
	if err != nil {
		t.Fatalf("published update does not decode: %v", err)
	}
	if u.ClientId != testSite || u.Kind != kind || u.BaseRound != base {
		t.Fatalf("update header: %v, want kind %v base round %d", u, kind, base)
	}
	return u, decodeFrame(t, u.Vector.Payload)
}

// plus returns base + d, as the aggregator reconstructs a delta.
func plus(base, d []float64) []float64 {
	out := make([]float64, len(d))
	for i := range d {
		out[i] = base[i] + d[i]
	}
	return out
}

// viaFP32 is what an fp32 delta v - base delivers: base + float32(v - base).
func viaFP32(base, v []float64) []float64 {
	out := make([]float64, len(v))
	for i := range v {
		out[i] = base[i] + float64(float32(v[i]-base[i]))
	}
	return out
}

func TestHandleFedProx(t *testing.T) {
	for _, algo := range []string{AlgoFedProx, AlgoFedAvg, "fedsim"} {
		t.Run(algo, func(t *testing.T) {
			h, _ := newHandler(t)
			x := f32(testGlobal(1))
			ann := announce(t, 1, algo, x)
			ann.AnchorSketch = &wire.SketchSpec{} // full anchor gradient
			res, err := h.Handle(context.Background(), ann)
			if err != nil {
				t.Fatal(err)
			}
			if res.Action != ActionSolved || res.Round != 1 {
				t.Fatalf("action %v round %d", res.Action, res.Round)
			}

			// The same solve, independently: LBFGS is deterministic.
			mu := 0.1
			if algo == AlgoFedAvg {
				mu = 0
			}
			cfg := proxsolver.Config{Solver: proxsolver.LBFGS, Mu: mu, Gamma: 1e-4}
			w, rep, err := proxsolver.Solve(context.Background(), mustModel(t), h.Data, x, nil, cfg,
				proxsolver.Budget{MaxEpochs: 30, Deadline: t0.Add(time.Hour), Clock: clock.NewFake(t0)}, nil)
			if err != nil {
				t.Fatal(err)
			}
			u, d := decodeUpdate(t, res.Msg, wire.UpdateKind_UPDATE_KIND_DELTA, 0)
			got := plus(x, d)
			if want := viaFP32(x, w); !slices.Equal(got, want) {
				t.Fatalf("x + the update's delta is\n%v\nwant the solver's w\n%v", got, want)
			}
			if !slices.Equal(res.Sent, got) {
				t.Fatal("Result.Sent differs from the decoded update")
			}
			r := u.Report
			if r.GradEvals != uint64(rep.GradEvals) || r.AchievedGamma != rep.Gamma || r.LocalLoss != rep.Loss ||
				r.AnchorLoss != rep.AnchorLoss || r.Epochs != uint64(math.Round(rep.Epochs)) {
				t.Fatalf("report %v, solver %+v", r, rep)
			}
			wantStop := stopReason(rep.Stop)
			if r.StopReason != wantStop || r.Partial != (wantStop != wire.StopReason_STOP_REASON_GAMMA_REACHED) {
				t.Fatalf("stop %v partial %v; solver stop %q", r.StopReason, r.Partial, rep.Stop)
			}
			if !slices.Equal(u.AnchorGrad, rep.AnchorGrad) {
				t.Fatal("anchor gradient not sent as asked")
			}
			if u.SampleCount != uint64(h.Data.N) || u.Round != 1 {
				t.Fatalf("sample count %d round %d", u.SampleCount, u.Round)
			}

			st := snapshot(t, h.Store)
			if st.applied != 1 || st.seen != 1 || st.globalRound != 1 || !slices.Equal(st.global, x) {
				t.Fatalf("state after the round: %+v", st)
			}
			if len(st.outbox) != 1 || st.outbox[0].Round != 1 || !slices.Equal(st.outbox[0].Msg, res.Msg) {
				t.Fatalf("outbox %v", st.outbox)
			}
			if st.z != nil {
				t.Fatal("FedProx wrote a FedSplit z")
			}
		})
	}
}

func TestHandleFedSplit(t *testing.T) {
	for _, algo := range []string{AlgoFedSplit, AlgoFedProxSplit} {
		t.Run(algo, func(t *testing.T) {
			h, _ := newHandler(t)
			var z, zs []float64 // the site's z, the aggregator's copy
			for round := uint64(1); round <= 3; round++ {
				x := f32(testGlobal(round))
				ann := announce(t, round, algo, x)
				ann.Params.Step, ann.Params.Relax = 0.5, 0 // relax unset: Peaceman-Rachford
				res, err := h.Handle(context.Background(), ann)
				if err != nil {
					t.Fatal(err)
				}
				if res.Action != ActionSolved {
					t.Fatalf("round %d: %v", round, res.Action)
				}
				if z == nil {
					z = x // z_j starts at the first global model
				}
				// The same step, independently.
				cfg := proxsolver.Config{Solver: proxsolver.LBFGS, Mu: 1 / 0.5, Gamma: 1e-4}
				b := proxsolver.Budget{MaxEpochs: 30, Deadline: t0.Add(time.Hour), Clock: clock.NewFake(t0)}
				zNew, _, err := split.ClientStep(x, z, 0.5, split.Params{Step: 0.5, Relax: 1}, func(v []float64, _ float64) ([]float64, error) {
					w, _, err := proxsolver.Solve(context.Background(), mustModel(t), h.Data, v, x, cfg, b, nil)
					return w, err
				})
				if err != nil {
					t.Fatal(err)
				}
				// The first delta is against x (base round 0), the next
				// ones against the aggregator's copy of the round before.
				base, baseRound := zs, round-1
				if zs == nil {
					base, baseRound = x, 0
				}
				_, d := decodeUpdate(t, res.Msg, wire.UpdateKind_UPDATE_KIND_Z_DELTA, baseRound)
				got := plus(base, d)
				if want := viaFP32(base, zNew); !slices.Equal(got, want) {
					t.Fatalf("round %d: the copy + delta is\n%v\nwant the client step's z\n%v", round, got, want)
				}
				if !slices.Equal(res.Sent, got) {
					t.Fatalf("round %d: Result.Sent is not the aggregator's new copy", round)
				}
				st := snapshot(t, h.Store)
				if st.zRound != round || !slices.Equal(st.z, zNew) {
					t.Fatalf("round %d: stored z (round %d) is not the client step's z", round, st.zRound)
				}
				if st.serverZRound != round || !slices.Equal(st.serverZ, got) {
					t.Fatalf("round %d: stored copy (round %d) is not the aggregator's bit for bit", round, st.serverZRound)
				}
				if st.applied != round || len(st.outbox) != int(round) || !slices.Equal(st.outbox[round-1].Msg, res.Msg) {
					t.Fatalf("round %d: applied %d, outbox %d entries", round, st.applied, len(st.outbox))
				}
				z, zs = zNew, got
			}
		})
	}
}

func TestHandleAppliedRoundIsNotSolvedAgain(t *testing.T) {
	h, _ := newHandler(t)
	ann := announce(t, 4, AlgoFedSplit, f32(testGlobal(4)))
	first, err := h.Handle(context.Background(), ann)
	if err != nil || first.Action != ActionSolved {
		t.Fatal(first.Action, err)
	}
	before := snapshot(t, h.Store)

	// Redelivery, and a re-announcement of the same round (new deadline,
	// re-selection): never solved again, the outbox entry re-sent as is.
	again := announce(t, 4, AlgoFedSplit, f32(testGlobal(9)))
	again.DeadlineUnixMs = t0.Add(time.Hour).UnixMilli()
	for _, a := range []*wire.RoundAnnouncement{ann, again} {
		res, err := h.Handle(context.Background(), a)
		if err != nil {
			t.Fatal(err)
		}
		if res.Action != ActionResend || !slices.Equal(res.Msg, first.Msg) {
			t.Fatalf("action %v, same bytes %v", res.Action, slices.Equal(res.Msg, first.Msg))
		}
		if !snapshot(t, h.Store).equal(before) {
			t.Fatal("re-handling an applied round changed the state")
		}
	}
	// An older round is not solved either.
	res, err := h.Handle(context.Background(), announce(t, 3, AlgoFedSplit, f32(testGlobal(3))))
	if err != nil || res.Action != ActionDone {
		t.Fatalf("older round: %v %v", res.Action, err)
	}

	// CommitRound's own refusal leads to the same re-send (a race with
	// another writer, or a crash between the check and the commit).
	if err := h.Store.CommitRound(4, nil, nil, []byte("x")); !errors.Is(err, storage.ErrAlreadyApplied) {
		t.Fatalf("CommitRound again: %v", err)
	}

	// After the receipt: nothing left to do.
	if had, err := h.Store.Ack(4); err != nil || !had {
		t.Fatal(had, err)
	}
	res, err = h.Handle(context.Background(), ann)
	if err != nil || res.Action != ActionDone || res.Msg != nil {
		t.Fatalf("after the receipt: %v %v", res.Action, err)
	}
}

func TestHandleRestartResends(t *testing.T) {
	h, path := newHandler(t)
	res, err := h.Handle(context.Background(), announce(t, 2, AlgoFedProx, f32(testGlobal(2))))
	if err != nil || res.Action != ActionSolved {
		t.Fatal(res.Action, err)
	}
	if err := h.Store.Close(); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, path)
	defer s.Close()
	h2 := &RoundHandler{ClientID: testSite, Federation: testFed, Store: s, Data: h.Data, Clock: clock.NewFake(t0)}
	out, err := s.Outbox()
	if err != nil || len(out) != 1 || !slices.Equal(out[0].Msg, res.Msg) {
		t.Fatalf("outbox after reopen: %v %v", out, err)
	}
	res2, err := h2.Handle(context.Background(), announce(t, 2, AlgoFedProx, f32(testGlobal(2))))
	if err != nil || res2.Action != ActionResend || !slices.Equal(res2.Msg, res.Msg) {
		t.Fatalf("after restart: %v %v", res2.Action, err)
	}
}

func TestHandleNotSelected(t *testing.T) {
	h, _ := newHandler(t)
	ann := announce(t, 5, AlgoFedProx, f32(testGlobal(5)))
	ann.Selected = []string{"site-b", "site-c"}
	res, err := h.Handle(context.Background(), ann)
	if err != nil || res.Action != ActionNotSelected {
		t.Fatal(res.Action, err)
	}
	st := snapshot(t, h.Store)
	if st.seen != 5 || st.applied != 0 || len(st.outbox) != 0 || st.global != nil {
		t.Fatalf("state %+v", st)
	}
	ann.Selected = append(ann.Selected, testSite)
	if res, err := h.Handle(context.Background(), ann); err != nil || res.Action != ActionSolved {
		t.Fatal(res.Action, err)
	}
}

func TestHandleStaleAnnouncement(t *testing.T) {
	h, _ := newHandler(t)
	if err := h.Store.SetGlobal(8, f32(testGlobal(8))); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, h.Store)
	res, err := h.Handle(context.Background(), announce(t, 6, AlgoFedProx, f32(testGlobal(6))))
	if err != nil || res.Action != ActionStale {
		t.Fatal(res.Action, err)
	}
	if !snapshot(t, h.Store).equal(before) {
		t.Fatal("a stale announcement changed the state")
	}
}

func TestHandleBadAnnouncements(t *testing.T) {
	x := f32(testGlobal(1))
	cases := []struct {
		name string
		mod  func(a *wire.RoundAnnouncement)
	}{
		{"other federation", func(a *wire.RoundAnnouncement) { a.Federation = "ward8" }},
		{"invalid message", func(a *wire.RoundAnnouncement) { a.Round = 0 }},
		{"no global", func(a *wire.RoundAnnouncement) { a.Global = nil }},
		{"vector dimension", func(a *wire.RoundAnnouncement) { a.Global.Dimension = testDim + 1 }},
		{"frame dimension", func(a *wire.RoundAnnouncement) {
			a.Global.Payload = frame(t, "", append(slices.Clone(x), 0))
		}},
		{"model of another shape", func(a *wire.RoundAnnouncement) {
			a.Model.Inputs = testInputs + 1
			a.Global = &wire.Vector{Codec: "fp32", Dimension: (testInputs + 2) * testClasses, Payload: frame(t, "", make([]float64, (testInputs+2)*testClasses))}
		}},
		{"labels beyond the classes", func(a *wire.RoundAnnouncement) {
			a.Model.Classes = 2
			a.Global = &wire.Vector{Codec: "fp32", Dimension: (testInputs + 1) * 2, Payload: frame(t, "", make([]float64, (testInputs+1)*2))}
		}},
		{"NaN in the model", func(a *wire.RoundAnnouncement) { a.Global.Payload = nanFrame(t, testDim) }},
		{"garbage frame", func(a *wire.RoundAnnouncement) { a.Global.Payload = []byte("not a quant frame at all, not at all") }},
		{"truncated frame", func(a *wire.RoundAnnouncement) { a.Global.Payload = a.Global.Payload[:len(a.Global.Payload)-5] }},
		{"bit flip", func(a *wire.RoundAnnouncement) { a.Global.Payload[40] ^= 1 }},
		{"unknown model", func(a *wire.RoundAnnouncement) { a.Model.Kind = "transformer" }},
		{"two hidden layers", func(a *wire.RoundAnnouncement) {
			a.Model = &wire.ModelSpec{Kind: model.KindMLP, Inputs: testInputs, Classes: testClasses, Hidden: []uint32{4, 4}, Activation: "relu"}
		}},
		{"huge inputs", func(a *wire.RoundAnnouncement) { a.Model.Inputs = math.MaxUint32 }},
		{"unknown solver", func(a *wire.RoundAnnouncement) { a.Params.Solver = "adam" }},
		{"gamma above 1", func(a *wire.RoundAnnouncement) { a.Params.Gamma = 2 }},
		{"fedsplit without step", func(a *wire.RoundAnnouncement) { a.Algorithm, a.Params.Step = AlgoFedSplit, 0 }},
		{"fedsplit relax above 1", func(a *wire.RoundAnnouncement) { a.Algorithm, a.Params.Relax = AlgoFedSplit, 1.5 }},
		{"fedsplit tiny step", func(a *wire.RoundAnnouncement) { a.Algorithm, a.Params.Step = AlgoFedSplit, 1e-320 }},
		{"bad uplink codec", func(a *wire.RoundAnnouncement) { a.UplinkCodec = "gzip" }},
		{"uplink dct beyond the model", func(a *wire.RoundAnnouncement) { a.UplinkCodec = "dct:28x28x10+q8" }},
		{"NaN mu", func(a *wire.RoundAnnouncement) { a.Params.Mu = math.NaN() }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, _ := newHandler(t)
			before := snapshot(t, h.Store)
			ann := announce(t, 1, AlgoFedProx, x)
			c.mod(ann)
			res, err := h.Handle(context.Background(), ann)
			if !errors.Is(err, ErrBadAnnouncement) {
				t.Fatalf("got %v, %v; want ErrBadAnnouncement", res.Action, err)
			}
			if res.Msg != nil {
				t.Fatal("an update for a bad announcement")
			}
			if !snapshot(t, h.Store).equal(before) {
				t.Fatalf("a bad announcement changed the state: %+v", snapshot(t, h.Store))
			}
		})
	}
}

func TestHandleBudget(t *testing.T) {
	deadline := t0.Add(10 * time.Second)
	cases := []struct {
		name      string
		local     Local
		round     *wire.WorkBudget
		deadline  time.Time
		epochs    int
		evals     int
		wantDeadl time.Time
	}{
		{"round only", Local{}, &wire.WorkBudget{MaxEpochs: 7, MaxGradEvals: 40}, time.Time{}, 7, 40, time.Time{}},
		{"device smaller", Local{MaxEpochs: 3}, &wire.WorkBudget{MaxEpochs: 7}, time.Time{}, 3, 0, time.Time{}},
		{"round smaller", Local{MaxEpochs: 9}, &wire.WorkBudget{MaxEpochs: 7}, time.Time{}, 7, 0, time.Time{}},
		{"device seconds", Local{MaxSeconds: 5}, &wire.WorkBudget{MaxSeconds: 8}, time.Time{}, 0, 0, t0.Add(5 * time.Second)},
		{"round seconds", Local{MaxSeconds: 5}, &wire.WorkBudget{MaxSeconds: 2}, time.Time{}, 0, 0, t0.Add(2 * time.Second)},
		{"deadline earlier", Local{MaxSeconds: 60}, nil, deadline, 0, 0, deadline.Add(-DefaultDeadlineMargin)},
		{"deadline later", Local{MaxSeconds: 2, DeadlineMargin: -1}, nil, deadline, 0, 0, t0.Add(2 * time.Second)},
		{"deadline, margin", Local{DeadlineMargin: 3 * time.Second}, nil, deadline, 0, 0, deadline.Add(-3 * time.Second)},
		{"nothing: fallback", Local{FallbackSeconds: 42}, nil, time.Time{}, 0, 0, t0.Add(42 * time.Second)},
		{"huge seconds", Local{}, &wire.WorkBudget{MaxSeconds: 1e300}, time.Time{}, 0, 0, t0.Add(time.Duration(math.MaxInt64/int64(time.Second)-1) * time.Second)},
		{"huge epochs", Local{}, &wire.WorkBudget{MaxEpochs: math.MaxUint32, MaxGradEvals: math.MaxUint64}, time.Time{}, math.MaxInt32, math.MaxInt32, time.Time{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := &RoundHandler{Clock: clock.NewFake(t0), Local: c.local}
			ann := &wire.RoundAnnouncement{Budget: c.round}
			if !c.deadline.IsZero() {
				ann.DeadlineUnixMs = c.deadline.UnixMilli()
			}
			b := h.budget(ann)
			if b.MaxEpochs != c.epochs || b.MaxGradEvals != c.evals || !b.Deadline.Equal(c.wantDeadl) {
				t.Fatalf("budget %+v, want epochs %d evals %d deadline %v", b, c.epochs, c.evals, c.wantDeadl)
			}
			if err := b.Validate(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestHandleSolverConfig(t *testing.T) {
	cases := []struct {
		name  string
		algo  string
		p     *wire.Params
		local Local
		want  proxsolver.Config
	}{
		{"fedprox defaults to sgd", AlgoFedProx, &wire.Params{Mu: 0.5}, Local{}, proxsolver.Config{Solver: proxsolver.SGD, Mu: 0.5, LR: DefaultSGDLearningRate, Batch: 90}},
		{"fedsplit defaults to lbfgs", AlgoFedSplit, &wire.Params{Step: 1}, Local{}, proxsolver.Config{Solver: proxsolver.LBFGS, Mu: 1}},
		{"fedavg has no prox term", AlgoFedAvg, &wire.Params{Mu: 0.5, Solver: "sgd", Lr: 0.1, Batch: 10}, Local{}, proxsolver.Config{Solver: proxsolver.SGD, LR: 0.1, Batch: 10}},
		{"device overrides", AlgoFedProx, &wire.Params{Mu: 1, Solver: "sgd", Lr: 0.1, Batch: 10, Gamma: 0.1}, Local{Solver: proxsolver.SGD, LR: 0.05, Batch: 32}, proxsolver.Config{Solver: proxsolver.SGD, Mu: 1, Gamma: 0.1, LR: 0.05, Batch: 32}},
		{"device forces lbfgs", AlgoFedProx, &wire.Params{Solver: "sgd"}, Local{Solver: proxsolver.LBFGS}, proxsolver.Config{Solver: proxsolver.LBFGS}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := &RoundHandler{Local: c.local, Data: testData(1, 90)}
			w, err := h.work(&wire.RoundAnnouncement{Algorithm: c.algo, Params: c.p}, h.Data.N)
			if got := w.Solver; err != nil || !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
}

func TestHandleDeadlineSendsPartialWork(t *testing.T) {
	h, _ := newHandler(t)
	fc := clock.NewFake(t0)
	fc.Tick = time.Millisecond // every look at the clock costs 1 ms
	h.Clock = fc
	h.Local.DeadlineMargin = -1
	ann := announce(t, 1, AlgoFedProxSplit, f32(testGlobal(1)))
	ann.Params.Solver, ann.Params.Lr, ann.Params.Batch, ann.Params.Gamma = proxsolver.SGD, 0.05, 5, 1e-9
	ann.Budget = nil
	ann.DeadlineUnixMs = t0.Add(20 * time.Millisecond).UnixMilli()
	res, err := h.Handle(context.Background(), ann)
	if err != nil || res.Action != ActionSolved {
		t.Fatal(res.Action, err)
	}
	r := res.Update.Report
	if r.StopReason != wire.StopReason_STOP_REASON_DEADLINE || !r.Partial {
		t.Fatalf("report %v", r)
	}
	if st := snapshot(t, h.Store); st.applied != 1 || len(st.outbox) != 1 || !slices.Equal(st.serverZ, res.Sent) {
		t.Fatalf("partial work not committed: %+v", st)
	}
}

func TestHandleCancellation(t *testing.T) {
	t.Run("preempted: partial work committed", func(t *testing.T) {
		h, _ := newHandler(t)
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(ErrPreempted)
		ann := announce(t, 1, AlgoFedSplit, f32(testGlobal(1)))
		res, err := h.Handle(ctx, ann)
		if err != nil || res.Action != ActionSolved {
			t.Fatal(res.Action, err)
		}
		if r := res.Update.Report; r.StopReason != wire.StopReason_STOP_REASON_SIGNAL || !r.Partial {
			t.Fatalf("report %v", r)
		}
		if st := snapshot(t, h.Store); st.applied != 1 || len(st.outbox) != 1 {
			t.Fatalf("state %+v", st)
		}
	})
	t.Run("shutdown: nothing committed", func(t *testing.T) {
		h, _ := newHandler(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		res, err := h.Handle(ctx, announce(t, 1, AlgoFedSplit, f32(testGlobal(1))))
		if !errors.Is(err, context.Canceled) || res.Msg != nil {
			t.Fatalf("got %v, %v", res.Action, err)
		}
		if st := snapshot(t, h.Store); st.applied != 0 || len(st.outbox) != 0 {
			t.Fatalf("state %+v", st)
		}
		// The retained announcement, delivered again later, runs the round.
		if res, err := h.Handle(context.Background(), announce(t, 1, AlgoFedSplit, f32(testGlobal(1)))); err != nil || res.Action != ActionSolved {
			t.Fatal(res.Action, err)
		}
	})
}

func TestHandleDivergedSolve(t *testing.T) {
	// A learning rate that makes SGD overflow: the global model (FedProx)
	// or z (FedSplit) goes back with stop reason ERROR.
	for _, algo := range []string{AlgoFedProx, AlgoFedProxSplit} {
		t.Run(algo, func(t *testing.T) {
			h, _ := newHandler(t)
			x := f32(testGlobal(1))
			ann := announce(t, 1, algo, x)
			ann.Params.Solver, ann.Params.Lr, ann.Params.Batch = proxsolver.SGD, 1e300, 1
			res, err := h.Handle(context.Background(), ann)
			if err != nil || res.Action != ActionSolved {
				t.Fatal(res.Action, err)
			}
			if r := res.Update.Report; r.StopReason != wire.StopReason_STOP_REASON_ERROR || !r.Partial {
				t.Fatalf("report %v", r)
			}
			if !slices.Equal(res.Sent, x) {
				t.Fatalf("sent %v, want the unchanged %v", res.Sent, x)
			}
		})
	}
}

func TestAnchorSketchSent(t *testing.T) {
	h, _ := newHandler(t)
	ann := announce(t, 1, AlgoFedProx, f32(testGlobal(1)))
	ann.AnchorSketch = &wire.SketchSpec{Dimension: 8, Seed: 11}
	res, err := h.Handle(context.Background(), ann)
	if err != nil {
		t.Fatal(err)
	}
	if want := aggregate.Sketch(res.Report.AnchorGrad, 8, 11); !slices.Equal(res.Update.AnchorGrad, want) {
		t.Fatalf("anchor sketch %v, want %v", res.Update.AnchorGrad, want)
	}
}

func TestRandomStreamsDiffer(t *testing.T) {
	a := &RoundHandler{ClientID: "site-a", Seed: 1}
	b := &RoundHandler{ClientID: "site-b", Seed: 1}
	draw := func(h *RoundHandler, round uint64, stream streams.SiteStream) uint64 {
		return h.rng(round, stream).Uint64()
	}
	if draw(a, 1, streams.SiteCodec) == draw(b, 1, streams.SiteCodec) {
		t.Fatal("two sites with the same seed draw the same codec noise")
	}
	if draw(a, 1, streams.SiteCodec) == draw(a, 2, streams.SiteCodec) || draw(a, 1, streams.SiteCodec) == draw(a, 1, streams.SiteSolve) {
		t.Fatal("rounds or streams share a random stream")
	}
	if draw(a, 3, streams.SiteSolve) != draw(&RoundHandler{ClientID: "site-a", Seed: 1}, 3, streams.SiteSolve) {
		t.Fatal("the stream is not deterministic")
	}
}

// With the federation's population announced, a site's prox step is
// s m n_j / n (sample weighting), so the mean of the z_j converges to the
// minimiser of the sample-weighted pooled objective.
func TestHandleFedSplitSampleWeightedStep(t *testing.T) {
	h, _ := newHandler(t)
	x := f32(testGlobal(1))
	ann := announce(t, 1, AlgoFedSplit, x)
	const m, n = 4, 1000
	ann.Params.Step, ann.Params.Clients, ann.Params.TotalSamples = 0.5, m, n
	res, err := h.Handle(context.Background(), ann)
	if err != nil || res.Action != ActionSolved {
		t.Fatal(res.Action, err)
	}
	stepJ := split.ClientStepSize(0.5, m, float64(h.Data.N)/n)
	cfg := proxsolver.Config{Solver: proxsolver.LBFGS, Mu: 1 / stepJ, Gamma: 1e-4}
	b := proxsolver.Budget{MaxEpochs: 30, Deadline: t0.Add(time.Hour), Clock: clock.NewFake(t0)}
	zNew, _, err := split.ClientStep(x, x, stepJ, split.Params{Step: 0.5, Relax: 1}, func(v []float64, _ float64) ([]float64, error) {
		w, _, err := proxsolver.Solve(context.Background(), mustModel(t), h.Data, v, x, cfg, b, nil)
		return w, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, d := decodeUpdate(t, res.Msg, wire.UpdateKind_UPDATE_KIND_Z_DELTA, 0); !slices.Equal(plus(x, d), viaFP32(x, zNew)) {
		t.Fatalf("update is not the client step with s_j = s m n_j / n = %v", stepJ)
	}
}

// TestHandleNewRun: rounds of a new aggregator run (another run id) are
// solved from round 1 on, though this site applied later rounds of the
// previous run; the same run id keeps the old behaviour (an older round is
// not solved again).
func TestHandleNewRun(t *testing.T) {
	h, _ := newHandler(t)
	run := func(round uint64, id string) *wire.RoundAnnouncement {
		a := announce(t, round, AlgoFedSplit, f32(testGlobal(round)))
		a.RunId = id
		return a
	}
	for _, r := range []uint64{6, 7} {
		if res, err := h.Handle(context.Background(), run(r, "run-A")); err != nil || res.Action != ActionSolved {
			t.Fatalf("run A round %d: %v %v", r, res.Action, err)
		}
	}
	if res, err := h.Handle(context.Background(), run(1, "run-A")); err != nil || res.Action == ActionSolved {
		t.Fatalf("run A round 1 after round 7: %v %v, want not solved", res.Action, err)
	}
	res, err := h.Handle(context.Background(), run(1, "run-B"))
	if err != nil || res.Action != ActionSolved {
		t.Fatalf("run B round 1: %v %v, want solved", res.Action, err)
	}
	st := snapshot(t, h.Store)
	if st.applied != 1 || st.zRound != 1 || len(st.outbox) != 1 || st.outbox[0].Round != 1 {
		t.Fatalf("state after run B round 1: applied %d, z round %d, outbox %+v", st.applied, st.zRound, st.outbox)
	}
	// The first FedSplit update of the new run is against the global
	// model (no copy of z from the old run survives).
	if res.Update.Kind != wire.UpdateKind_UPDATE_KIND_Z_DELTA || res.Update.BaseRound != 0 {
		t.Fatalf("run B round 1 update: kind %v base %d, want Z_DELTA against the global model", res.Update.Kind, res.Update.BaseRound)
	}
	if id, err := h.Store.RunID(); err != nil || id != "run-B" {
		t.Fatalf("stored run id %q, %v", id, err)
	}
}

// An announcement of a run this site has left (older than the run it is
// in, a stale retained copy) is refused as bad and leaves the round state
// and the run order as they are; a newer run is taken.
func TestHandleLeftRun(t *testing.T) {
	h, _ := newHandler(t)
	run := func(round uint64, id string, at int64) *wire.RoundAnnouncement {
		a := announce(t, round, AlgoFedSplit, f32(testGlobal(round)))
		a.RunId, a.CreatedAtUnixMs = id, at
		return a
	}
	if res, err := h.Handle(context.Background(), run(1, "run-B", 5000)); err != nil || res.Action != ActionSolved {
		t.Fatalf("run B round 1: %v %v", res.Action, err)
	}
	before := snapshot(t, h.Store)
	if _, err := h.Handle(context.Background(), run(7, "run-A", 4000)); !errors.Is(err, ErrBadAnnouncement) || !strings.Contains(err.Error(), "a run it has left") {
		t.Fatalf("run A (older) round 7: %v, want a bad announcement", err)
	}
	if after := snapshot(t, h.Store); !after.equal(before) {
		t.Fatalf("the left run's announcement changed the state: %+v -> %+v", before, after)
	}
	if id, since, err := h.Store.RunOrder(); err != nil || id != "run-B" || since != 5000 {
		t.Fatalf("run order %s %d %v", id, since, err)
	}
	if res, err := h.Handle(context.Background(), run(1, "run-C", 9000)); err != nil || res.Action != ActionSolved {
		t.Fatalf("run C (newer) round 1: %v %v", res.Action, err)
	}
	if id, since, err := h.Store.RunOrder(); err != nil || id != "run-C" || since != 9000 {
		t.Fatalf("run order %s %d %v", id, since, err)
	}
}

// A partial work report is explained where it is logged: what stopped the
// solve, against which target gamma, and that the work is used.
func TestPartialWhy(t *testing.T) {
	for _, c := range []struct {
		stop wire.StopReason
		want string
	}{
		{wire.StopReason_STOP_REASON_MAX_EPOCHS, "stopped by the epoch budget (max_epochs) before reaching the target gamma 0.01 (achieved 0.25); the work is sent and used"},
		{wire.StopReason_STOP_REASON_DEADLINE, "stopped by the round's deadline or the time budget before reaching the target gamma 0.01"},
		{wire.StopReason_STOP_REASON_SIGNAL, "stopped by a newer round (pre-empted)"},
		{wire.StopReason_STOP_REASON_ERROR, "diverged"},
	} {
		got := partialWhy(&wire.WorkReport{StopReason: c.stop, AchievedGamma: 0.25, Partial: true}, 0.01)
		if !strings.Contains(got, c.want) {
			t.Errorf("%v: %q, want %q", c.stop, got, c.want)
		}
	}
}

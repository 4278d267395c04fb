package agent

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/proto/wire"
	"github.com/edgefl/edgefl/testkit"
)

// contrastAnnounce is a round of a contrastive algorithm over a small MLP
// of the test data's shape, with a global model drawn from seed.
func contrastAnnounce(t *testing.T, round uint64, algo string, seed uint64) (*wire.RoundAnnouncement, []float64) {
	t.Helper()
	spec := model.ContrastSpec(model.ContrastKindOf(algo), model.Spec{Kind: model.KindMLP, Inputs: testInputs, Classes: testClasses, Hidden: 5, Activation: model.ActivationTanh})
	m, err := model.New(spec)
	if err != nil {
		t.Fatal(err)
	}
	x := f32(m.InitParams(rand.New(rand.NewPCG(seed, 9))))
	ann := announce(t, round, algo, x)
	ann.Model = &wire.ModelSpec{Kind: model.KindMLP, Inputs: testInputs, Classes: testClasses, Hidden: []uint32{5}, Activation: model.ActivationTanh}
	ann.Params = &wire.Params{Mu: 1, Tau: 0.5, Solver: proxsolver.SGD, Lr: 0.05, Batch: 10}
	ann.Budget = &wire.WorkBudget{MaxEpochs: 3}
	if algo != model.AlgoMOON {
		ann.Params.Tau = 0
	}
	return ann, x
}

// TestContrastResumesAfterRestart: a site of a contrastive algorithm
// commits its local model with each update; stopped after committing round
// 1 and restarted on its state file, it solves round 2 bit for bit as a
// site that never stopped (the same update bytes), and unlike a site whose
// state file lost the previous model (which solves against the global
// model instead), so the stored model is what the solve used.
func TestContrastResumesAfterRestart(t *testing.T) {
	for _, algo := range []string{model.AlgoMOON, model.AlgoFedSiamDA} {
		t.Run(algo, func(t *testing.T) {
			ann1, _ := contrastAnnounce(t, 1, algo, 1)
			ann2, _ := contrastAnnounce(t, 2, algo, 2)
			solve := func(h *RoundHandler, ann *wire.RoundAnnouncement) Result {
				t.Helper()
				res, err := h.Handle(context.Background(), ann)
				if err != nil || res.Action != ActionSolved {
					t.Fatalf("round %d: %v %v", ann.Round, res.Action, err)
				}
				return res
			}
			// Without a stop.
			a, _ := newHandler(t)
			r1 := solve(a, ann1)
			local, err := a.Store.Residual(edgestore.ResidualLocal)
			if err != nil || len(local) != int(ann1.Global.Dimension) {
				t.Fatalf("stored local model after round 1: %d values, %v", len(local), err)
			}
			want := solve(a, ann2)

			// Stopped after round 1's commit, restarted on the file.
			b, path := newHandler(t)
			if got := solve(b, ann1); !slices.Equal(got.Msg, r1.Msg) {
				t.Fatal("round 1 differs between two fresh sites")
			}
			if err := b.Store.Close(); err != nil {
				t.Fatal(err)
			}
			s := openStore(t, path)
			defer s.Close()
			b2 := &RoundHandler{ClientID: testSite, Federation: testFed, Store: s, Data: b.Data, Clock: clock.NewFake(t0), Seed: 3, Log: testkit.Logger(t)}
			if got := solve(b2, ann2); !slices.Equal(got.Msg, want.Msg) {
				t.Error("round 2 after the restart is not the uninterrupted site's update")
			}

			// A site whose round 2 starts without the previous model.
			c, _ := newHandler(t)
			if got := solve(c, ann2); slices.Equal(got.Msg, want.Msg) {
				t.Error("round 2 without the previous local model is the same update: the stored model was not used")
			}
		})
	}
}

// TestContrastRefused: announcements a contrastive site refuses before
// writing anything: a model without a representation layer, DP, a bad
// temperature.
func TestContrastRefused(t *testing.T) {
	cases := []struct {
		name string
		ann  func() *wire.RoundAnnouncement
	}{
		{"moon over logreg", func() *wire.RoundAnnouncement {
			a := announce(t, 1, model.AlgoMOON, f32(testGlobal(1)))
			a.Params.Tau = 0.5
			return a
		}},
		{"fedsiam-da over logreg", func() *wire.RoundAnnouncement { return announce(t, 1, model.AlgoFedSiamDA, f32(testGlobal(1))) }},
		{"moon without tau", func() *wire.RoundAnnouncement {
			a, _ := contrastAnnounce(t, 1, model.AlgoMOON, 1)
			a.Params.Tau = 0
			return a
		}},
		{"moon under DP", func() *wire.RoundAnnouncement {
			a, _ := contrastAnnounce(t, 1, model.AlgoMOON, 1)
			a.Dp = &wire.DPParams{ClipNorm: 1}
			return a
		}},
		{"fedsiam-da without its head", func() *wire.RoundAnnouncement {
			a, _ := contrastAnnounce(t, 1, model.AlgoMOON, 1) // the MLP without a head
			a.Algorithm = model.AlgoFedSiamDA
			return a
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := newHandler(t)
			before := snapshot(t, h.Store)
			_, err := h.Handle(context.Background(), tc.ann())
			if !errors.Is(err, ErrBadAnnouncement) {
				t.Fatalf("err = %v, want ErrBadAnnouncement", err)
			}
			if !snapshot(t, h.Store).equal(before) {
				t.Fatal("a refused announcement changed the state")
			}
		})
	}
}

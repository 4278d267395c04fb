package agent

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// TestHandleDP: under an announced DPParams the site sends its update
// clipped to the clip norm and its loss fields and achieved gamma as 0; a
// distributed-mode or FedSplit announcement is refused.
func TestHandleDP(t *testing.T) {
	const c = 1e-3 // far below the solve's step: the clip bites
	h, _ := newHandler(t)
	x := f32(testGlobal(1))
	ann := announce(t, 1, AlgoFedProx, x)
	ann.Dp = &wire.DPParams{Mode: wire.DPMode_DP_MODE_CENTRAL, ClipNorm: c, NoiseMultiplier: 1, Delta: 1e-5}
	res, err := h.Handle(context.Background(), ann)
	if err != nil {
		t.Fatal(err)
	}
	u, d := decodeUpdate(t, res.Msg, wire.UpdateKind_UPDATE_KIND_DELTA, 0)
	if n := dp.Norm(d); n > c*(1+1e-6) || n < c/2 {
		t.Fatalf("sent a delta of norm %v, want the clip norm %v", n, c)
	}
	if r := u.Report; r.LocalLoss != 0 || r.AnchorLoss != 0 || r.AchievedGamma != 0 || r.GradEvals == 0 {
		t.Fatalf("report %v: want the losses and gamma as 0, the work as done", r)
	}

	for _, tc := range []struct {
		name string
		mod  func(a *wire.RoundAnnouncement)
		want string
	}{
		// The announcement's validation refuses it first (wire), the agent
		// again (dpClip): the noise shares need a secure sum.
		{"distributed without secagg", func(a *wire.RoundAnnouncement) { a.Dp.Mode, a.Dp.NoiseShares = wire.DPMode_DP_MODE_DISTRIBUTED, 2 }, "secagg"},
		{"central with secagg", func(a *wire.RoundAnnouncement) {
			a.Secagg = &wire.SecAggSpec{Threshold: 2, Clip: 1, ScaleBits: 20, MaxSites: 3}
		}, "central differential privacy"},
		{"distributed share of a few grid steps", func(a *wire.RoundAnnouncement) {
			a.Dp.Mode, a.Dp.NoiseShares = wire.DPMode_DP_MODE_DISTRIBUTED, 2
			a.Secagg = &wire.SecAggSpec{Threshold: 2, Clip: 1, ScaleBits: 2, MaxSites: 3}
		}, "grid steps"},
		// Shares sized for more sites than a sum may hold: a sum of t
		// inputs would carry sqrt(t/3) of the announced noise.
		{"distributed with more shares than the threshold", func(a *wire.RoundAnnouncement) {
			a.Dp.Mode, a.Dp.NoiseShares = wire.DPMode_DP_MODE_DISTRIBUTED, 3
			a.Secagg = &wire.SecAggSpec{Threshold: 2, Clip: 2, ScaleBits: 20, MaxSites: 3}
		}, "secagg threshold"},
		{"fedsplit", func(a *wire.RoundAnnouncement) { a.Algorithm = AlgoFedProxSplit }, uplink.ErrSplitDP.Error()},
		{"anchor gradient", func(a *wire.RoundAnnouncement) { a.AnchorSketch = &wire.SketchSpec{} }, "anchor gradient"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := newHandler(t)
			a := announce(t, 1, AlgoFedProx, x)
			a.Dp = &wire.DPParams{Mode: wire.DPMode_DP_MODE_CENTRAL, ClipNorm: c, NoiseMultiplier: 1, Delta: 1e-5}
			tc.mod(a)
			_, err := h.Handle(context.Background(), a)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrBadAnnouncement) {
				t.Fatalf("Handle = %v, want a refusal of the announcement", err)
			}
		})
	}
}

// TestHandleClipBit: with adaptive clipping announced the update carries
// its clip bit (1: within the clip norm), for both families; without it
// the bit is 0.
func TestHandleClipBit(t *testing.T) {
	x := f32(testGlobal(1))
	for _, tc := range []struct {
		algo     string
		clip     float64
		adaptive bool
		want     uint32
	}{
		{AlgoFedProx, 1e-3, true, 0},
		{AlgoFedProx, 1e3, true, 1},
		{AlgoFedProx, 1e3, false, 0},
		{AlgoFedProxSplit, 1e-3, true, 0},
		{AlgoFedProxSplit, 1e3, true, 1},
	} {
		h, _ := newHandler(t)
		a := announce(t, 1, tc.algo, x)
		a.Dp = &wire.DPParams{Mode: wire.DPMode_DP_MODE_CENTRAL, ClipNorm: tc.clip, NoiseMultiplier: 1, Delta: 1e-5}
		if tc.algo == AlgoFedProxSplit {
			a = sumAnnounce(t, 1, x, tc.clip)
		}
		if tc.adaptive {
			a.Dp.UpdateNoiseMultiplier = 1.1
			a.Dp.Adaptive = &wire.AdaptiveClip{TargetQuantile: 0.5, LearningRate: 0.2, BitNoise: 1}
		}
		res, err := h.Handle(context.Background(), a)
		if err != nil {
			t.Fatal(err)
		}
		if res.Update.ClipBit != tc.want {
			t.Errorf("%s, C = %v, adaptive %v: clip bit %d, want %d", tc.algo, tc.clip, tc.adaptive, res.Update.ClipBit, tc.want)
		}
	}
}

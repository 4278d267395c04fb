package wire

import (
	"math"
	"testing"
)

// TestValidateDPParams checks the rules of RoundAnnouncement.dp
// (docs/privacy.md, "Wire fields (proposed)").
func TestValidateDPParams(t *testing.T) {
	valid := func() *DPParams {
		return &DPParams{Mode: DPMode_DP_MODE_CENTRAL, ClipNorm: 1, NoiseMultiplier: 1.1, Delta: 1e-5, EpsilonSpent: 0.5, EpsilonBudget: 8}
	}
	tests := []struct {
		name   string
		mutate func(*RoundAnnouncement)
		ok     bool
	}{
		{"central", func(r *RoundAnnouncement) {}, true},
		{"distributed", func(r *RoundAnnouncement) {
			r.Dp.Mode, r.Dp.NoiseShares = DPMode_DP_MODE_DISTRIBUTED, 7
			r.Secagg = &SecAggSpec{Threshold: 7, Clip: 1, ScaleBits: 20, MaxSites: 10}
		}, true},
		{"distributed without secagg", func(r *RoundAnnouncement) { r.Dp.Mode, r.Dp.NoiseShares = DPMode_DP_MODE_DISTRIBUTED, 7 }, false},
		{"distributed without shares", func(r *RoundAnnouncement) {
			r.Dp.Mode = DPMode_DP_MODE_DISTRIBUTED
			r.Secagg = &SecAggSpec{Threshold: 7, Clip: 1, ScaleBits: 20, MaxSites: 10}
		}, false},
		{"central with shares", func(r *RoundAnnouncement) { r.Dp.NoiseShares = 3 }, false},
		{"no budget", func(r *RoundAnnouncement) { r.Dp.EpsilonBudget, r.Dp.EpsilonSpent = 0, 0 }, true},
		{"absent", func(r *RoundAnnouncement) { r.Dp = nil }, true},
		{"mode unspecified", func(r *RoundAnnouncement) { r.Dp.Mode = DPMode_DP_MODE_UNSPECIFIED }, false},
		{"mode unknown", func(r *RoundAnnouncement) { r.Dp.Mode = 3 }, false},
		{"clip 0", func(r *RoundAnnouncement) { r.Dp.ClipNorm = 0 }, false},
		{"clip negative", func(r *RoundAnnouncement) { r.Dp.ClipNorm = -1 }, false},
		{"clip inf", func(r *RoundAnnouncement) { r.Dp.ClipNorm = math.Inf(1) }, false},
		{"clip NaN", func(r *RoundAnnouncement) { r.Dp.ClipNorm = math.NaN() }, false},
		{"noise 0", func(r *RoundAnnouncement) { r.Dp.NoiseMultiplier = 0 }, false},
		{"noise NaN", func(r *RoundAnnouncement) { r.Dp.NoiseMultiplier = math.NaN() }, false},
		{"delta 0", func(r *RoundAnnouncement) { r.Dp.Delta = 0 }, false},
		{"delta 1", func(r *RoundAnnouncement) { r.Dp.Delta = 1 }, false},
		{"epsilon spent negative", func(r *RoundAnnouncement) { r.Dp.EpsilonSpent = -1 }, false},
		{"epsilon budget inf", func(r *RoundAnnouncement) { r.Dp.EpsilonBudget = math.Inf(1) }, false},
		{"finished phase: the final epsilon", func(r *RoundAnnouncement) { r.Phase = Phase_PHASE_FINISHED }, true},
		{"update noise multiplier above z", func(r *RoundAnnouncement) { r.Dp.UpdateNoiseMultiplier = 1.2 }, true},
		{"update noise multiplier equal to z", func(r *RoundAnnouncement) { r.Dp.UpdateNoiseMultiplier = 1.1 }, true},
		{"update noise multiplier below z", func(r *RoundAnnouncement) { r.Dp.UpdateNoiseMultiplier = 1 }, false},
		{"update noise multiplier inf", func(r *RoundAnnouncement) { r.Dp.UpdateNoiseMultiplier = math.Inf(1) }, false},
		{"adaptive", func(r *RoundAnnouncement) {
			r.Dp.Adaptive = &AdaptiveClip{TargetQuantile: 0.5, LearningRate: 0.2, BitNoise: 0.5}
		}, true},
		{"adaptive quantile 1", func(r *RoundAnnouncement) {
			r.Dp.Adaptive = &AdaptiveClip{TargetQuantile: 1, LearningRate: 0.2, BitNoise: 0.5}
		}, false},
		{"adaptive quantile NaN", func(r *RoundAnnouncement) {
			r.Dp.Adaptive = &AdaptiveClip{TargetQuantile: math.NaN(), LearningRate: 0.2, BitNoise: 0.5}
		}, false},
		{"adaptive learning rate 0", func(r *RoundAnnouncement) {
			r.Dp.Adaptive = &AdaptiveClip{TargetQuantile: 0.5, BitNoise: 0.5}
		}, false},
		{"adaptive bit noise inf", func(r *RoundAnnouncement) {
			r.Dp.Adaptive = &AdaptiveClip{TargetQuantile: 0.5, LearningRate: 0.2, BitNoise: math.Inf(1)}
		}, false},
		{"statistics phase", func(r *RoundAnnouncement) {
			*r = RoundAnnouncement{Federation: "fed1", Phase: Phase_PHASE_STATISTICS, Schema: schemaJSON, RunId: "R1", Dp: r.Dp}
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := sampleRound()
			r.Dp = valid()
			tt.mutate(r)
			checkValidity(t, r, tt.ok, Limits{})
		})
	}
}

// TestValidateSumDelta checks the sum-mode update kind (docs/privacy.md,
// "FedSplit") and the clip bit of adaptive clipping.
func TestValidateSumDelta(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*ClientUpdate)
		ok     bool
	}{
		{"join", func(u *ClientUpdate) { u.Kind, u.BaseRound = UpdateKind_UPDATE_KIND_SUM_DELTA, 0 }, true},
		{"against the record of an earlier round", func(u *ClientUpdate) { u.Kind, u.BaseRound = UpdateKind_UPDATE_KIND_SUM_DELTA, u.Round-1 }, true},
		{"base round not before the round", func(u *ClientUpdate) { u.Kind, u.BaseRound = UpdateKind_UPDATE_KIND_SUM_DELTA, u.Round }, false},
		{"kind 5", func(u *ClientUpdate) { u.Kind = 5 }, false},
		{"clip bit 1", func(u *ClientUpdate) { u.ClipBit = 1 }, true},
		{"clip bit 2", func(u *ClientUpdate) { u.ClipBit = 2 }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := sampleUpdate()
			tt.mutate(u)
			checkValidity(t, u, tt.ok, Limits{})
		})
	}
}

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

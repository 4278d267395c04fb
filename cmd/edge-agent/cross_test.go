package main

import (
	"encoding/json"
	"testing"

	"github.com/edgefl/edgefl/internal/crossarch"
)

// TestCrossArch builds edge-agent as it ships to the gateways (static,
// stripped, for linux/arm64 and 32-bit linux/arm v7) and runs it under qemu
// user-mode emulation: `version` and a small `bench`. It fails when qemu-user
// is missing (scripts/test.sh installs it) and skips under -short.
func TestCrossArch(t *testing.T) {
	const stamp = "crossarch-test"
	for _, target := range []crossarch.Target{crossarch.ARM64, crossarch.ARMv7} {
		t.Run(target.Name(), func(t *testing.T) {
			t.Parallel()
			emu := crossarch.Require(t, target)
			bin := crossarch.Build(t, target, modulePath+"/cmd/edge-agent", stamp)
			dir := t.TempDir()

			if got, want := crossarch.Run(t, emu, dir, bin, "version"), "edge-agent "+stamp+"\n"; got != want {
				t.Errorf("version printed %q, want %q", got, want)
			}

			out := crossarch.Run(t, emu, dir, bin, "bench", "--samples", "200", "--features", "20", "--epochs", "2", "--json")
			var r benchResult
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatalf("bench --json output does not parse: %v\n%s", err, out)
			}
			checkBenchResult(t, r, target.GOOS, target.GOARCH)
			if r.Version != stamp || r.Samples != 200 || r.Model.Inputs != 20 || r.EpochsDone != 2 || r.SampleGrads != 4*200 {
				t.Errorf("version %q, %d samples, %d features, %v epochs, %d sample gradients; want %s, 200, 20, 2, 800",
					r.Version, r.Samples, r.Model.Inputs, r.EpochsDone, r.SampleGrads, stamp)
			}
			if r.PeakRSSSource != "VmHWM" {
				t.Errorf("peak RSS source %q under qemu-user, want VmHWM", r.PeakRSSSource)
			}
			t.Logf("%s under %v: %.0f samples/s (emulated: a functional check only), peak RSS %.1f MiB (qemu's own memory included), budget %d epochs",
				target.Name(), emu, r.SamplesPerSecond, float64(r.PeakRSSBytes)/(1<<20), r.BudgetEpochs)
		})
	}
}

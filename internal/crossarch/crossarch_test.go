package crossarch

import (
	"slices"
	"strings"
	"testing"
)

const modulePath = "github.com/edgefl/edgefl"

// TestPackagesOnARMv7 runs the tests of the packages whose behaviour depends
// on the word size under 32-bit ARM (older Raspberry Pis), where int is 32
// bits and a memory map cannot exceed 2 GB.
func TestPackagesOnARMv7(t *testing.T) {
	emu := Require(t, ARMv7)
	tests := []struct {
		pkg, why string
		// reexec names the tests that re-execute the test binary as a child
		// process, which needs binfmt_misc under qemu-user.
		reexec []string
	}{
		{"node/storage", "bbolt on 32-bit ARM: its 2 GB map limit, integer widths of keys, counters and sizes", nil},
		{"node/edgestore", "the gateway's store on 32-bit ARM (a Raspberry Pi's): the same, on the edge file", []string{"TestKillDuringWrites"}},
		{"node/aggstore", "the aggregator's store on 32-bit ARM: the same, on the round log", []string{"TestKillDuringWrites"}},
		{"learn/quant", "frame header fields wider than a 32-bit int, allocation bounds of the generic (non-amd64) zstd decoder", nil},
	}
	for _, tt := range tests {
		t.Run(tt.pkg, func(t *testing.T) {
			t.Parallel()
			t.Logf("why: %s", tt.why)
			args := []string{"test", "-count=1", "-timeout=4m"}
			if emu != nil {
				args = append(args, "-exec="+strings.Join(emu, " "))
			}
			if len(tt.reexec) > 0 && !BinfmtRegistered(ARMv7) {
				t.Logf("skipping %v: they re-execute the test binary, and binfmt_misc does not run ARM binaries through qemu on this host", tt.reexec)
				args = append(args, "-skip=^("+strings.Join(tt.reexec, "|")+")$")
			}
			out := Go(t, ARMv7, "", append(args, modulePath+"/"+tt.pkg)...)
			t.Logf("GOARCH=arm GOARM=7 go %s:\n%s", strings.Join(args, " "), out)
		})
	}
}

func TestTargets(t *testing.T) {
	tests := []struct {
		target Target
		name   string
		env    string
	}{
		{ARM64, "linux-arm64", "GOARCH=arm64"},
		{ARMv7, "linux-armv7", "GOARM=7"},
	}
	for _, tt := range tests {
		if got := tt.target.Name(); got != tt.name {
			t.Errorf("Name() = %q, want %q", got, tt.name)
		}
		env := tt.target.Env()
		if !slices.Contains(env, tt.env) || !slices.Contains(env, "CGO_ENABLED=0") {
			t.Errorf("%s: Env() ends %q, want CGO_ENABLED=0 and %s", tt.name, env[len(env)-4:], tt.env)
		}
	}
}

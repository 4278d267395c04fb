package aggstore

import (
	"syscall"
	"testing"
	"time"
)

// cpuNow is the process's user and system CPU time. On a machine shared
// with other builds a benchmark's wall time per op swings with the load
// (an fsync waits for the disk); its CPU per op moves far less, and it is
// what the sealed counts cost.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the CPU time per op since start as cpu-ns/op.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuNow()-start)/float64(b.N), "cpu-ns/op")
}

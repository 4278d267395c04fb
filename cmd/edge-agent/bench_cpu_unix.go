//go:build unix

package main

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time the process has used so far, user and
// system, all threads (the garbage collector's included).
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}

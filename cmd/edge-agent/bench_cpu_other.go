//go:build !unix

package main

import "time"

// processCPU is not measured here: bench reports no solve CPU time.
func processCPU() (time.Duration, bool) { return 0, false }

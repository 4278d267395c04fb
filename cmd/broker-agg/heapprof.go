package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime/metrics"
	"runtime/pprof"
	"time"
)

// heapProfileEnv names a file that `run` keeps a heap profile in, written
// each time the live heap grows past 1.1x its size at the last write: the
// file ends holding the profile taken nearest the run's peak (go tool pprof
// -sample_index=inuse_space). For measuring where the memory goes at scale
// (scripts/bench-scale.sh's HEAP_PROFILE); off when unset.
const heapProfileEnv = "EDGEFL_HEAP_PROFILE"

// startHeapProfile starts the peak-heap sampler when heapProfileEnv is set;
// it ends with ctx.
func startHeapProfile(ctx context.Context, log *slog.Logger) {
	path := os.Getenv(heapProfileEnv)
	if path == "" {
		return
	}
	log.Info("heap profile: written near the peak", "file", path)
	go func() {
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		var last uint64
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > last+last/10 {
				if err := writeHeapProfile(path); err != nil {
					log.Warn("heap profile not written", "file", path, "err", err)
					return
				}
				last = v
			}
		}
	}()
}

// writeHeapProfile replaces path with the current heap profile.
func writeHeapProfile(path string) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("heap profile: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	return nil
}

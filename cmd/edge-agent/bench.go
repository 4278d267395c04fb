package main

import (
	"context"
	"errors"
	"io"
)

// runBench benchmarks a local solve on this device.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("not implemented yet")
}

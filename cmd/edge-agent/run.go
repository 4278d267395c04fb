package main

import (
	"context"
	"errors"
	"io"
)

// runAgent runs the edge daemon.
func runAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("not implemented yet")
}

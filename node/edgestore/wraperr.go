package edgestore

import "fmt"

// wrapErr is fmt.Errorf(prefix+": %w", err) out of line: one call instead
// of a copy of fmt.Errorf's argument setup at every error path keeps
// edge-agent's text under its size budget.
//
//go:noinline
func wrapErr(prefix string, err error) error {
	return fmt.Errorf("%s: %w", prefix, err)
}

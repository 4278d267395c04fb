package main

import (
	"context"
	"errors"
	"io"
)

// runServe runs the aggregator daemon (`broker-agg run`).
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("not implemented yet")
}

// runStatus prints the federation's current round and clients.
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("not implemented yet")
}

// runPKI makes a site PKI.
func runPKI(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("not implemented yet")
}

// runDemo runs the embedded broker, the aggregator and in-process agents.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("not implemented yet")
}

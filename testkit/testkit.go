// Package testkit is the shared support of the repository's tests: a test
// logger that is safe to call after its test has ended, an embedded MQTT
// broker that lets every client in, a goroutine-safe buffer and a
// goroutine-leak check. It is imported only from _test.go files (and the e2e
// tests); cmd/edge-agent's dependency guard keeps it, and the testing
// package with it, out of the gateway binary. CONTRIBUTING.md, "The test
// kit", says when to use which.
package testkit

import (
	"bytes"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Logger returns a debug-level text logger writing to LogWriter(t).
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(LogWriter(t), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// LogWriter returns a writer that passes each write (one log line) to t.Log
// until t and its cleanups have finished, and drops it afterwards.
//
// The daemons log from paho's and mochi's goroutines, which can outlive the
// test by a moment (a connection-lost callback, a keep-alive); t.Log after
// the test has completed panics ("Log in goroutine after Test... has
// completed") or races with the test's end. The writer's own cleanup,
// registered when it is made, marks it done under the same mutex Write
// holds, so no t.Log call starts after it. Cleanups run last-in first-out:
// a broker or server started after the logger is stopped (and logs its
// shutdown) before the writer closes.
func LogWriter(t testing.TB) io.Writer {
	w := &logWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return w
}

type logWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}

// FailureLog returns a debug-level text logger writing to a SyncBuffer,
// and the buffer, which is printed under "what's log:" if the test fails:
// for a whole federation's log, too long to pass to t.Log line by line,
// that a test may also search.
func FailureLog(t testing.TB, what string) (*slog.Logger, *SyncBuffer) {
	logs := new(SyncBuffer)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s's log:\n%s", what, logs.String())
		}
	})
	return slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), logs
}

// SyncBuffer is a bytes.Buffer that a logger (or a command's output) and
// the test can use from different goroutines. The zero value is empty and
// ready to use.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what has been written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Lines returns the complete lines written so far that contain sub (every
// complete line when sub is empty), without their newlines.
func (s *SyncBuffer) Lines(sub string) []string {
	var out []string
	text := s.String()
	for {
		line, rest, ok := strings.Cut(text, "\n")
		if !ok {
			return out
		}
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
		text = rest
	}
}

// WriteFile writes data to path, readable by the owner only (as the
// daemons' configuration and key files must be), and fails the test if it
// cannot. A file another user must read is written with os.WriteFile.
func WriteFile(t testing.TB, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// WriteFileIn writes data to the file name in dir as WriteFile does, and
// returns its path.
func WriteFileIn(t testing.TB, dir, name, data string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	WriteFile(t, path, data)
	return path
}

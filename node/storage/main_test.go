package storage

import (
	"flag"
	"os"
	"testing"
)

// TestMain runs every test with the census self-check on (wtx.go): each
// write transaction recounts the file and compares it with the census its
// writes kept, so every test that writes also tests the wrappers. Not for
// benchmarks, whose figures would then include the recount.
func TestMain(m *testing.M) {
	flag.Parse()
	if b := flag.Lookup("test.bench"); b == nil || b.Value.String() == "" {
		SelfCheckCensus = true
	}
	os.Exit(m.Run())
}

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestGeneratedFilesUpToDate regenerates wire's code from wire/edgefl.proto
// in memory and compares it with the committed files: a schema edited
// without `go generate ./wire`, or a generated file edited by hand, fails
// here (scripts/test.sh also checks it with git diff).
func TestGeneratedFilesUpToDate(t *testing.T) {
	files, err := generate(filepath.Join("..", "..", "edgefl.proto"))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join("..", "..", name))
		if err != nil {
			t.Fatalf("%v: run go generate ./wire", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("wire/%s is stale: run go generate ./wire and commit the result", name)
		}
	}
}

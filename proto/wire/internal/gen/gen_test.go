package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGeneratedFilesUpToDate regenerates wire's code from proto/wire/edgefl.proto
// in memory and compares it with the committed files: a schema edited
// without `go generate ./proto/wire`, or a generated file edited by hand, fails
// here (scripts/test.sh also checks it with git diff).
func TestGeneratedFilesUpToDate(t *testing.T) {
	files, err := generate(filepath.Join("..", "..", "edgefl.proto"))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join("..", "..", name))
		if err != nil {
			t.Fatalf("%v: run go generate ./proto/wire", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("wire/%s is stale: run go generate ./proto/wire and commit the result", name)
		}
	}
}

// TestGenerateRejects: schemas the generated code would not handle.
func TestGenerateRejects(t *testing.T) {
	const head = "syntax = \"proto3\";\npackage p;\nmessage S {}\n"
	for name, tc := range map[string]struct{ src, want string }{
		"no envelope":      {head, "want a message Envelope"},
		"envelope no body": {head + "message Envelope { uint32 version = 1; }", "want a message Envelope"},
		"interleaved": {head + "message Envelope { uint32 version = 2; oneof body { S a = 1; S b = 3; } }",
			"lies between the numbers of oneof body"},
		"parse error": {head + "message Envelope { int32 x = 1; }", "int32"},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "x.proto")
			if err := os.WriteFile(path, []byte(tc.src), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := generate(path); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("generate: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

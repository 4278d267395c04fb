package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/data/schema"
)

// export refuses in one line: without --out, a state file without a
// schema, a run still in its statistics phase; through a running daemon's
// /bundle, the daemon's refusal is the error.
func TestExportErrors(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain.db")
	stateFile(t, plain, "f", nil)
	sc, err := schema.Load("../../deploy/schema.example.json")
	if err != nil {
		t.Fatal(err)
	}
	fed := filepath.Join(dir, "fed.db")
	stateFile(t, fed, "f", sc)
	daemon := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "round 9 is not stored in /var/lib/broker-agg/broker-agg.db (stored: rounds 0..4, the model after that many aggregations)", http.StatusNotFound)
	}))
	defer daemon.Close()
	out := filepath.Join(dir, "out.json")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"export", "--state", plain}, "--out: the bundle's file is required"},
		{[]string{"export", "--state", plain, "--out", out}, "is a run without a federation schema: it has no bundles"},
		{[]string{"export", "--state", fed, "--out", out}, "is still in the statistics phase: no model yet"},
		{[]string{"export", "--state", filepath.Join(dir, "none.db"), "--out", out}, "--state: stat"},
		{[]string{"export", "--addr", strings.TrimPrefix(daemon.URL, "http://"), "--round", "9", "--out", out}, "round 9 is not stored in"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), tc.args, &stdout, &stderr); code != 1 {
			t.Errorf("%v: exit %d, stderr %s", tc.args, code, &stderr)
		}
		if msg := strings.TrimSpace(stderr.String()); strings.Count(msg, "\n") != 0 || !strings.Contains(msg, tc.want) {
			t.Errorf("%v: stderr %q, want one line containing %q", tc.args, msg, tc.want)
		}
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("a refused export wrote %s: %v", out, err)
	}
}

package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// splitSites: by a site column (sites in the values' sorted order, every
// column kept), or the rows dealt to n sites; refusals name the file.
func TestSplitSites(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "all.csv")
	os.WriteFile(src, []byte("x,y,hospital\n1,0,south\n2,1,north\n3,0,south\n4,1,east\n"), 0o600)
	ids, files, err := splitSites(src, "hospital", 0, 1, dir)
	if err != nil || !slices.Equal(ids, []string{"site-01", "site-02", "site-03"}) {
		t.Fatalf("%v %v", ids, err)
	}
	for i, want := range []string{"x,y,hospital\n4,1,east\n", "x,y,hospital\n2,1,north\n", "x,y,hospital\n1,0,south\n3,0,south\n"} {
		if b, _ := os.ReadFile(files[i]); string(b) != want {
			t.Errorf("%s: %q, want %q", files[i], b, want)
		}
	}
	ids, files, err = splitSites(src, "", 2, 7, t.TempDir())
	if err != nil || len(ids) == 0 || len(ids) > 2 {
		t.Fatalf("dealt: %v %v", ids, err)
	}
	rows := 0
	for _, f := range files {
		b, _ := os.ReadFile(f)
		rows += strings.Count(string(b), "\n") - 1
	}
	if rows != 4 {
		t.Fatalf("%d rows dealt, want 4", rows)
	}
	if _, _, err := splitSites(src, "ward", 0, 1, dir); err == nil || !strings.Contains(err.Error(), `--site-column "ward"`) {
		t.Fatalf("unknown site column: %v", err)
	}
}

package main

import (
	"slices"
	"testing"
)

// TestErrorTextsAreShort fails on an error or log text of the module's
// non-test code longer than MaxLen: a stable message a reader can grep for
// plus, where it helps, a hint (CONTRIBUTING.md, "Error and log messages").
func TestErrorTextsAreShort(t *testing.T) {
	texts, err := scan("../..")
	if err != nil {
		t.Fatal(err)
	}
	if len(texts) < 1000 {
		t.Fatalf("found %d texts in the module: the scan lost its way", len(texts))
	}
	for _, x := range texts {
		if x.Len() > MaxLen {
			t.Errorf("%s: %s text of %d characters, over %d (a short stable message plus a hint): %q", x.Pos, x.Kind, x.Len(), MaxLen, x.Text)
		}
	}
}

// TestScanFindsPlantedTexts checks the scan finds every kind of long text
// planted in testdata/planted and passes the short ones.
func TestScanFindsPlantedTexts(t *testing.T) {
	texts, err := scan("testdata/planted")
	if err != nil {
		t.Fatal(err)
	}
	var long []string
	for _, x := range texts {
		if x.Len() > MaxLen {
			long = append(long, x.Pos+" "+x.Kind)
		}
	}
	want := []string{"planted.go:13 slog", "planted.go:14 slog", "planted.go:15 refuse", "planted.go:17 errors.New", "planted.go:18 fmt.Errorf"}
	if !slices.Equal(long, want) {
		t.Errorf("long texts found: %q, want %q", long, want)
	}
	if len(texts) != 7 {
		t.Errorf("found %d texts, want 7 (the short ones too)", len(texts))
	}
}

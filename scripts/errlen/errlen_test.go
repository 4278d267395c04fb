package main

import (
	"slices"
	"testing"
)

// TestScanFindsPlantedTexts checks the scan finds every kind of long text
// planted in testdata/planted and passes the short ones.
func TestScanFindsPlantedTexts(t *testing.T) {
	texts, err := scan("testdata/planted", nil)
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

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/bundle"
)

// broker-agg demo --schema end to end (needs the agent side of issue 11):
// three sites split by a column, the statistics phase, evaluations, the
// final bundle at the aggregator and at every site, the same bytes.
func TestDemoSchema(t *testing.T) {
	dir := t.TempDir()
	var csv strings.Builder
	csv.WriteString("x1,color,y,hospital\n")
	for i := range 90 {
		x := float64(i%17)/4 - 2
		y := "0"
		if x+float64(i%3)/3 > 0 {
			y = "1"
		}
		csv.WriteString(strings.Join([]string{ftoa(x), []string{"red", "green", "blue"}[i%3], y, []string{"north", "south", "east"}[i%3]}, ",") + "\n")
	}
	data := filepath.Join(dir, "all.csv")
	if err := os.WriteFile(data, []byte(csv.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	sc := filepath.Join(dir, "schema.json")
	if err := os.WriteFile(sc, []byte(`{"task":"binary","features":[{"name":"x1","type":"numeric"},{"name":"color","type":"categorical"}],
 "label":{"column":"y","classes":[{"name":"no","values":["0"]},{"name":"yes","values":["1"]}]},"min_site_samples":5}`), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "demo")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"demo", "--schema", sc, "--dataset", "csv:" + data, "--site-column", "hospital",
		"--rounds", "4", "--eval-every", "2", "--dir", state}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, &stdout, &stderr)
	}
	if !strings.Contains(stdout.String(), "every site wrote the final bundle") || !strings.Contains(stdout.String(), "final bundle of round 4") {
		t.Fatalf("stdout:\n%s", &stdout)
	}
	agg, err := os.ReadFile(filepath.Join(state, "final.bundle.json"))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := bundle.Unmarshal(agg); err != nil || b.Evaluation == nil || len(b.Evaluation.Sites) != 3 {
		t.Fatalf("final bundle: %v", err)
	}
	for _, id := range []string{"site-01", "site-02", "site-03"} {
		if site, err := os.ReadFile(filepath.Join(state, id, "final.bundle.json")); err != nil || !bytes.Equal(site, agg) {
			t.Fatalf("%s's copy: %v", id, err)
		}
	}
}

func ftoa(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }

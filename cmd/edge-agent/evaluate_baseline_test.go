package main

import (
	"bytes"
	"context"
	"regexp"
	"testing"
)

// `edge-agent evaluate` puts the majority-class baseline of the site's rows
// next to its accuracy, and says whether the model beats it.
func TestEvaluateShowsBaseline(t *testing.T) {
	b := writeTestBundle(t, t.TempDir())
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"evaluate", "--model", b, "--data", "csv:../../data/schema/testdata/site.csv"}, &out, &errb); code != 0 {
		t.Fatalf("evaluate exit %d: %s", code, errb.String())
	}
	re := regexp.MustCompile(`(?m)^accuracy   [0-9.]+\nbalanced   [0-9.]+\nbaseline   [0-9.]+ \(always \S+, the most frequent class here; the model (beats it|does NOT beat it)\)$`)
	if !re.MatchString(out.String()) {
		t.Fatalf("evaluate's output lacks the baseline:\n%s", out.String())
	}
}

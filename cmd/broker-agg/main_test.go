package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/testkit"
)

// Bad input gets a one-line error naming the flag or file, a non-zero exit
// and never a panic.
func TestSimulateBadInput(t *testing.T) {
	dir := t.TempDir()
	ragged := testkit.WriteFileIn(t, dir, "ragged.csv", "a,b,label\n1,2,0\n3,1\n")
	nan := testkit.WriteFileIn(t, dir, "nan.csv", "a,b,label\n1,NaN,0\n3,1,1\n")
	small := testkit.WriteFileIn(t, dir, "small.csv", "a,b,label\n1,2,0\n3,1,1\n2,2,1\n")
	labels := testkit.WriteFileIn(t, dir, "labels.csv", "a,b,label\n1,2,0\n3,1,-1\n")
	tests := []struct {
		name string
		args []string
		want string // in the error line
	}{
		{"unknown dataset", []string{"--dataset", "mnist"}, "--dataset"},
		{"unknown partition", []string{"--partition", "zipf:2"}, "--partition"},
		{"missing file", []string{"--dataset", "csv:" + filepath.Join(dir, "nope.csv") + ":label=label", "--partition", "iid"}, "nope.csv"},
		{"ragged csv", []string{"--dataset", "csv:" + ragged + ":label=label", "--partition", "iid", "--clients", "1", "--per-round", "1"}, "ragged.csv"},
		{"nan in data", []string{"--dataset", "csv:" + nan + ":label=label", "--partition", "iid", "--clients", "1", "--per-round", "1"}, "nan.csv"},
		{"label out of range", []string{"--dataset", "csv:" + labels + ":label=label", "--partition", "iid", "--clients", "1", "--per-round", "1"}, "labels.csv"},
		{"more clients than samples", []string{"--dataset", "csv:" + small + ":label=label", "--partition", "iid", "--clients", "5", "--per-round", "1"}, "clients"},
		{"zero step", []string{"--step", "0"}, "--step"},
		{"negative step", []string{"--step", "-1"}, "--step"},
		{"gamma negative", []string{"--gamma", "-1"}, "--gamma"},
		{"gamma above one", []string{"--gamma", "1.5"}, "--gamma"},
		{"unknown algo", []string{"--algo", "fedfoo"}, "fedfoo"},
		{"unknown aggregator", []string{"--agg", "meanish"}, "meanish"},
		{"unknown model", []string{"--model", "cnn"}, "--model"},
		{"unknown solver", []string{"--solver", "adam"}, "--solver"},
		{"stray argument", []string{"extra"}, "extra"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			args := append([]string{"simulate", "--rounds", "1", "--out", t.TempDir()}, tt.args...)
			code := run(context.Background(), args, &stdout, &stderr)
			if code == 0 {
				t.Fatalf("exit 0; stderr: %s", stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			last := lines[len(lines)-1]
			if !strings.Contains(last, tt.want) || !strings.HasPrefix(last, "broker-agg simulate: ") {
				t.Errorf("last stderr line %q: want a broker-agg simulate error naming %q", last, tt.want)
			}
		})
	}
}

func TestUnknownCommand(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"frobnicate"}, &stdout, &stderr); code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	if !strings.Contains(stderr.String(), `unknown command "frobnicate"`) {
		t.Errorf("stderr: %s", stderr.String())
	}
}

func TestSimulateBadFlagIsUsageError(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"simulate", "--clients", "many"}, &stdout, &stderr); code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
}

// --agg runs the named aggregators (alone, or after --algo's list).
func TestSimulateAggFlag(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"--agg", "median,simprox"}, []string{"median", "simprox"}},
		{[]string{"--algo", "fedavg", "--agg", "median"}, []string{"fedavg", "median"}},
	} {
		var stdout, stderr bytes.Buffer
		dir := t.TempDir()
		args := append([]string{"simulate", "--dataset", "synthetic:1,1", "--clients", "5", "--per-round", "2", "--rounds", "1", "--epochs", "1", "--out", dir}, tt.args...)
		if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
			t.Fatalf("%v: exit %d: %s", tt.args, code, stderr.String())
		}
		b, err := os.ReadFile(filepath.Join(dir, "results.json"))
		if err != nil {
			t.Fatal(err)
		}
		var res struct {
			Runs []struct {
				Algo string `json:"algo"`
			} `json:"runs"`
		}
		if err := json.Unmarshal(b, &res); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range res.Runs {
			got = append(got, r.Algo)
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%v: runs %v, want %v", tt.args, got, tt.want)
		}
	}
}

// simulate --schema: a multi-site CSV by its site column, the federated
// evaluation in results.json, the final bundle, and one-line errors.
func TestSimulateSchema(t *testing.T) {
	dir := t.TempDir()
	schemaFile := filepath.Join(dir, "schema.json")
	testkit.WriteFile(t, schemaFile, `{"task": "binary", "features": [{"name": "a", "type": "numeric"}, {"name": "k", "type": "categorical"}],
		"label": {"column": "y", "classes": [{"name": "no", "values": ["N"]}, {"name": "yes", "values": ["Y"]}]}, "min_site_samples": 5, "holdout": 0.3}`)
	var b strings.Builder
	b.WriteString("k,site,y,a,note\n")
	for i := range 120 {
		y := "N"
		if (i*7)%10 < 4+i%3 {
			y = "Y"
		}
		fmt.Fprintf(&b, "%s,s%d,%s,%d,x\n", []string{"p", "q", "NA"}[i%3], i%3, y, (i*37)%23)
	}
	data := testkit.WriteFileIn(t, dir, "all.csv", b.String())
	out := t.TempDir()
	bundleFile := filepath.Join(out, "final.bundle.json")
	var stdout, stderr bytes.Buffer
	args := []string{"simulate", "--schema", schemaFile, "--dataset", "csv:" + data, "--site-column", "site", "--partition", "natural",
		"--algo", "fedproxsplit", "--rounds", "4", "--eval-every", "2", "--l2", "0.01", "--out", out, "--bundle-out", bundleFile}
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "federation") || !strings.Contains(stdout.String(), "s2") {
		t.Fatalf("summary without the federated evaluation:\n%s", stdout.String())
	}
	raw, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Sites []struct{ ID string } `json:"sites"`
		Runs  []struct {
			Rounds []struct {
				Round int `json:"round"`
				Eval  *struct {
					Federation struct{ N int } `json:"federation"`
					Sites      map[string]struct{ N int }
				} `json:"eval"`
			} `json:"rounds"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Sites) != 3 || len(res.Runs) != 1 {
		t.Fatalf("%s", raw)
	}
	var evaluated []int
	for _, r := range res.Runs[0].Rounds {
		if r.Eval != nil {
			evaluated = append(evaluated, r.Round)
			if len(r.Eval.Sites) != 3 || r.Eval.Federation.N == 0 {
				t.Fatalf("round %d eval %+v", r.Round, r.Eval)
			}
		}
	}
	if !slices.Equal(evaluated, []int{2, 4}) {
		t.Fatalf("evaluated rounds %v", evaluated)
	}
	bu, err := bundle.Read(bundleFile)
	if err != nil || bu.Evaluation == nil || bu.Evaluation.Round != 4 || bu.Provenance.Algorithm != "fedproxsplit" || bu.Provenance.EdgeflVersion != version {
		t.Fatalf("bundle: %v %+v", err, bu)
	}

	bad := testkit.WriteFileIn(t, dir, "bad.csv", "site,a,k,y\ns0,1,p,N\ns1,?,p,Y\ns1,1e999,q,N\n")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--schema", schemaFile, "--dataset", "csv:" + bad, "--site-column", "site"}, `bad.csv: line 4: column "a": "1e999" is not a finite number`},
		{[]string{"--site-column", "site"}, "--site-column needs --schema"},
		{[]string{"--bundle-out", bundleFile}, "--bundle-out needs --schema"},
		{[]string{"--eval-dataset", "csv:" + data}, "--eval-dataset needs --schema"},
		{[]string{"--schema", schemaFile, "--dataset", "csv:" + data, "--partition", "iid", "--clients", "2", "--eval-dataset", "csv:" + data}, "--eval-dataset needs --site-column"},
		{[]string{"--schema", schemaFile, "--dataset", "csv:" + data, "--site-column", "site", "--test-fraction", "0.2"}, "--test-fraction"},
		{[]string{"--schema", filepath.Join(dir, "none.json"), "--dataset", "csv:" + data}, "none.json"},
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"simulate", "--rounds", "1", "--out", t.TempDir()}, c.args...)
		if code := run(context.Background(), args, &stdout, &stderr); code == 0 {
			t.Fatalf("%v: exit 0", c.args)
		}
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		if last := lines[len(lines)-1]; !strings.Contains(last, c.want) || !strings.HasPrefix(last, "broker-agg simulate: ") {
			t.Errorf("%v: last stderr line %q, want %q", c.args, last, c.want)
		}
	}
}

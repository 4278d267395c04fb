package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/node/broker"
	"github.com/edgefl/edgefl/sim/localfed"
	"github.com/edgefl/edgefl/testkit"
)

const demoSchemaJSON = `{"task": "binary",
 "features": [{"name": "age", "type": "numeric"}, {"name": "dose", "type": "numeric"}, {"name": "ward", "type": "categorical"}],
 "label": {"column": "outcome", "classes": [{"name": "well", "values": ["0", "well"]}, {"name": "ill", "values": ["1", "ill"]}]},
 "holdout": 0.25}`

// demoDeclaredSchemaJSON is demoSchemaJSON with its preprocessing
// declared (what --dp needs).
const demoDeclaredSchemaJSON = `{"task": "binary",
 "features": [{"name": "age", "type": "numeric", "center": 58, "scale": 12}, {"name": "dose", "type": "numeric", "center": 2, "scale": 1},
              {"name": "ward", "type": "categorical", "levels": ["A", "B"]}],
 "label": {"column": "outcome", "classes": [{"name": "well", "values": ["0", "well"]}, {"name": "ill", "values": ["1", "ill"]}]},
 "holdout": 0.25}`

// demoCSV writes a multi-site CSV (a hospital column, rows of the three
// sites interleaved, each site its own case mix, missing cells) and the
// schema into dir.
func demoCSV(t *testing.T, dir string) (schemaPath, csvPath string) {
	t.Helper()
	rng := rand.New(rand.NewPCG(3, 4))
	var b strings.Builder
	b.WriteString("hospital,ward,age,outcome,dose\n")
	sites := []string{"north", "south", "east"}
	for i := range 150 {
		k := rng.IntN(3)
		age := 50 + 10*rng.NormFloat64() + 8*float64(k)
		dose := 2 + rng.NormFloat64()
		ward := []string{"A", "B"}[rng.IntN(2)]
		z := (age-58)/10 + dose - 2 + map[string]float64{"A": 0.5, "B": -0.5}[ward]
		y := "well"
		if z+0.5*rng.NormFloat64() > 0 {
			y = "ill"
		}
		ageCell := fmt.Sprintf("%.1f", age)
		if i%19 == 4 {
			ageCell = "NA"
		}
		fmt.Fprintf(&b, "%s,%s,%s,%s,%.3f\n", sites[k], ward, ageCell, y, dose)
	}
	schemaPath, csvPath = filepath.Join(dir, "schema.json"), filepath.Join(dir, "all.csv")
	testkit.WriteFile(t, schemaPath, demoSchemaJSON)
	testkit.WriteFile(t, csvPath, b.String())
	return schemaPath, csvPath
}

// TestDemoSchema: `demo --schema` partitions the CSV by the site column,
// writes each site's rows as its own CSV, runs the federation over MQTT
// (statistics, rounds with federated evaluation, the end), and every site
// writes the aggregator's final bundle to its model_out; the end prints
// the federation's and each site's held-out figures next to the
// centralised reference.
func TestDemoSchema(t *testing.T) {
	src := t.TempDir()
	schemaPath, csvPath := demoCSV(t, src)
	dir := filepath.Join(t.TempDir(), "demo")
	code, out, errOut := runCLI(t, "demo", "--schema", schemaPath, "--dataset", "csv:"+csvPath, "--site-column", "hospital",
		"--rounds", "3", "--eval-every", "2", "--l2", "0.01", "--dir", dir)
	if code != 0 {
		t.Fatalf("demo --schema: exit %d\n%s%s", code, out, errOut)
	}
	final := filepath.Join(dir, "final.bundle.json")
	want, err := os.ReadFile(final)
	if err != nil {
		t.Fatalf("no final bundle: %v\n%s", err, out)
	}
	b, err := bundle.Unmarshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if b.Provenance.Round != 3 || b.Evaluation == nil || len(b.Evaluation.Sites) != 3 || b.Evaluation.Federation.AUC == nil {
		t.Fatalf("final bundle: round %d, evaluation %+v", b.Provenance.Round, b.Evaluation)
	}
	rows := 0
	for _, id := range []string{"east", "north", "south"} { // the site column's values
		got, err := os.ReadFile(filepath.Join(dir, id+".bundle.json"))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("site %s's model_out: %v (same bytes as the aggregator's: %v)", id, err, bytes.Equal(got, want))
		}
		raw, err := os.ReadFile(filepath.Join(dir, id+".csv"))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
		if lines[0] != "hospital,ward,age,outcome,dose" {
			t.Errorf("%s.csv header %q", id, lines[0])
		}
		for _, l := range lines[1:] {
			if !strings.HasPrefix(l, id+",") {
				t.Errorf("%s.csv has a row of another site: %q", id, l)
			}
		}
		rows += len(lines) - 1
		if r := b.Evaluation.Sites[id]; r.N == 0 {
			t.Errorf("no evaluation of site %s", id)
		}
	}
	if rows != 150 {
		t.Errorf("%d rows in the site CSVs, want 150", rows)
	}
	// Accuracy with the balanced accuracy and the majority-class
	// baseline of the same rows next to it (marked when not beaten).
	const acc = `accuracy [0-9.]+%  balanced [0-9.]+%  baseline [0-9.]+%(?: \(not above\))?`
	for _, re := range []string{
		`(?m)^\s+2\s+3/3\s+0\s+\S+\s*$`,
		`(?m)^\s+3\s+3/3\s+0\s+\S+\s+of round 2: loss [0-9.]+  ` + acc + `  AUC [0-9.]+$`,
		`every site's model_out \(.*SITE\.bundle\.json\) is the aggregator's final bundle, byte for byte`,
		`final bundle ` + regexp.QuoteMeta(final) + `, round 3, digest ` + b.Digest[:16],
		`(?m)^  federation \(n \d+\)\s+loss [0-9.]+  ` + acc + `  AUC [0-9.]+\s+loss [0-9.]+  ` + acc + `  AUC [0-9.]+$`,
		`(?m)^  east \(n \d+\)\s+loss [0-9.]+  ` + acc + `  AUC [0-9.]+\s+loss [0-9.]+  accuracy`,
		`centralised reference \(pooled training rows, same preprocessing\)`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("output lacks %s:\n%s", re, out)
		}
	}

	// Rows dealt iid to --clients sites, as simulate deals them.
	code, out, errOut = runCLI(t, "demo", "--schema", schemaPath, "--dataset", "csv:"+csvPath, "--partition", "iid", "--clients", "2",
		"--rounds", "1", "--eval-every", "0", "--l2", "0.01")
	if code != 0 || !strings.Contains(out, "client0 (n ") || !strings.Contains(out, "client1 (n ") || !strings.Contains(out, "byte for byte") {
		t.Fatalf("demo --schema --partition iid: exit %d\n%s%s", code, out, errOut)
	}
}

// Refusals of demo --schema: one line naming the flag, before anything runs.
func TestDemoSchemaRefusals(t *testing.T) {
	schemaPath, csvPath := demoCSV(t, t.TempDir())
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--dataset", "csv:" + csvPath}, "--partition natural with --schema needs --site-column"},
		{[]string{"--dataset", "csv:" + csvPath, "--site-column", "hospital", "--clients", "4"}, "--clients 4"},
		{[]string{"--dataset", "csv:" + csvPath, "--site-column", "ward"}, "ward"},
		{[]string{"--dataset", "csv:" + csvPath + ":label=outcome", "--site-column", "hospital"}, "want csv:PATH"},
		{[]string{"--dataset", "csv:" + csvPath, "--partition", "iid", "--site-column", "hospital"}, "--site-column hospital: only --partition natural"},
	} {
		code, out, errOut := runCLI(t, append([]string{"demo", "--schema", schemaPath, "--rounds", "1"}, c.args...)...)
		if code == 0 || !strings.Contains(errOut, c.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || out != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want one line with %q", c.args, code, out, errOut, c.want)
		}
	}
}

func TestWriteSiteCSVs(t *testing.T) {
	dir := t.TempDir()
	src := testkit.WriteFileIn(t, dir, "all.csv", "x,\"y, quoted\",site\n1,0,b\n2,\"a,b\",a\n3,0,b\n")
	files, err := writeSiteCSVs(src, [][]int{{1}, {0, 2}}, []string{"a", "b"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"x,\"y, quoted\",site\n2,\"a,b\",a\n", "x,\"y, quoted\",site\n1,0,b\n3,0,b\n"} {
		if got, _ := os.ReadFile(files[i]); string(got) != want || files[i] != filepath.Join(dir, []string{"a", "b"}[i]+".csv") {
			t.Errorf("%s: %q, want %q", files[i], got, want)
		}
	}
	if _, err := writeSiteCSVs(src, [][]int{{3}}, []string{"a"}, dir); err == nil || !strings.Contains(err.Error(), "no data row 3") {
		t.Errorf("a row beyond the file: %v", err)
	}
}

// TestRunExitWhenFinishedDeliversTheBundle: `run --schema
// --exit-when-finished` with the embedded broker exits once the run has
// ended, and only after the connected sites have the end of the run: each
// site writes the final bundle to its model_out, byte for byte the
// aggregator's, although the broker is gone by then.
func TestRunExitWhenFinishedDeliversTheBundle(t *testing.T) {
	dir := t.TempDir()
	schemaPath, csvPath := demoCSV(t, dir)
	raw, err := os.ReadFile(csvPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	ids := []string{"site-a", "site-b"}
	passwd := filepath.Join(dir, "passwd")
	for i, id := range ids {
		rows := append([]string{lines[0]}, lines[1+75*i:1+75*(i+1)]...)
		testkit.WriteFile(t, filepath.Join(dir, id+".csv"), strings.Join(rows, "\n")+"\n")
		if err := broker.SetPassword(passwd, id, id+"-pw", 1000); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	conf := filepath.Join(dir, "aggregator.conf")
	testkit.WriteFile(t, conf, fmt.Sprintf("federation = f\nstate_file = %s\nmetrics_addr =\nlisten = %s\npassword_file = %s\nschema = %s\n"+
		"per_round = 2\nrounds = 2\nsettle = 100ms\nround_timeout = 20s\nalgorithm = fedproxsplit\nsolver = lbfgs\nl2 = 0.01\nexit_when_finished = true\nlog_format = json\n",
		filepath.Join(dir, "aggregator.db"), addr, passwd, schemaPath))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stdout, stderr testkit.SyncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"run", "--config", conf}, &stdout, &stderr) }()

	pw := map[string]string{}
	sites := make([]localfed.Site, len(ids))
	for i, id := range ids {
		pw[id] = id + "-pw"
		sites[i] = localfed.Site{ID: id, Source: "csv:" + filepath.Join(dir, id+".csv"), ModelOut: filepath.Join(dir, id+".bundle.json")}
	}
	agents, err := localfed.StartAgents(ctx, localfed.AgentsConfig{Federation: "f", Brokers: []string{"tcp://" + addr}, Passwords: pw,
		Dir: dir, Sites: sites, ReconnectMin: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = agents.Stop() }() // on an early failure; stopped and checked at the end
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("run exited %d:\n%s", code, stderr.String())
		}
	case <-ctx.Done():
		t.Fatalf("run did not exit:\n%s", stderr.String())
	}
	want, err := os.ReadFile(filepath.Join(dir, "final.bundle.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		p := filepath.Join(dir, id+".bundle.json")
		var got []byte
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if got, err = os.ReadFile(p); err == nil {
				break
			}
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s's model_out: %v (the aggregator's bundle: %v)\n%s", id, err, bytes.Equal(got, want), stderr.String())
		}
	}
	if strings.Contains(stderr.String(), "have not acknowledged the end of the run") {
		t.Errorf("the drain timed out:\n%s", stderr.String())
	}
	if err := agents.Stop(); err != nil {
		t.Error(err)
	}
}

// TestDemoSchemaDP: `demo --schema --dp central` with a schema that
// declares its preprocessing runs the whole path: no statistics phase,
// every site's model_out byte for byte the aggregator's final bundle,
// which records the guarantee and no evaluation; the end prints the
// guarantee and the aggregator's (operator's) view of the evaluation.
func TestDemoSchemaDP(t *testing.T) {
	src := t.TempDir()
	_, csvPath := demoCSV(t, src)
	schemaPath := filepath.Join(src, "declared.json")
	testkit.WriteFile(t, schemaPath, demoDeclaredSchemaJSON)
	dir := filepath.Join(t.TempDir(), "demo")
	code, out, errOut := runCLI(t, "demo", "--schema", schemaPath, "--dataset", "csv:"+csvPath, "--site-column", "hospital",
		"--algorithm", "fedprox", "--rounds", "3", "--eval-every", "2", "--l2", "0.01", "--dir", dir,
		"--dp", "central", "--dp-clip", "0.5", "--dp-noise", "2", "--dp-fixed-rounds=false")
	if code != 0 {
		t.Fatalf("demo --schema --dp: exit %d\n%s%s", code, out, errOut)
	}
	want, err := os.ReadFile(filepath.Join(dir, "final.bundle.json"))
	if err != nil {
		t.Fatalf("no final bundle: %v\n%s", err, out)
	}
	b, err := bundle.Unmarshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if p := b.Privacy; p == nil || b.Evaluation != nil || p.Rounds != 3 || p.NoiseMultiplier != 2 || p.ClipNorm != 0.5 || b.Version != 2 {
		t.Fatalf("final bundle: version %d, privacy %+v, evaluation %+v", b.Version, b.Privacy, b.Evaluation)
	}
	for _, id := range []string{"east", "north", "south"} {
		if got, err := os.ReadFile(filepath.Join(dir, id+".bundle.json")); err != nil || !bytes.Equal(got, want) {
			t.Errorf("site %s's model_out: %v (same bytes as the aggregator's: %v)", id, err, bytes.Equal(got, want))
		}
	}
	for _, re := range []string{
		`(?m)^\s+1\s+3/3\s+0\s+\S+\s+epsilon [0-9.]+`,
		`every site's model_out .* is the aggregator's final bundle, byte for byte`,
		`privacy: central differential privacy \(per site\): epsilon [0-9.]+ at delta 1e-05 after 3 rounds`,
		`the bundle carries no evaluation \(outside the guarantee\); the aggregator's operator view of it:`,
		`(?m)^  federation \(n \d+\)\s+loss [0-9.]+  accuracy [0-9.]+%`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("output lacks %s:\n%s", re, out)
		}
	}
	if strings.Contains(out, "statistics") {
		t.Errorf("a statistics phase with a declared schema:\n%s", out)
	}
	// export of round 2: the guarantee after 2 rounds, shown.
	exp := filepath.Join(dir, "round2.bundle.json")
	code, out, errOut = runCLI(t, "export", "--state", filepath.Join(dir, "aggregator.db"), "--round", "2", "--out", exp)
	if code != 0 || !strings.Contains(out, "no evaluation: outside the privacy guarantee") || !strings.Contains(out, "privacy: central differential privacy (per site)") ||
		!strings.Contains(out, "after 2 rounds") {
		t.Fatalf("export: exit %d\n%s%s", code, out, errOut)
	}
	b2, err := bundle.Read(exp)
	if err != nil || b2.Privacy == nil || b2.Privacy.Rounds != 2 || !(b2.Privacy.Epsilon < b.Privacy.Epsilon) || b2.Evaluation != nil {
		t.Fatalf("exported bundle of round 2: %v %+v", err, b2)
	}
}

package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/testkit"
)

// taskCSV writes a multi-site CSV (a hospital column, three sites
// interleaved) whose label suits task, and the task's schema, into dir.
func taskCSV(t *testing.T, dir, task string) (schemaPath, csvPath string) {
	t.Helper()
	label := map[string]string{
		schema.TaskBinary:     `{"column": "outcome", "classes": [{"name": "well", "values": ["0"]}, {"name": "ill", "values": ["1"]}]}`,
		schema.TaskMulticlass: `{"column": "outcome", "classes": [{"name": "low", "values": ["L"]}, {"name": "mid", "values": ["M"]}, {"name": "high", "values": ["H"]}]}`,
		schema.TaskRegression: `{"column": "outcome"}`,
	}[task]
	rng := rand.New(rand.NewPCG(3, 5))
	var b strings.Builder
	b.WriteString("hospital,ward,age,outcome,dose\n")
	for i := range 150 {
		k := rng.IntN(3)
		age := 50 + 10*rng.NormFloat64() + 8*float64(k)
		dose := 2 + rng.NormFloat64()
		ward := []string{"A", "B"}[rng.IntN(2)]
		z := (age-58)/10 + dose - 2 + map[string]float64{"A": 0.5, "B": -0.5}[ward] + 0.5*rng.NormFloat64()
		y := fmt.Sprintf("%.4f", 10+3*z)
		switch task {
		case schema.TaskBinary:
			y = map[bool]string{false: "0", true: "1"}[z > 0]
		case schema.TaskMulticlass:
			y = "M"
			if z < -0.7 {
				y = "L"
			} else if z > 0.7 {
				y = "H"
			}
		}
		ageCell := fmt.Sprintf("%.1f", age)
		if i%19 == 4 {
			ageCell = "NA"
		}
		fmt.Fprintf(&b, "%s,%s,%s,%s,%.3f\n", []string{"north", "south", "east"}[k], ward, ageCell, y, dose)
	}
	schemaPath, csvPath = filepath.Join(dir, "schema.json"), filepath.Join(dir, "all.csv")
	testkit.WriteFile(t, schemaPath, `{"task": "`+task+`", "features": [{"name": "age", "type": "numeric"}, {"name": "dose", "type": "numeric"},
 {"name": "ward", "type": "categorical"}], "label": `+label+`, "holdout": 0.25}`)
	testkit.WriteFile(t, csvPath, b.String())
	return schemaPath, csvPath
}

// TestSchemaEveryTaskSimulateAndDemo: `simulate --schema` and `demo
// --schema` run every task (binary, multiclass, regression) with the site
// column and with --partition iid: simulate prints its summary with the
// task's held-out figures, demo runs the daemons over MQTT to a final
// bundle every site holds, and prints the task's figures next to the
// centralised reference. A regression schema once panicked in both
// (Table.Subset indexed class counts by the target value).
func TestSchemaEveryTaskSimulateAndDemo(t *testing.T) {
	for _, task := range []string{schema.TaskBinary, schema.TaskMulticlass, schema.TaskRegression} {
		schemaPath, csvPath := taskCSV(t, t.TempDir(), task)
		figures := `loss [0-9.]+  accuracy [0-9.]+%`
		if task == schema.TaskRegression {
			figures = `loss [0-9.]+  rmse [0-9.e+-]+  r2 -?[0-9.]+`
		}
		for _, part := range [][]string{{"--site-column", "hospital"}, {"--partition", "iid", "--clients", "3"}} {
			t.Run(task+"/"+part[1], func(t *testing.T) {
				args := append([]string{"simulate", "--schema", schemaPath, "--dataset", "csv:" + csvPath, "--algo", "fedavg,fedproxsplit",
					"--rounds", "3", "--eval-every", "3", "--l2", "0.01", "--out", t.TempDir()}, part...)
				if part[0] == "--partition" {
					args = append(args, "--per-round", "3")
				}
				code, out, errOut := runCLI(t, args...)
				if code != 0 || !strings.Contains(out, "federation") || !strings.Contains(out, "fedproxsplit") {
					t.Fatalf("simulate: exit %d\n%s%s", code, out, errOut)
				}
				if task == schema.TaskRegression && !strings.Contains(out, "RMSE / R^2") {
					t.Errorf("simulate's summary of a regression run lacks RMSE / R^2:\n%s", out)
				}

				dir := filepath.Join(t.TempDir(), "demo")
				code, out, errOut = runCLI(t, append([]string{"demo", "--schema", schemaPath, "--dataset", "csv:" + csvPath,
					"--rounds", "3", "--eval-every", "2", "--l2", "0.01", "--dir", dir}, part...)...)
				if code != 0 {
					t.Fatalf("demo: exit %d\n%s%s", code, out, errOut)
				}
				raw, err := os.ReadFile(filepath.Join(dir, "final.bundle.json"))
				if err != nil {
					t.Fatalf("no final bundle: %v\n%s", err, out)
				}
				b, err := bundle.Unmarshal(raw)
				if err != nil {
					t.Fatal(err)
				}
				if b.Schema.Task != task || b.Provenance.Round != 3 || b.Evaluation == nil || len(b.Evaluation.Sites) != 3 {
					t.Fatalf("final bundle: task %s round %d evaluation %+v", b.Schema.Task, b.Provenance.Round, b.Evaluation)
				}
				// Every evaluation asked for (--eval-every 2: round 2's,
				// then the final model's), each with every site's report:
				// round 2's on round 3's row, or after the rows when a
				// site's report came after round 3 closed (rounds drawn
				// back to back; the aggregator completes it then).
				for _, re := range []string{
					`every site's model_out \(.*SITE\.bundle\.json\) is the aggregator's final bundle, byte for byte`,
					`(?m)^  federation \(n \d+\)\s+` + figures + `.*\s+` + figures,
					`(?m)^\s+(3\s+3/3\s+0\s+\S+\s+)?of round 2: ` + figures,
				} {
					if !regexp.MustCompile(re).MatchString(out) {
						t.Errorf("demo output lacks %s:\n%s", re, out)
					}
				}
			})
		}
	}
}

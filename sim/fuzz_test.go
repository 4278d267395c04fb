package sim

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/testkit"
)

// fuzzPartitions are the partitions FuzzSimulateSchema runs (its part
// argument picks one): the site column and the three row partitions.
var fuzzPartitions = []string{"natural", "iid", "dirichlet:1", "classes:1"}

// FuzzSimulateSchema: any schema and any CSV through `simulate --schema`
// (read, partition, statistics, transform, a round of FedAvg and of
// FedProx:FedSplit, the federated evaluation and the bundle) either run or
// are refused with one line; nothing panics. Seeded with a site CSV of
// every task.
func FuzzSimulateSchema(f *testing.F) {
	for _, task := range tasks {
		var b strings.Builder
		b.WriteString("site,size,colour,age,y\n")
		for r := range 24 {
			y := []string{"N", "Y"}[r%2]
			switch task {
			case schema.TaskMulticlass:
				y = []string{"L", "M", "H"}[r%3]
			case schema.TaskRegression:
				y = []string{"1.5", "-2", "7e1", "0"}[r%4]
			}
			b.WriteString(strings.Join([]string{[]string{"a", "b"}[r%2], []string{"1", "2.5", "NA", "-3"}[r%4],
				[]string{"red", "green", "?"}[r%3], []string{"30", "41", "59"}[r%3], y}, ",") + "\n")
		}
		for part := range fuzzPartitions {
			f.Add([]byte(taskSchemas[task]), []byte(b.String()), uint8(part))
		}
	}
	// The schema's value rules and CSV dialect: per-feature missing
	// tokens, a valid range, ";" separators and decimal commas.
	f.Add([]byte(`{"task":"regression","features":[{"name":"a","type":"numeric","missing":["0"],"min":-5,"max":50,"out_of_range":"missing"},`+
		`{"name":"k","type":"categorical","missing":["x"]}],"label":{"column":"y"},"min_site_samples":2,"separator":";","decimal":","}`),
		[]byte("site;a;k;y\ns1;1,5;4,0;2\ns1;0;4;1,25\ns1;99;x;3\ns1;2;1.0;4\ns2;3,5;4;5\ns2;-7;2;6\ns2;4;2,0;7\ns2;1;x;8\n"), uint8(0))
	// One directory per fuzzing process: a fresh one per execution would
	// cost more than the run.
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, schemaJSON, csv []byte, part uint8) { fuzzSimulate(t, dir, schemaJSON, csv, part) })
}

// fuzzSimulate is one execution of FuzzSimulateSchema: the files in dir.
func fuzzSimulate(t *testing.T, dir string, schemaJSON, csv []byte, part uint8) {
	cfg := DefaultConfig()
	cfg.Schema = testkit.WriteFileIn(t, dir, "schema.json", string(schemaJSON))
	cfg.Dataset = "csv:" + testkit.WriteFileIn(t, dir, "data.csv", string(csv))
	cfg.Partition = fuzzPartitions[int(part)%len(fuzzPartitions)]
	cfg.Clients, cfg.PerRound = 2, 2
	if cfg.Partition == "natural" {
		cfg.SiteColumn, cfg.Clients, cfg.PerRound = "site", 0, 0
	}
	cfg.Rounds, cfg.EvalEvery, cfg.Workers, cfg.OptimumEvals, cfg.L2 = 1, 1, 1, 20, 0.01
	cfg.Local.MaxEpochs = 1
	cfg = withAlgos(t, cfg, "fedavg,fedproxsplit")
	res, err := Run(context.Background(), cfg, io.Discard)
	if err != nil {
		if strings.Contains(err.Error(), "\n") {
			t.Fatalf("multi-line error: %q", err)
		}
		return
	}
	for _, run := range res.Runs {
		if len(run.Final) == 0 {
			t.Fatalf("%s: no final model", run.Algo)
		}
		b, err := res.Bundle(run, "fuzz", time.Unix(0, 0))
		if err != nil {
			t.Fatalf("%s: bundle: %v", run.Algo, err)
		}
		if _, err := b.Marshal(); err != nil && strings.Contains(err.Error(), "\n") {
			t.Fatalf("%s: multi-line bundle error: %q", run.Algo, err)
		}
	}
}

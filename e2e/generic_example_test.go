package e2e

import (
	"encoding/csv"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/schema"
)

// TestGenericExampleConfigs runs deploy/broker-agg.example.conf and
// deploy/edge-agent.example.conf together, with deploy/schema.example.json
// installed where the aggregator's config says, as their headers tell an
// operator to: the aggregator with its embedded broker under mutual TLS,
// three sites with certificates from `broker-agg pki`, to the end of a run
// and its final bundle at every site. Each file's text is used as shipped
// but for its absolute directories, moved under the test's directory
// (/etc/edgefl/, /var/lib/broker-agg/, /var/lib/edgefl/, /srv/edgefl/, and
// the systemd credentials directory /run/credentials/<unit>/, where the test
// puts what the units' LoadCredential= lines would), and these flags, the
// settings the headers say to change:
//
//   - broker-agg: --listen and --metrics-addr on free loopback ports,
//     --per-round 3 (three sites), --rounds 3 (shipped: 0, forever) and
//     --settle 300ms (shipped 30s, which the first draw after a start
//     waits in full);
//   - edge-agent: --broker ssl://127.0.0.1:PORT, and at the sites other
//     than hospital-north --site-id and --tls-cert.
func TestGenericExampleConfigs(t *testing.T) {
	e2eTest(t)
	const rounds = 3
	dir := t.TempDir()
	etc := filepath.Join(dir, "etc")
	if err := mkdir(etc); err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	write := func(path, text string, mode os.FileMode) {
		t.Helper()
		if err := os.WriteFile(path, []byte(text), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(etc, "schema.json"), read("schema.example.json"), 0o644)
	sc, err := schema.Load(filepath.Join(etc, "schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"hospital-north", "hospital-south", "hospital-east"}
	out, err := exec.Command(aggBin, "pki", "--dir", filepath.Join(etc, "pki"), "--hosts", "agg.ward7.example,127.0.0.1", "--clients", strings.Join(ids, ",")).CombinedOutput()
	if err != nil {
		t.Fatalf("broker-agg pki: %v\n%s", err, out)
	}

	aggState := filepath.Join(dir, "var-lib-broker-agg")
	if err := mkdir(aggState); err != nil {
		t.Fatal(err)
	}
	aggConf := filepath.Join(dir, "broker-agg.conf")
	write(aggConf, strings.NewReplacer(
		"/etc/edgefl/", etc+"/",
		"/run/credentials/broker-agg.service/", filepath.Join(etc, "pki")+"/",
		"/var/lib/broker-agg/", aggState+"/",
	).Replace(read("broker-agg.example.conf")), 0o644)
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	agg := &aggregator{t: t, dir: dir, conf: aggConf, state: filepath.Join(aggState, "broker-agg.db"),
		metrics: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	agg.p = startProc(t, dir, "aggregator", nil, aggBin, "run", "--config", aggConf,
		"--listen", listen, "--metrics-addr", agg.metrics, "--per-round", fmt.Sprint(len(ids)), "--rounds", fmt.Sprint(rounds), "--settle", "300ms")
	agg.runs = append(agg.runs, agg.p)
	agg.waitHealthy(30 * time.Second)

	edgeText := read("edge-agent.example.conf")
	var edges []*edge
	for i, id := range ids {
		site := filepath.Join(dir, id)
		creds := filepath.Join(site, "credentials")
		if err := mkdir(creds); err != nil {
			t.Fatal(err)
		}
		key, err := os.ReadFile(filepath.Join(etc, "pki", "clients", id+".key"))
		if err != nil {
			t.Fatal(err)
		}
		write(filepath.Join(creds, "site.key"), string(key), 0o600) // LoadCredential=site.key:/etc/edgefl/pki/clients/<site>.key
		breastCancerSite(t, sc, filepath.Join(site, "patients.csv"), uint64(i+1), 80)
		conf := filepath.Join(site, "edge-agent.conf")
		write(conf, strings.NewReplacer(
			"/etc/edgefl/", etc+"/",
			"/run/credentials/edge-agent.service/", creds+"/",
			"/var/lib/edgefl/", site+"/",
			"/srv/edgefl/", site+"/",
		).Replace(edgeText), 0o644)
		args := []string{"run", "--config", conf, "--broker", "ssl://" + listen}
		if id != "hospital-north" {
			args = append(args, "--site-id", id, "--tls-cert", filepath.Join(etc, "pki", "clients", id+".crt"))
		}
		e := &edge{t: t, dir: dir, id: id, conf: conf, state: filepath.Join(site, "edge-agent.db")}
		e.p = startProc(t, dir, id, nil, agentBin, args...)
		e.runs = append(e.runs, e.p)
		edges = append(edges, e)
	}

	waitFinishedWith(agg, edges, 180*time.Second)
	final := filepath.Join(aggState, "final.bundle.json")
	waitFor(t, 60*time.Second, "the aggregator's final.bundle.json", func() (bool, error) {
		_, err := os.Stat(final)
		return err == nil, err
	})
	want, err := bundle.Read(final)
	if err != nil {
		t.Fatal(err)
	}
	if want.Provenance.Federation != "ward-7" || want.Provenance.Round != rounds || want.Schema == nil || want.Schema.Digest() != sc.Digest() ||
		want.Evaluation == nil || len(want.Evaluation.Sites) != len(ids) {
		t.Fatalf("final bundle: provenance %+v, evaluation %+v: want ward-7, round %d, the example schema, %d sites evaluated",
			want.Provenance, want.Evaluation, rounds, len(ids))
	}
	for _, e := range edges {
		p := filepath.Join(dir, e.id, "final.bundle.json") // model_out's default: next to the state file
		waitFor(t, 60*time.Second, e.id+"'s model_out", func() (bool, error) {
			_, err := os.Stat(p)
			return err == nil, err
		})
		got, err := bundle.Read(p)
		if err != nil {
			t.Fatal(err)
		}
		if got.Digest != want.Digest {
			t.Errorf("%s wrote bundle %s, the aggregator's is %s", e.id, got.Digest, want.Digest)
		}
	}
	stopFederation(t, agg, edges...)
}

// breastCancerSite writes a CSV with the columns of sc (numeric features,
// a label of raw values M and B) and rows from one linear rule, seeded.
func breastCancerSite(t *testing.T, sc *schema.Schema, path string, seed uint64, rows int) {
	t.Helper()
	if err := mkdir(filepath.Dir(path)); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 5))
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := csv.NewWriter(f)
	header := []string{sc.Label.Column}
	for _, ft := range sc.Features {
		header = append(header, ft.Name)
	}
	if err := w.Write(header); err != nil {
		t.Fatal(err)
	}
	for range rows {
		rec := make([]string, len(header))
		z := 0.0
		for j := range sc.Features {
			// Sizes are never negative: the shipped schema gives mean
			// radius the valid range [0, 100].
			x := math.Abs(10 + 3*rng.NormFloat64())
			if j < 5 {
				z += x - 10
			}
			rec[j+1] = strconv.FormatFloat(x, 'f', 3, 64)
		}
		rec[0] = "B"
		if z+rng.NormFloat64() > 0 {
			rec[0] = "M"
		}
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
	}
	w.Flush()
	if err := w.Error(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

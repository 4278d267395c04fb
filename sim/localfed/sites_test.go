package localfed

import (
	"log/slog"
	"testing"

	"github.com/edgefl/edgefl/data/dataset"
	"github.com/edgefl/edgefl/testkit"
)

// syntheticSites is a test federation of n sites over synthetic:1,1
// (natural partition, 40 samples at most per site, drawn from seed) and a
// debug logger writing to logs, which the test prints if it fails.
func syntheticSites(t *testing.T, n int, seed uint64) (fd *dataset.Federated, sites []Site, log *slog.Logger, logs *testkit.SyncBuffer) {
	t.Helper()
	src, err := dataset.ParseSource("synthetic:1,1")
	if err != nil {
		t.Fatal(err)
	}
	fd, err = dataset.Build(src, dataset.Partition{Kind: dataset.PartNatural}, dataset.BuildOptions{Clients: n, Seed: seed, SyntheticMaxSamples: 40})
	if err != nil {
		t.Fatal(err)
	}
	sites = make([]Site, n)
	for i, id := range SiteIDs(n, 0) {
		data := fd.Clients[i].Train
		sites[i] = Site{ID: id, Data: &data}
	}
	log, logs = testkit.FailureLog(t, "the federation")
	return fd, sites, log, logs
}

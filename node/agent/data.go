package agent

import (
	"fmt"
	"slices"

	"github.com/edgefl/edgefl/data/dataset"
	"github.com/edgefl/edgefl/learn/model"
)

// LoadData loads this site's training data as the configuration describes
// (see Config.Data and Config.DataClient).
//
// With DataClient = -1 the whole source is the site's data: every sample of
// a CSV file, of an IDX directory (training and test files pooled) or of all
// users of a LEAF file, train and test. With DataClient = K >= 0 the source
// is partitioned as dataset.Build does for the simulator (DataPartition,
// DataClients, DataSeed, DataMaxSamples) and the site trains on client K's
// training split: N agents with the same settings and K = 0..N-1 reproduce
// the simulated federation. Features are standardised with the site's own
// statistics when Standardize asks for it (the default for csv and leaf).
func LoadData(c Config) (model.Data, error) {
	if c.Data == "" {
		return model.Data{}, configErr("no data source")
	}
	src, err := dataset.ParseSource(c.Data)
	if err != nil {
		return model.Data{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if c.DataClient >= 0 {
		return loadClient(c, src)
	}
	mode := c.Standardize
	if mode == "" {
		mode = dataset.StandardizeNone
		if src.Kind == dataset.SourceCSV || src.Kind == dataset.SourceLEAF {
			mode = dataset.StandardizeClient
		}
	}
	var (
		d       model.Data
		classes int
	)
	switch src.Kind {
	case dataset.SourceCSV:
		ds, err := dataset.LoadCSV(src.Path, dataset.CSVOptions{Label: src.Label, Regression: src.Regression})
		if err != nil {
			return model.Data{}, wrap("agent: data", err)
		}
		d, classes = ds.Data, ds.Classes
	case dataset.SourceIDX:
		ds, err := dataset.LoadIDX(src.Path)
		if err != nil {
			return model.Data{}, wrap("agent: data", err)
		}
		d, classes = ds.Data, ds.Classes
	case dataset.SourceLEAF:
		f, err := dataset.LoadLEAF(src.Path, dataset.SplitOptions{Seed: c.DataSeed})
		if err != nil {
			return model.Data{}, wrap("agent: data", err)
		}
		train, test := f.Pooled()
		d, classes = concat(train, test), f.Classes
	default:
		return model.Data{}, configErr("data %q: a %s source is a whole federation; pick this site's share with data_client", c.Data, src.Kind)
	}
	if d.N == 0 {
		return model.Data{}, fmt.Errorf("agent: data %q: no samples", c.Data)
	}
	f := &dataset.Federated{Name: c.Data, D: d.D, Classes: classes, Clients: []dataset.Client{{ID: c.SiteID, Train: d}}}
	if err := dataset.Standardize(f, mode); err != nil {
		return model.Data{}, wrap("agent: data", err)
	}
	return f.Clients[0].Train, nil
}

func loadClient(c Config, src dataset.Source) (model.Data, error) {
	part, err := dataset.ParsePartition(c.DataPartition)
	if err != nil {
		return model.Data{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	opt := dataset.BuildOptions{
		Clients: c.DataClients, Seed: c.DataSeed, Standardize: c.Standardize,
		SyntheticMaxSamples: c.DataMaxSamples,
	}
	f, err := dataset.Build(src, part, opt)
	if err != nil {
		return model.Data{}, wrap("agent: data", err)
	}
	if c.DataClient >= len(f.Clients) {
		return model.Data{}, configErr("data client %d: the federation %s has %d clients (0..%d)", c.DataClient, f.Name, len(f.Clients), len(f.Clients)-1)
	}
	d := f.Clients[c.DataClient].Train
	if d.N == 0 {
		return model.Data{}, fmt.Errorf("agent: data client %d of %s has no training samples", c.DataClient, f.Name)
	}
	return d, nil
}

func concat(a, b model.Data) model.Data {
	if b.N == 0 {
		return a
	}
	if a.N == 0 {
		return b
	}
	return model.Data{N: a.N + b.N, D: a.D, X: slices.Concat(a.X, b.X), Y: slices.Concat(a.Y, b.Y)}
}

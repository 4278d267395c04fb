package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/data/dataset"
	"github.com/edgefl/edgefl/data/prep"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/node/agent"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/node/storage"
)

// maxSuggestedEpochs caps the suggested budget. A small model on a small
// site fits millions of epochs into a round deadline, but the local solve
// stops at its gamma (or the round's own budget, the aggregator's
// --max-epochs) long before: a device cap beyond this only says "no limit".
const maxSuggestedEpochs = 1000

// siteBench is what --config gives the benchmark: the site's training data
// as the agent would train on it, and its model.
type siteBench struct {
	data      model.Data
	spec      model.Spec
	dataDesc  string // the data, for the report
	shapeFrom string // where the model's shape comes from
}

// loadSiteBench reads the site's configuration file (its data settings
// only: no credentials are read, nothing is sent) and its data, and decides
// the model: from the federation schema (--schema FILE, or the schema and
// preprocessing of the site's last final bundle) for data read by a schema,
// else from the data's features and labels and --model.
func loadSiteBench(cfg benchConfig) (siteBench, error) {
	f, err := os.Open(cfg.Config)
	if err != nil {
		return siteBench{}, wrapErr("--config", err)
	}
	file, err := readConfig(f, cfg.Config)
	f.Close()
	if err != nil {
		return siteBench{}, err
	}
	rc, err := buildConfig(file, nil, version)
	if err != nil {
		return siteBench{}, err
	}
	if rc.Data == "" {
		return siteBench{}, fmt.Errorf("%s: no data = ... line: the site's data is what the benchmark trains on", cfg.Config)
	}
	if path, ok := csvPathOnly(rc.Data); ok && rc.DataClient < 0 {
		return loadSchemaSite(cfg, rc, path)
	}
	src, err := dataset.ParseSource(rc.Data)
	if err != nil {
		return siteBench{}, fmt.Errorf("%s: data: %w", cfg.Config, err)
	}
	if cfg.SchemaFile != "" {
		return siteBench{}, fmt.Errorf("--schema: the site's data %q names its label: it is not read by a federation schema", rc.Data)
	}
	d, err := agent.LoadData(rc.Config)
	if err != nil {
		return siteBench{}, err
	}
	spec := model.Spec{Kind: cfg.Model, Inputs: d.D, L2: cfg.L2}
	shape := fmt.Sprintf("the data's %d features", d.D)
	switch {
	case src.Regression:
		spec.Kind = model.KindLinear
		shape += ", a real-valued label: the linear model"
	case cfg.Model == model.KindLogReg || cfg.Model == model.KindMLP:
		spec.Classes = numClasses(d)
		shape += fmt.Sprintf(" and %d label classes", spec.Classes)
	}
	if spec.Kind == model.KindMLP {
		spec.Hidden, spec.Activation = cfg.Hidden, model.ActivationReLU
	}
	if !src.Regression {
		shape += "; the model kind is the aggregator's --model, assumed " + spec.Kind + " (--model)"
	}
	return siteBench{data: d, spec: spec, dataDesc: rc.Data, shapeFrom: shape}, nil
}

// csvPathOnly is the path of a csv:PATH data setting without a label (read
// by the federation's schema).
func csvPathOnly(data string) (string, bool) {
	rest, ok := strings.CutPrefix(data, "csv:")
	if !ok || strings.Contains(rest, ":label=") || strings.HasSuffix(rest, ":regression") {
		return "", false
	}
	return rest, true
}

// numClasses is 1 + the largest label (labels are 0..K-1), at least 2.
func numClasses(d model.Data) int {
	k := 2
	for _, y := range d.Y {
		if y >= 0 && y < math.MaxInt32 {
			k = max(k, int(y)+1)
		}
	}
	return k
}

// loadSchemaSite reads a site's CSV by the federation's schema: with
// --schema, the preprocessing is fitted on this site's own statistics (the
// federation's is fitted on every site's, so a categorical level only other
// sites have is missing: the model may have a few inputs fewer); without
// it, the schema, preprocessing and model of the site's last final bundle
// are used as they are.
func loadSchemaSite(cfg benchConfig, rc runConfig, path string) (siteBench, error) {
	var (
		sc    *schema.Schema
		tr    *prep.Transform
		spec  model.Spec
		shape string
	)
	if cfg.SchemaFile != "" {
		s, err := schema.Load(cfg.SchemaFile)
		if err != nil {
			return siteBench{}, wrapErr("--schema", err)
		}
		site, err := sitedata.Load(s, path)
		if err != nil {
			return siteBench{}, err
		}
		own, err := site.Statistics()
		if err != nil {
			return siteBench{}, err
		}
		if tr, err = sitedata.Fit(s, own); err != nil {
			return siteBench{}, wrapErr("preprocessing", err)
		}
		kind, hidden, act := cfg.Model, 0, ""
		if kind == model.KindMLP {
			hidden, act = cfg.Hidden, model.ActivationReLU
		}
		if spec, err = sitedata.ModelSpec(s, tr, kind, hidden, act, cfg.L2); err != nil {
			return siteBench{}, err
		}
		sc = s
		shape = fmt.Sprintf("the schema %s with a preprocessing fitted on this site's own statistics (assumed: the federation's, fitted on every site's, may one-hot a categorical level only other sites have); the model kind is the aggregator's --model, assumed %s (--model)", cfg.SchemaFile, cfg.Model)
	} else {
		b, from, err := storedBundle(rc)
		if err != nil {
			return siteBench{}, err
		}
		sc, tr, spec = b.Schema, b.Transform, b.Model.Spec
		shape = fmt.Sprintf("the final model bundle of this site's last run (%s): the federation's schema, preprocessing and model", from)
	}
	site, err := sitedata.Load(sc, path)
	if err != nil {
		return siteBench{}, err
	}
	train, _, err := site.Data(tr)
	if err != nil {
		return siteBench{}, err
	}
	if train.N == 0 {
		return siteBench{}, fmt.Errorf("%s: no training rows after the schema's holdout", path)
	}
	return siteBench{data: train, spec: spec, shapeFrom: shape,
		dataDesc: fmt.Sprintf("csv:%s (the training rows: the schema's holdout share left out)", path)}, nil
}

// storedBundle is the site's last final bundle: model_out, else the one in
// its state file (when no running agent holds it).
func storedBundle(rc runConfig) (*bundle.Bundle, string, error) {
	out := rc.ModelOut
	if out == "" && rc.StateFile != "" {
		out = filepath.Join(filepath.Dir(rc.StateFile), agent.DefaultModelOutName)
	}
	if out != "" {
		if b, err := bundle.Read(out); err == nil {
			return b, out, nil
		}
	}
	if rc.StateFile != "" {
		if _, err := os.Stat(rc.StateFile); err == nil {
			s, err := edgestore.OpenEdge(rc.StateFile, storage.Options{LockTimeout: time.Second})
			if err == nil {
				fin, ferr := s.Final()
				s.Close()
				if ferr == nil {
					if b, err := bundle.Unmarshal(fin.Bundle); err == nil {
						return b, rc.StateFile, nil
					}
				}
			}
		}
	}
	return nil, "", errors.New("no schema to read the site's data: the aggregator announces it, and no final model bundle is stored (hint: --schema FILE, as broker-agg run --schema)")
}

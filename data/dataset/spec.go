package dataset

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/edgefl/edgefl/learn/model"
)

// Source kinds.
const (
	SourceSynthetic    = "synthetic"
	SourceSyntheticIID = "synthetic-iid"
	SourceIDX          = "idx"
	SourceCSV          = "csv"
	SourceLEAF         = "leaf"
)

// Partition kinds.
const (
	PartNatural   = "natural"
	PartIID       = "iid"
	PartDirichlet = "dirichlet"
	PartClasses   = "classes"
)

const sourceForms = "synthetic:ALPHA,BETA, synthetic-iid, idx:DIR, csv:PATH:label=COLUMN[:regression] or leaf:PATH"
const partitionForms = "natural, iid, dirichlet:ALPHA or classes:K"

// Source is a parsed data source spec.
type Source struct {
	Kind        string
	Alpha, Beta float64 // synthetic
	Path        string  // idx, csv, leaf
	Label       string  // csv: label column name or 0-based index
	Regression  bool    // csv: real-valued label
}

// String returns the spec that ParseSource reads back as s.
func (s Source) String() string {
	switch s.Kind {
	case SourceSynthetic:
		return fmt.Sprintf("synthetic:%g,%g", s.Alpha, s.Beta)
	case SourceCSV:
		spec := "csv:" + s.Path + ":label=" + s.Label
		if s.Regression {
			spec += ":regression"
		}
		return spec
	case SourceIDX, SourceLEAF:
		return s.Kind + ":" + s.Path
	}
	return s.Kind
}

// Partition is a parsed partition spec.
type Partition struct {
	Kind  string
	Alpha float64 // dirichlet
	K     int     // classes
}

// String returns the spec that ParsePartition reads back as p.
func (p Partition) String() string {
	switch p.Kind {
	case PartDirichlet:
		return fmt.Sprintf("dirichlet:%g", p.Alpha)
	case PartClasses:
		return fmt.Sprintf("classes:%d", p.K)
	}
	return p.Kind
}

// ParseSource parses a data source spec:
//
//	synthetic:ALPHA,BETA                FedProx synthetic(alpha, beta), alpha, beta >= 0
//	synthetic-iid                       FedProx synthetic-iid
//	idx:DIR                             MNIST-style IDX directory (see LoadIDX)
//	csv:PATH:label=COLUMN[:regression]  CSV file, label column by name or 0-based index
//	leaf:PATH                           LEAF JSON file or directory of them
//
// PATH may itself contain colons: the csv options are taken from the end.
func ParseSource(s string) (Source, error) {
	bad := func(format string, a ...any) (Source, error) {
		return Source{}, specf("source %q: %s", s, fmt.Sprintf(format, a...))
	}
	spec := strings.TrimSpace(s)
	kind, rest, hasArg := strings.Cut(spec, ":")
	switch kind {
	case SourceSyntheticIID:
		if hasArg {
			return bad("synthetic-iid takes no arguments")
		}
		return Source{Kind: SourceSyntheticIID}, nil
	case SourceSynthetic:
		a, b, ok := strings.Cut(rest, ",")
		if !hasArg || !ok {
			return bad("expected synthetic:ALPHA,BETA (e.g. synthetic:1,1) or synthetic-iid")
		}
		alpha, err := parseStdDev(a)
		if err != nil {
			return bad("alpha: %v; expected synthetic:ALPHA,BETA", err)
		}
		beta, err := parseStdDev(b)
		if err != nil {
			return bad("beta: %v; expected synthetic:ALPHA,BETA", err)
		}
		return Source{Kind: SourceSynthetic, Alpha: alpha, Beta: beta}, nil
	case SourceIDX, SourceLEAF:
		if strings.TrimSpace(rest) == "" {
			if kind == SourceIDX {
				return bad("expected idx:DIR (a directory of train-images-idx3-ubyte(.gz) etc.)")
			}
			return bad("expected leaf:PATH (a LEAF .json file or a directory of them)")
		}
		return Source{Kind: kind, Path: rest}, nil
	case SourceCSV:
		src := Source{Kind: SourceCSV}
		if r, ok := strings.CutSuffix(rest, ":regression"); ok {
			src.Regression, rest = true, r
		}
		at := strings.LastIndex(rest, ":label=")
		if at < 0 {
			return bad("expected csv:PATH:label=COLUMN[:regression], COLUMN a header name or 0-based index")
		}
		src.Path, src.Label = rest[:at], strings.TrimSpace(rest[at+len(":label="):])
		if src.Path == "" {
			return bad("no file: expected csv:PATH:label=COLUMN[:regression]")
		}
		if src.Label == "" || strings.Contains(src.Label, ":") {
			return bad("label %q: expected label=COLUMN (a header name or 0-based index), optionally followed by :regression", src.Label)
		}
		return src, nil
	}
	return bad("unknown source, expected %s", sourceForms)
}

// parseStdDev parses a finite number >= 0.
func parseStdDev(s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, fmt.Errorf("%q is not a finite number >= 0", s)
	}
	return v, nil
}

// ParsePartition parses a partition spec:
//
//	natural          one client per synthetic device or LEAF user
//	iid              shuffled, near-equal sizes
//	dirichlet:ALPHA  label skew, per-class proportions ~ Dir(ALPHA), ALPHA > 0
//	classes:K        K classes per client, power-law sizes (FedProx MNIST)
func ParsePartition(s string) (Partition, error) {
	bad := func(format string, a ...any) (Partition, error) {
		return Partition{}, specf("partition %q: %s", s, fmt.Sprintf(format, a...))
	}
	spec := strings.TrimSpace(s)
	kind, rest, hasArg := strings.Cut(spec, ":")
	switch kind {
	case PartNatural, PartIID:
		if hasArg {
			return bad("%s takes no arguments", kind)
		}
		return Partition{Kind: kind}, nil
	case PartDirichlet:
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if !hasArg || err != nil || !(v > 0 && v <= math.MaxFloat64) {
			return bad("expected dirichlet:ALPHA with ALPHA a number > 0 (e.g. dirichlet:0.1; smaller is more skewed)")
		}
		return Partition{Kind: PartDirichlet, Alpha: v}, nil
	case PartClasses:
		k, err := strconv.Atoi(strings.TrimSpace(rest))
		if !hasArg || err != nil || k < 1 {
			return bad("expected classes:K with K an integer >= 1 (e.g. classes:2)")
		}
		return Partition{Kind: PartClasses, K: k}, nil
	}
	return bad("unknown partition, expected %s", partitionForms)
}

// BuildOptions configures Build. Zero values mean defaults.
type BuildOptions struct {
	// Clients is the number of clients of the iid, dirichlet and classes
	// partitions (required there). With natural it must be 0 or the
	// natural count (for synthetic it sets the device count when
	// SyntheticDevices is 0).
	Clients int
	// TestFraction of each client's samples is held out (0 means 0.1).
	TestFraction float64
	Seed         uint64
	// Standardize is none, client or global; "" picks client for csv and
	// leaf sources and none for synthetic and idx (already in a fixed
	// range).
	Standardize string
	// SyntheticDevices is the number of synthetic devices (default 30);
	// SyntheticMaxSamples caps a device's samples (0 = no cap).
	SyntheticDevices    int
	SyntheticMaxSamples int
	// MinClientSamples is dirichlet's minimum client size, PerClass the
	// classes partition's first per-class share (see PartitionOptions).
	MinClientSamples int
	PerClass         int
}

// Build loads or generates the source, partitions it and standardises the
// result. natural keeps the source's own clients (synthetic devices, LEAF
// users); the other partitions pool the source first (for synthetic and
// LEAF, every device's or user's samples, train and test) and split the
// pool over opt.Clients clients. Every client has its own train/test split.
func Build(src Source, part Partition, opt BuildOptions) (*Federated, error) {
	frac, err := testFraction(opt.TestFraction)
	if err != nil {
		return nil, err
	}
	mode, err := buildMode(src, part, opt)
	if err != nil {
		return nil, err
	}
	synth := SyntheticConfig{
		Alpha: src.Alpha, Beta: src.Beta, IID: src.Kind == SourceSyntheticIID,
		Devices: opt.SyntheticDevices, MaxSamples: opt.SyntheticMaxSamples,
		TestFraction: frac, Seed: opt.Seed,
	}
	split := SplitOptions{TestFraction: frac, Seed: opt.Seed}

	var f *Federated
	if part.Kind == PartNatural {
		if f, err = buildNatural(src, opt, synth, split); err != nil {
			return nil, err
		}
		f.Name += ", natural"
	} else if f, err = buildPartitioned(src, part, opt, synth, split, frac); err != nil {
		return nil, err
	}
	if err := Standardize(f, mode); err != nil {
		return nil, err
	}
	return f, nil
}

// buildMode checks the options Build does not pass on (the number of
// clients and devices, the partition's kind) and returns the
// standardisation mode, the source's default for "".
func buildMode(src Source, part Partition, opt BuildOptions) (string, error) {
	mode := opt.Standardize
	switch mode {
	case "":
		mode = StandardizeNone
		if src.Kind == SourceCSV || src.Kind == SourceLEAF {
			mode = StandardizeClient
		}
	case StandardizeNone, StandardizeClient, StandardizeGlobal:
	default:
		return "", specf("standardize %q, expected none, client or global (or empty for the source's default)", opt.Standardize)
	}
	if opt.Clients < 0 || opt.SyntheticDevices < 0 {
		return "", specf("%d clients, %d synthetic devices: expected >= 0", opt.Clients, opt.SyntheticDevices)
	}
	switch part.Kind {
	case PartNatural, PartIID, PartDirichlet, PartClasses:
	default:
		return "", specf("partition %q, expected %s", part.Kind, partitionForms)
	}
	return mode, nil
}

// buildNatural loads a source's own clients (synthetic devices, LEAF
// users); Build adds ", natural" to the name.
func buildNatural(src Source, opt BuildOptions, synth SyntheticConfig, split SplitOptions) (*Federated, error) {
	switch src.Kind {
	case SourceSynthetic, SourceSyntheticIID:
		if synth.Devices == 0 {
			synth.Devices = opt.Clients
		} else if opt.Clients != 0 && opt.Clients != synth.Devices {
			return nil, specf("partition natural of %s: %d clients but %d synthetic devices (one client per device)", src, opt.Clients, synth.Devices)
		}
		return Synthetic(synth)
	case SourceLEAF:
		f, err := LoadLEAF(src.Path, split)
		if err != nil {
			return nil, err
		}
		if opt.Clients != 0 && opt.Clients != len(f.Clients) {
			return nil, specf("partition natural of %s: it has %d users, so the clients must be %d (or 0), not %d; use iid, dirichlet:ALPHA or classes:K to repartition", src, len(f.Clients), len(f.Clients), opt.Clients)
		}
		return f, nil
	case SourceCSV, SourceIDX:
		return nil, specf("partition natural of %s: only synthetic and leaf sources have natural clients; use iid, dirichlet:ALPHA or classes:K", src)
	default:
		return nil, specf("source %q, expected %s", src.Kind, sourceForms)
	}
}

// buildPartitioned loads a source's samples as one pool and partitions
// them among opt.Clients clients (iid, dirichlet or classes).
func buildPartitioned(src Source, part Partition, opt BuildOptions, synth SyntheticConfig, split SplitOptions, frac float64) (*Federated, error) {
	if opt.Clients < 1 {
		return nil, specf("partition %s of %s needs the number of clients (>= 1)", part, src)
	}
	var ds *Dataset
	var err error
	switch src.Kind {
	case SourceSynthetic, SourceSyntheticIID:
		ds, err = SyntheticPool(synth)
	case SourceLEAF:
		var lf *Federated
		lf, err = LoadLEAF(src.Path, split)
		if err == nil {
			ds = lf.pool()
		}
	case SourceCSV:
		ds, err = LoadCSV(src.Path, CSVOptions{Label: src.Label, Regression: src.Regression})
	case SourceIDX:
		ds, err = LoadIDX(src.Path)
	default:
		return nil, specf("source %q, expected %s", src.Kind, sourceForms)
	}
	if err != nil {
		return nil, err
	}
	var f *Federated
	popt := PartitionOptions{TestFraction: frac, Seed: opt.Seed, MinSamples: opt.MinClientSamples, PerClass: opt.PerClass}
	switch part.Kind {
	case PartIID:
		f, err = PartitionIID(ds, opt.Clients, popt)
	case PartDirichlet:
		f, err = PartitionDirichlet(ds, opt.Clients, part.Alpha, popt)
	case PartClasses:
		f, err = PartitionClasses(ds, opt.Clients, part.K, popt)
	}
	if err != nil {
		return nil, err
	}
	return f, nil
}

// pool concatenates every client's train samples, then every client's test
// samples, into one Dataset.
func (f *Federated) pool() *Dataset {
	train, test := f.Pooled()
	return &Dataset{Name: f.Name, Data: concat(f.D, []model.Data{train, test}), Classes: f.Classes, FeatureNames: f.FeatureNames}
}

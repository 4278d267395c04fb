// Package dataset loads, generates and partitions the data of a federation.
//
// Sources: the FedProx synthetic(alpha, beta) and synthetic-iid generators,
// IDX files (MNIST, Fashion-MNIST; plain or gzip), CSV files and LEAF JSON.
// Partitioners split a pooled data set over N clients (IID, Dirichlet label
// skew, k classes per client with power-law sizes); synthetic devices and LEAF
// users are natural clients. Every client keeps its own train/test split.
//
// Spec strings (ParseSource, ParsePartition) and Build are what the command
// line uses. Everything is deterministic given a seed: randomness comes only
// from math/rand/v2 generators built from it; there are no goroutines, globals
// or clocks. Files are treated as hostile input: sizes are checked before
// allocating and bad input returns an error naming the file, never a panic.
package dataset

import (
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/edgefl/edgefl/learn/model"
)

// ErrSpec matches (errors.Is) the errors of ParseSource, ParsePartition and
// every error about an invalid spec, option or combination of source,
// partition and options: the user asked for something wrong, as opposed to
// a bad file. Its text does not appear in the messages.
var ErrSpec = errors.New("dataset spec")

// specErr marks an error as an ErrSpec one without adding text to it.
type specErr struct{ error }

func (e specErr) Is(target error) bool { return target == ErrSpec }
func (e specErr) Unwrap() error        { return e.error }

func specf(format string, a ...any) error { return specErr{fmt.Errorf(format, a...)} }

// DefaultTestFraction is the share of each client's samples held out for
// testing when no fraction is given (the FedProx reference keeps 90 % for
// training).
const DefaultTestFraction = 0.1

// Dataset is a pooled data set, before it is partitioned over clients.
type Dataset struct {
	Name string
	Data model.Data
	// Classes is the number of classes (labels are 0..Classes-1), 0 for a
	// regression target.
	Classes int
	// FeatureNames names the columns of Data.X when the source has names
	// (CSV); nil otherwise.
	FeatureNames []string
}

// Client is one site of a federation with its own train/test split.
type Client struct {
	ID          string
	Train, Test model.Data
	// Mean and Scale are the standardisation Standardize applied to this
	// client's features (x' = (x - Mean) / Scale); nil when none was. An
	// edge site applies the same transform to new local data.
	Mean, Scale []float64
}

// Federated is a data set spread over clients.
type Federated struct {
	Name string
	// D is the feature dimension, Classes the number of classes (0 for a
	// regression target).
	D, Classes int
	Clients    []Client
	// FeatureNames names the features when the source has names (CSV).
	FeatureNames []string
	// Dropped counts the source samples no client received (classes:K
	// leaves out the classes no client holds); 0 for every other partition.
	Dropped int
	// Standardized is the Standardize mode applied ("" when none was).
	Standardized string
}

// Pooled returns the concatenation of all clients' train sets and of all
// their test sets, in client order. The slices are fresh copies.
func (f *Federated) Pooled() (train, test model.Data) {
	trains := make([]model.Data, len(f.Clients))
	tests := make([]model.Data, len(f.Clients))
	for i, c := range f.Clients {
		trains[i], tests[i] = c.Train, c.Test
	}
	return concat(f.D, trains), concat(f.D, tests)
}

// Validate checks that every client's train and test sets have dimension D,
// finite values and, for classifiers, labels in 0..Classes-1.
func (f *Federated) Validate() error {
	if f.D <= 0 {
		return fmt.Errorf("federation %s: feature dimension %d, expected >= 1", f.Name, f.D)
	}
	for _, c := range f.Clients {
		for _, part := range []struct {
			name string
			d    model.Data
		}{{"train", c.Train}, {"test", c.Test}} {
			if part.d.D != f.D {
				return fmt.Errorf("federation %s: client %s %s has %d features, expected %d", f.Name, c.ID, part.name, part.d.D, f.D)
			}
			if err := part.d.Validate(); err != nil {
				return fmt.Errorf("federation %s: client %s %s: %w", f.Name, c.ID, part.name, err)
			}
			if err := checkLabels(part.d.Y, f.Classes); err != nil {
				return fmt.Errorf("federation %s: client %s %s: %w", f.Name, c.ID, part.name, err)
			}
		}
	}
	return nil
}

// checkLabels reports the first label that is not an integer in
// 0..classes-1 (nothing for regression, classes == 0).
func checkLabels(y []float64, classes int) error {
	if classes == 0 {
		return nil
	}
	for i, v := range y {
		if !(v >= 0 && v < float64(classes) && v == float64(int(v))) {
			return fmt.Errorf("sample %d has label %v, expected an integer in 0..%d", i, v, classes-1)
		}
	}
	return nil
}

// concat stacks the rows of parts (all of dimension d).
func concat(d int, parts []model.Data) model.Data {
	n := 0
	for _, p := range parts {
		n += p.N
	}
	out := model.Data{N: n, D: d, X: make([]float64, 0, n*d), Y: make([]float64, 0, n)}
	for _, p := range parts {
		out.X = append(out.X, p.X[:p.N*d]...)
		out.Y = append(out.Y, p.Y[:p.N]...)
	}
	return out
}

// Random streams: each use of the seed gets its own PCG stream so that
// changing one stage (say the partition) leaves the others' draws alone.
const (
	streamSource    = 0x5eed_0001
	streamPartition = 0x5eed_0002
	streamSplit     = 0x5eed_0003
)

func newRand(seed, stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, stream))
}

// testFraction resolves 0 to the default and checks the range.
func testFraction(f float64) (float64, error) {
	if f == 0 {
		return DefaultTestFraction, nil
	}
	if !(f > 0 && f < 1) {
		return 0, specf("test fraction %v, expected a number in (0, 1) (0 means %v)", f, DefaultTestFraction)
	}
	return f, nil
}

// testCount is the number of test samples of a client with n samples: as
// the FedProx reference, train = int((1-frac) n) and the rest is test, but a
// client with at least 2 samples always has at least one of each.
func testCount(n int, frac float64) int {
	if n < 2 {
		return 0
	}
	test := n - int((1-frac)*float64(n))
	return min(max(test, 1), n-1)
}

// splitClient shuffles the rows idx of d and cuts them into a train and a
// test set. idx is reordered in place.
func splitClient(id string, d model.Data, idx []int, frac float64, rng *rand.Rand) Client {
	rng.Shuffle(len(idx), func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
	nTrain := len(idx) - testCount(len(idx), frac)
	return Client{
		ID:    id,
		Train: d.Gather(idx[:nTrain], model.Data{}),
		Test:  d.Gather(idx[nTrain:], model.Data{}),
	}
}

// clientID names client i of n with a fixed width so that IDs sort.
func clientID(prefix string, i, n int) string {
	w := len(fmt.Sprint(max(n-1, 0)))
	return fmt.Sprintf("%s%0*d", prefix, w, i)
}

// seq returns 0..n-1.
func seq(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// checkDataset validates a pooled data set before partitioning.
func checkDataset(ds *Dataset) error {
	if ds == nil {
		return errors.New("no data set")
	}
	if ds.Data.N <= 0 {
		return fmt.Errorf("data set %s has no samples", ds.Name)
	}
	if ds.Data.D <= 0 || len(ds.Data.X) != ds.Data.N*ds.Data.D || len(ds.Data.Y) != ds.Data.N {
		return fmt.Errorf("data set %s: inconsistent shape %d×%d with %d values and %d targets", ds.Name, ds.Data.N, ds.Data.D, len(ds.Data.X), len(ds.Data.Y))
	}
	if ds.Classes < 0 {
		return fmt.Errorf("data set %s: %d classes, expected >= 0", ds.Name, ds.Classes)
	}
	if err := checkLabels(ds.Data.Y, ds.Classes); err != nil {
		return fmt.Errorf("data set %s: %w", ds.Name, err)
	}
	return nil
}

package dataset

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/edgefl/edgefl/learn/model"
)

// Defaults of the FedProx synthetic generator (generate_synthetic.py).
const (
	DefaultSyntheticDevices = 30
	DefaultSyntheticDim     = 60
	DefaultSyntheticClasses = 10
)

// maxSyntheticValues bounds the generated feature values (samples × Dim):
// the lognormal(4, 2) size of a device has a heavy tail (one device in a
// few hundred gets more than 20,000 samples, and the tail is unbounded).
const maxSyntheticValues = 1 << 28

// SyntheticConfig configures Synthetic. The zero value of a field means its
// default.
type SyntheticConfig struct {
	// Alpha and Beta are the standard deviations of u_k (how much the
	// devices' models differ) and of B_k (how much their feature means
	// differ). Ignored when IID is set.
	Alpha, Beta float64
	// IID generates synthetic-iid: one W, b ~ N(0, 1) shared by every
	// device and feature mean v_k = 0.
	IID bool
	// Devices (default 30), Dim (default 60), Classes (default 10).
	Devices, Dim, Classes int
	// MaxSamples caps a device's sample count (0 = no cap, the reference
	// behaviour).
	MaxSamples int
	// TestFraction of each device's samples is held out (default 0.1: the
	// reference's train_len = int(0.9 n)).
	TestFraction float64
	Seed         uint64
}

func (c SyntheticConfig) withDefaults() (SyntheticConfig, error) {
	if c.Devices == 0 {
		c.Devices = DefaultSyntheticDevices
	}
	if c.Dim == 0 {
		c.Dim = DefaultSyntheticDim
	}
	if c.Classes == 0 {
		c.Classes = DefaultSyntheticClasses
	}
	var err error
	switch {
	case c.IID && (c.Alpha != 0 || c.Beta != 0):
		err = fmt.Errorf("synthetic-iid takes no alpha, beta (got %v, %v)", c.Alpha, c.Beta)
	case !(c.Alpha >= 0 && c.Alpha <= math.MaxFloat64), !(c.Beta >= 0 && c.Beta <= math.MaxFloat64):
		err = fmt.Errorf("synthetic: alpha %v, beta %v, expected finite standard deviations >= 0", c.Alpha, c.Beta)
	case c.Devices < 1:
		err = fmt.Errorf("synthetic: %d devices, expected >= 1", c.Devices)
	case c.Dim < 1:
		err = fmt.Errorf("synthetic: dimension %d, expected >= 1", c.Dim)
	case c.Classes < 2:
		err = fmt.Errorf("synthetic: %d classes, expected >= 2", c.Classes)
	case c.MaxSamples < 0:
		err = fmt.Errorf("synthetic: max samples %d, expected >= 0 (0 = no cap)", c.MaxSamples)
	}
	if err != nil {
		return c, specErr{err}
	}
	c.TestFraction, err = testFraction(c.TestFraction)
	return c, err
}

func (c SyntheticConfig) name() string {
	if c.IID {
		return "synthetic-iid"
	}
	return fmt.Sprintf("synthetic(%g,%g)", c.Alpha, c.Beta)
}

// synthDevice is one generated device with the parameters it was drawn from.
type synthDevice struct {
	W    []float64 // Dim×Classes, row-major
	B    []float64 // Classes
	V    []float64 // Dim: the feature mean
	Data model.Data
}

// Synthetic generates the FedProx synthetic(alpha, beta) federation (or
// synthetic-iid), one client per device, as the reference
// generate_synthetic.py of Li et al. does:
//
//	n_k   = int(lognormal(4, 2)) + 50            (capped at MaxSamples if set)
//	u_k ~ N(0, alpha),  B_k ~ N(0, beta)
//	v_k ~ N(B_k, 1) per coordinate,  Sigma = diag((j+1)^-1.2)
//	W_k ~ N(u_k, 1) (Dim×Classes),  b_k ~ N(u_k, 1)
//	x ~ N(v_k, Sigma),  y = argmax softmax(x W_k + b_k)
//
// then shuffles each device's samples and keeps train = int(0.9 n) of them
// for training. synthetic-iid draws one W, b ~ N(0, 1) for every device and
// uses v_k = 0. Client IDs are the reference's user names f_00000, ...
//
// The distribution is the reference's; numpy's random stream is not
// reproduced, so the same seed does not give the reference's numbers. The
// result is deterministic given Seed.
func Synthetic(cfg SyntheticConfig) (*Federated, error) {
	cfg, devs, err := drawSynthetic(cfg)
	if err != nil {
		return nil, err
	}
	rng := newRand(cfg.Seed, streamSplit)
	f := &Federated{Name: cfg.name(), D: cfg.Dim, Classes: cfg.Classes, Clients: make([]Client, len(devs))}
	for k, d := range devs {
		f.Clients[k] = splitClient(fmt.Sprintf("f_%05d", k), d.Data, seq(d.Data.N), cfg.TestFraction, rng)
	}
	return f, nil
}

// SyntheticPool generates the same samples as Synthetic with the same
// config, all devices pooled in device order, for repartitioning.
func SyntheticPool(cfg SyntheticConfig) (*Dataset, error) {
	cfg, devs, err := drawSynthetic(cfg)
	if err != nil {
		return nil, err
	}
	parts := make([]model.Data, len(devs))
	for k, d := range devs {
		parts[k] = d.Data
	}
	return &Dataset{Name: cfg.name(), Data: concat(cfg.Dim, parts), Classes: cfg.Classes}, nil
}

// drawSynthetic validates cfg, fills in its defaults and draws its devices:
// Synthetic and SyntheticPool see the same samples.
func drawSynthetic(cfg SyntheticConfig) (SyntheticConfig, []synthDevice, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return cfg, nil, err
	}
	devs, err := generateSynthetic(cfg)
	return cfg, devs, err
}

// generateSynthetic draws the devices of a validated config.
func generateSynthetic(cfg SyntheticConfig) ([]synthDevice, error) {
	rng := newRand(cfg.Seed, streamSource)
	dim, classes := cfg.Dim, cfg.Classes

	// Sample counts first, with the overall size checked before any
	// allocation proportional to it.
	sizes := make([]int, cfg.Devices)
	total := 0.0
	for k := range sizes {
		s := math.Floor(math.Exp(4+2*rng.NormFloat64())) + 50
		if cfg.MaxSamples > 0 {
			s = min(s, float64(cfg.MaxSamples))
		}
		total += s
		if total*float64(dim) > maxSyntheticValues {
			return nil, fmt.Errorf("synthetic: %d devices × %d features, seed %d: over %d values at device %d (%.0f samples) (hint: cap samples per device, or lower devices or dimension)", cfg.Devices, dim, cfg.Seed, maxSyntheticValues, k, s)
		}
		sizes[k] = int(s)
	}

	// Priors. With IID the reference draws none of these: v_k = 0 and one
	// shared W, b.
	u := make([]float64, cfg.Devices)
	bk := make([]float64, cfg.Devices)
	v := make([][]float64, cfg.Devices)
	var sharedW, sharedB []float64
	if cfg.IID {
		for k := range v {
			v[k] = make([]float64, dim)
		}
		sharedW, sharedB = normals(rng, dim*classes, 0, 1), normals(rng, classes, 0, 1)
	} else {
		for k := range u {
			u[k] = cfg.Alpha * rng.NormFloat64()
		}
		for k := range bk {
			bk[k] = cfg.Beta * rng.NormFloat64()
		}
		for k := range v {
			v[k] = normals(rng, dim, bk[k], 1)
		}
	}
	sd := make([]float64, dim) // sqrt of Sigma's diagonal
	for j := range sd {
		sd[j] = math.Pow(float64(j+1), -0.6)
	}

	devs := make([]synthDevice, cfg.Devices)
	logits := make([]float64, classes)
	for k := range devs {
		W, b := sharedW, sharedB
		if !cfg.IID {
			W, b = normals(rng, dim*classes, u[k], 1), normals(rng, classes, u[k], 1)
		}
		n := sizes[k]
		d := model.Data{N: n, D: dim, X: make([]float64, n*dim), Y: make([]float64, n)}
		for i := range n {
			x := d.X[i*dim : (i+1)*dim]
			for j := range x {
				x[j] = v[k][j] + sd[j]*rng.NormFloat64()
			}
			copy(logits, b)
			for j, xj := range x {
				row := W[j*classes : (j+1)*classes]
				for c, w := range row {
					logits[c] += xj * w
				}
			}
			d.Y[i] = float64(argmax(logits))
		}
		devs[k] = synthDevice{W: W, B: b, V: v[k], Data: d}
	}
	return devs, nil
}

// normals returns n draws of N(mean, sd^2).
func normals(rng *rand.Rand, n int, mean, sd float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = mean + sd*rng.NormFloat64()
	}
	return out
}

// argmax returns the index of the largest value, the first one on ties
// (numpy's rule; softmax is monotone so the reference's argmax of the
// softmax is the argmax of the logits).
func argmax(z []float64) int {
	best := 0
	for i, v := range z {
		if v > z[best] {
			best = i
		}
	}
	return best
}

package dataset

import (
	"fmt"
	"math"
	"slices"

	"github.com/edgefl/edgefl/learn/model"
)

// Standardisation modes.
const (
	StandardizeNone   = "none"
	StandardizeClient = "client" // each client's own train statistics
	StandardizeGlobal = "global" // pooled train statistics of all clients
)

// Standardize rescales every feature to zero mean and unit standard
// deviation (population, divide by n), in place:
//
//   - "none" leaves the data alone;
//   - "client" uses each client's train mean and standard deviation and
//     applies them to that client's train and test sets: no statistic
//     crosses a site, as in a real deployment;
//   - "global" uses the pooled train statistics of all clients for
//     everyone. Computing them needs every site's data (or a secure
//     aggregation of moments), so it is only done when asked for.
//
// A feature with zero variance is centred but not scaled. The transform
// applied is recorded in each Client's Mean and Scale and in
// f.Standardized. Standardizing twice is refused.
func Standardize(f *Federated, mode string) error {
	switch mode {
	case StandardizeNone:
		return nil
	case StandardizeClient, StandardizeGlobal:
	default:
		return specf("standardize %q, expected none, client or global", mode)
	}
	if f.Standardized != "" {
		return fmt.Errorf("standardize %s: federation %s is already standardized (%s)", mode, f.Name, f.Standardized)
	}
	if mode == StandardizeGlobal {
		train, _ := f.Pooled()
		mean, scale := moments(train)
		for i := range f.Clients {
			c := &f.Clients[i]
			c.Mean, c.Scale = slices.Clone(mean), slices.Clone(scale)
			apply(c.Train, mean, scale)
			apply(c.Test, mean, scale)
		}
	} else {
		for i := range f.Clients {
			c := &f.Clients[i]
			c.Mean, c.Scale = moments(c.Train)
			apply(c.Train, c.Mean, c.Scale)
			apply(c.Test, c.Mean, c.Scale)
		}
	}
	f.Standardized = mode
	return nil
}

// moments returns each feature's mean and the scale to divide by: the
// population standard deviation, or 1 when it is zero (to rounding: below
// 1e-12 of the feature's magnitude). With no samples the mean is 0.
func moments(d model.Data) (mean, scale []float64) {
	mean = make([]float64, d.D)
	scale = make([]float64, d.D)
	if d.N == 0 {
		for j := range scale {
			scale[j] = 1
		}
		return mean, scale
	}
	for i := range d.N {
		for j, v := range d.X[i*d.D : (i+1)*d.D] {
			mean[j] += v
		}
	}
	n := float64(d.N)
	for j := range mean {
		mean[j] /= n
	}
	for i := range d.N {
		for j, v := range d.X[i*d.D : (i+1)*d.D] {
			r := v - mean[j]
			scale[j] += r * r
		}
	}
	for j := range scale {
		sd := math.Sqrt(scale[j] / n)
		if !(sd > 1e-12*max(1, math.Abs(mean[j]))) {
			sd = 1
		}
		scale[j] = sd
	}
	return mean, scale
}

func apply(d model.Data, mean, scale []float64) {
	for i := range d.N {
		row := d.X[i*d.D : (i+1)*d.D]
		for j := range row {
			row[j] = (row[j] - mean[j]) / scale[j]
		}
	}
}

package aggregate

// FedSiam is FedSiam-DA's dual aggregation (seeds/004, eq. 13-16): a first
// aggregate w0 = (1/K) sum_k w_k (eq. 13), then xi_k = cos(w_k, w0) /
// sum_j cos(w_j, w0) (eq. 14-15) and the model sum_k xi_k w_k (eq. 16).
//
// Non-positive cosines: eq. 15 is only a set of convex weights when every
// cosine is positive. A client with cos <= 0 is given xi_k = 0 (excluded) and
// the others are renormalised, which leaves the paper's weights untouched
// whenever they are well defined. Since sum_k <w_k, w0> = K ||w0||^2 > 0, at
// least one cosine is positive unless w0 = 0; when w0 is zero (or all
// cosines vanish) the weights are uniform, i.e. the result is w0 itself.
//
// SampleWeighted makes the first aggregate FedAvg's sum_k (n_k/n) w_k: the
// paper's text says the first aggregation "is consistent with FedAvg, the
// weighted average", while its eq. 13 is the plain mean (the default here).
//
// With On = OnUpdates the cosines are taken between w_k - global and
// w0 - global.
type FedSiam struct {
	On             Space
	SampleWeighted bool
}

func (f FedSiam) Name() string {
	n := "fedsiam"
	if f.On != OnUpdates {
		n += ":on=" + f.On.String()
	}
	if f.SampleWeighted {
		n += ":w0=fedavg"
	}
	return n
}

func (f FedSiam) Aggregate(global []float64, ups []Update, out []float64) (Report, error) {
	if err := check(global, ups, out); err != nil {
		return Report{}, err
	}
	p := uniform(len(ups))
	if f.SampleWeighted {
		var err error
		if p, err = sampleWeights(ups); err != nil {
			return Report{}, err
		}
	}
	sims := cosineToRef(global, ups, f.On == OnUpdates, p)
	w, rep := cosineWeights(sims)
	weightedSum(ups, w, out)
	var mean float64
	for _, s := range sims {
		mean += s
	}
	rep.Metrics["avg_similarity"] = mean / float64(len(sims))
	return rep, nil
}

// sampleWeights returns FedAvg's n_k/n (uniform when every count is 0).
func sampleWeights(ups []Update) ([]float64, error) {
	var n float64
	for _, u := range ups {
		if u.Samples < 0 {
			return nil, errNegSamples(u)
		}
		n += float64(u.Samples)
	}
	if n == 0 {
		return uniform(len(ups)), nil
	}
	w := make([]float64, len(ups))
	for k, u := range ups {
		w[k] = float64(u.Samples) / n
	}
	return w, nil
}

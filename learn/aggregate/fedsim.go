package aggregate

// FedSim is the cosine-similarity weighting of the FedSim validation sheet
// (seeds/001): omega_k = sim(w_k, w) / sum_j sim(w_j, w), where w is the
// global model and sim the cosine of the flattened parameter vectors; the new
// model is sum_k omega_k w_k.
//
// Edge cases, each handled explicitly:
//   - a client with non-positive similarity (anti-correlated or orthogonal)
//     gets weight exactly 0: it is excluded, not allowed to push the weights
//     of others above 1 or below 0;
//   - a zero vector (a zero model on weights, or on updates a client that
//     did not move, w_k = w) has no direction: its similarity is 0, so it is
//     excluded;
//   - when no client has positive similarity (all excluded, all identical
//     to the global model on updates, or a zero global model on weights) the
//     weights fall back to uniform 1/K: the sheet's "identical models give
//     uniform weights", and the mean of the clients is the least surprising
//     model to publish;
//   - K = 1 gives weight 1 (the single client's model) whatever its
//     similarity.
//
// With On = OnUpdates the similarity is cos(w_k - w, mean_j (w_j - w)).
//
// Report.Metrics carries the sheet's avg_similarity and similarity_variance
// (mean and population variance of the raw similarities, zero vectors
// counting as 0), max_weight, min_weight, weight_entropy, and excluded (the
// number of clients given weight 0) and fallback (1 when the uniform fallback
// was used).
type FedSim struct {
	On Space
}

func (f FedSim) Name() string {
	if f.On == OnUpdates {
		return "fedsim"
	}
	return "fedsim:on=" + f.On.String()
}

func (f FedSim) Aggregate(global []float64, ups []Update, out []float64) (Report, error) {
	if err := check(global, ups, out); err != nil {
		return Report{}, err
	}
	var sims []float64
	if f.On == OnUpdates {
		sims = cosineToRef(global, ups, true, uniform(len(ups)))
	} else {
		sims = cosineToRef(global, ups, false, nil)
	}
	w, rep := cosineWeights(sims)
	weightedSum(ups, w, out)
	var mean, variance float64
	for _, s := range sims {
		mean += s
	}
	mean /= float64(len(sims))
	for _, s := range sims {
		variance += (s - mean) * (s - mean)
	}
	variance /= float64(len(sims))
	rep.Metrics["avg_similarity"] = mean
	rep.Metrics["similarity_variance"] = variance
	return rep, nil
}

// cosineWeights turns similarities into weights max(s_k, 0)/sum, with the
// uniform fallback when none is positive, and reports excluded/fallback and
// the weight statistics.
func cosineWeights(sims []float64) ([]float64, Report) {
	pos := make([]float64, len(sims))
	excluded := 0
	for k, s := range sims {
		if s > 0 {
			pos[k] = s
		} else {
			excluded++
		}
	}
	w, ok := normalizePos(pos)
	fb := 0.0
	if !ok {
		fb = 1
		excluded = 0
	}
	m := map[string]float64{"excluded": float64(excluded), "fallback": fb}
	weightStats(m, w)
	return w, Report{Weights: w, Metrics: m}
}

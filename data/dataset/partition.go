package dataset

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
)

// Defaults of the partitioners.
const (
	// DefaultPerClass is the number of samples of each of its classes a
	// client gets first under classes:K (the FedProx MNIST recipe's 5).
	DefaultPerClass = 5
	// DefaultMinSamples is the fewest samples a client may get under
	// dirichlet:ALPHA (lowered for small pools, see PartitionOptions).
	DefaultMinSamples = 10
	// DirichletAttempts is how many Dirichlet draws are tried before giving
	// up on the minimum client size.
	DirichletAttempts = 1000
)

// PartitionOptions are the knobs of the partitioners.
type PartitionOptions struct {
	// TestFraction of each client's samples is held out (0 means 0.1); a
	// client with at least 2 samples gets at least 1 test sample.
	TestFraction float64
	Seed         uint64
	// MinSamples is the fewest samples a client may get under Dirichlet;
	// 0 means min(10, N/(2 clients)), at least 1.
	MinSamples int
	// PerClass is how many samples of each of its classes a client gets
	// before the power-law share under classes:K; 0 means 5.
	PerClass int
}

// partitionSetup checks the common arguments and returns the resolved test
// fraction.
func partitionSetup(ds *Dataset, clients int, opt PartitionOptions) (float64, error) {
	if err := checkDataset(ds); err != nil {
		return 0, err
	}
	if clients < 1 {
		return 0, specf("%d clients, expected >= 1", clients)
	}
	if clients > ds.Data.N {
		return 0, specf("%d clients but data set %s has only %d samples", clients, ds.Name, ds.Data.N)
	}
	return testFraction(opt.TestFraction)
}

// federate turns groups of sample indices into clients, splitting each.
func federate(ds *Dataset, name string, groups [][]int, frac float64, rng *rand.Rand) *Federated {
	f := &Federated{
		Name: name, D: ds.Data.D, Classes: ds.Classes,
		FeatureNames: slices.Clone(ds.FeatureNames),
		Clients:      make([]Client, len(groups)),
	}
	used := 0
	for i, g := range groups {
		f.Clients[i] = splitClient(clientID("client", i, len(groups)), ds.Data, g, frac, rng)
		used += len(g)
	}
	f.Dropped = ds.Data.N - used
	return f
}

// PartitionIID shuffles the pool and deals it into clients of near-equal
// sizes (they differ by at most one sample).
func PartitionIID(ds *Dataset, clients int, opt PartitionOptions) (*Federated, error) {
	frac, err := partitionSetup(ds, clients, opt)
	if err != nil {
		return nil, wrapErr("partition iid", err)
	}
	rng := newRand(opt.Seed, streamPartition)
	perm := rng.Perm(ds.Data.N)
	groups := make([][]int, clients)
	base, extra := ds.Data.N/clients, ds.Data.N%clients
	at := 0
	for i := range groups {
		n := base
		if i < extra {
			n++
		}
		groups[i] = perm[at : at+n : at+n]
		at += n
	}
	return federate(ds, ds.Name+", iid", groups, frac, rng), nil
}

// byClass lists the sample indices of each class, each list shuffled.
func byClass(ds *Dataset, rng *rand.Rand) [][]int {
	idx := make([][]int, ds.Classes)
	for i, y := range ds.Data.Y {
		c := int(y)
		idx[c] = append(idx[c], i)
	}
	for _, l := range idx {
		rng.Shuffle(len(l), func(i, j int) { l[i], l[j] = l[j], l[i] })
	}
	return idx
}

// PartitionDirichlet gives every client a label-skewed share: for each class
// independently, proportions p ~ Dir(alpha, ..., alpha) over the clients, and
// the class's samples (shuffled) are cut at the cumulative proportions. Small
// alpha (0.1 and below) gives each class to few clients; large alpha tends to
// IID. The draw is repeated (up to DirichletAttempts times) until every
// client has at least MinSamples samples. Every sample is used exactly once.
func PartitionDirichlet(ds *Dataset, clients int, alpha float64, opt PartitionOptions) (*Federated, error) {
	spec := fmt.Sprintf("dirichlet:%g", alpha)
	frac, err := partitionSetup(ds, clients, opt)
	if err != nil {
		return nil, fmt.Errorf("partition %s: %w", spec, err)
	}
	if !(alpha > 0 && alpha <= math.MaxFloat64) {
		return nil, specf("partition %s: alpha must be a finite number > 0", spec)
	}
	if ds.Classes < 1 {
		return nil, specf("partition %s: data set %s has a regression target, the partition needs class labels (use iid)", spec, ds.Name)
	}
	minN := opt.MinSamples
	if minN == 0 {
		minN = max(1, min(DefaultMinSamples, ds.Data.N/(2*clients)))
	}
	if minN < 0 || minN*clients > ds.Data.N {
		return nil, specf("partition %s: minimum %d samples per client × %d clients, but data set %s has %d samples", spec, minN, clients, ds.Name, ds.Data.N)
	}
	rng := newRand(opt.Seed, streamPartition)
	classIdx := byClass(ds, rng)

	// cuts[c][i] is where client i's share of class c ends.
	cuts := make([][]int, ds.Classes)
	for c := range cuts {
		cuts[c] = make([]int, clients)
	}
	logg := make([]float64, clients)
	counts := make([]int, clients)
	best := -1
	for attempt := 0; ; attempt++ {
		if attempt == DirichletAttempts {
			return nil, fmt.Errorf("partition %s: after %d draws some client still had fewer than %d samples (at best %d): raise alpha, use fewer clients or a smaller minimum", spec, DirichletAttempts, minN, best)
		}
		clear(counts)
		for c, l := range classIdx {
			p := dirichlet(rng, alpha, logg)
			cum := 0.0
			prev := 0
			for i := range clients {
				cum += p[i]
				end := int(cum * float64(len(l)))
				if i == clients-1 {
					end = len(l)
				}
				end = min(max(end, prev), len(l))
				cuts[c][i] = end
				counts[i] += end - prev
				prev = end
			}
		}
		smallest := slices.Min(counts)
		best = max(best, smallest)
		if smallest >= minN {
			break
		}
	}
	groups := make([][]int, clients)
	for i := range groups {
		groups[i] = make([]int, 0, counts[i])
	}
	for c, l := range classIdx {
		prev := 0
		for i, end := range cuts[c] {
			groups[i] = append(groups[i], l[prev:end]...)
			prev = end
		}
	}
	return federate(ds, ds.Name+", "+spec, groups, frac, rng), nil
}

// dirichlet draws p ~ Dir(alpha, ..., alpha) of length len(buf) (buf is
// scratch, overwritten and returned as p). The Gamma draws are kept as
// logarithms: for small alpha most of them underflow a float64.
func dirichlet(rng *rand.Rand, alpha float64, buf []float64) []float64 {
	m := math.Inf(-1)
	for i := range buf {
		buf[i] = logGamma(rng, alpha)
		m = max(m, buf[i])
	}
	if math.IsInf(m, -1) { // every draw underflowed even as a logarithm
		m = 0
		for i := range buf {
			buf[i] = 0
		}
	}
	sum := 0.0
	for i, l := range buf {
		buf[i] = math.Exp(l - m)
		sum += buf[i]
	}
	for i := range buf {
		buf[i] /= sum
	}
	return buf
}

// logGamma returns log G for G ~ Gamma(shape a, scale 1): Marsaglia and
// Tsang's method, with G(a) = G(a+1) U^(1/a) for a < 1.
func logGamma(rng *rand.Rand, a float64) float64 {
	if a < 1 {
		u := 1 - rng.Float64() // (0, 1]
		return logGamma(rng, a+1) + math.Log(u)/a
	}
	d := a - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := rng.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := 1 - rng.Float64()
		if math.Log(u) < 0.5*x*x+d-d*v+d*math.Log(v) {
			return math.Log(d) + math.Log(v)
		}
	}
}

// PartitionClasses is the FedProx MNIST recipe generalised: client u holds
// the k classes (u + j) mod C, j < k. Each class's samples (shuffled) go to
// the clients holding it: first PerClass samples each (fewer if the class is
// too small to give everyone that many), then the rest in proportions drawn
// from lognormal(0, 2), one draw per (client, class) pair, so client sizes
// follow a power law. Shares are rounded down and the remainders handed out
// by largest fraction, so every sample of a held class is used exactly once.
// Classes no client holds (when clients + k - 1 < C) are left out and
// counted in Federated.Dropped.
func PartitionClasses(ds *Dataset, clients, k int, opt PartitionOptions) (*Federated, error) {
	spec := fmt.Sprintf("classes:%d", k)
	frac, err := partitionSetup(ds, clients, opt)
	if err != nil {
		return nil, fmt.Errorf("partition %s: %w", spec, err)
	}
	if ds.Classes < 1 {
		return nil, specf("partition %s: data set %s has a regression target, the partition needs class labels (use iid)", spec, ds.Name)
	}
	if k < 1 || k > ds.Classes {
		return nil, specf("partition %s: k must be in 1..%d, the classes of data set %s", spec, ds.Classes, ds.Name)
	}
	perClass := opt.PerClass
	if perClass == 0 {
		perClass = DefaultPerClass
	}
	if perClass < 0 {
		return nil, specf("partition %s: %d samples per class, expected >= 0", spec, perClass)
	}
	C := ds.Classes
	rng := newRand(opt.Seed, streamPartition)
	classIdx := byClass(ds, rng)

	// holders[l] lists the clients holding class l, in client order.
	holders := make([][]int, C)
	for u := range clients {
		for j := range k {
			l := (u + j) % C
			holders[l] = append(holders[l], u)
		}
	}
	groups := make([][]int, clients)
	share := make([]float64, clients)
	for l, idx := range classIdx {
		h := holders[l]
		if len(h) == 0 || len(idx) == 0 {
			continue
		}
		base := min(perClass, len(idx)/len(h))
		at := 0
		for _, u := range h {
			groups[u] = append(groups[u], idx[at:at+base]...)
			at += base
		}
		// The power-law share of the rest.
		rest := len(idx) - at
		props := share[:len(h)]
		sum := 0.0
		for i := range props {
			props[i] = math.Exp(2 * rng.NormFloat64())
			sum += props[i]
		}
		counts := largestRemainder(props, sum, rest)
		for i, u := range h {
			groups[u] = append(groups[u], idx[at:at+counts[i]]...)
			at += counts[i]
		}
	}
	for u, g := range groups {
		if len(g) == 0 {
			cl := make([]int, k)
			for j := range cl {
				cl[j] = (u + j) % C
			}
			return nil, fmt.Errorf("partition %s: client %d gets no samples: its classes %v have fewer samples than clients holding them in data set %s (use fewer clients or a larger k)", spec, u, cl, ds.Name)
		}
	}
	return federate(ds, ds.Name+", "+spec, groups, frac, rng), nil
}

// largestRemainder splits total in proportion to w (summing to sum) into
// integers that add up to total: each gets the floor of its share, and the
// leftover units go to the largest fractional parts (the earliest on ties).
func largestRemainder(w []float64, sum float64, total int) []int {
	counts := make([]int, len(w))
	if total == 0 {
		return counts
	}
	fracs := make([]float64, len(w))
	given := 0
	for i, x := range w {
		s := x / sum * float64(total)
		fl := math.Floor(s)
		counts[i] = min(int(fl), total-given)
		fracs[i] = s - fl
		given += counts[i]
	}
	order := seq(len(w))
	// sort.SliceStable (the same stable algorithm as slices.SortStableFunc)
	// rather than the generic one, whose instantiation for []int only this
	// call needed: 2 kB of edge-agent's text.
	sort.SliceStable(order, func(i, j int) bool { return fracs[order[i]] > fracs[order[j]] })
	for i := 0; given < total; i = (i + 1) % len(order) {
		counts[order[i]]++
		given++
	}
	return counts
}

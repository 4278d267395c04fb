package prep

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/data/schema"
)

const testSchema = `{"task":"binary","features":[
 {"name":"big","type":"numeric"},{"name":"small","type":"numeric"},
 {"name":"kind","type":"categorical"},{"name":"flat","type":"numeric"}],
 "label":{"column":"y","classes":[{"name":"n","values":["0"]},{"name":"p","values":["1","2"]}]},
 "min_site_samples":3}`

func mustSchema(t testing.TB, js string) *schema.Schema {
	s, err := schema.Parse([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// randomTable has a feature with a large offset and small spread (where
// sum-of-squares variance loses precision), missing values and levels.
func randomTable(rng *rand.Rand, n int) *schema.Table {
	t := &schema.Table{Rows: n, Columns: make([]schema.Column, 4), ClassCounts: make([]int, 2)}
	levels := []string{"b", "a", "c"}
	for range n {
		for j := range 4 {
			c := &t.Columns[j]
			miss := rng.Float64() < 0.1
			c.Missing = append(c.Missing, miss)
			switch j {
			case 0:
				c.Num = append(c.Num, 1e4+rng.NormFloat64())
			case 1:
				c.Num = append(c.Num, rng.NormFloat64())
			case 2:
				l := levels[rng.IntN(3)]
				if miss {
					l = ""
				}
				c.Level = append(c.Level, l)
			case 3:
				c.Num = append(c.Num, 7)
			}
		}
		k := rng.IntN(2)
		t.Labels = append(t.Labels, float64(k))
		t.ClassCounts[k]++
	}
	return t
}

func all(n int) []int {
	r := make([]int, n)
	for i := range r {
		r[i] = i
	}
	return r
}

func relErr(a, b float64) float64 {
	if a == b {
		return 0
	}
	return math.Abs(a-b) / math.Max(math.Abs(a), math.Abs(b))
}

// Reference statistics of the concatenated data, two-pass.
func reference(t *schema.Table, j int) (mean, variance float64) {
	c := t.Columns[j]
	n := 0.0
	for i := range t.Rows {
		if !c.Missing[i] {
			mean += c.Num[i]
			n++
		}
	}
	mean /= n
	// One refinement pass: the mean of the residuals corrects the
	// rounding of the first sum.
	corr := 0.0
	for i := range t.Rows {
		if !c.Missing[i] {
			corr += c.Num[i] - mean
		}
	}
	mean += corr / n
	for i := range t.Rows {
		if !c.Missing[i] {
			d := c.Num[i] - mean
			variance += d * d
		}
	}
	return mean, variance / n
}

func TestPooledEqualsConcatenated(t *testing.T) {
	s := mustSchema(t, testSchema)
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		tab := randomTable(rng, 200+rng.IntN(2000))
		// A random partition into 2..8 sites of at least 3 rows.
		k := 2 + rng.IntN(7)
		perm := rng.Perm(tab.Rows)
		cuts := []int{0}
		for range k - 1 {
			cuts = append(cuts, 3+rng.IntN(tab.Rows-6))
		}
		cuts = append(cuts, tab.Rows)
		sortInts(cuts)
		var sites []*Stats
		for p := range k {
			rows := perm[cuts[p]:cuts[p+1]]
			if len(rows) < s.MinSiteSamples {
				continue
			}
			st, err := Compute(s, tab, rows)
			if err != nil {
				t.Fatal(err)
			}
			sites = append(sites, st)
		}
		pooled, err := Combine(s, sites)
		if err != nil {
			t.Fatal(err)
		}
		if pooled.Rows != int64(tab.Rows) && len(sites) == k {
			t.Fatalf("seed %d: rows %d, want %d", seed, pooled.Rows, tab.Rows)
		}
		if len(sites) != k {
			continue // a tiny part was left out; covered by other seeds
		}
		for _, j := range []int{0, 1, 3} {
			mean, variance := reference(tab, j)
			got := pooled.Features[j].Numeric
			if e := relErr(got.Mean, mean); e > 1e-12 {
				t.Errorf("seed %d feature %d: mean rel err %g", seed, j, e)
			}
			if e := relErr(got.Var(), variance); e > 1e-12 {
				t.Errorf("seed %d feature %d: variance %v want %v rel err %g", seed, j, got.Var(), variance, e)
			}
			// The test discriminates: the textbook sum-of-squares
			// variance misses 1e-12 on the offset feature.
			naive := got.SumSq/float64(got.Count) - (got.Sum/float64(got.Count))*(got.Sum/float64(got.Count))
			if j == 0 && relErr(naive, variance) < 1e-12 {
				t.Errorf("seed %d: sum-of-squares variance is within 1e-12 (%g): the offset is too small to test", seed, relErr(naive, variance))
			}
		}
		central, _ := Compute(s, tab, all(tab.Rows))
		if !equalCounts(central, pooled) {
			t.Errorf("seed %d: counts differ from the concatenated data", seed)
		}
		// A federation-style fit equals a centralised fit.
		fed, err := Fit(s, pooled, nil)
		if err != nil {
			t.Fatal(err)
		}
		cen, _ := Fit(s, central, nil)
		a, b := fed.Apply(tab, nil), cen.Apply(tab, nil)
		if a.D != b.D || a.D != 6 {
			t.Fatalf("outputs %d vs %d, want 6", a.D, b.D)
		}
		for i := range a.X {
			if math.Abs(a.X[i]-b.X[i]) > 1e-9*math.Max(1, math.Abs(b.X[i])) {
				t.Fatalf("seed %d: transformed value %d: %v vs %v", seed, i, a.X[i], b.X[i])
			}
		}
	}
}

func sortInts(v []int) {
	for i := 1; i < len(v); i++ {
		for j := i; j > 0 && v[j] < v[j-1]; j-- {
			v[j], v[j-1] = v[j-1], v[j]
		}
	}
}

func equalCounts(a, b *Stats) bool {
	if a.Rows != b.Rows {
		return false
	}
	for j := range a.Features {
		fa, fb := a.Features[j], b.Features[j]
		if fa.Numeric != nil && (fa.Numeric.Count != fb.Numeric.Count || fa.Numeric.Missing != fb.Numeric.Missing || fa.Numeric.Min != fb.Numeric.Min || fa.Numeric.Max != fb.Numeric.Max) {
			return false
		}
		if fa.Missing != fb.Missing || len(fa.Levels) != len(fb.Levels) {
			return false
		}
		for l, c := range fa.Levels {
			if fb.Levels[l] != c {
				return false
			}
		}
	}
	for k := range a.ClassCounts {
		if a.ClassCounts[k] != b.ClassCounts[k] {
			return false
		}
	}
	return true
}

func TestTransformRules(t *testing.T) {
	s := mustSchema(t, testSchema)
	csv := "y,big,small,kind,flat\n" +
		"0,1,10,b,7\n1,3,NA,a,7\n2,NA,20,b,7\n0,5,30,,7\n"
	tab, err := s.ReadCSV(strings.NewReader(csv), "t.csv")
	if err != nil {
		t.Fatal(err)
	}
	st, err := Compute(s, tab, nil2all(tab))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := Fit(s, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Validate(s); err != nil {
		t.Fatal(err)
	}
	kind := tr.Columns[2]
	if strings.Join(kind.Levels, ",") != "a,b" || kind.ImputeLevel != "b" {
		t.Fatalf("levels %v impute %q", kind.Levels, kind.ImputeLevel)
	}
	if tr.Columns[3].Scale != 1 || tr.Columns[0].Impute != 3 {
		t.Fatalf("flat scale %v, big impute %v", tr.Columns[3].Scale, tr.Columns[0].Impute)
	}
	d := tr.Apply(tab, nil)
	// Row 3 (big missing -> mean 3 -> 0; kind b; flat 0).
	row := d.Row(2)
	want := []float64{0, 0 /* 20 is the pooled mean */, 0, 1, 0}
	for i := range want {
		if math.Abs(row[i]-want[i]) > 1e-15 {
			t.Fatalf("row 3 = %v, want %v", row, want)
		}
	}
	// Row 4: kind missing -> most frequent level b.
	if r := d.Row(3); r[2] != 0 || r[3] != 1 {
		t.Fatalf("row 4 = %v", r)
	}
	if d.Y[1] != 1 || d.Y[2] != 1 || d.Y[3] != 0 {
		t.Fatalf("labels %v", d.Y)
	}
}

func nil2all(t *schema.Table) []int { return all(t.Rows) }

func TestTooFewSamples(t *testing.T) {
	s := mustSchema(t, testSchema)
	tab := randomTable(rand.New(rand.NewPCG(1, 1)), 10)
	_, err := Compute(s, tab, []int{0, 1})
	var few *TooFewSamplesError
	if !errors.As(err, &few) || few.Rows != 2 || few.Min != 3 {
		t.Fatalf("err %v", err)
	}
}

func TestClientStandardize(t *testing.T) {
	s := mustSchema(t, strings.Replace(testSchema, `"min_site_samples":3`, `"min_site_samples":3,"standardize":"client"`, 1))
	tab := randomTable(rand.New(rand.NewPCG(2, 1)), 100)
	a, _ := Compute(s, tab, all(50))
	b, _ := Compute(s, tab, all(100)[50:])
	pooled, _ := Combine(s, []*Stats{a, b})
	if _, err := Fit(s, pooled, nil); err == nil {
		t.Fatal("client mode without own statistics accepted")
	}
	tr, err := Fit(s, pooled, a)
	if err != nil {
		t.Fatal(err)
	}
	if tr.Columns[1].Mean != a.Features[1].Numeric.Mean || tr.Columns[1].Impute != pooled.Features[1].Numeric.Mean {
		t.Fatal("client mode: mean must be the site's, imputation the federation's")
	}
}

func TestStatsJSONRoundTripAndValidate(t *testing.T) {
	s := mustSchema(t, testSchema)
	tab := randomTable(rand.New(rand.NewPCG(3, 1)), 100)
	st, _ := Compute(s, tab, all(100))
	b1, _ := json.Marshal(st)
	var back Stats
	if err := json.Unmarshal(b1, &back); err != nil {
		t.Fatal(err)
	}
	b2, _ := json.Marshal(&back)
	if !bytes.Equal(b1, b2) {
		t.Fatal("statistics JSON does not round-trip byte for byte")
	}
	if err := back.Validate(s); err != nil {
		t.Fatal(err)
	}
	bad := []func(*Stats){
		func(x *Stats) { x.Version = 9 },
		func(x *Stats) { x.SchemaDigest = "00" },
		func(x *Stats) { x.Features = x.Features[:2] },
		func(x *Stats) { x.Features[0].Numeric.M2 = math.NaN() },
		func(x *Stats) { x.Features[1].Numeric.Count++ },
		func(x *Stats) { x.Features[2].Levels["zz"] = 5 },
		func(x *Stats) { x.ClassCounts[0] = -1 },
		func(x *Stats) { x.Features[1].Numeric.Mean = x.Features[1].Numeric.Max + 1 },
	}
	for k, mutate := range bad {
		var c Stats
		if err := json.Unmarshal(b1, &c); err != nil {
			t.Fatal(err)
		}
		mutate(&c)
		if err := c.Validate(s); err == nil {
			t.Errorf("mutation %d accepted", k)
		}
		if _, err := Combine(s, []*Stats{st, &c}); err == nil {
			t.Errorf("mutation %d: combine accepted", k)
		}
	}
	tr, _ := Fit(s, st, nil)
	tb, _ := json.Marshal(tr)
	var tr2 Transform
	if err := json.Unmarshal(tb, &tr2); err != nil {
		t.Fatal(err)
	}
	if err := tr2.Validate(s); err != nil {
		t.Fatal(err)
	}
	tr2.Columns[0].Scale = 0
	if tr2.Validate(s) == nil {
		t.Fatal("zero scale accepted")
	}
}

// A site's categorical cells are schema.Level's ("4.0" reads as level
// "4"): statistics hold the one level, and a transform fitted before
// (levels "1.0", "4.0") still finds its level for every cell, so a model
// bundle made then predicts as it did.
func TestNumericLevelsAreOneLevel(t *testing.T) {
	s, err := schema.Parse([]byte(`{"task":"regression","features":[{"name":"cp","type":"categorical"}],"label":{"column":"y"},"min_site_samples":1,"holdout":0}`))
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.ReadCSV(strings.NewReader("cp,y\n1.0,1\n4.0,2\n4.0,3\n"), "a.csv")
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.ReadCSV(strings.NewReader("cp,y\n1,1\n4,2\n"), "b.csv")
	if err != nil {
		t.Fatal(err)
	}
	sa, _ := Compute(s, a, []int{0, 1, 2})
	sb, _ := Compute(s, b, []int{0, 1})
	pooled, err := Combine(s, []*Stats{sa, sb})
	if err != nil {
		t.Fatal(err)
	}
	if got := pooled.Features[0].Levels; len(got) != 2 || got["1"] != 2 || got["4"] != 3 {
		t.Fatalf("pooled levels %v, want 1:2 4:3", got)
	}
	tr, err := Fit(s, pooled, nil)
	if err != nil || tr.Outputs != 2 {
		t.Fatalf("fit %v: %d outputs, want 2", err, tr.Outputs)
	}
	old := *tr
	old.Columns = []Column{{Name: "cp", Type: schema.Categorical, Levels: []string{"1.0", "4.0"}, ImputeLevel: "4.0"}}
	for _, x := range []*Transform{tr, &old} {
		d := x.Apply(b, nil)
		if !slices.Equal(d.X, []float64{1, 0, 0, 1}) {
			t.Fatalf("levels %v: X %v, want one-hot 1, 4", x.Columns[0].Levels, d.X)
		}
	}
}

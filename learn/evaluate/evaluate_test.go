package evaluate

import (
	"encoding/json"
	"math"
	"os"
	"testing"
)

type fixture struct {
	Kind             string    `json:"kind"`
	Classes          int       `json:"classes"`
	Y                []float64 `json:"y"`
	Probs            []float64 `json:"probs"`
	Pred             []float64 `json:"pred"`
	Accuracy         float64   `json:"accuracy"`
	BalancedAccuracy float64   `json:"balanced_accuracy"`
	Confusion        [][]int64 `json:"confusion"`
	Loss             float64   `json:"loss"`
	AUC              float64   `json:"auc"`
	RMSE             float64   `json:"rmse"`
	R2               float64   `json:"r2"`
}

func loadFixtures(t *testing.T) []fixture {
	b, err := os.ReadFile("testdata/sklearn.json")
	if err != nil {
		t.Fatal(err)
	}
	var fs []fixture
	if err := json.Unmarshal(b, &fs); err != nil {
		t.Fatal(err)
	}
	return fs
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-12*math.Max(1, math.Abs(b)) }

func (f fixture) report(t *testing.T) Report {
	var r Report
	var err error
	if f.Kind == "regression" {
		r, err = Regression(f.Pred, f.Y)
	} else {
		r, err = Classification(f.Probs, f.Y, f.Classes)
	}
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func check(t *testing.T, name string, f fixture, r Report) {
	t.Helper()
	if r.N != int64(len(f.Y)) || !near(r.Loss, f.Loss) {
		t.Errorf("%s: n %d loss %v, sklearn %d %v", name, r.N, r.Loss, len(f.Y), f.Loss)
	}
	if f.Kind == "regression" {
		if !near(r.RMSE, f.RMSE) || r.R2 == nil || !near(*r.R2, f.R2) {
			t.Errorf("%s: rmse %v r2 %v, sklearn %v %v", name, r.RMSE, r.R2, f.RMSE, f.R2)
		}
		return
	}
	if !near(r.Accuracy, f.Accuracy) || !near(r.BalancedAccuracy, f.BalancedAccuracy) {
		t.Errorf("%s: accuracy %v balanced %v, sklearn %v %v", name, r.Accuracy, r.BalancedAccuracy, f.Accuracy, f.BalancedAccuracy)
	}
	for i := range f.Confusion {
		for j := range f.Confusion[i] {
			if r.Confusion[i][j] != f.Confusion[i][j] {
				t.Fatalf("%s: confusion %v, sklearn %v", name, r.Confusion, f.Confusion)
			}
		}
	}
	if f.Kind == "binary" && (r.AUC == nil || !near(*r.AUC, f.AUC)) {
		t.Errorf("%s: auc %v, sklearn %v", name, r.AUC, f.AUC)
	}
}

func TestAgainstSklearn(t *testing.T) {
	for i, f := range loadFixtures(t) {
		check(t, f.Kind+"/"+string(rune('0'+i)), f, f.report(t))
	}
}

// Splitting a fixture's rows over sites and combining gives the figures of
// the whole (AUC excepted: approximated).
func TestCombineExact(t *testing.T) {
	for i, f := range loadFixtures(t) {
		n := len(f.Y)
		if n < 20 {
			continue
		}
		cuts := []int{0, n / 3, n / 2, n}
		var reports []Report
		for p := 0; p+1 < len(cuts); p++ {
			lo, hi := cuts[p], cuts[p+1]
			part := f
			part.Y = f.Y[lo:hi]
			if f.Kind == "regression" {
				part.Pred = f.Pred[lo:hi]
			} else {
				part.Probs = f.Probs[lo*f.Classes : hi*f.Classes]
			}
			reports = append(reports, part.report(t))
		}
		reports = append(reports, Report{}) // an empty site is skipped
		got, err := Combine(reports)
		if err != nil {
			t.Fatal(err)
		}
		if f.Kind == "binary" {
			if got.AUC == nil {
				t.Fatal("combined AUC missing")
			}
			f.AUC = *got.AUC // approximated, not compared
		}
		check(t, "combined "+f.Kind+"/"+string(rune('0'+i)), f, got)
	}
}

func TestSingleClassAUCUndefined(t *testing.T) {
	r, err := Classification([]float64{0.2, 0.8, 0.6, 0.4}, []float64{1, 1}, 2)
	if err != nil || r.AUC != nil || r.BalancedAccuracy != 0.5 {
		t.Fatalf("%v %+v", err, r)
	}
}

func TestBadInput(t *testing.T) {
	if _, err := Classification([]float64{0.5}, []float64{0}, 2); err == nil {
		t.Fatal("short probabilities accepted")
	}
	if _, err := Classification([]float64{0.5, 0.5}, []float64{3}, 2); err == nil {
		t.Fatal("class out of range accepted")
	}
	a, _ := Classification([]float64{0.5, 0.5}, []float64{0}, 2)
	b, _ := Regression([]float64{1}, []float64{2})
	if _, err := Combine([]Report{a, b}); err == nil {
		t.Fatal("mixed tasks combined")
	}
}

// The baseline a model must beat: the rows' majority class (classification;
// a model that predicts it for everyone equals it and does not beat it) or
// the rows' mean (regression: R^2 above 0).
func TestBaseline(t *testing.T) {
	r2 := func(v float64) *float64 { return &v }
	cases := []struct {
		name string
		r    Report
		want *Baseline
	}{
		// 78 % is exactly "everyone has the disease": not beaten.
		{"everyone has it", Report{N: 100, Confusion: [][]int64{{0, 22}, {0, 78}}},
			&Baseline{Rule: BaselineMajority, Class: 1, Accuracy: 0.78, Beaten: false}},
		// 85.7 % below the 92.9 % of the majority class: not beaten.
		{"below the rule", Report{N: 14, Confusion: [][]int64{{12, 1}, {1, 0}}},
			&Baseline{Rule: BaselineMajority, Class: 0, Accuracy: 13.0 / 14, Beaten: false}},
		{"above the rule", Report{N: 10, Confusion: [][]int64{{3, 1}, {0, 6}}},
			&Baseline{Rule: BaselineMajority, Class: 1, Accuracy: 0.6, Beaten: true}},
		{"tie: the lowest class", Report{N: 4, Confusion: [][]int64{{1, 1, 0}, {0, 2, 0}, {0, 0, 0}}},
			&Baseline{Rule: BaselineMajority, Class: 0, Accuracy: 0.5, Beaten: true}},
		{"regression above the mean", Report{N: 5, R2: r2(0.4)}, &Baseline{Rule: BaselineMean, Beaten: true}},
		{"regression at the mean", Report{N: 5, R2: r2(0)}, &Baseline{Rule: BaselineMean, Beaten: false}},
		{"regression, constant labels", Report{N: 5}, nil},
		{"no rows", Report{Confusion: [][]int64{{0, 0}, {0, 0}}}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := c.r
			if r.Confusion != nil {
				r.fromConfusion()
			}
			got := r.WithBaseline().Baseline
			if (got == nil) != (c.want == nil) || got != nil && *got != *c.want {
				t.Fatalf("baseline %+v, want %+v", got, c.want)
			}
		})
	}
}

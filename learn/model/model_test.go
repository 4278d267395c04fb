package model

import (
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
)

// TestLossHandComputed checks loss values worked out by hand on tiny models.
func TestLossHandComputed(t *testing.T) {
	relu, err := NewMLP(1, 1, 2, ActivationReLU, 0)
	if err != nil {
		t.Fatal(err)
	}
	tanh, err := NewMLP(1, 1, 2, ActivationTanh, 0)
	if err != nil {
		t.Fatal(err)
	}
	reluL2, err := NewMLP(1, 1, 2, ActivationReLU, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	one := func(x, y float64) Data { return Data{N: 1, D: 1, X: []float64{x}, Y: []float64{y}} }
	tests := []struct {
		name string
		m    Model
		w    []float64
		d    Data
		want float64
	}{
		// Logits [1, -1], class 0: log(1 + e^-2).
		{"logreg", NewLogReg(1, 2, 0), []float64{1, -1, 0, 0}, one(1, 0), 0.1269280110429725},
		// Same plus (0.5/2)(1 + 1).
		{"logreg l2", NewLogReg(1, 2, 0.5), []float64{1, -1, 0, 0}, one(1, 0), 0.1269280110429725 + 0.5},
		// Zero weights: uniform over 3 classes, log 3, whatever the input.
		{"logreg zero", NewLogReg(2, 3, 0), make([]float64, 9), Data{N: 2, D: 2, X: []float64{5, -3, 0.5, 8}, Y: []float64{2, 0}}, 1.0986122886681098},
		// Logits [1000, -1000], class 1: 2000, without overflow.
		{"logreg extreme", NewLogReg(1, 2, 0), []float64{1000, -1000, 0, 0}, one(1, 1), 2000},
		{"logreg extreme right", NewLogReg(1, 2, 0), []float64{1000, -1000, 0, 0}, one(1, 0), 0},
		// z = 2*1 - 1 = 1: class 1 costs log(1 + e^-1), class 0 log(1 + e).
		{"binary y=1", NewBinaryLogReg(1, 0), []float64{1, -1}, one(2, 1), 0.31326168751822286},
		{"binary y=0", NewBinaryLogReg(1, 0), []float64{1, -1}, one(2, 0), 1.3132616875182228},
		{"binary mean", NewBinaryLogReg(1, 0), []float64{1, -1}, Data{N: 2, D: 1, X: []float64{2, 2}, Y: []float64{1, 0}}, (0.31326168751822286 + 1.3132616875182228) / 2},
		{"binary l2", NewBinaryLogReg(1, 2), []float64{1, -1}, one(2, 1), 0.31326168751822286 + 2},
		{"binary zero", NewBinaryLogReg(3, 0), make([]float64, 4), Data{N: 1, D: 3, X: []float64{1, 2, 3}, Y: []float64{1}}, math.Ln2},
		{"binary extreme", NewBinaryLogReg(1, 0), []float64{1000, 0}, one(1, 0), 1000},
		{"binary extreme right", NewBinaryLogReg(1, 0), []float64{1000, 0}, one(1, 1), 0},
		{"binary extreme negative", NewBinaryLogReg(1, 0), []float64{-1000, 0}, one(1, 1), 1000},
		// W1 = 2, b1 = -1, W2 = [1, -1], b2 = 0. x = 1: h = 1, logits [1, -1].
		// x = 0: h = relu(-1) = 0, logits [0, 0], log 2.
		{"mlp relu", relu, []float64{2, -1, 1, -1, 0, 0}, one(1, 0), 0.1269280110429725},
		{"mlp relu dead", relu, []float64{2, -1, 1, -1, 0, 0}, one(0, 0), math.Ln2},
		{"mlp relu mean", relu, []float64{2, -1, 1, -1, 0, 0}, Data{N: 2, D: 1, X: []float64{1, 0}, Y: []float64{0, 0}}, 0.4100375958014589},
		// (0.5/2)(4 + 1 + 1 + 1).
		{"mlp relu l2", reluL2, []float64{2, -1, 1, -1, 0, 0}, one(1, 0), 0.1269280110429725 + 1.75},
		// h = tanh(1), logits [h, -h], class 1: log(1 + e^(2h)).
		{"mlp tanh", tanh, []float64{2, -1, 1, -1, 0, 0}, one(1, 1), 1.7204113511467445},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			grad := make([]float64, tt.m.NumParams())
			got := tt.m.LossGrad(tt.w, tt.d, grad)
			if !near(got, tt.want, 1e-12) {
				t.Errorf("loss %.17g, want %.17g", got, tt.want)
			}
			if !allFinite(grad) {
				t.Errorf("gradient %v not finite", grad)
			}
		})
	}
}

// TestInvalidTargetNaN checks the documented behaviour for a class index out
// of range: a NaN loss, not a panic.
func TestInvalidTargetNaN(t *testing.T) {
	mlp, err := NewMLP(1, 2, 3, ActivationReLU, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []Model{NewLogReg(1, 3, 0), mlp} {
		for _, y := range []float64{-1, 3, 1.5, math.NaN(), math.Inf(1)} {
			d := Data{N: 1, D: 1, X: []float64{1}, Y: []float64{y}}
			if loss := m.LossGrad(make([]float64, m.NumParams()), d, make([]float64, m.NumParams())); !math.IsNaN(loss) {
				t.Errorf("%s, target %v: loss %v, want NaN", m.Spec().Kind, y, loss)
			}
		}
	}
}

func TestPredictScore(t *testing.T) {
	mlp, err := NewMLP(2, 2, 2, ActivationReLU, 0)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		m     Model
		w     []float64
		d     Data
		pred  []float64
		score float64
	}{
		// Logits [x0, x1, 0]; (1, 1) ties classes 0 and 1: the lower wins.
		{"logreg", NewLogReg(2, 3, 0), []float64{1, 0, 0, 0, 1, 0, 0, 0, 0},
			Data{N: 4, D: 2, X: []float64{2, 1, 1, 3, -1, -1, 1, 1}, Y: []float64{0, 1, 2, 1}},
			[]float64{0, 1, 2, 0}, 0.75},
		// Margin x0 - x1; exactly 0 predicts class 0.
		{"binary", NewBinaryLogReg(2, 0), []float64{1, -1, 0},
			Data{N: 3, D: 2, X: []float64{2, 1, 1, 2, 1, 1}, Y: []float64{1, 0, 1}},
			[]float64{1, 0, 0}, 2.0 / 3},
		// Identity layers: class argmax(relu(x)); (-1, -2) ties at 0.
		{"mlp", mlp, []float64{1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0},
			Data{N: 3, D: 2, X: []float64{2, 1, 0, 3, -1, -2}, Y: []float64{0, 1, 1}},
			[]float64{0, 1, 0}, 2.0 / 3},
		// y = 2x + 1 exactly: R^2 = 1.
		{"linear", NewLinear(1, 0), []float64{2, 1},
			Data{N: 3, D: 1, X: []float64{0, 1, 2}, Y: []float64{1, 3, 5}},
			[]float64{1, 3, 5}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := make([]float64, tt.d.N)
			tt.m.Predict(tt.w, tt.d, out)
			for i := range out {
				if out[i] != tt.pred[i] {
					t.Errorf("predictions %v, want %v", out, tt.pred)
					break
				}
			}
			if got := tt.m.Score(tt.w, tt.d); !near(got, tt.score, 1e-15) {
				t.Errorf("score %v, want %v", got, tt.score)
			}
		})
	}
}

// TestEmptyBatch checks that a zero-sample batch neither panics nor yields
// non-finite values: the loss and gradient are the L2 term's alone, and the
// score is NaN as documented.
func TestEmptyBatch(t *testing.T) {
	rng := newRNG(7)
	for _, base := range gradSpecs {
		for _, empty := range []Data{{D: base.Inputs}, {}} {
			s := base
			s.L2 = 0.5
			m := mustNew(t, s)
			w := randParams(rng, m, 1)
			grad := make([]float64, m.NumParams())
			loss := m.LossGrad(w, empty, grad)
			var want float64
			for i, v := range w {
				want += 0.25 * v * v
				if !near(grad[i], 0.5*v, 1e-15) {
					t.Fatalf("%s: gradient[%d] = %v, want %v", s.Kind, i, grad[i], 0.5*v)
				}
			}
			if !near(loss, want, 1e-12) {
				t.Errorf("%s: loss %v, want %v", s.Kind, loss, want)
			}
			m.Predict(w, empty, nil)
			if sc := m.Score(w, empty); !math.IsNaN(sc) {
				t.Errorf("%s: score %v, want NaN", s.Kind, sc)
			}
		}
	}
}

func TestNewSpec(t *testing.T) {
	tests := []struct {
		name    string
		spec    Spec
		params  int
		wantErr string // substring; "" for a valid spec
	}{
		{"logreg", Spec{Kind: KindLogReg, Inputs: 784, Classes: 10}, 7850, ""},
		{"binary", Spec{Kind: KindBinaryLogReg, Inputs: 5, L2: 0.1}, 6, ""},
		{"binary classes 2", Spec{Kind: KindBinaryLogReg, Inputs: 5, Classes: 2}, 6, ""},
		{"linear", Spec{Kind: KindLinear, Inputs: 3}, 4, ""},
		{"mlp relu", Spec{Kind: KindMLP, Inputs: 4, Hidden: 3, Classes: 2, Activation: "relu"}, 4*3 + 3 + 3*2 + 2, ""},
		{"mlp tanh", Spec{Kind: KindMLP, Inputs: 784, Hidden: 100, Classes: 10, Activation: "tanh"}, 79510, ""},
		{"empty kind", Spec{Inputs: 3}, 0, `unknown model kind ""`},
		{"unknown kind", Spec{Kind: "svm", Inputs: 3}, 0, `unknown model kind "svm"`},
		{"zero inputs", Spec{Kind: KindLinear}, 0, "inputs must be positive, got 0"},
		{"negative inputs", Spec{Kind: KindLogReg, Inputs: -1, Classes: 3}, 0, "inputs must be positive"},
		{"negative l2", Spec{Kind: KindLogReg, Inputs: 2, Classes: 3, L2: -1}, 0, "l2 must be a finite number >= 0"},
		{"nan l2", Spec{Kind: KindLinear, Inputs: 2, L2: math.NaN()}, 0, "l2 must be"},
		{"inf l2", Spec{Kind: KindLinear, Inputs: 2, L2: math.Inf(1)}, 0, "l2 must be"},
		{"logreg one class", Spec{Kind: KindLogReg, Inputs: 2, Classes: 1}, 0, "classes must be >= 2, got 1"},
		{"logreg no classes", Spec{Kind: KindLogReg, Inputs: 2}, 0, "classes must be >= 2, got 0"},
		{"mlp one class", Spec{Kind: KindMLP, Inputs: 2, Hidden: 2, Classes: 1, Activation: "relu"}, 0, "classes must be >= 2"},
		{"mlp no hidden", Spec{Kind: KindMLP, Inputs: 2, Classes: 2, Activation: "relu"}, 0, "hidden must be >= 1, got 0"},
		{"mlp no activation", Spec{Kind: KindMLP, Inputs: 2, Hidden: 2, Classes: 2}, 0, `activation must be "relu" or "tanh", got ""`},
		{"mlp bad activation", Spec{Kind: KindMLP, Inputs: 2, Hidden: 2, Classes: 2, Activation: "ReLU"}, 0, `got "ReLU"`},
		{"binary 3 classes", Spec{Kind: KindBinaryLogReg, Inputs: 2, Classes: 3}, 0, "exactly 2 classes"},
		{"linear classes", Spec{Kind: KindLinear, Inputs: 2, Classes: 2}, 0, "classes must be unset"},
		{"logreg hidden", Spec{Kind: KindLogReg, Inputs: 2, Classes: 2, Hidden: 8}, 0, `did you mean kind "mlp"`},
		{"logreg activation", Spec{Kind: KindLogReg, Inputs: 2, Classes: 2, Activation: "relu"}, 0, "activation must be unset"},
		{"too large", Spec{Kind: KindMLP, Inputs: 1 << 20, Hidden: 1 << 20, Classes: 2, Activation: "relu"}, 0, "parameters, more than"},
		{"overflowing", Spec{Kind: KindLogReg, Inputs: math.MaxInt, Classes: math.MaxInt}, 0, "parameters, more than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := New(tt.spec)
			if tt.wantErr != "" {
				if err == nil || !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("New: error %v, want one wrapping ErrSpec containing %q", err, tt.wantErr)
				}
				if m != nil {
					t.Errorf("New returned a model with its error")
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if got := m.NumParams(); got != tt.params {
				t.Errorf("NumParams %d, want %d", got, tt.params)
			}
			got := m.Spec()
			want := tt.spec
			if want.Kind == KindBinaryLogReg {
				want.Classes = 0 // 2 is accepted and implied
			}
			if got != want {
				t.Errorf("Spec() = %+v, want %+v", got, want)
			}
			if len(m.InitParams(newRNG(1))) != tt.params {
				t.Errorf("InitParams length differs from NumParams")
			}
			if m.Layout() == "" {
				t.Errorf("empty Layout")
			}
		})
	}
}

func TestNewMLPError(t *testing.T) {
	if _, err := NewMLP(3, 0, 2, ActivationReLU, 0); !errors.Is(err, ErrSpec) {
		t.Errorf("NewMLP with no hidden units: error %v, want ErrSpec", err)
	}
}

func TestMLPInitParams(t *testing.T) {
	for _, act := range []string{ActivationReLU, ActivationTanh} {
		m, err := NewMLP(400, 300, 10, act, 0)
		if err != nil {
			t.Fatal(err)
		}
		w := m.InitParams(newRNG(8))
		if again := m.InitParams(newRNG(8)); !equalBits(w, again) {
			t.Errorf("%s: InitParams is not deterministic given the seed", act)
		}
		b1, w2, b2 := m.offsets()
		for _, b := range [][]float64{w[b1:w2], w[b2:]} {
			for _, v := range b {
				if v != 0 {
					t.Fatalf("%s: nonzero initial bias %v", act, v)
				}
			}
		}
		// The sample standard deviation of W1 matches the scheme within 2 %.
		wantStd := math.Sqrt(2.0 / 400)
		if act == ActivationTanh {
			wantStd = math.Sqrt(2.0 / 700)
		}
		var ss float64
		for _, v := range w[:b1] {
			ss += v * v
		}
		if std := math.Sqrt(ss / float64(b1)); !near(std, wantStd, 0.02) {
			t.Errorf("%s: W1 std %v, want about %v", act, std, wantStd)
		}
	}
}

func TestCheckTargets(t *testing.T) {
	logreg := Spec{Kind: KindLogReg, Inputs: 1, Classes: 3}
	binary := Spec{Kind: KindBinaryLogReg, Inputs: 1}
	mlp := Spec{Kind: KindMLP, Inputs: 1, Hidden: 2, Classes: 4, Activation: ActivationTanh}
	linear := Spec{Kind: KindLinear, Inputs: 1}
	ys := func(y ...float64) Data { return Data{N: len(y), D: 1, X: make([]float64, len(y)), Y: y} }
	tests := []struct {
		name    string
		spec    Spec
		d       Data
		wantErr string // substring; "" when valid
	}{
		{"logreg ok", logreg, ys(0, 1, 2, 2), ""},
		{"logreg empty", logreg, Data{D: 1}, ""},
		{"logreg too big", logreg, ys(0, 3, 1), "sample 1 has target 3, want a class index in [0, 3)"},
		{"logreg negative", logreg, ys(-1), "sample 0 has target -1"},
		{"logreg fraction", logreg, ys(0, 1, 1.5), "sample 2 has target 1.5"},
		{"logreg nan", logreg, ys(math.NaN()), "sample 0 has target NaN"},
		{"logreg inf", logreg, ys(math.Inf(1)), "target +Inf"},
		{"logreg first bad sample", logreg, ys(0, 7, -2), "sample 1 "},
		{"mlp ok", mlp, ys(3, 0), ""},
		{"mlp too big", mlp, ys(4), "want a class index in [0, 4)"},
		{"binary ok", binary, ys(0, 1, 1), ""},
		{"binary two", binary, ys(1, 2), "sample 1 has label 2, want 0 or 1"},
		{"binary minus one", binary, ys(-1), "has label -1, want 0 or 1"},
		{"binary soft", binary, ys(0.5), "label 0.5"},
		{"linear ok", linear, ys(-3.5, 1e9), ""},
		{"linear nan", linear, ys(0, math.NaN()), "sample 1 has target NaN, want a finite number"},
		{"features", logreg, Data{N: 1, D: 2, X: []float64{0, 0}, Y: []float64{0}}, "samples have 2 features, the logreg model expects 1"},
		{"short Y", logreg, Data{N: 2, D: 1, X: []float64{0, 0}, Y: []float64{0}}, "need 2 features and 2 targets, have 2 and 1"},
		{"short X", logreg, Data{N: 2, D: 1, X: []float64{0}, Y: []float64{0, 0}}, "have 1 and 2"},
		{"negative N", logreg, Data{N: -1, D: 1}, "targets"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckTargets(tt.spec, tt.d)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("CheckTargets: %v", err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrData) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("CheckTargets: error %v, want one wrapping ErrData containing %q", err, tt.wantErr)
			}
		})
	}
	if err := CheckTargets(Spec{Kind: "svm", Inputs: 1}, ys(0)); !errors.Is(err, ErrSpec) {
		t.Errorf("CheckTargets with a bad spec: error %v, want ErrSpec", err)
	}
}

// TestClone checks that a clone has the same spec and results and shares no
// scratch memory with the original: both are driven from two goroutines at
// once, on batches of different sizes, and must match sequential results
// (run with -race to make any sharing fail loudly).
func TestClone(t *testing.T) {
	rng := newRNG(9)
	for _, s := range gradSpecs {
		s.L2 = 0.1
		m := mustNew(t, s)
		w := randParams(rng, m, 0.5)
		batches := []Data{randData(rng, s, 40), randData(rng, s, 3)}
		want := make([][]float64, len(batches))
		wantLoss := make([]float64, len(batches))
		for i, d := range batches {
			want[i] = make([]float64, m.NumParams())
			wantLoss[i] = m.LossGrad(w, d, want[i])
		}
		c := m.Clone()
		if c.Spec() != m.Spec() {
			t.Fatalf("clone spec %+v, want %+v", c.Spec(), m.Spec())
		}
		var wg sync.WaitGroup
		errs := make([]string, 2)
		for g, mod := range []Model{m, c} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				grad := make([]float64, mod.NumParams())
				for it := range 50 {
					i := (it + g) % 2
					loss := mod.LossGrad(w, batches[i], grad)
					if loss != wantLoss[i] || !equalBits(grad, want[i]) {
						errs[g] = "results differ from the sequential ones"
						return
					}
				}
			}()
		}
		wg.Wait()
		for g, e := range errs {
			if e != "" {
				t.Errorf("%s model %d: %s", s.Kind, g, e)
			}
		}
	}
}

func equalBits(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float64bits(a[i]) != math.Float64bits(b[i]) {
			return false
		}
	}
	return true
}

// TestShapePanics checks the documented panics on programmer errors, and that
// they say what is wrong.
func TestShapePanics(t *testing.T) {
	mlp, err := NewMLP(2, 3, 2, ActivationReLU, 0)
	if err != nil {
		t.Fatal(err)
	}
	d := Data{N: 1, D: 2, X: []float64{1, 2}, Y: []float64{0}}
	for _, m := range []Model{NewLogReg(2, 2, 0), NewBinaryLogReg(2, 0), mlp} {
		np := m.NumParams()
		tests := []struct {
			name string
			call func()
			want string
		}{
			{"short w", func() { m.LossGrad(make([]float64, np-1), d, nil) }, "parameters"},
			{"short grad", func() { m.LossGrad(make([]float64, np), d, make([]float64, np-1)) }, "gradient"},
			{"features", func() { m.LossGrad(make([]float64, np), Data{N: 1, D: 1, X: []float64{1}, Y: []float64{0}}, nil) }, "features"},
			{"short X", func() {
				m.Predict(make([]float64, np), Data{N: 2, D: 2, X: []float64{1, 2}, Y: []float64{0, 1}}, make([]float64, 2))
			}, "data 2×2"},
			{"short out", func() { m.Predict(make([]float64, np), d, nil) }, "predictions"},
		}
		for _, tt := range tests {
			func() {
				defer func() {
					r := recover()
					if msg, _ := r.(string); !strings.Contains(msg, tt.want) {
						t.Errorf("%s %s: panic %v, want one mentioning %q", m.Spec().Kind, tt.name, r, tt.want)
					}
				}()
				tt.call()
			}()
		}
	}
	for _, f := range []func(){func() { NewLogReg(2, 1, 0) }, func() { NewBinaryLogReg(0, 0) }} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("constructor accepted a bad shape")
				}
			}()
			f()
		}()
	}
}

package proxsolver

import (
	"math/rand/v2"

	"github.com/edgefl/edgefl/learn/model"
)

// sgdRun is mini-batch SGD on h(w; a): each epoch visits the samples in a
// fresh random order (rng.Shuffle of the previous order), in mini-batches of
// cfg.Batch samples (the last one partial), and steps
//
//	w <- w - lr (grad f_batch(w) + mu (w - a)).
type sgdRun struct {
	obj   *objective
	tr    *tracker
	w     []float64 // the iterate
	gb    []float64 // mini-batch gradient
	perm  []int     // sample order
	batch model.Data
	lr    float64
	bs    int
	// stepper is the model's fused mini-batch step, when it has one.
	stepper model.Stepper

	maxEvals int   // 0 = unlimited
	seen     int64 // training samples processed
	steps    int   // mini-batch steps taken
}

func newSGDRun(obj *objective, tr *tracker, w []float64, cfg Config, maxEvals int) *sgdRun {
	n := obj.d.N
	r := &sgdRun{
		obj: obj, tr: tr, w: w,
		gb:       make([]float64, len(w)),
		perm:     make([]int, n),
		lr:       cfg.LR,
		bs:       min(cfg.Batch, n),
		maxEvals: maxEvals,
	}
	for i := range r.perm {
		r.perm[i] = i
	}
	r.stepper, _ = obj.m.(model.Stepper)
	return r
}

// epoch runs one pass over the data, checking the context, the deadline and
// the evaluation budget before every mini-batch. It returns the reason it
// stopped early, or "" when the pass was completed. reserve is the number of
// evaluations that must stay available after the last mini-batch.
func (r *sgdRun) epoch(rng *rand.Rand, reserve int) (string, error) {
	n := len(r.perm)
	rng.Shuffle(n, func(i, j int) { r.perm[i], r.perm[j] = r.perm[j], r.perm[i] })
	mu, a, w, gb := r.obj.mu, r.obj.anchor, r.w, r.gb
	for lo := 0; lo < n; lo += r.bs {
		if r.maxEvals > 0 && r.obj.gradEvals+1+reserve > r.maxEvals {
			return StopGradEvals, nil
		}
		if stop := r.tr.interrupted(); stop != "" {
			return stop, nil
		}
		idx := r.perm[lo:min(lo+r.bs, n)]
		lr := r.lr
		if r.stepper != nil && r.obj.shift == nil {
			// The model's fused step: the same update, without a
			// separate gradient vector pass (SCAFFOLD's shifted step takes
			// the plain path below).
			if err := r.obj.step(r.stepper, w, idx, lr); err != nil {
				return "", err
			}
			r.seen += int64(len(idx))
			r.steps++
			continue
		}
		r.batch = r.obj.d.Gather(idx, r.batch)
		if _, err := r.obj.batch(w, r.batch, gb); err != nil {
			return "", err
		}
		if sh := r.obj.shift; sh != nil {
			// SCAFFOLD's corrected step: w <- w - lr (g + mu (w - a) + shift).
			for i, g := range gb {
				if mu != 0 {
					g += mu * (w[i] - a[i])
				}
				w[i] -= lr * (g + sh[i])
			}
		} else if mu == 0 {
			for i, g := range gb {
				w[i] -= lr * g
			}
		} else {
			for i, g := range gb {
				w[i] -= lr * (g + mu*(w[i]-a[i]))
			}
		}
		r.seen += int64(r.batch.N)
		r.steps++
	}
	return "", nil
}

func (r *sgdRun) epochs() float64 { return float64(r.seen) / float64(len(r.perm)) }

// sgd runs SGD from start (nil = anchor) after the anchor measurement.
func (s *session) sgd(start []float64, rep Report, rng *rand.Rand) ([]float64, error) {
	s.rep = rep
	obj, b := s.obj, s.tr.b
	p := len(obj.anchor)
	gf, gh := make([]float64, p), make([]float64, p)

	// The current point's measurement: at the anchor it is already known.
	w := clone(obj.anchor)
	f := rep.AnchorLoss
	_, gnorm := obj.prox(w, f, rep.AnchorGrad, gh)
	if start != nil && !equal(start, obj.anchor) {
		stop := s.tr.interrupted()
		if b.MaxGradEvals > 0 && obj.gradEvals+1 > b.MaxGradEvals {
			stop = StopGradEvals
		}
		if stop != "" {
			// Cannot afford to measure the start point: keep the anchor.
			s.done(f, gnorm, stop)
			return w, nil
		}
		copy(w, start)
		var err error
		if f, err = obj.full(w, gf); err != nil {
			return nil, err
		}
		_, gnorm = obj.prox(w, f, gf, gh)
		if s.thresh > 0 && gnorm <= s.thresh {
			s.done(f, gnorm, StopGamma)
			return w, nil
		}
	}

	r := newSGDRun(obj, s.tr, w, s.cfg, b.MaxGradEvals)
	measured := true // f and gnorm are those of w
	var stop string
	for ep := 0; ; ep++ {
		if b.MaxEpochs > 0 && ep >= b.MaxEpochs {
			stop = StopEpochs
			break
		}
		before := r.seen
		st, err := r.epoch(rng, 1)
		s.rep.Epochs, s.rep.Steps = r.epochs(), r.steps
		if err != nil {
			return nil, err
		}
		if r.seen > before {
			measured = false
		}
		if st != "" {
			stop = st
			break
		}
		if s.thresh > 0 {
			// The gamma test (it uses the evaluation held in reserve).
			if f, err = obj.full(w, gf); err != nil {
				return nil, err
			}
			_, gnorm = obj.prox(w, f, gf, gh)
			measured = true
			if gnorm <= s.thresh {
				stop = StopGamma
				break
			}
		}
	}
	if !measured {
		var err error
		if f, err = obj.full(w, gf); err != nil {
			return nil, err
		}
		_, gnorm = obj.prox(w, f, gf, gh)
	}
	s.done(f, gnorm, stop)
	return w, nil
}

func equal(a, b []float64) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

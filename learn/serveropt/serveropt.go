// Package serveropt is the server step of the FedAvg/FedProx families as an
// optimiser (Reddi et al. 2021, "Adaptive Federated Optimization", their
// Algorithm 2; FedAvgM after Hsu, Qi & Brown 2019). The round's aggregate
// a (the aggregator's output: for fedavg and mean the weighted mean of the
// clients' models) gives the pseudo-gradient Delta = a - x, the mean of
// the clients' deltas; then
//
//	sgd:                                        x' = x + lr Delta
//	avgm:    m = beta1 m + Delta                x' = x + lr m
//	adagrad: m = beta1 m + (1-beta1) Delta      v = v + Delta^2
//	adam:    m = beta1 m + (1-beta1) Delta      v = beta2 v + (1-beta2) Delta^2
//	yogi:    m = beta1 m + (1-beta1) Delta      v = v - (1-beta2) Delta^2 sign(v - Delta^2)
//	                                            x' = x + lr m / (sqrt(v) + tau)
//
// coordinate by coordinate, with m = 0 and v = tau^2 before the first
// step (the paper's v_{-1} >= tau^2) and no bias correction (the paper
// has none). FedAvgM with beta1 = 0 and lr = 1 is plain FedAvg. sgd is the
// paper's Algorithm 1 with SGD as the server optimiser, the server (global)
// learning rate alone: FedAvg's eta and SCAFFOLD's eta_g (Karimireddy et
// al. 2020, x += eta_g mean(delta y)); it keeps no moment (its state is
// the step count).
//
// The package is pure and deterministic: the aggregator's shell and
// simulate call Step with the same inputs and get the same bits; the
// state (T, M, V) is what a checkpoint keeps (Marshal, Unmarshal).
package serveropt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Kind names an optimiser.
type Kind string

const (
	None    Kind = "none"
	SGD     Kind = "sgd"
	AvgM    Kind = "avgm"
	Adagrad Kind = "adagrad"
	Adam    Kind = "adam"
	Yogi    Kind = "yogi"
)

// Kinds lists the valid names, for --help and errors.
var Kinds = []Kind{None, SGD, AvgM, Adagrad, Adam, Yogi}

// Defaults of the parameters (the paper's choices: beta1 0.9, beta2 0.99,
// tau 1e-3; its server learning rates are tuned per task, 1 for FedAvgM
// and 1e-2 for the adaptive ones are the starting points).
const (
	DefaultBeta1      = 0.9
	DefaultBeta2      = 0.99
	DefaultTau        = 1e-3
	DefaultLRMomentum = 1.0
	DefaultLRAdaptive = 1e-2
)

// Params choose the server optimiser. The zero value is off (plain
// aggregation). Beta1, Beta2 and Tau are taken as given (Defaults sets
// the paper's); LR 0 takes the kind's default learning rate in
// WithDefaults.
type Params struct {
	Kind  Kind    `json:"kind,omitempty"`
	LR    float64 `json:"lr,omitempty"`
	Beta1 float64 `json:"beta1,omitempty"`
	Beta2 float64 `json:"beta2,omitempty"`
	Tau   float64 `json:"tau,omitempty"`
}

// Defaults are kind's parameters with the defaults.
func Defaults(k Kind) Params {
	return Params{Kind: k, Beta1: DefaultBeta1, Beta2: DefaultBeta2, Tau: DefaultTau}.WithDefaults()
}

// On says the optimiser replaces plain aggregation.
func (p Params) On() bool { return p.Kind != "" && p.Kind != None }

// moment says the step keeps a first moment m (all but sgd).
func (p Params) moment() bool { return p.Kind != SGD }

// Adaptive says the step divides by sqrt(v) + tau.
func (p Params) Adaptive() bool { return p.Kind == Adagrad || p.Kind == Adam || p.Kind == Yogi }

// ParseKind reads an optimiser's name ("" is none).
func ParseKind(s string) (Kind, error) {
	if s == "" {
		return None, nil
	}
	for _, k := range Kinds {
		if string(k) == s {
			return k, nil
		}
	}
	return None, fmt.Errorf("server optimiser %q: want one of none, sgd, avgm, adagrad, adam, yogi", s)
}

// WithDefaults sets a zero LR to the kind's default (1 for sgd and avgm,
// 1e-2 for the adaptive ones); off, it is the zero Params of kind none.
func (p Params) WithDefaults() Params {
	if !p.On() {
		return Params{Kind: None}
	}
	if p.LR == 0 {
		p.LR = DefaultLRAdaptive
		if p.Kind == AvgM || p.Kind == SGD {
			p.LR = DefaultLRMomentum
		}
	}
	return p
}

// Validate checks p (after WithDefaults).
func (p Params) Validate() error {
	if _, err := ParseKind(string(p.Kind)); err != nil {
		return err
	}
	if !p.On() {
		return nil
	}
	if !(p.LR > 0) || math.IsInf(p.LR, 0) {
		return fmt.Errorf("server optimiser %s: learning rate must be > 0, got %v", p.Kind, p.LR)
	}
	if !(p.Beta1 >= 0 && p.Beta1 < 1) {
		return fmt.Errorf("server optimiser %s: beta1 must be in [0, 1), got %v", p.Kind, p.Beta1)
	}
	if !(p.Beta2 >= 0 && p.Beta2 < 1) {
		return fmt.Errorf("server optimiser %s: beta2 must be in [0, 1), got %v", p.Kind, p.Beta2)
	}
	if p.Adaptive() && (!(p.Tau > 0) || math.IsInf(p.Tau, 0)) {
		return fmt.Errorf("server optimiser %s: tau must be > 0, got %v", p.Kind, p.Tau)
	}
	return nil
}

// String names p with its parameters, for logs, the status and a
// bundle's provenance: "adam:lr=0.01:beta1=0.9:beta2=0.99:tau=0.001".
func (p Params) String() string {
	if !p.On() {
		return string(None)
	}
	s := string(p.Kind) + ":lr=" + ftoa(p.LR)
	if p.Kind == SGD {
		return s
	}
	s += ":beta1=" + ftoa(p.Beta1)
	if p.Kind == Adam || p.Kind == Yogi {
		s += ":beta2=" + ftoa(p.Beta2)
	}
	if p.Adaptive() {
		s += ":tau=" + ftoa(p.Tau)
	}
	return s
}

func ftoa(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// State is the optimiser's state between rounds: T steps taken, the first
// moment M and (adaptive optimisers) the second moment V. The zero value
// is the state before the first step.
type State struct {
	T uint64
	M []float64
	V []float64
}

// ErrNonFinite: the step produced a value that is not a finite number;
// neither the state nor out is to be used.
var ErrNonFinite = errors.New("server optimiser: non-finite value")

// Step takes one server step from the global model x and the round's
// aggregate a into out (len(x) each; out may alias a but not x), updating
// st. On error st is unchanged.
func Step(p Params, st *State, x, a, out []float64) error {
	d := len(x)
	if len(a) != d || len(out) != d {
		return fmt.Errorf("server optimiser: %d parameters, aggregate %d, out %d", d, len(a), len(out))
	}
	if st.T > 0 && ((p.moment() && len(st.M) != d) || (p.Adaptive() && len(st.V) != d)) {
		return fmt.Errorf("server optimiser: state of %d/%d values, the model has %d", len(st.M), len(st.V), d)
	}
	var m, v []float64
	if p.moment() {
		m = make([]float64, d)
		if st.T > 0 {
			copy(m, st.M)
		}
	}
	if p.Adaptive() {
		v = make([]float64, d)
		if st.T > 0 {
			copy(v, st.V)
		} else {
			for i := range v {
				v[i] = p.Tau * p.Tau
			}
		}
	}
	b1, b2 := p.Beta1, p.Beta2
	for i := range d {
		delta := a[i] - x[i]
		var step float64
		switch p.Kind {
		case SGD:
			step = delta
		case AvgM:
			m[i] = b1*m[i] + delta
			step = m[i]
		case Adagrad:
			m[i] = b1*m[i] + (1-b1)*delta
			v[i] += delta * delta
		case Adam:
			m[i] = b1*m[i] + (1-b1)*delta
			v[i] = b2*v[i] + (1-b2)*delta*delta
		case Yogi:
			m[i] = b1*m[i] + (1-b1)*delta
			d2 := delta * delta
			v[i] -= (1 - b2) * d2 * sign(v[i]-d2)
		default:
			return fmt.Errorf("server optimiser %q: not a step", p.Kind)
		}
		if p.Adaptive() {
			step = m[i] / (math.Sqrt(v[i]) + p.Tau)
		}
		r := x[i] + p.LR*step
		if math.IsNaN(r) || math.IsInf(r, 0) || (m != nil && (math.IsNaN(m[i]) || math.IsInf(m[i], 0))) {
			return fmt.Errorf("%w at %d", ErrNonFinite, i)
		}
		out[i] = r
	}
	st.T, st.M, st.V = st.T+1, m, v
	return nil
}

// sign is the sign function with sign(0) = 0, as the paper's Yogi.
func sign(v float64) float64 {
	switch {
	case v > 0:
		return 1
	case v < 0:
		return -1
	}
	return 0
}

// Marshal encodes st for a checkpoint: T, then len(M), M, len(V), V,
// little-endian, exact bits (nil: the zero state).
func (st *State) Marshal() []byte {
	if st == nil || st.T == 0 {
		return nil
	}
	b := make([]byte, 0, 24+8*(len(st.M)+len(st.V)))
	b = binary.LittleEndian.AppendUint64(b, st.T)
	for _, vec := range [][]float64{st.M, st.V} {
		b = binary.LittleEndian.AppendUint64(b, uint64(len(vec)))
		for _, f := range vec {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f))
		}
	}
	return b
}

// Unmarshal decodes Marshal's encoding for a model of dim parameters
// (empty: the zero state).
func Unmarshal(b []byte, dim int) (State, error) {
	if len(b) == 0 {
		return State{}, nil
	}
	var st State
	if len(b) < 8 {
		return State{}, errors.New("server optimiser state: truncated")
	}
	st.T, b = binary.LittleEndian.Uint64(b), b[8:]
	for _, dst := range []*[]float64{&st.M, &st.V} {
		if len(b) < 8 {
			return State{}, errors.New("server optimiser state: truncated")
		}
		n := binary.LittleEndian.Uint64(b)
		b = b[8:]
		if n != 0 && n != uint64(dim) {
			return State{}, fmt.Errorf("server optimiser state: %d values, the model has %d", n, dim)
		}
		if uint64(len(b)) < 8*n {
			return State{}, errors.New("server optimiser state: truncated")
		}
		if n > 0 {
			*dst = make([]float64, n)
			for i := range *dst {
				(*dst)[i] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
			}
		}
		b = b[8*n:]
	}
	if len(b) != 0 {
		return State{}, errors.New("server optimiser state: trailing bytes")
	}
	if st.T == 0 {
		return State{}, errors.New("server optimiser state: no step taken")
	}
	return st, nil
}

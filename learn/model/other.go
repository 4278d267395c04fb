package model

import (
	"errors"
	"fmt"
	"math"
)

// MaxParams bounds the parameter count New accepts. Edge models are orders of
// magnitude smaller; the bound keeps size arithmetic from overflowing on
// 32-bit gateways and a corrupt saved file from demanding gigabytes.
const MaxParams = 1 << 26

// ErrData is wrapped by every error CheckTargets returns about the data.
var ErrData = errors.New("model data")

// checkSpec reports, wrapping ErrSpec, the first problem with s.
func checkSpec(s Spec) error {
	switch s.Kind {
	case KindLogReg, KindBinaryLogReg, KindLinear, KindMLP:
	default:
		return fmt.Errorf("%w: unknown model kind %q (want %s, %s, %s or %s)", ErrSpec, s.Kind, KindLogReg, KindBinaryLogReg, KindLinear, KindMLP)
	}
	if s.Inputs <= 0 {
		return fmt.Errorf("%w: %s: inputs must be positive, got %d", ErrSpec, s.Kind, s.Inputs)
	}
	if s.L2 < 0 || math.IsNaN(s.L2) || math.IsInf(s.L2, 0) {
		return fmt.Errorf("%w: %s: l2 must be a finite number >= 0, got %v", ErrSpec, s.Kind, s.L2)
	}
	// Fields that do not apply to a kind must be unset: a hidden size on a
	// logreg spec means someone expected an MLP.
	switch s.Kind {
	case KindLogReg, KindMLP:
		if s.Classes < 2 {
			return fmt.Errorf("%w: %s: classes must be >= 2, got %d", ErrSpec, s.Kind, s.Classes)
		}
	case KindBinaryLogReg:
		if s.Classes != 0 && s.Classes != 2 {
			return fmt.Errorf("%w: %s has exactly 2 classes (labels 0 and 1), got classes %d", ErrSpec, s.Kind, s.Classes)
		}
	case KindLinear:
		if s.Classes != 0 {
			return fmt.Errorf("%w: %s is a regression model, classes must be unset, got %d", ErrSpec, s.Kind, s.Classes)
		}
	}
	if s.Kind == KindMLP {
		if s.Hidden < 1 {
			return fmt.Errorf("%w: %s: hidden must be >= 1, got %d", ErrSpec, s.Kind, s.Hidden)
		}
		if s.Activation != ActivationReLU && s.Activation != ActivationTanh {
			return fmt.Errorf("%w: %s: activation must be %q or %q, got %q", ErrSpec, s.Kind, ActivationReLU, ActivationTanh, s.Activation)
		}
		if s.Head < 0 {
			return fmt.Errorf("%w: %s: head must be >= 0 (0 = none), got %d", ErrSpec, s.Kind, s.Head)
		}
	} else {
		if s.Head != 0 {
			return fmt.Errorf("%w: %s has no representation layer, head must be unset, got %d", ErrSpec, s.Kind, s.Head)
		}
		if s.Hidden != 0 {
			return fmt.Errorf("%w: %s has no hidden layer, hidden must be unset, got %d (did you mean kind %q?)", ErrSpec, s.Kind, s.Hidden, KindMLP)
		}
		if s.Activation != "" {
			return fmt.Errorf("%w: %s has no hidden layer, activation must be unset, got %q (did you mean kind %q?)", ErrSpec, s.Kind, s.Activation, KindMLP)
		}
	}
	// In float64 so that the check itself cannot overflow.
	d, h, c, q := float64(s.Inputs), float64(s.Hidden), float64(s.Classes), float64(s.Head)
	var np float64
	switch s.Kind {
	case KindLogReg:
		np = d*c + c
	case KindMLP:
		np = d*h + h + h*c + c
		if q > 0 {
			np += 2*h*q + 2*q + h
		}
	default:
		np = d + 1
	}
	if np > MaxParams {
		return fmt.Errorf("%w: %s with %d inputs, %d hidden, %d classes has %.0f parameters, more than the %d allowed", ErrSpec, s.Kind, s.Inputs, s.Hidden, s.Classes, np, MaxParams)
	}
	return nil
}

// build returns the model for a spec that passed checkSpec.
func build(s Spec) Model {
	switch s.Kind {
	case KindLogReg:
		return NewLogReg(s.Inputs, s.Classes, s.L2)
	case KindBinaryLogReg:
		return NewBinaryLogReg(s.Inputs, s.L2)
	case KindMLP:
		return &MLP{d: s.Inputs, h: s.Hidden, c: s.Classes, q: s.Head, act: s.Activation, l2: s.L2}
	default:
		return NewLinear(s.Inputs, s.L2)
	}
}

// CheckTargets reports the first reason d cannot be fed to the model s
// describes: the spec itself (wrapping ErrSpec), or, wrapping ErrData, a
// shape that does not match (feature count, lengths of X and Y) or a target
// that is not a class index in [0, classes) for logreg and mlp, not 0 or 1 for
// binary-logreg, or not finite for linear. The error names the first bad
// sample. A batch that passes CheckTargets cannot make LossGrad, Predict or
// Score panic and gives them the targets they assume.
func CheckTargets(s Spec, d Data) error {
	if err := checkSpec(s); err != nil {
		return err
	}
	if d.N < 0 || len(d.Y) != d.N || len(d.X) != d.N*d.D {
		return fmt.Errorf("%w: %d×%d samples need %d features and %d targets, have %d and %d", ErrData, d.N, d.D, d.N*d.D, d.N, len(d.X), len(d.Y))
	}
	if d.N > 0 && d.D != s.Inputs {
		return fmt.Errorf("%w: samples have %d features, the %s model expects %d", ErrData, d.D, s.Kind, s.Inputs)
	}
	classes := s.Classes
	switch s.Kind {
	case KindBinaryLogReg:
		classes = 2
	case KindLinear:
		for i, y := range d.Y {
			if math.IsNaN(y) || math.IsInf(y, 0) {
				return fmt.Errorf("%w: sample %d has target %v, want a finite number", ErrData, i, y)
			}
		}
		return nil
	}
	for i, y := range d.Y {
		// Written so that NaN fails too.
		if !(y >= 0 && y < float64(classes) && y == math.Trunc(y)) {
			if s.Kind == KindBinaryLogReg {
				return fmt.Errorf("%w: sample %d has label %v, want 0 or 1", ErrData, i, y)
			}
			return fmt.Errorf("%w: sample %d has target %v, want a class index in [0, %d)", ErrData, i, y, classes)
		}
	}
	return nil
}

package model

import "fmt"

// newOther builds the non-linear kinds. (Filled in by the logistic and MLP models.)
func newOther(s Spec) (Model, error) {
	return nil, fmt.Errorf("%w: unknown model kind %q (want logreg, binary-logreg, linear or mlp)", ErrSpec, s.Kind)
}

package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
)

// Saved is the JSON form of a trained model: the Spec's fields (kind, inputs,
// classes, hidden, activation, l2) at top level, the human-readable layout,
// and the flat parameter vector under "weights". encoding/json writes the
// shortest decimal that parses back to the same float64, so a round trip is
// exact.
type Saved struct {
	Spec
	Layout string    `json:"layout"`
	Params []float64 `json:"weights"`
}

// ErrSaved is wrapped by every error Save and Load return about the model
// file's content (I/O errors are wrapped as they come).
var ErrSaved = errors.New("saved model")

// Save writes m's spec and params as one JSON document.
func Save(w io.Writer, m Model, params []float64) error {
	if err := checkParams(m, params); err != nil {
		return err
	}
	enc := json.NewEncoder(w)
	if err := enc.Encode(Saved{Spec: m.Spec(), Layout: m.Layout(), Params: params}); err != nil {
		return fmt.Errorf("model: save: %w", err)
	}
	return nil
}

// Load reads a model written by Save: it rebuilds the model from the spec
// (with New's checks) and returns it with its parameters, after checking
// that their count matches and that every one is finite. The layout text is
// informational and not compared, so rewording it does not orphan old files;
// unknown fields and anything after the document are rejected.
func Load(r io.Reader) (Model, []float64, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var s Saved
	if err := dec.Decode(&s); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrSaved, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, fmt.Errorf("%w: unexpected data after the model document", ErrSaved)
	}
	m, err := New(s.Spec)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrSaved, err)
	}
	if s.Params == nil {
		return nil, nil, fmt.Errorf("%w: no weights", ErrSaved)
	}
	if err := checkParams(m, s.Params); err != nil {
		return nil, nil, err
	}
	return m, s.Params, nil
}

func checkParams(m Model, params []float64) error {
	if len(params) != m.NumParams() {
		return fmt.Errorf("%w: %s model has %d parameters, got %d", ErrSaved, m.Spec().Kind, m.NumParams(), len(params))
	}
	for i, v := range params {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("%w: parameter %d is %v", ErrSaved, i, v)
		}
	}
	return nil
}

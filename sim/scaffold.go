package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/edgefl/edgefl/learn/proxsolver"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/proto/uplink"
)

// SCAFFOLD in simulate, as the daemons run it (package uplink's
// scaffold.go; node/agent/scaffold.go; node/aggregator/server_scaffold.go):
// each client's c_i is kept as it would be in its store (plus its decoded
// delta c), the server's c as the aggregator keeps it (moved by the mean
// of the round's deltas over all the clients, in client-id order, then
// through the downlink codec as it is announced). Stragglers are kept
// with their partial work: delta c counts the steps they took.

// Scaffold is SCAFFOLD's family name (--algo scaffold).
const Scaffold = "scaffold"

// scaffoldState is the control variates of one algorithm's run.
type scaffoldState struct {
	c  []float64         // the server's c
	ci map[int][]float64 // each client's c_i (absent: zero)
	// The round's received control deltas, by client id.
	ids    []string
	deltas map[string][]float64
}

// validateScaffold refuses what SCAFFOLD does not compose with, as the
// aggregator does (ServerConfig.scaffoldConfig).
func (c Config) validateScaffold() error {
	for _, a := range c.Algos {
		if a.Family != Scaffold {
			continue
		}
		switch {
		case a.Local.Solver != proxsolver.SGD:
			return fmt.Errorf("algorithm %s: scaffold needs the sgd solver, not %q", a.Label, a.Local.Solver)
		case c.DP != nil:
			return fmt.Errorf("algorithm %s: scaffold does not compose with --dp (the clip and the noise cover the model's delta, not delta c)", a.Label)
		case c.SecAgg != nil:
			return fmt.Errorf("algorithm %s: scaffold does not compose with --secagg (the masked sum carries the model's delta, not delta c)", a.Label)
		}
	}
	return nil
}

func newScaffoldState(dim int) *scaffoldState {
	return &scaffoldState{c: make([]float64, dim), ci: map[int][]float64{}}
}

// shift is client's solver shift c - c_i.
func (st *scaffoldState) shift(client int) []float64 { return uplink.Shift(st.c, st.ci[client]) }

// clientControl is the client's side after its solve: delta c for the
// steps taken, encoded by codec (nil: exact) from rng after the model's
// frame, and the client's new c_i.
func (st *scaffoldState) clientControl(codec *quant.Codec, client int, x, y []float64, rep proxsolver.Report, lr float64, rng *rand.Rand) (payload []byte, delta, next []float64, err error) {
	if delta, err = uplink.ControlDelta(st.c, x, y, rep.Steps, lr); err != nil {
		return nil, nil, nil, err
	}
	if codec != nil {
		payload, next, err = uplink.EncodeControl(codec, st.ci[client], delta, rng)
		return payload, nil, next, err
	}
	next = slices.Clone(delta)
	if ci := st.ci[client]; len(ci) == len(delta) {
		for k := range next {
			next[k] += ci[k]
		}
	}
	return nil, delta, next, nil
}

// receive is the server's side of one client's control delta.
func (st *scaffoldState) receive(codec *quant.Codec, id string, client int, o outcome) error {
	d := o.ctrlDelta
	if codec != nil && o.frame != nil {
		var err error
		if d, err = codec.Decode(o.ctrlPayload, nil); err != nil {
			return fmt.Errorf("control delta: %w", err)
		}
	}
	if len(d) != len(st.c) {
		return errors.New("control delta of another dimension")
	}
	st.ids = append(st.ids, id)
	st.deltas[id] = d
	st.ci[client] = o.ci
	return nil
}

// step moves c by the round's deltas over n clients, in client-id order
// (the aggregator's store order), then through the downlink codec.
func (st *scaffoldState) step(n int, down *quant.Codec) error {
	slices.SortFunc(st.ids, strings.Compare)
	ds := make([][]float64, len(st.ids))
	for i, id := range st.ids {
		ds[i] = st.deltas[id]
	}
	next, err := uplink.NextControl(st.c, ds, n)
	if err != nil {
		return err
	}
	if down != nil {
		f, err := down.Encode(nil, next, nil, nil)
		if err != nil {
			return fmt.Errorf("control variate downlink: %w", err)
		}
		if next, err = down.Decode(f, nil); err != nil {
			return fmt.Errorf("control variate downlink: %w", err)
		}
	}
	st.c = next
	return nil
}

// reset starts a round's reception.
func (st *scaffoldState) reset() { st.ids, st.deltas = nil, map[string][]float64{} }

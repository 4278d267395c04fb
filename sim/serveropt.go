package sim

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/edgefl/edgefl/learn/serveropt"
)

// The server optimiser (learn/serveropt) as the aggregator runs it
// (node/aggregator/server_opt.go): the FedAvg/FedProx families' aggregate,
// under central DP the noisy mean, under --secagg the secure sum's uniform
// mean, is x + Delta, and the optimiser
// steps from x with Delta as its pseudo-gradient. Config.ServerOpt is the
// run's (--server-opt and its flags); an algorithm of --algo may set its
// own with the keys serverOptKeys.

// serverOptKeys are --algo's per-algorithm server optimiser keys, named as
// the flags.
var serverOptKeys = map[string]bool{"server-opt": true, "server-lr": true, "server-beta1": true, "server-beta2": true, "server-tau": true}

// parseServerOpt builds an algorithm's optimiser from its server-* keys:
// server-opt=KIND is required, the others default as the flags do.
func parseServerOpt(kv map[string]string) (*serveropt.Params, error) {
	if len(kv) == 0 {
		return nil, nil
	}
	name, ok := kv["server-opt"]
	if !ok {
		return nil, fmt.Errorf("server-lr, server-beta1, server-beta2 and server-tau need server-opt=KIND")
	}
	k, err := serveropt.ParseKind(name)
	if err != nil {
		return nil, err
	}
	p := serveropt.Defaults(k)
	p.LR = 0
	for key, v := range kv {
		if key == "server-opt" {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: want a number", key, v)
		}
		switch key {
		case "server-lr":
			p.LR = f
		case "server-beta1":
			p.Beta1 = f
		case "server-beta2":
			p.Beta2 = f
		case "server-tau":
			p.Tau = f
		}
	}
	p = p.WithDefaults()
	return &p, p.Validate()
}

// serverOptOf is algorithm a's optimiser: its own, else the run's.
func (c Config) serverOptOf(a Algo) serveropt.Params {
	if a.ServerOpt != nil {
		return a.ServerOpt.WithDefaults()
	}
	return c.ServerOpt.WithDefaults()
}

// validateServerOpt refuses an optimiser where the aggregator refuses it:
// the FedSplit family (under --secagg too: its sum mode is FedSplit's step).
func (c Config) validateServerOpt() error {
	for _, a := range c.Algos {
		p := c.serverOptOf(a)
		if err := p.Validate(); err != nil {
			return fmt.Errorf("algorithm %s: --server-opt: %w", a.Label, err)
		}
		if !p.On() {
			continue
		}
		if a.Family == FedSplit || a.Family == FedProxSplit {
			return fmt.Errorf("algorithm %s: --server-opt %s: the FedSplit family's server step is not a mean of deltas (hint: fedavg or fedprox)", a.Label, p.Kind)
		}
	}
	return nil
}

// optStep replaces the aggregate next with the optimiser's step from s.x.
func (s *algoState) optStep(t int, next []float64) error {
	if !s.opt.On() {
		return nil
	}
	if err := serveropt.Step(s.opt, &s.ost, s.x, next, next); err != nil {
		return fmt.Errorf("round %d: %w", t, err)
	}
	return nil
}

// splitServerKeys takes the server-* keys out of an --algo item's options.
func splitServerKeys(opts []string) (rest []string, kv map[string]string) {
	for _, o := range opts {
		k, v, _ := strings.Cut(o, "=")
		if serverOptKeys[k] {
			if kv == nil {
				kv = map[string]string{}
			}
			kv[k] = v
			continue
		}
		rest = append(rest, o)
	}
	return rest, kv
}

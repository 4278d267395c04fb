package main

import (
	"flag"
	"fmt"

	"github.com/edgefl/edgefl/learn/serveropt"
)

// serverOptFlags are the server optimiser's flags of run, demo and
// simulate (docs/aggregators.md, "Server optimisers").
type serverOptFlags struct {
	kind                  string
	lr, beta1, beta2, tau float64
}

func (o *serverOptFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&o.kind, "server-opt", "none", "the server step of the FedAvg/FedProx families (Reddi et al. 2021): none (the aggregate is the next model) | sgd (x += lr Delta: the server learning rate alone, SCAFFOLD's global rate eta_g) | avgm (server momentum: m = beta1 m + Delta, x += lr m) | adagrad | adam | yogi (x += lr m / (sqrt(v) + tau)), Delta the aggregate minus the global model (for fedavg and mean the mean of the sites' deltas); the state (m, v) is kept with each checkpoint; composes with the codecs, --dp central (it steps on the noisy mean) and --secagg (on the secure sum's mean, --dp distributed's noise included), refused with the FedSplit family (docs/aggregators.md, \"Server optimisers\")")
	fs.Float64Var(&o.lr, "server-lr", 0, "with --server-opt: the server learning rate (0: 1 for sgd and avgm, 0.01 for adagrad, adam, yogi); with --server-opt sgd and scaffold, SCAFFOLD's eta_g")
	fs.Float64Var(&o.beta1, "server-beta1", serveropt.DefaultBeta1, "with --server-opt (not sgd): the first moment's decay beta1 in [0, 1) (avgm: the momentum)")
	fs.Float64Var(&o.beta2, "server-beta2", serveropt.DefaultBeta2, "with --server-opt adam or yogi: the second moment's decay beta2 in [0, 1)")
	fs.Float64Var(&o.tau, "server-tau", serveropt.DefaultTau, "with --server-opt adagrad, adam or yogi: the adaptivity tau > 0 (v starts at tau^2)")
}

// params are the flags' optimiser (checked; kind none: the zero Params).
func (o *serverOptFlags) params() (serveropt.Params, error) {
	k, err := serveropt.ParseKind(o.kind)
	if err != nil {
		return serveropt.Params{}, fmt.Errorf("--server-opt: %w", err)
	}
	p := serveropt.Params{Kind: k, LR: o.lr, Beta1: o.beta1, Beta2: o.beta2, Tau: o.tau}.WithDefaults()
	if err := p.Validate(); err != nil {
		return serveropt.Params{}, fmt.Errorf("--server-opt: %w", err)
	}
	return p, nil
}

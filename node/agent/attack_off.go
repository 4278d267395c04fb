//go:build !edgefl_attack

package agent

// poison is a no-op in every shipped build. The e2e tests build an attacking
// agent with -tags edgefl_attack (attack_on.go) to check the aggregator's
// defences against a site that scales its updates.
func poison([]float64) {}

// claimedSamples is the sample count the site reports: its own in every
// shipped build (attack_on.go lies about it).
func claimedSamples(n uint64) uint64 { return n }

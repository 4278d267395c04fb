//go:build !edgefl_attack

package agent

// poison is nil in every shipped build (uplink calls no hook back up into
// the agent then). The e2e tests build an attacking agent with -tags
// edgefl_attack (attack_on.go) to check the aggregator's defences against a
// site that scales its updates.
var poison func([]float64)

// claimedSamples is the sample count the site reports: its own in every
// shipped build (attack_on.go lies about it).
func claimedSamples(n uint64) uint64 { return n }

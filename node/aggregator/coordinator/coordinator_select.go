package coordinator

import (
	"slices"

	"github.com/edgefl/edgefl/learn/aggregate"
)

// Rounds of random size and private invitations (docs/privacy.md,
// "Sampling rate"):
//
//   - A Sampler selector (aggregate.Poisson, --dp's default) selects every
//     pool member independently, so a round's selection has any size from
//     0 to the pool. Its quorum is the configured fraction Quorum/K of the
//     sites drawn (QuorumOf: 7 of 10 drawn at a fraction of 0.7, all 3 of
//     3); below it at the deadline the round is extended once and then
//     stalls, as any DP round does (no re-selection under DP). The draw
//     still waits for Settle and for Quorum sites in the pool, as for
//     uniform selection, and a Sampler needs DP (a round of one site
//     without noise would publish that site's model).
//   - An empty draw is a round all the same: it is announced (the sites see
//     its number and its parameters, as for any round) and closes at once
//     with no contributors; under DP the shell releases the noisy mean of
//     nothing (Gaussian noise over the fixed denominator) and the
//     accountant charges it, because skipping or redrawing it would make
//     whether a round happens depend on the draw, which the amplification
//     argument keeps secret.
//   - Fixed-length rounds (dp.Config.FixedRounds): a round that is
//     collecting closes only at its deadline, also when every invited site
//     has reported and when the draw was empty, so the time from one
//     announcement to the next is RoundTimeout + aggregation + Settle
//     whatever the draw (an extension below quorum and a stalled round
//     depend on the sites' availability, which DP assumes independent of
//     their data).
//   - Invitations (Config.Invitations): the shell announces rounds without
//     the selection; every selected site is told privately, by an Invite
//     decision, with the announcement, with its extension, whenever it
//     comes online before it has reported, and in Resume. The state holds
//     the selection, persisted before the decisions are carried out, so
//     the invitations are as durable as the announcement; the agent treats
//     a repeated invitation like a repeated announcement.

// Invite: tell Client, privately (receipts/<id>), that it is selected for
// Round. Emitted only with Config.Invitations, before the Announce or
// Extend it belongs to.
type Invite struct {
	Round  int
	Client string
}

func (Invite) decision() {}

// sampled says whether the selector draws rounds of random size.
func (c *Coordinator) sampled() bool {
	_, ok := c.sel.(aggregate.Sampler)
	return ok
}

// quorum is the number of updates the open round closes with at its
// deadline: Config.Quorum, or for a Sampler's round the same fraction of
// the sites it invited (0 for an empty round).
func (c *Coordinator) quorum() int {
	if !c.sampled() {
		return c.cfg.Quorum
	}
	n := len(c.invited)
	if n == 0 {
		return 0
	}
	return QuorumOf(n, float64(c.cfg.Quorum)/float64(c.cfg.K))
}

// invite appends an Invite for each of ids (with Config.Invitations).
func (c *Coordinator) invite(out []Decision, ids []string) []Decision {
	if !c.cfg.Invitations {
		return out
	}
	for _, id := range ids {
		out = append(out, Invite{Round: c.round, Client: id})
	}
	return out
}

// waitingFor lists the selected clients that have not reported, sorted.
func (c *Coordinator) waitingFor() []string {
	var ids []string
	for _, id := range c.selected {
		if _, done := c.received[id]; !done {
			ids = append(ids, id)
		}
	}
	return ids
}

// reinvite invites id again when it is selected for the open round and has
// not reported: it has (re)connected, and may have missed its invitation
// (a restarted site keeps none).
func (c *Coordinator) reinvite(id string) []Decision {
	if !c.cfg.Invitations || (c.phase != PhaseCollecting && c.phase != PhaseStalled) {
		return nil
	}
	if _, done := c.received[id]; done || !c.isSelected(id) {
		return nil
	}
	return []Decision{Invite{Round: c.round, Client: id}}
}

// SetSelectionKey sets Config.SelectionKey: the shell reads the key from
// its state file after New, before the first Step or Restore.
func (c *Coordinator) SetSelectionKey(key []byte) {
	var k [32]byte
	copy(k[:], key)
	c.cfg.SelectionKey = &k
}

// SelectionKey is the key the selection draws from (nil: the public seed).
func (c *Coordinator) SelectionKey() *[32]byte { return c.cfg.SelectionKey }

// SelectorName names the selector the coordinator draws with.
func (c *Coordinator) SelectorName() string { return c.sel.Name() }

// isSelected says whether id is in the current selection (sorted: a
// binary search, as a status or a message may ask it of K selected).
func (c *Coordinator) isSelected(id string) bool {
	_, ok := slices.BinarySearch(c.selected, id)
	return ok
}

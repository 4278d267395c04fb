// Package uplink owns the update protocol between a site and the aggregator
// (ARCHITECTURE.md, "Uplink encoding"), on both sides, once: the agent, the
// aggregator and `broker-agg simulate` all call it, so what a site believes
// the aggregator holds and what the aggregator holds are the same
// computation, bit for bit.
//
// Site side (Encode): what travels is always a delta encoded by a quant
// codec.
//
//   - FedProx family (wire.UpdateKind_UPDATE_KIND_DELTA): w_k - x plus the
//     error-feedback residual of earlier rounds; the codec's new residual
//     (what it did not get across) is returned to be committed with the
//     update. The lossless fp32 codec keeps none.
//   - FedSplit family (wire.UpdateKind_UPDATE_KIND_Z_DELTA): z_j minus the
//     aggregator's copy of z_j, which the site records (Copy) as the
//     aggregator computes it. BaseRound names the round whose update set the
//     copy. z_j - copy already holds what earlier frames did not deliver, so
//     there is no separate residual (quant.Codec.EncodeBounded). Without a
//     usable copy (none yet, or after a rejection) the delta is taken
//     against the round's global model x with base round 0.
//   - SCAFFOLD (scaffold.go): the FedProx family's DELTA (delta y, with its
//     residual) plus delta c, the change of the site's control variate,
//     through the same codec (EncodeControl).
//
// Aggregator side (BaseOf, CheckCopy, Receive): a frame's decoded values are
// added to its base: nothing for a FULL vector, the round's global model for
// a DELTA or a base-round-0 Z_DELTA, the aggregator's copy of z_j for any
// other Z_DELTA, which must be the copy that base round set
// (ErrBaseMismatch otherwise). The site computes Frame.Applied with the same
// Receive, so the two sides cannot drift apart.
//
// Under central differential privacy (private.go) the site clips and the
// aggregator re-clips and takes the noisy mean; the FedSplit family then
// runs in sum mode (sum.go): the aggregator keeps only the sum of the
// sites' contributions, each site its own record of what it contributed.
//
// The package is pure: no goroutines, clocks, globals or I/O. Callers bring
// what they stored (residual, copies, global models) and the random stream
// the codec draws from (only qsgd draws; see internal/streams), and persist
// what comes back.
package uplink

import (
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/learn/quant"
	"github.com/edgefl/edgefl/proto/wire"
)

// Header is what an update says about its vector beyond the frame: its kind
// and, for a Z_DELTA, the round of the copy it is against.
type Header struct {
	Kind      wire.UpdateKind
	BaseRound uint64
}

// HeaderOf is the header of a received update.
func HeaderOf(m *wire.ClientUpdate) Header {
	return Header{Kind: m.GetKind(), BaseRound: m.GetBaseRound()}
}

// Copy is the aggregator's copy of a site's z_j: the value set by the update
// of Round.
type Copy struct {
	Round uint64
	Z     []float64
}

// Update is one site's update to encode.
type Update struct {
	// Split selects the FedSplit family (Z_DELTA); otherwise the FedProx
	// family (DELTA).
	Split bool
	// Round is the round being answered.
	Round uint64
	// Sent is w_k (FedProx family) or the site's new z_j (FedSplit).
	Sent []float64
	// Global is x, the round's global model as the site decoded it.
	Global []float64
	// Residual is the FedProx family's error-feedback residual of earlier
	// rounds (nil, or of another length: none yet). It is not written.
	Residual []float64
	// Copy is the FedSplit family's record of the aggregator's copy of z_j
	// (nil: none). A copy of another length, or not from an earlier round,
	// is not used (Frame.CopyUnused).
	Copy *Copy
	// Clip, when > 0, is central DP's clip norm C (docs/privacy.md, "The
	// mechanism per round"): delta + residual is clipped to C before it is
	// encoded, and the decoded frame is re-clipped as the aggregator does
	// (Reclip) before Applied is computed. FedProx family only
	// (ErrSplitDP): the FedSplit family under DP is EncodeSum's.
	Clip float64
	// Tamper, when set, changes the delta in place before it is encoded:
	// the agent's poison hook, a no-op except in the e2e tests' attacking
	// build (node/agent/attack_on.go), whose own record follows what it sent.
	Tamper func(delta []float64)
}

// Frame is an encoded update and what committing it changes at the site.
type Frame struct {
	Header
	// Payload is the quant frame (the update's Vector.Payload).
	Payload []byte
	// Applied is what the aggregator holds once it applies the frame
	// (Receive): w_k as received (FedProx family), its new copy of z_j
	// (FedSplit), which the site records as its Copy for Round.
	Applied []float64
	// Residual is the new error-feedback residual (FedProx family, lossy
	// codec), nil otherwise.
	Residual []float64
	// CopyUnused: Update.Copy was given but does not fit this round, so the
	// delta is against the global model (base round 0).
	CopyUnused bool
	// Clipped is the DP clip's report (Update.Clip > 0): the norm of
	// delta + residual before the clip and whether the clip shortened it.
	Clipped dp.Clipped
	// Sum is what a sum-mode update (EncodeSum) adds to the aggregator's
	// sum once it is confirmed, nil otherwise.
	Sum *Pending
}

// copyFits reports whether cp can be the base of an update of round with n
// values: the copy of an earlier round, of the model's dimension.
func copyFits(cp *Copy, round uint64, n int) bool {
	return cp != nil && len(cp.Z) == n && cp.Round < round
}

// Encode is the site side: it encodes u with codec c, drawing from rng (qsgd
// only; the same rng state gives the same bytes), decodes the frame again
// and returns it with what the aggregator will hold and the new residual.
func Encode(c *quant.Codec, u Update, rng *rand.Rand) (Frame, error) {
	n := len(u.Sent)
	if len(u.Global) != n {
		return Frame{}, fmt.Errorf("uplink: %d values to send, a global model of %d", n, len(u.Global))
	}
	f := Frame{Header: Header{Kind: wire.UpdateKind_UPDATE_KIND_DELTA}}
	base := u.Global
	var cp *Copy
	if u.Split {
		f.Kind = wire.UpdateKind_UPDATE_KIND_Z_DELTA
		if copyFits(u.Copy, u.Round, n) {
			cp, f.BaseRound, base = u.Copy, u.Copy.Round, u.Copy.Z
		} else {
			f.CopyUnused = u.Copy != nil
		}
	} else if !c.Lossless() {
		f.Residual = make([]float64, n)
		if len(u.Residual) == n {
			copy(f.Residual, u.Residual)
		}
	}
	delta := make([]float64, n)
	for i := range delta {
		delta[i] = u.Sent[i] - base[i]
	}
	if u.Clip > 0 {
		if u.Split {
			return Frame{}, fmt.Errorf("uplink: %w", ErrSplitDP)
		}
		var err error
		if delta, f.Clipped, err = ClipDelta(delta, f.Residual, u.Clip); err != nil {
			return Frame{}, err
		}
		if f.Residual != nil {
			clear(f.Residual) // in delta now: what the codec leaves of the clipped vector is the new residual
		}
	}
	if u.Tamper != nil {
		u.Tamper(delta)
	}
	var err error
	if u.Split {
		// z_j - copy is FedSplit's residual already. EncodeBounded keeps
		// QSGD unbiased (errors average out over the sites' copies) except
		// where its variance would amplify what the next delta re-sends.
		f.Payload, err = c.EncodeBounded(nil, delta, rng)
	} else {
		// Encode replaces the residual with (delta + residual) - what it
		// sends.
		f.Payload, err = c.Encode(nil, delta, f.Residual, rng)
	}
	if err != nil {
		return Frame{}, fmt.Errorf("uplink: encode the update with %s: %w", c, err)
	}
	d, err := c.Decode(f.Payload, nil)
	if err != nil || len(d) != n {
		return Frame{}, fmt.Errorf("uplink: decode own update (%d values): %w", len(d), err)
	}
	if u.Clip > 0 {
		if err := Reclip(d, u.Clip); err != nil {
			return Frame{}, err
		}
	}
	// What the aggregator computes, by the aggregator's own rule.
	if f.Applied, err = Receive(f.Header, d, u.Global, cp); err != nil {
		return Frame{}, err
	}
	return f, nil
}

// Base says what a received update's decoded vector is added to.
type Base int

const (
	// BaseNone: a FULL vector is the model (w_k or z_j) itself.
	BaseNone Base = iota
	// BaseGlobal: the global model of the update's round (a DELTA, and a
	// Z_DELTA with base round 0, which resets the aggregator's copy).
	BaseGlobal
	// BaseCopy: the aggregator's copy of the site's z_j set by the update
	// of BaseRound (a Z_DELTA with base round > 0).
	BaseCopy
)

// BaseOf is the base h's vector is added to, so that the aggregator reads
// only the one it needs.
func BaseOf(h Header) Base {
	switch {
	case h.Kind == wire.UpdateKind_UPDATE_KIND_FULL:
		return BaseNone
	case h.Kind == wire.UpdateKind_UPDATE_KIND_Z_DELTA && h.BaseRound > 0:
		return BaseCopy
	}
	return BaseGlobal
}

// ErrBaseMismatch is wrapped by a Z_DELTA against a copy of z_j the
// aggregator does not hold; the site re-sends against the round's global
// model (its copy is forgotten on the rejection).
var ErrBaseMismatch = errors.New("base round mismatch")

// CheckCopy is the base-round check of a Z_DELTA against the copy of
// baseRound with n values: held (nil: none) must be that round's copy, of
// that dimension.
func CheckCopy(baseRound uint64, held *Copy, n int) error {
	switch {
	case held == nil:
		return fmt.Errorf("%w: a delta against the copy of round %d, this server holds none", ErrBaseMismatch, baseRound)
	case held.Round != baseRound || len(held.Z) != n:
		return fmt.Errorf("%w: a delta against the copy of round %d, this server holds round %d's", ErrBaseMismatch, baseRound, held.Round)
	}
	return nil
}

// DamagedCopy is the error for a Z_DELTA whose base, the aggregator's
// stored copy, failed its checksum: refused as a copy it does not hold, so
// the site re-sends against the round's global model, which replaces the
// damaged copy. Retrying the delta would fail the same way forever.
func DamagedCopy(baseRound uint64) error {
	return fmt.Errorf("%w: the copy held for round %d is damaged", ErrBaseMismatch, baseRound)
}

// Receive is the aggregator side: the vector an update of header h with
// decoded values d stands for (w_k, or the site's z_j and so the
// aggregator's new copy of it). global is the global model of the update's
// round and held the aggregator's copy of the site's z_j; only the one
// BaseOf(h) names is read (the other may be nil). A FULL vector is d itself;
// otherwise the result is a new slice, base + d. A Z_DELTA whose copy fails
// CheckCopy is an error wrapping ErrBaseMismatch.
func Receive(h Header, d, global []float64, held *Copy) ([]float64, error) {
	var base []float64
	switch BaseOf(h) {
	case BaseNone:
		return d, nil
	case BaseGlobal:
		base = global
	case BaseCopy:
		if err := CheckCopy(h.BaseRound, held, len(d)); err != nil {
			return nil, err
		}
		base = held.Z
	}
	if len(base) != len(d) {
		return nil, fmt.Errorf("uplink: %d decoded values, a base of %d", len(d), len(base))
	}
	return add(make([]float64, len(d)), base, d), nil
}

// add sets out to base + d, bit for bit on both sides: this is the one sum.
func add(out, base, d []float64) []float64 {
	for i := range out {
		out[i] = base[i] + d[i]
	}
	return out
}

// ReceiveInto is Receive writing a DELTA's base + d into dst's storage when
// it has the room (dst may be d itself: each value is read before it is
// written): the same sum, without a vector's allocation per update where
// the aggregator has scratch to spare. Any other update, or a dst too
// short, is Receive's.
func ReceiveInto(dst []float64, h Header, d, global []float64, held *Copy) ([]float64, error) {
	if BaseOf(h) != BaseGlobal || cap(dst) < len(d) || len(global) != len(d) {
		return Receive(h, d, global, held)
	}
	return add(dst[:len(d)], global, d), nil
}

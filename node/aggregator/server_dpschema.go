package aggregator

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/edgefl/edgefl/node/aggstore"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/storage"
)

// Differential privacy with a federation schema (docs/privacy.md,
// "Preprocessing under DP" and "Evaluation under DP"): the schema declares
// the preprocessing, so no site sends statistics (Config.DeclaredTransform);
// the sites' evaluation reports reach the aggregator (trusted in central
// mode: its operator sees them in status, /metrics and the console) and
// nothing released carries them: the bundles of a --dp run have no
// evaluation and record the privacy guarantee at their round instead
// (bundle.Privacy), computed from the coordinator's charging history.

// bundlePrivacy is the privacy of the model after e aggregations of a run
// with DP configuration c, from the charging history in the coordinator
// state st (nil, nil without DP).
func bundlePrivacy(c *dp.Config, st *coordinator.DPState, e int) (*bundle.Privacy, error) {
	if c == nil {
		return nil, nil
	}
	if st == nil {
		return nil, fmt.Errorf("%w: a run with differential privacy has no accountant in its state", coordinator.ErrBadState)
	}
	return bundle.NewPrivacy(*c, st.Rates, e)
}

// livePrivacy is bundlePrivacy of the running coordinator.
func (s *Server) livePrivacy(e int) (*bundle.Privacy, error) {
	return bundlePrivacy(s.cfg.DP, s.coord.SnapshotDP(), e)
}

// storedPrivacy is bundlePrivacy from the newest coordinator state in the
// round log (`broker-agg export`): its charging history holds every round
// aggregated so far.
func storedPrivacy(store *aggstore.AggStore, sc storedConfig, e int) (*bundle.Privacy, error) {
	if sc.DP == nil {
		return nil, nil
	}
	cur, err := store.CurrentRound()
	if err != nil {
		return nil, err
	}
	var st coordinator.State
	if err := json.Unmarshal(cur.State, &st); err != nil {
		return nil, fmt.Errorf("%w: %s: state of round %d: %w", storage.ErrCorrupt, store.Path(), cur.Number, err)
	}
	p, err := bundlePrivacy(sc.DP, st.DP, e)
	if err != nil {
		return nil, fmt.Errorf("%s: round %d: %w", store.Path(), e, err)
	}
	return p, nil
}

// errNoPrivacy: a bundle of a --dp run must record its guarantee.
var errNoPrivacy = errors.New("a run with differential privacy makes no bundle without its privacy guarantee")

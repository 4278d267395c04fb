package aggregator

import (
	"fmt"
	"strings"

	"github.com/edgefl/edgefl/data/prep"
	"github.com/edgefl/edgefl/data/schema"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/proto/wire"
)

// The statistics review (prep.ReviewStats) of a run with a federation
// schema: once the statistics phase has closed and the preprocessing is
// fitted, before round 1, the aggregator logs each finding at WARN, and
// `status` and the console show them (read from the stored statistics,
// so a status read from the state file has them too). With
// ServerConfig.StatsReview (--stats-review) a review with findings stops
// the run there: round 1 is not announced, the daemon stays up for
// `status` and the console, and the operator either fixes the schema and
// starts a new run, or restarts without --stats-review to go on with this
// preprocessing. The review reads only the statistics the sites sent.

// StatsReview is the statistics review in Status.
type StatsReview struct {
	prep.Review
	// Findings are the findings, one line each (prep.Review.Lines).
	Findings []string `json:"findings"`
	// Stopped: the run stopped before round 1 for the review
	// (--stats-review; the running daemon's only).
	Stopped bool `json:"stopped,omitempty"`
}

// storedStats decodes the stored statistics of sites (the statistics the
// preprocessing was fitted from), in the order given.
func storedStats(store *aggstore.AggStore, sc *schema.Schema, lim wire.Limits, sites []string) ([]*prep.Stats, error) {
	recs, err := store.Statistics()
	if err != nil {
		return nil, err
	}
	by := map[string][]byte{}
	for _, r := range recs {
		by[r.ClientID] = r.Msg
	}
	var out []*prep.Stats
	for _, id := range sites {
		raw, ok := by[id]
		if !ok {
			return nil, fmt.Errorf("no stored statistics of %q", id)
		}
		m, err := wire.DecodeStatistics(raw, lim)
		if err != nil {
			return nil, fmt.Errorf("stored statistics of %q: %w", id, err)
		}
		st, err := decodeStats(sc, m.Stats)
		if err != nil {
			return nil, fmt.Errorf("stored statistics of %q: %w", id, err)
		}
		out = append(out, st)
	}
	return out, nil
}

// reviewOf is the review of the fitted run's statistics (nil for a
// schema that declares its preprocessing: no site sent any).
func reviewOf(store *aggstore.AggStore, rec *fitRecord, lim wire.Limits) (*StatsReview, error) {
	if rec.schema.Declared() || len(rec.Sites) == 0 {
		return nil, nil
	}
	stats, err := storedStats(store, rec.schema, lim, rec.Sites)
	if err != nil {
		return nil, err
	}
	r, err := prep.ReviewStats(rec.schema, rec.Sites, stats)
	if err != nil {
		return nil, err
	}
	return &StatsReview{Review: *r, Findings: r.Lines()}, nil
}

// reviewStatistics logs the review of the fitted statistics and reports
// whether the run stops before round 1 for it (--stats-review).
func (s *Server) reviewStatistics() (stop bool, err error) {
	// The fit is stored: status (cached by the view's generation) must
	// read the file again, even if no round follows.
	defer s.notify()
	r, err := reviewOf(s.store, s.fed.fitted(), s.lim)
	if err != nil {
		return false, fmt.Errorf("aggregator: the statistics review: %w", err)
	}
	if r == nil {
		return false, nil
	}
	if len(r.Findings) == 0 {
		s.log.Info("statistics review: no level seen at one site only, no per-site ranges that disagree", "sites", r.Sites)
		return false, nil
	}
	for _, f := range r.Findings {
		s.log.Warn("statistics review: "+f, "sites", r.Sites)
	}
	if !s.fed.stopsForReview() {
		s.log.Warn(fmt.Sprintf("statistics review: %d findings; the run goes on with this preprocessing (--stats-review stops here)", len(r.Findings)))
		return false, nil
	}
	s.reviewStop.Store(true)
	s.log.Warn(fmt.Sprintf("statistics review: %d findings; the run stops before round 1 (--stats-review): fix the schema "+
		"(a feature's \"missing\" tokens, \"min\"/\"max\") and start a new run, or restart without --stats-review to go on with this preprocessing",
		len(r.Findings)), "findings", strings.Join(r.Findings, "; "))
	return true, nil
}

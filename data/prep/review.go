package prep

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/edgefl/edgefl/data/schema"
)

// The statistics review: before round 1, what the sites' statistics say
// about values that mean different things at different sites, which one
// preprocessing would silently get wrong. It reads only the statistics
// the sites sent (per site: each categorical feature's levels, each
// numeric feature's count, mean, variance, min and max), so it reveals
// nothing the aggregator does not already hold. Two findings:
//
//   - a level seen at only one site (of two or more that have the
//     feature): "4.0" at one hospital and "4" at the others before
//     numbers were compared as numbers; "M"/"male"; a code only one site
//     uses;
//   - a numeric feature whose per-site ranges disagree: a site's mean
//     lies outside another site's whole range (a cholesterol of 0, "not
//     measured", at a hospital whose every value is 0, the others'
//     starting at 85 and 126), or a site's minimum (maximum) lies below
//     (above) another site's and more than RangeSD of that site's
//     standard deviations below (above) its mean (a resting blood
//     pressure of 0 where another site's are 132 +- 18).
//
// Findings are for the operator to judge (a rare category or a wider
// case mix is legitimate); `broker-agg run --stats-review` stops before
// round 1 when there are any, so the schema can be fixed first
// ("missing": ["0"] on the feature, "min"/"max").

// RangeSD is how far, in standard deviations of the other site, a site's
// minimum or maximum must lie from the other site's mean for the ranges
// to disagree. A normal sample of 1000 reaches about 3.2 standard
// deviations; skewed clinical values reach further (the four heart-disease
// hospitals' training rows: oldpeak 5.9, a cholesterol of 603 at 6.8 of
// another site's), so 7 leaves a site's own tail alone and still finds a
// resting blood pressure of 0 (7.7). It is a heuristic with that margin:
// a finding is for the operator to judge, and a sentinel close to the
// other sites' values (a 0 where they are 1 +- 0.5) is not one.
const RangeSD = 7

// MaxReviewLevels bounds the levels a finding lists (the rest counted).
const MaxReviewLevels = 8

// Review is the statistics review of one federation's site statistics.
type Review struct {
	Sites  []string       `json:"sites"`
	Levels []SiteLevels   `json:"single_site_levels,omitempty"`
	Ranges []RangeFinding `json:"range_disagreements,omitempty"`
}

// SiteLevels are the levels of a categorical feature that only Site has.
type SiteLevels struct {
	Feature string   `json:"feature"`
	Site    string   `json:"site"`
	Levels  []string `json:"levels"`         // lexical order, at most MaxReviewLevels
	More    int      `json:"more,omitempty"` // further levels not listed
}

// RangeFinding is a numeric feature whose per-site ranges disagree: every
// site's range (sites without a value left out), and the largest
// disagreement.
type RangeFinding struct {
	Feature string      `json:"feature"`
	Ranges  []SiteRange `json:"ranges"`
	// Site's minimum (Side "minimum") or maximum lies SDs standard
	// deviations of Other beyond Other's.
	Site  string  `json:"site"`
	Other string  `json:"other"`
	Side  string  `json:"side"`
	SDs   float64 `json:"sds"`
}

// SiteRange is one site's range of a numeric feature.
type SiteRange struct {
	Site  string  `json:"site"`
	Count int64   `json:"count"`
	Min   float64 `json:"min"`
	Max   float64 `json:"max"`
}

// Empty reports a review without findings.
func (r *Review) Empty() bool { return r == nil || (len(r.Levels) == 0 && len(r.Ranges) == 0) }

// Findings is the number of findings.
func (r *Review) Findings() int {
	if r == nil {
		return 0
	}
	return len(r.Levels) + len(r.Ranges)
}

// ReviewStats reviews the statistics of sites (ids[k] is stats[k]'s site;
// validated, as Combine takes them).
func ReviewStats(s *schema.Schema, ids []string, stats []*Stats) (*Review, error) {
	if len(ids) != len(stats) {
		return nil, fmt.Errorf("review: %d site ids for %d statistics", len(ids), len(stats))
	}
	for k, st := range stats {
		if err := st.Validate(s); err != nil {
			return nil, fmt.Errorf("review: site %s's statistics: %w", ids[k], err)
		}
	}
	order := make([]int, len(ids))
	for k := range order {
		order[k] = k
	}
	sort.SliceStable(order, func(a, b int) bool { return ids[order[a]] < ids[order[b]] })
	r := &Review{}
	for _, k := range order {
		r.Sites = append(r.Sites, ids[k])
	}
	for j, f := range s.Features {
		if f.Type == schema.Categorical {
			r.Levels = append(r.Levels, singleSiteLevels(f.Name, j, ids, stats, order)...)
		} else if fd, ok := rangeFinding(f.Name, j, ids, stats, order); ok {
			r.Ranges = append(r.Ranges, fd)
		}
	}
	return r, nil
}

func singleSiteLevels(name string, j int, ids []string, stats []*Stats, order []int) []SiteLevels {
	seen := map[string]int{} // level -> sites
	having := 0
	for _, st := range stats {
		if len(st.Features[j].Levels) > 0 {
			having++
		}
		for l := range st.Features[j].Levels {
			seen[l]++
		}
	}
	if having < 2 {
		return nil
	}
	var out []SiteLevels
	for _, k := range order {
		var only []string
		for l := range stats[k].Features[j].Levels {
			if seen[l] == 1 {
				only = append(only, l)
			}
		}
		if len(only) == 0 {
			continue
		}
		slices.Sort(only)
		sl := SiteLevels{Feature: name, Site: ids[k], Levels: only}
		if len(only) > MaxReviewLevels {
			sl.Levels, sl.More = only[:MaxReviewLevels], len(only)-MaxReviewLevels
		}
		out = append(out, sl)
	}
	return out
}

func rangeFinding(name string, j int, ids []string, stats []*Stats, order []int) (RangeFinding, bool) {
	fd := RangeFinding{Feature: name}
	for _, k := range order {
		if n := stats[k].Features[j].Numeric; n.Count > 0 {
			fd.Ranges = append(fd.Ranges, SiteRange{Site: ids[k], Count: n.Count, Min: n.Min, Max: n.Max})
		}
	}
	// A site whose mean lies outside other sites' whole ranges: its
	// typical value is never seen there, the strongest disagreement,
	// whatever the spread. Named: the site for which that holds at the
	// most other sites (Switzerland's cholesterol of 0, outside
	// Cleveland's and Hungary's ranges; not Cleveland's mean, outside
	// Switzerland's single value only).
	outside := 0
	for _, a := range order {
		na := stats[a].Features[j].Numeric
		n, other := 0, ""
		for _, b := range order {
			nb := stats[b].Features[j].Numeric
			if a != b && na.Count > 0 && nb.Count >= 2 && (na.Mean < nb.Min || na.Mean > nb.Max) {
				if n++; other == "" {
					other = ids[b]
				}
			}
		}
		if n > outside {
			outside = n
			fd.Site, fd.Other, fd.Side = ids[a], other, "mean"
		}
	}
	if outside > 0 {
		return fd, true
	}
	worst := 0.0
	for _, a := range order {
		na := stats[a].Features[j].Numeric
		if na.Count == 0 {
			continue
		}
		for _, b := range order {
			nb := stats[b].Features[j].Numeric
			if a == b || nb.Count < 2 {
				continue
			}
			sd := math.Sqrt(nb.Var())
			if !(sd > 0) {
				continue
			}
			for _, c := range []struct {
				side   string
				by     float64
				beyond bool
			}{{"minimum", (nb.Mean - na.Min) / sd, na.Min < nb.Min}, {"maximum", (na.Max - nb.Mean) / sd, na.Max > nb.Max}} {
				if c.beyond && c.by > RangeSD && c.by > worst {
					worst = c.by
					fd.Site, fd.Other, fd.Side, fd.SDs = ids[a], ids[b], c.side, c.by
				}
			}
		}
	}
	return fd, fd.Site != ""
}

// Lines are the findings, one line each, for the log and `status`.
func (r *Review) Lines() []string {
	if r == nil {
		return nil
	}
	var out []string
	for _, l := range r.Levels {
		q := make([]string, len(l.Levels))
		for i, v := range l.Levels {
			q[i] = strconv.Quote(v)
		}
		more := ""
		if l.More > 0 {
			more = fmt.Sprintf(" and %d more", l.More)
		}
		out = append(out, fmt.Sprintf("feature %q: levels seen only at site %s: %s%s", l.Feature, l.Site, strings.Join(q, ", "), more))
	}
	g := func(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }
	for _, f := range r.Ranges {
		var rs []string
		for _, sr := range f.Ranges {
			rs = append(rs, fmt.Sprintf("%s [%s, %s]", sr.Site, g(sr.Min), g(sr.Max)))
		}
		var why string
		switch f.Side {
		case "mean":
			why = fmt.Sprintf("site %s's mean lies outside site %s's range", f.Site, f.Other)
		case "minimum":
			why = fmt.Sprintf("site %s's minimum lies %.1f standard deviations of site %s below its mean", f.Site, f.SDs, f.Other)
		default:
			why = fmt.Sprintf("site %s's maximum lies %.1f standard deviations of site %s above its mean", f.Site, f.SDs, f.Other)
		}
		out = append(out, fmt.Sprintf("feature %q: per-site ranges disagree (%s): %s", f.Feature, why, strings.Join(rs, ", ")))
	}
	return out
}

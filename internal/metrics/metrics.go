// Package metrics writes the Prometheus text exposition format (version
// 0.0.4) without a client library: a daemon builds a list of families from
// its own counters when scraped and hands it to Write.
//
// It is deliberately small: no registry, no global state. Counters that
// several goroutines bump live in the daemon (sync/atomic or a LabeledCounter
// from this package); the scrape handler copies them into Families.
package metrics

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// ContentType is the Content-Type of the text exposition format.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Type is a metric family's type.
type Type string

// Family types.
const (
	Counter Type = "counter"
	Gauge   Type = "gauge"
	Summary Type = "summary"
	Untyped Type = "untyped"
)

// Label is one name="value" pair.
type Label struct{ Name, Value string }

// Sample is one line of a family: the family name plus Suffix (e.g. "_sum",
// "_count" for a summary; empty otherwise), its labels and value.
type Sample struct {
	Suffix string
	Labels []Label
	Value  float64
}

// Family is a metric with its help text, type and samples.
type Family struct {
	Name    string
	Help    string
	Type    Type
	Samples []Sample
}

// One returns a family with a single unlabelled sample.
func One(name, help string, t Type, v float64) Family {
	return Family{Name: name, Help: help, Type: t, Samples: []Sample{{Value: v}}}
}

// ValidName reports whether s is a valid metric or label name
// ([a-zA-Z_:][a-zA-Z0-9_:]*; label names may not contain ':', which this
// check does not distinguish).
func ValidName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9'
		if !ok {
			return false
		}
	}
	return true
}

var helpEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
var labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)

// FormatValue formats v as the exposition format wants: shortest
// round-tripping decimal, NaN, +Inf, -Inf.
func FormatValue(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// Write writes fams in order. A family or label with an invalid name is an
// error (nothing of that family is written); families with no samples are
// skipped.
func Write(w io.Writer, fams []Family) error {
	bw := bufio.NewWriter(w)
	for _, f := range fams {
		if !ValidName(f.Name) {
			return fmt.Errorf("metrics: invalid metric name %q", f.Name)
		}
		if len(f.Samples) == 0 {
			continue
		}
		for _, s := range f.Samples {
			if s.Suffix != "" && !ValidName(f.Name+s.Suffix) {
				return fmt.Errorf("metrics: invalid suffix %q on %s", s.Suffix, f.Name)
			}
			for _, l := range s.Labels {
				if !ValidName(l.Name) || strings.Contains(l.Name, ":") {
					return fmt.Errorf("metrics: invalid label name %q on %s", l.Name, f.Name)
				}
			}
		}
		t := f.Type
		if t == "" {
			t = Untyped
		}
		if f.Help != "" {
			fmt.Fprintf(bw, "# HELP %s %s\n", f.Name, helpEscaper.Replace(f.Help))
		}
		fmt.Fprintf(bw, "# TYPE %s %s\n", f.Name, t)
		for _, s := range f.Samples {
			bw.WriteString(f.Name)
			bw.WriteString(s.Suffix)
			if len(s.Labels) > 0 {
				bw.WriteByte('{')
				for i, l := range s.Labels {
					if i > 0 {
						bw.WriteByte(',')
					}
					fmt.Fprintf(bw, `%s="%s"`, l.Name, labelEscaper.Replace(l.Value))
				}
				bw.WriteByte('}')
			}
			bw.WriteByte(' ')
			bw.WriteString(FormatValue(s.Value))
			bw.WriteByte('\n')
		}
	}
	return bw.Flush()
}

// LabeledCounter is a set of monotonic counters keyed by one label value,
// safe for concurrent use. The zero value is ready.
type LabeledCounter struct {
	mu sync.Mutex
	m  map[string]uint64
}

// Add adds n to the counter of value.
func (c *LabeledCounter) Add(value string, n uint64) {
	c.mu.Lock()
	if c.m == nil {
		c.m = map[string]uint64{}
	}
	c.m[value] += n
	c.mu.Unlock()
}

// Inc adds 1 to the counter of value.
func (c *LabeledCounter) Inc(value string) { c.Add(value, 1) }

// Get returns the counter of value.
func (c *LabeledCounter) Get(value string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[value]
}

// Snapshot returns a copy of every counter.
func (c *LabeledCounter) Snapshot() map[string]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]uint64, len(c.m))
	for k, v := range c.m {
		out[k] = v
	}
	return out
}

// Samples returns one sample per key of m, labelled label=key, in key
// order, so that the output is stable.
func Samples(label string, m map[string]uint64) []Sample {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]Sample, len(keys))
	for i, k := range keys {
		out[i] = Sample{Labels: []Label{{label, k}}, Value: float64(m[k])}
	}
	return out
}

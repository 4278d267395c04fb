package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
)

// The run topic (<prefix>run, RunSpec) carries a run's schema and fitted
// transform once; every announcement names them by digest. This file is
// that protocol rule, used by the aggregator (BodyDigest, RunSpecOf) and
// the agent (BodyCache, Resolve).

// BodyDigest is the digest an announcement names a schema or transform
// body by: the lowercase hex SHA-256 of its exact bytes.
func BodyDigest(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// HasSchema reports whether the announcement has a schema, as its body or
// its digest.
func (x *RoundAnnouncement) HasSchema() bool {
	return x != nil && (len(x.Schema) > 0 || x.SchemaDigest != "")
}

// HasTransform reports whether the announcement has a transform, as its
// body or its digest.
func (x *RoundAnnouncement) HasTransform() bool {
	return x != nil && (len(x.Transform) > 0 || x.TransformDigest != "")
}

// ByDigest moves the announcement's schema and transform bodies to the
// run spec the aggregator publishes on the run topic and leaves their
// digests in their place. It returns that spec (nil: no schema, nothing to
// publish).
func (x *RoundAnnouncement) ByDigest() *RunSpec {
	if len(x.Schema) == 0 {
		return nil
	}
	spec := &RunSpec{Federation: x.Federation, RunId: x.RunId, Schema: x.Schema, Transform: x.Transform}
	x.SchemaDigest, x.Schema = BodyDigest(x.Schema), nil
	if len(x.Transform) > 0 {
		x.TransformDigest, x.Transform = BodyDigest(x.Transform), nil
	}
	return spec
}

// Contradicts reports whether the spec is of the announcement's run and
// holds a schema or transform body that is not the one the announcement
// names by digest: then the body was altered (or is not the aggregator's),
// where a spec of another run, or one without the transform yet (the
// statistics phase's), is merely not the announcement's.
func (x *RunSpec) Contradicts(a *RoundAnnouncement) bool {
	if x == nil || a == nil || x.RunId != a.RunId {
		return false
	}
	return a.SchemaDigest != "" && BodyDigest(x.Schema) != a.SchemaDigest ||
		a.TransformDigest != "" && len(x.Transform) > 0 && BodyDigest(x.Transform) != a.TransformDigest
}

// ErrBodyMissing is Resolve's error while the announcement names a body by
// a digest that the cache does not hold (the run spec has not arrived yet,
// or the one that arrived is another run's or was altered).
var ErrBodyMissing = errors.New("wire: the announcement names a schema or transform not received (yet) on the run topic")

// maxCachedBodies bounds a BodyCache: a run has at most a schema and a
// transform; the room for a few runs covers a stale retained run spec.
const maxCachedBodies = 8

// BodyCache holds the schema and transform bodies received on the run
// topic by the digest the receiver computed itself, so a body is only ever
// used for the digest of its own bytes. Safe for concurrent use.
type BodyCache struct {
	mu    sync.Mutex
	byDig map[string][]byte
	order []string // oldest first
}

// Add keeps the run spec's bodies.
func (c *BodyCache) Add(spec *RunSpec) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byDig == nil {
		c.byDig = make(map[string][]byte)
	}
	for _, b := range [][]byte{spec.GetSchema(), spec.GetTransform()} {
		if len(b) == 0 {
			continue
		}
		d := BodyDigest(b)
		if _, ok := c.byDig[d]; ok {
			continue
		}
		c.byDig[d] = append([]byte(nil), b...)
		c.order = append(c.order, d)
		if len(c.order) > maxCachedBodies {
			delete(c.byDig, c.order[0])
			c.order = c.order[1:]
		}
	}
}

// Resolve fills the announcement's schema and transform from the cache
// where it names them by digest only. The error wraps ErrBodyMissing when
// the cache lacks one (the announcement is then unchanged).
func (c *BodyCache) Resolve(x *RoundAnnouncement) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var sc, tr []byte
	if d := x.SchemaDigest; d != "" && len(x.Schema) == 0 {
		if sc = c.byDig[d]; sc == nil {
			return fmt.Errorf("%w: schema %.12s…", ErrBodyMissing, d)
		}
	}
	if d := x.TransformDigest; d != "" && len(x.Transform) == 0 {
		if tr = c.byDig[d]; tr == nil {
			return fmt.Errorf("%w: transform %.12s…", ErrBodyMissing, d)
		}
	}
	if sc != nil {
		x.Schema = sc
	}
	if tr != nil {
		x.Transform = tr
	}
	return nil
}

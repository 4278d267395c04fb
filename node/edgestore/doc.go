// Package edgestore owns the edge agent's durable state in one bbolt file:
// the site's identity and instance id, the run it follows, the global
// model, FedSplit's z and the aggregator's copy of it, the uplink's
// error-feedback residual, the outbox of messages not yet acknowledged,
// FedSplit's sum-mode records, the secure-aggregation session and the
// final model bundle (EdgeStore; the schema is in edge.go).
//
// Opening, the page checks, the sealed values and counts, the migrations
// and the errors are node/storage's, shared with the aggregator's store
// (node/aggstore), which the edge agent does not link.
package edgestore

// Package aggstore owns the aggregator's durable state in one bbolt file:
// the client registry, the rounds (configuration, coordinator state, sum
// mode), every accepted update, the latest FedSplit z per client, the
// global-model checkpoints, the replay log of the messages stored since the
// coordinator's state was last written (log.go), the records of a run with
// a federation schema (agg_fed.go), secure aggregation's records
// (secagg.go), and rollback to an intact round (rollback.go) (AggStore;
// the schema is in agg.go).
//
// Opening, the page checks, the sealed values and counts, the migrations
// and the errors are node/storage's, shared with the edge agent's store
// (node/edgestore).
package aggstore

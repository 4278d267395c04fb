package aggregator

import "github.com/edgefl/edgefl/internal/metrics"

// The embedded broker's rate limit (node/broker/ratelimit.go) drops a flooding
// site's messages before they reach the aggregator at all; with an external
// broker only the aggregator's own limit (ingest.go) applies. The broker's
// drops are shown here, where the operator looks: /metrics
// (edgefl_broker_rate_limited_total{client}, next to the aggregator's
// edgefl_aggregator_rate_limited_total{client}) and the site's row of
// /status and the console (rejections "broker_rate_limited").

// brokerRateLimitedReason names the broker's drops among a site's rejections.
const brokerRateLimitedReason = "broker_rate_limited"

// brokerFamilies are the embedded broker's metrics (none without one).
func (s *Server) brokerFamilies() []metrics.Family {
	var f []metrics.Family
	if s.cfg.BrokerRateLimited != nil {
		f = append(f, metrics.Family{Name: "edgefl_broker_rate_limited_total",
			Help: "Publishes the embedded broker dropped before routing them because their client was over its rate limit (--rate-messages, --rate-burst, --rate-bytes), by client.",
			Type: metrics.Counter, Samples: metrics.Samples("client", s.cfg.BrokerRateLimited())})
	}
	if s.cfg.BrokerDropped != nil {
		// A message routed but not delivered (to the aggregator: a
		// status or an update lost): node/broker/queue.go.
		f = append(f, metrics.Family{Name: "edgefl_broker_dropped_total",
			Help: "Messages the embedded broker dropped instead of delivering them to a client, by reason: inflight_full (the client's store of unacknowledged QoS 1 messages was full), write_queue_full (its queue of pending writes was full).",
			Type: metrics.Counter, Samples: metrics.Samples("reason", s.cfg.BrokerDropped())})
	}
	return f
}

// addBrokerRejections adds the embedded broker's drops to the sites'
// rejections by reason (a snapshot, the caller's to change).
func (s *Server) addBrokerRejections(rejected map[string]map[string]uint64) map[string]map[string]uint64 {
	if s.cfg.BrokerRateLimited == nil {
		return rejected
	}
	for id, n := range s.cfg.BrokerRateLimited() {
		if n == 0 {
			continue
		}
		if rejected == nil {
			rejected = map[string]map[string]uint64{}
		}
		if rejected[id] == nil {
			rejected[id] = map[string]uint64{}
		}
		rejected[id][brokerRateLimitedReason] = n
	}
	return rejected
}

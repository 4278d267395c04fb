// Package fedbroker starts the embedded broker (package broker) for one
// federation in a test: authentication by password, the federation's ACL,
// a random loopback port. It is apart from testkit because the broker
// package's own tests use testkit, and testkit importing broker would be an
// import cycle. Like testkit, it is imported only by tests.
package fedbroker

import (
	"log/slog"
	"testing"

	"github.com/edgefl/edgefl/node/broker"
	"github.com/edgefl/edgefl/proto/wire"
)

// Aggregator is the aggregator's user name, and AggregatorPassword its
// password.
const (
	Aggregator         = "aggregator"
	AggregatorPassword = "agg-pw"
)

// Password is the password of a site's user.
func Password(site string) string { return "pw-" + site }

// Start runs broker.Start for federation's topics with the user
// Aggregator (a superuser) and one user per site (Password), the sites in
// superusers being superusers too, logging to log; it closes the broker
// when the test ends.
func Start(t testing.TB, federation string, log *slog.Logger, superusers []string, sites ...string) *broker.Broker {
	t.Helper()
	topics, err := wire.ForFederation(federation)
	if err != nil {
		t.Fatal(err)
	}
	users := map[string]string{Aggregator: AggregatorPassword}
	for _, id := range sites {
		users[id] = Password(id)
	}
	b, err := broker.Start(broker.Config{Addr: "127.0.0.1:0", Prefix: topics.Prefix(), Users: users,
		Superusers: append([]string{Aggregator}, superusers...), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

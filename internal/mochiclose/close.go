// Package mochiclose stops an embedded mochi-mqtt server without the
// shutdown hang of its Close (see Close).
package mochiclose

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Close stops a mochi server whose listeners are listenerIDs,
// disconnecting their clients and the clients of extra (clients with no
// registered listener, such as the aggregator's in-process one).
//
// Why not srv.Close alone: mochi-mqtt v2.7.9 lists a listener's clients
// with Clients.GetByListener, which takes the clients' read lock and then
// again inside it (Len). A client connecting or leaving in between queues
// a write lock behind the first, and the second read lock then waits
// forever: a shutdown that hangs. Each listener is closed first here with a
// closer that lists the clients under one read lock (Clients.GetAll); a
// listener closes its clients once, so srv.Close then skips its own
// listing.
func Close(srv *mqtt.Server, listenerIDs []string, extra ...string) error {
	disconnect := func(listener string) {
		for _, cl := range srv.Clients.GetAll() {
			if cl.Net.Listener == listener && !cl.Closed() {
				_ = srv.DisconnectClient(cl, packets.ErrServerShuttingDown)
			}
		}
	}
	for _, id := range extra {
		disconnect(id)
	}
	for _, id := range listenerIDs {
		srv.Listeners.Close(id, disconnect)
	}
	return srv.Close()
}

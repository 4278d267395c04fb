// Package mochiclose stops an embedded mochi-mqtt server without the two
// shutdown defects of its Close (see Close and Listener).
package mochiclose

import (
	"net"
	"sync"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Listener wraps a mochi listener so that Close can wait for the
// connections it accepted.
//
// Why: mochi-mqtt v2.7.9's listener hands each accepted connection to a
// new goroutine, which counts itself in the server's client WaitGroup
// only when it starts. A connection accepted just before Close can start
// counting while Close waits on that WaitGroup at zero, and sync panics
// ("WaitGroup is reused before previous Wait has returned"). A Listener
// admits no connection once shut, and shut waits for those admitted.
type Listener struct {
	listeners.Listener

	mu      sync.Mutex
	closing bool
	conns   map[net.Conn]struct{}
	active  sync.WaitGroup
}

// Wrap returns l guarded for Close. Register the result with the server
// (srv.AddListener) in place of l.
func Wrap(l listeners.Listener) *Listener {
	return &Listener{Listener: l, conns: make(map[net.Conn]struct{})}
}

// Serve serves the wrapped listener, counting every connection it hands
// to mochi until mochi's handler returns.
func (l *Listener) Serve(establish listeners.EstablishFn) {
	l.Listener.Serve(func(id string, c net.Conn) error {
		l.mu.Lock()
		if l.closing {
			l.mu.Unlock()
			return c.Close()
		}
		l.active.Add(1)
		l.conns[c] = struct{}{}
		l.mu.Unlock()
		defer func() {
			l.mu.Lock()
			delete(l.conns, c)
			l.mu.Unlock()
			l.active.Done()
		}()
		return establish(id, c)
	})
}

// shut admits no further connection, closes those still open (their
// clients were asked to disconnect already) and waits until mochi's
// handler of each has returned.
func (l *Listener) shut() {
	l.mu.Lock()
	l.closing = true
	for c := range l.conns {
		_ = c.Close()
	}
	l.mu.Unlock()
	l.active.Wait()
}

// Close stops a mochi server whose listeners are ls (each registered
// through Wrap), disconnecting their clients and the clients of extra
// (clients with no registered listener, such as the aggregator's
// in-process one).
//
// Why not srv.Close alone: besides the WaitGroup race (see Listener),
// mochi-mqtt v2.7.9 lists a listener's clients with
// Clients.GetByListener, which takes the clients' read lock and then again
// inside it (Len). A client connecting or leaving in between queues a
// write lock behind the first, and the second read lock then waits
// forever: a shutdown that hangs. Each listener is closed first here with
// a closer that lists the clients under one read lock (Clients.GetAll); a
// listener closes its clients once, so srv.Close then skips its own
// listing.
func Close(srv *mqtt.Server, ls []*Listener, extra ...string) error {
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
	for _, l := range ls {
		srv.Listeners.Close(l.ID(), disconnect)
		l.shut()
	}
	return srv.Close()
}

package broker

import (
	"errors"
	"net"
	"time"
)

// DefaultWriteStall is how long a write to a client may make no progress
// before the broker closes the connection (Config.WriteStall).
const DefaultWriteStall = 30 * time.Second

// stallChunk is the most written to a client under one deadline: a slow
// but moving link (a gateway receiving a large model over a thin uplink)
// renews the deadline with every chunk; a stalled one does not.
const stallChunk = 64 << 10

// sendBuffer is a site connection's socket send buffer (SO_SNDBUF; Linux
// doubles it). The kernel wakes a blocked writer only once about half of
// the buffer is free again, so the buffer bounds the bytes a client must
// read to show progress: with autotuning's 4 MiB a gateway on a 32 kB/s
// link would need a minute, and be cut as stalled. 256 KiB still lets a
// link of 200 ms round trip carry 2.5 MB/s.
const sendBuffer = 256 << 10

// A client that stops reading.
//
// mochi writes a packet to a client while holding that client's lock, and
// routing a QoS 1 message to a client takes the same lock (for its packet
// id). A site that subscribes to the round and then stops reading (a
// hostile one, with keepalive 0 so that nothing ever times out; or a
// gateway whose network stalls) fills its socket buffers, after which the
// broker's write to it blocks, and with it the routing of every message
// the aggregator publishes next: every other site's receipts and the next
// announcement (TestSlowReaderDoesNotStall reproduced it: another site's
// receipt never arrived). Mosquitto queues per client and is not affected.
//
// Every site connection (not the aggregator's in-process one) is wrapped
// in a stallConn: each write of up to stallChunk bytes must complete
// within WriteStall (30 s), or the connection is closed; with the send
// buffer at sendBuffer, a client reading at a few kB/s keeps up. mochi then drops the
// client (its session stays, within --session-expiry and --site-queue),
// the lock is released and routing goes on. The connection's deadlines
// belong to the stallConn: mochi's keepalive deadline (SetDeadline on
// every packet read) sets the read deadline only, so that a client cannot
// clear the write deadline by sending packets.
type stallConn struct {
	net.Conn
	stall   time.Duration
	onStall func(remote string)
}

func (c *stallConn) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		end := min(len(p), n+stallChunk)
		if err := c.SetWriteDeadline(time.Now().Add(c.stall)); err != nil {
			return n, err
		}
		m, err := c.Conn.Write(p[n:end])
		n += m
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				_ = c.Close()
				c.onStall(c.Conn.RemoteAddr().String())
			}
			return n, err
		}
	}
	return n, nil
}

// SetDeadline sets the read deadline only (see stallConn).
func (c *stallConn) SetDeadline(t time.Time) error { return c.SetReadDeadline(t) }

// NetConn returns the wrapped connection (as tls.Conn's NetConn does).
func (c *stallConn) NetConn() net.Conn { return c.Conn }

// stallListener wraps every accepted connection in a stallConn.
type stallListener struct {
	net.Listener
	stall   time.Duration
	onStall func(remote string)
}

func (l *stallListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(sendBuffer) // a hint; the kernel may round it
	}
	return &stallConn{Conn: c, stall: l.stall, onStall: l.onStall}, nil
}

// stalled counts and logs (at most once a minute per remote address) a
// connection closed for not reading.
func (h *authHook) stalled(remote string) {
	defer h.writeStalls.Add(1)
	if ok, suppressed := h.refusals.allow("stall\x00" + remote); ok {
		args := []any{"remote", remote}
		if suppressed > 0 {
			args = append(args, "suppressed", suppressed)
		}
		h.log.Warn("mqtt client stopped reading: connection closed so that the broker's other clients are not held up", args...)
	}
}

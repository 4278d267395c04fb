package mochiclose

import (
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// closeFn is the function under test; swapping in mochi's own srv.Close
// shows the hang and the WaitGroup panic it avoids.
var closeFn = func(srv *mqtt.Server, l *Listener) error { return Close(srv, []*Listener{l}) }

// TestCloseWhileClientsChurn closes servers while clients connect and
// leave as fast as they can, each close bounded by a deadline: mochi's
// Close can hang when a client's removal queues between its two read
// locks of the client list.
func TestCloseWhileClientsChurn(t *testing.T) {
	for i := range 30 {
		srv := mqtt.New(&mqtt.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err := srv.AddHook(new(allowAll), nil); err != nil {
			t.Fatal(err)
		}
		tcp := Wrap(listeners.NewTCP(listeners.Config{ID: "t", Address: "127.0.0.1:0"}))
		if err := srv.AddListener(tcp); err != nil {
			t.Fatal(err)
		}
		if err := srv.Serve(); err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for c := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				churn(tcp.Address(), c, stop)
			}()
		}
		time.Sleep(20 * time.Millisecond) // let connections build up: the churn is the point
		done := make(chan error, 1)
		go func() { done <- closeFn(srv, tcp) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("iteration %d: the server's close did not return in 10 s", i)
		}
		close(stop)
		wg.Wait()
	}
}

// churn connects a raw MQTT client with id c and drops it, again and
// again, until stop.
func churn(addr string, c int, stop chan struct{}) {
	connect := []byte{0x10, 15, 0, 4, 'M', 'Q', 'T', 'T', 4, 0x02, 0, 30, 0, 3, 'c', '-', byte('a' + c)}
	for {
		select {
		case <-stop:
			return
		default:
		}
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				continue
			}
		}
		_, _ = conn.Write(connect)
		_ = conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		_, _ = conn.Read(make([]byte, 4))
		_ = conn.Close()
	}
}

type allowAll struct{ mqtt.HookBase }

func (*allowAll) ID() string { return "allow-all" }

func (*allowAll) Provides(b byte) bool {
	return b == mqtt.OnConnectAuthenticate || b == mqtt.OnACLCheck
}

func (*allowAll) OnConnectAuthenticate(*mqtt.Client, packets.Packet) bool { return true }

func (*allowAll) OnACLCheck(*mqtt.Client, string, bool) bool { return true }

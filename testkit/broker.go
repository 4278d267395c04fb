package testkit

import (
	"io"
	"log/slog"
	"testing"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edgefl/edgefl/internal/mochiclose"
)

// StartBroker runs mochi-mqtt in-process on a random loopback port with
// the AllowAll hook (no authentication, no ACL), and closes it when the
// test ends. It returns the server (to disconnect or inspect clients) and
// its URL, tcp://127.0.0.1:PORT. Tests of authentication and the
// federation's ACL use the broker package itself (broker.Start).
func StartBroker(t testing.TB) (*mochi.Server, string) {
	t.Helper()
	srv := mochi.New(&mochi.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := srv.AddHook(new(AllowAll), nil); err != nil {
		t.Fatal(err)
	}
	tcp := mochiclose.Wrap(listeners.NewTCP(listeners.Config{ID: "tcp", Address: "127.0.0.1:0"}))
	if err := srv.AddListener(tcp); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mochiclose.Close(srv, []*mochiclose.Listener{tcp}) })
	return srv, "tcp://" + tcp.Address()
}

// AllowAll is a mochi hook that lets every client connect, publish and
// subscribe.
type AllowAll struct{ mochi.HookBase }

// ID names the hook.
func (*AllowAll) ID() string { return "allow-all" }

// Provides says the hook answers authentication and ACL checks.
func (*AllowAll) Provides(b byte) bool {
	return b == mochi.OnConnectAuthenticate || b == mochi.OnACLCheck
}

// OnConnectAuthenticate lets every client in.
func (*AllowAll) OnConnectAuthenticate(*mochi.Client, packets.Packet) bool { return true }

// OnACLCheck allows every topic, both ways.
func (*AllowAll) OnACLCheck(*mochi.Client, string, bool) bool { return true }

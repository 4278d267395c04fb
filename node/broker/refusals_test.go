package broker

import (
	"crypto/tls"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edgefl/edgefl/proto/pki"
	"github.com/edgefl/edgefl/testkit"
)

// refused marks the log line of a refused connection.
const refused = `msg="mqtt connection refused"`

// waitRefusals waits until the broker has counted n refusals (the log line
// is written before the count is read back here).
func waitRefusals(t *testing.T, b *Broker, n uint64) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for b.Stats().AuthFailures < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d refusals counted, want %d", b.Stats().AuthFailures, n)
		}
		time.Sleep(5 * time.Millisecond) // the broker's own goroutines; no clock to inject
	}
}

// Refused connections are logged at WARN with the client id and the reason
// (TLS: no certificate, a certificate of another CA; MQTT: a bad password),
// at most once a minute per client and reason, the next line counting those
// suppressed; every one is counted.
func TestConnectionRefusalsLogged(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	for _, d := range []string{dir, other} {
		if _, err := pki.MakeSite(pki.SiteOptions{Dir: d, Clients: []string{"aggregator", "site-a"}}); err != nil {
			t.Fatal(err)
		}
	}
	scfg, err := pki.ServerTLSConfig(filepath.Join(dir, pki.ServerCertFile), filepath.Join(dir, pki.ServerKeyFile), filepath.Join(dir, pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	logs := &testkit.SyncBuffer{}
	now := time.Unix(1_700_000_000, 0)
	var clockMu sync.Mutex
	b, err := Start(Config{Addr: "127.0.0.1:0", Prefix: prefix, TLS: scfg, Users: map[string]string{"site-a": "right"},
		Superusers: []string{"aggregator"}, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.hook.refusals.now = func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return now }
	tlsFrom := func(d string, cert bool) *tls.Config {
		cf, kf := pki.ClientFiles(d, "site-a")
		c, err := pki.ClientTLSConfig(filepath.Join(dir, pki.CACertFile), cf, kf) // trusts our broker
		if err != nil {
			t.Fatal(err)
		}
		if !cert {
			c.Certificates = nil
		}
		c.ServerName = "localhost"
		return c
	}
	attempts := []struct {
		o    opts
		want string
	}{
		{opts{id: "site-a", tls: tlsFrom(dir, false)}, `reason="no client certificate"`},
		{opts{id: "site-a", tls: tlsFrom(other, true)}, `client_id=site-a remote=127.0.0.1`},
		{opts{id: "site-a", user: "site-a", pass: "wrong", tls: tlsFrom(dir, true)}, `reason="bad username or password"`},
	}
	for i, a := range attempts {
		if c, err := dial(t, b.URL(), a.o); err == nil {
			c.c.Disconnect(0)
			t.Fatalf("attempt %d connected", i)
		}
		waitRefusals(t, b, uint64(i+1))
		lines := logs.Lines(refused)
		if len(lines) != i+1 || !strings.Contains(lines[i], "level=WARN") || !strings.Contains(lines[i], a.want) {
			t.Fatalf("attempt %d: refusal lines %q, want the last with %s", i, lines, a.want)
		}
	}
	if l := logs.Lines(refused)[1]; !strings.Contains(l, `reason="client certificate not signed by the site CA"`) {
		t.Fatalf("another CA's certificate: %s", l)
	}
	// The same refusal again within the minute: counted, not logged.
	for i := range 3 {
		if _, err := dial(t, b.URL(), attempts[2].o); err == nil {
			t.Fatal("connected")
		}
		waitRefusals(t, b, uint64(4+i))
	}
	if n := len(logs.Lines(refused)); n != 3 {
		t.Fatalf("%d refusal lines after repeats, want 3", n)
	}
	clockMu.Lock()
	now = now.Add(refusalLogEvery)
	clockMu.Unlock()
	if _, err := dial(t, b.URL(), attempts[2].o); err == nil {
		t.Fatal("connected")
	}
	waitRefusals(t, b, 7)
	lines := logs.Lines(refused)
	if len(lines) != 4 || !strings.Contains(lines[3], "suppressed=3") {
		t.Fatalf("the line after the window: %q", lines)
	}
}

// Every refused connection is kept per claimed identity (Refusals: the
// latest reason and time, and a count), so the aggregator can show a site
// that never got in: a certificate of another CA, an expired one, a
// certificate of the site CA whose CN is not on the roster (Config.Sites),
// a wrong password. A superuser and a roster site get in.
func TestRefusalRecord(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	if _, err := pki.MakeSite(pki.SiteOptions{Dir: dir, Clients: []string{"aggregator", "site-a", "site-b", "stranger"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.MakeSite(pki.SiteOptions{Dir: other, Clients: []string{"site-a"}}); err != nil {
		t.Fatal(err)
	}
	// site-old: the same CA, a certificate that expired yesterday.
	if _, err := pki.MakeSite(pki.SiteOptions{Dir: dir, Clients: []string{"site-old"}, Now: time.Now().Add(-72 * time.Hour), Validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
	scfg, err := pki.ServerTLSConfig(filepath.Join(dir, pki.ServerCertFile), filepath.Join(dir, pki.ServerKeyFile), filepath.Join(dir, pki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1_700_000_000, 0).UTC()
	b, err := Start(Config{Addr: "127.0.0.1:0", Prefix: prefix, TLS: scfg, Users: map[string]string{"site-b": "right"},
		Superusers: []string{"aggregator"}, Sites: []string{"site-a", "site-b", "site-old"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.hook.record.now = func() time.Time { return at }
	tlsOf := func(d, id string) *tls.Config {
		cf, kf := pki.ClientFiles(d, id)
		c, err := pki.ClientTLSConfig(filepath.Join(dir, pki.CACertFile), cf, kf)
		if err != nil {
			t.Fatal(err)
		}
		c.ServerName = "localhost"
		return c
	}
	for _, ok := range []opts{{id: "aggregator", tls: tlsOf(dir, "aggregator")}, {id: "site-a", tls: tlsOf(dir, "site-a")}} {
		c, err := dial(t, b.URL(), ok)
		if err != nil {
			t.Fatalf("%s refused: %v", ok.id, err)
		}
		c.c.Disconnect(0)
	}
	bad := []opts{
		{id: "site-a", tls: tlsOf(other, "site-a")},
		{id: "site-old", tls: tlsOf(dir, "site-old")},
		{id: "stranger", tls: tlsOf(dir, "stranger")},
		{id: "site-b", user: "site-b", pass: "wrong", tls: tlsOf(dir, "site-b")},
	}
	for i, o := range bad {
		if _, err := dial(t, b.URL(), o); err == nil {
			t.Fatalf("%s connected", o.id)
		}
		waitRefusals(t, b, uint64(i+1))
	}
	want := []Refusal{
		{ID: "site-a", Reason: "client certificate not signed by the site CA", At: at, Count: 1},
		{ID: "site-b", Reason: "bad username or password", At: at, Count: 1},
		{ID: "site-old", Reason: "client certificate expired or not yet valid", At: at, Count: 1},
		{ID: "stranger", Reason: "identity not on the roster (--sites)", At: at, Count: 1},
	}
	if got := b.Refusals(); !slices.Equal(got, want) {
		t.Fatalf("refusals\n got %+v\nwant %+v", got, want)
	}
}

package agent

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgefl/edgefl/proto/pki"
	"github.com/edgefl/edgefl/testkit"
)

// The site's TLS files are checked at start, each failure in one line: a
// certificate of another site (its CN is not site_id), an expired one, one
// from another PKI whose CA has the same name as tls_ca's; a certificate
// of an unrelated issuer is only warned about (a broker may trust a
// separate client CA).
func TestCheckOwnCert(t *testing.T) {
	dir, other, foreign := t.TempDir(), t.TempDir(), t.TempDir()
	if _, err := pki.MakeSite(pki.SiteOptions{Dir: dir, Clients: []string{"site-a", "site-b"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.MakeSite(pki.SiteOptions{Dir: other, Clients: []string{"site-a"}}); err != nil { // same CA name, another key
		t.Fatal(err)
	}
	if _, err := pki.MakeSite(pki.SiteOptions{Dir: foreign, CAName: "hospital IT CA", Clients: []string{"site-a"}}); err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, pki.CACertFile)
	now := time.Now()
	cases := []struct {
		name, pkiDir, id string
		caFile           string
		now              time.Time
		wantErr, wantLog string
	}{
		{"its own certificate", dir, "site-a", ca, now, "", ""},
		{"no tls_ca", dir, "site-a", "", now, "", ""},
		{"another site's certificate", dir, "site-b", ca, now, `is issued to "site-b", not to this site_id "site-a"`, ""},
		{"expired", dir, "site-a", ca, now.Add(20 * 365 * 24 * time.Hour), "expired on", ""},
		{"not yet valid by the clock", dir, "site-a", ca, time.Unix(0, 0), "", "not valid yet by this gateway's clock"},
		{"another PKI, same CA name", other, "site-a", ca, now, "the certificate comes from another PKI", ""},
		{"an unrelated issuer", foreign, "site-a", ca, now, "", "tls_cert is not signed by tls_ca"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cf, kf := pki.ClientFiles(c.pkiDir, c.id)
			cert, err := tls.LoadX509KeyPair(cf, kf)
			if err != nil {
				t.Fatal(err)
			}
			logs := &testkit.SyncBuffer{}
			err = checkOwnCert(cert, cf, "site-a", c.caFile, c.now, slog.New(slog.NewTextHandler(logs, nil)))
			switch {
			case c.wantErr == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr) || !errors.Is(err, ErrConfig) || strings.Contains(err.Error(), "\n")):
				t.Fatalf("error %v, want one line with %q", err, c.wantErr)
			}
			if got := logs.String(); (c.wantLog == "") != (got == "") || !strings.Contains(got, c.wantLog) {
				t.Fatalf("log %q, want %q", got, c.wantLog)
			}
		})
	}
}

// A failed connection says why in one line (connHint): a real TLS
// handshake with a broker whose certificate tls_ca did not sign, and the
// broker's refusal of the site's login.
func TestConnHint(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	for _, d := range []string{dir, other} {
		if _, err := pki.MakeSite(pki.SiteOptions{Dir: d, Clients: []string{"site-a"}}); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := pki.ServerTLSConfig(filepath.Join(other, pki.ServerCertFile), filepath.Join(other, pki.ServerKeyFile), "")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", srv)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _ = c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	cf, kf := pki.ClientFiles(dir, "site-a")
	cli, err := pki.ClientTLSConfig(filepath.Join(dir, pki.CACertFile), cf, kf)
	if err != nil {
		t.Fatal(err)
	}
	cli.ServerName = "localhost"
	d := &net.Dialer{Timeout: 10 * time.Second}
	_, herr := tls.DialWithDialer(d, "tcp", ln.Addr().String(), cli)
	if herr == nil {
		t.Fatal("handshake with another PKI's broker succeeded")
	}
	cfg := Config{SiteID: "site-a", CAFile: filepath.Join(dir, pki.CACertFile)}
	wrapped := fmt.Errorf("network Error : %w", herr) // as paho wraps it
	if h := connHint(wrapped, cfg); !strings.Contains(h, "the broker's certificate is not signed by tls_ca "+cfg.CAFile) {
		t.Fatalf("hint for %v: %q", herr, h)
	}
	if h := connHint(errors.New("not Authorized"), cfg); !strings.Contains(h, "the broker refused this site's login") || !strings.Contains(h, "site-a") {
		t.Fatalf("hint for not Authorized: %q", h)
	}
	if h := connHint(errors.New("remote error: tls: unknown certificate authority"), cfg); !strings.Contains(h, "refused this site's TLS certificate (unknown certificate authority)") {
		t.Fatalf("hint for a refused certificate: %q", h)
	}
	if h := connHint(errors.New("dial tcp: connection refused"), cfg); h != "" {
		t.Fatalf("hint for a refused TCP connection: %q", h)
	}
}

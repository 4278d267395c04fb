package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/edgefl/edgefl/testkit"
)

func TestMakeSite(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	written, err := MakeSite(SiteOptions{Dir: dir, Hosts: []string{"agg.hospital.local", "10.0.0.5"}, Clients: []string{"site-a", "aggregator", "site-a"}, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if len(written) != 8 {
		t.Fatalf("wrote %d files: %v", len(written), written)
	}
	for _, f := range written {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		want := os.FileMode(0o644)
		if filepath.Ext(f) == ".key" {
			want = 0o600
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", f, st.Mode().Perm(), want)
		}
	}
	pool, err := LoadCertPool(filepath.Join(dir, CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	srv := loadCert(t, filepath.Join(dir, ServerCertFile))
	if _, err := srv.Verify(x509.VerifyOptions{Roots: pool, DNSName: "agg.hospital.local", CurrentTime: now}); err != nil {
		t.Errorf("server cert by name: %v", err)
	}
	if _, err := srv.Verify(x509.VerifyOptions{Roots: pool, DNSName: "10.0.0.5", CurrentTime: now}); err != nil {
		t.Errorf("server cert by IP: %v", err)
	}
	cf, _ := ClientFiles(dir, "site-a")
	cl := loadCert(t, cf)
	if cl.Subject.CommonName != "site-a" {
		t.Errorf("client CN %q", cl.Subject.CommonName)
	}
	if _, err := cl.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, CurrentTime: now}); err != nil {
		t.Errorf("client cert: %v", err)
	}
	if _, err := cl.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, CurrentTime: now}); err == nil {
		t.Error("a client certificate verifies as a server certificate")
	}

	// A second run reuses the CA and adds only the new client.
	caBefore, _ := os.ReadFile(filepath.Join(dir, CACertFile))
	written, err = MakeSite(SiteOptions{Dir: dir, Clients: []string{"site-a", "site-b"}, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	cb, kb := ClientFiles(dir, "site-b")
	if !slices.Equal(written, []string{cb, kb}) {
		t.Errorf("second run wrote %v", written)
	}
	caAfter, _ := os.ReadFile(filepath.Join(dir, CACertFile))
	if string(caBefore) != string(caAfter) {
		t.Error("second run replaced the CA")
	}
	if _, err := loadCert(t, cb).Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, CurrentTime: now}); err != nil {
		t.Errorf("site-b cert under the same CA: %v", err)
	}
}

func TestMakeSiteBadInput(t *testing.T) {
	tests := []struct {
		name string
		o    SiteOptions
	}{
		{"no dir", SiteOptions{}},
		{"bad id", SiteOptions{Clients: []string{"site/a"}}},
		{"wildcard id", SiteOptions{Clients: []string{"+"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name != "no dir" {
				tt.o.Dir = t.TempDir()
			}
			if _, err := MakeSite(tt.o); err == nil {
				t.Fatal("no error")
			}
		})
	}
	// A CA key without its certificate is an error, not a new CA.
	dir := t.TempDir()
	testkit.WriteFile(t, filepath.Join(dir, CAKeyFile), "junk")
	if _, err := MakeSite(SiteOptions{Dir: dir}); err == nil {
		t.Fatal("half a CA accepted")
	}
}

func TestWriteFilesRefusesOverwrite(t *testing.T) {
	dir := t.TempDir()
	ca, err := NewCA("x", time.Now(), 0)
	if err != nil {
		t.Fatal(err)
	}
	c, k := filepath.Join(dir, "a.crt"), filepath.Join(dir, "a.key")
	if err := WriteFiles(c, k, ca.Cert, ca.Key, false); err != nil {
		t.Fatal(err)
	}
	if err := WriteFiles(c, k, ca.Cert, ca.Key, false); err == nil {
		t.Fatal("overwrote without force")
	}
	if err := WriteFiles(c, k, ca.Cert, ca.Key, true); err != nil {
		t.Fatalf("force: %v", err)
	}
}

func loadCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(path, path[:len(path)-len(".crt")]+".key")
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Mutual TLS between ServerTLSConfig and ClientTLSConfig: the server sees
// the client's CN; a certificate from another CA is refused.
func TestMutualTLSHandshake(t *testing.T) {
	dir := t.TempDir()
	if _, err := MakeSite(SiteOptions{Dir: dir, Clients: []string{"site-a"}}); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	if _, err := MakeSite(SiteOptions{Dir: other, Clients: []string{"site-a"}}); err != nil {
		t.Fatal(err)
	}
	scfg, err := ServerTLSConfig(filepath.Join(dir, ServerCertFile), filepath.Join(dir, ServerKeyFile), filepath.Join(dir, CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		certDir string
		wantCN  string
	}{
		{"same CA", dir, "site-a"},
		{"other CA", other, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cf, kf := ClientFiles(tt.certDir, "site-a")
			ccfg, err := ClientTLSConfig(filepath.Join(dir, CACertFile), cf, kf)
			if err != nil {
				t.Fatal(err)
			}
			ccfg.ServerName = "localhost"
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			got := make(chan string, 1)
			go func() {
				s := tls.Server(a, scfg)
				if err := s.Handshake(); err != nil {
					got <- ""
					s.Close()
					return
				}
				got <- s.ConnectionState().PeerCertificates[0].Subject.CommonName
			}()
			c := tls.Client(b, ccfg)
			cerr := c.Handshake()
			if tt.wantCN == "" {
				// TLS 1.3 reports the client's rejection on the first read.
				if cerr == nil {
					_, cerr = c.Read(make([]byte, 1))
				}
				if cerr == nil {
					t.Error("client handshake succeeded with a foreign certificate")
				}
				b.Close()
			}
			select {
			case cn := <-got:
				if cn != tt.wantCN {
					t.Errorf("server saw CN %q, want %q", cn, tt.wantCN)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("handshake did not finish")
			}
		})
	}
	if _, err := ClientTLSConfig("", "only-cert.crt", ""); err == nil || errors.Is(err, os.ErrNotExist) {
		t.Errorf("cert without key: %v", err)
	}
}

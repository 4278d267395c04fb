// Package secaggid gives tests a federation CA and each site's signing
// identity for signed secure aggregation (uplink.SecAggIdentity), as
// `broker-agg pki` would issue them, in memory.
package secaggid

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/edgefl/edgefl/proto/pki"
	"github.com/edgefl/edgefl/proto/uplink"
)

// Federation is a test CA and the identities it issued.
type Federation struct {
	CA    *pki.CA
	Roots *x509.CertPool
	IDs   map[string]*uplink.SecAggIdentity
}

// New makes a CA valid at now and a client certificate for every id.
func New(t testing.TB, now time.Time, ids ...string) *Federation {
	t.Helper()
	ca, err := pki.NewCA("test federation CA", now, 30*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := &Federation{CA: ca, Roots: x509.NewCertPool(), IDs: map[string]*uplink.SecAggIdentity{}}
	f.Roots.AddCert(ca.Cert)
	for _, id := range ids {
		f.IDs[id] = f.Issue(t, now, id)
	}
	return f
}

// Issue is a new identity for id from f's CA.
func (f *Federation) Issue(t testing.TB, now time.Time, id string) *uplink.SecAggIdentity {
	t.Helper()
	cert, key, err := f.CA.Issue(pki.Client, id, nil, now, 30*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &uplink.SecAggIdentity{Cert: cert.Raw, Signer: key, Roots: f.Roots}
}

// Get is the identity of id (nil if none): localfed's SecAggIdentity.
func (f *Federation) Get(id string) *uplink.SecAggIdentity { return f.IDs[id] }

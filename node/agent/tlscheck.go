package agent

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"
)

// The TLS files are checked at start, so that a site the broker would
// refuse says why in one line of its own log instead of a bare "not
// Authorized" at every attempt: its certificate's CN must be its site_id
// (the broker takes the CN as the identity), it must not have expired, and
// when tls_ca is the CA that issued it (the `broker-agg pki` layout: one CA
// for the broker and the sites) it must verify against it. A connection
// failure is explained the same way (connHint).

// checkOwnCert checks the site's client certificate against its site id
// and its CA file (caFile may be ""). It returns a configuration error for
// what the broker would certainly refuse, and logs at WARN what it might.
func checkOwnCert(cert tls.Certificate, certFile, siteID, caFile string, now time.Time, log *slog.Logger) error {
	leaf := cert.Leaf
	if leaf == nil {
		if len(cert.Certificate) == 0 {
			return configErr("tls_cert %s holds no certificate", certFile)
		}
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return configErr("tls_cert %s: %v", certFile, err)
		}
	}
	if cn := leaf.Subject.CommonName; cn != siteID {
		return configErr("tls_cert %s is issued to %q, not to this site_id %q: the broker would refuse it (hint: use the site's own clients/%s.crt, or set site_id = %s)",
			certFile, cn, siteID, siteID, cn)
	}
	if now.After(leaf.NotAfter) {
		return configErr("tls_cert %s expired on %s (this gateway's clock says %s): the broker would refuse it; issue a new one (broker-agg pki --clients %s --force)",
			certFile, leaf.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339), siteID)
	}
	if now.Before(leaf.NotBefore) {
		log.Warn("tls_cert is not valid yet by this gateway's clock: check the clock (a gateway without a hardware clock needs time synchronisation before it connects)",
			"tls_cert", certFile, "not_before", leaf.NotBefore.UTC(), "now", now.UTC())
	}
	if caFile == "" {
		return nil
	}
	cas, err := readCerts(caFile)
	if err != nil {
		return configErr("tls_ca %s: %v", caFile, err)
	}
	pool := x509.NewCertPool()
	sameName := false
	for _, ca := range cas {
		pool.AddCert(ca)
		if ca.Subject.String() == leaf.Issuer.String() {
			sameName = true
		}
	}
	inter := x509.NewCertPool()
	for _, c := range cert.Certificate[1:] {
		if ic, err := x509.ParseCertificate(c); err == nil {
			inter.AddCert(ic)
		}
	}
	// Verified at a time within the certificate's validity: its dates are
	// checked above, against this gateway's clock.
	_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: leaf.NotBefore.Add(time.Second),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	switch {
	case err == nil:
	case sameName:
		return configErr("tls_cert %s: issuer %q as in tls_ca %s, but that CA did not sign it: the certificate comes from another PKI (hint: broker-agg pki run in another directory?)",
			certFile, leaf.Issuer.CommonName, caFile)
	default:
		log.Warn("tls_cert is not signed by tls_ca: fine only if the broker trusts its issuer for clients (with broker-agg pki, one CA signs the broker and every site)",
			"tls_cert", certFile, "issuer", leaf.Issuer.String(), "tls_ca", caFile, "err", err)
	}
	return nil
}

// readCerts reads every certificate of a PEM file.
func readCerts(path string) ([]*x509.Certificate, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, raw = pem.Decode(raw)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate in it")
	}
	return out, nil
}

// connHint explains a failed connection in one line, or "": the broker's
// certificate not signed by tls_ca, the broker refusing this site's
// certificate, or its login ("not Authorized", which alone says nothing of
// why).
func connHint(err error, c Config) string {
	if err == nil {
		return ""
	}
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	var ci x509.CertificateInvalidError
	var alert tls.AlertError
	msg := err.Error()
	switch {
	case errors.As(err, &ua):
		return fmt.Sprintf("the broker's certificate is not signed by tls_ca %s: use the CA that signed the broker's certificate (with broker-agg pki: its ca.crt)", orSystem(c.CAFile))
	case errors.As(err, &hn):
		return fmt.Sprintf("the broker's certificate is not for the host in the broker URL: %v (set tls_server_name, or use the host its certificate names)", hn)
	case errors.As(err, &ci) && ci.Reason == x509.Expired:
		return "the broker's certificate has expired, or this gateway's clock is wrong"
	case errors.As(err, &alert) || strings.Contains(msg, "remote error: tls:"):
		return "the broker refused this site's TLS certificate (" + tlsAlert(msg) + "): it must be signed by the CA the broker trusts for clients, unexpired, with CN = site_id " + c.SiteID
	case strings.Contains(msg, "not Authorized") || strings.Contains(msg, "bad user name or password"):
		return "the broker refused this site's login: check that the certificate's CN (or the username) is site_id " + c.SiteID +
			", that the password matches the broker's password file, and that the site is on the broker's roster; the broker's log says which"
	}
	return ""
}

func tlsAlert(msg string) string {
	if _, a, ok := strings.Cut(msg, "remote error: tls: "); ok {
		return a
	}
	return "a TLS alert"
}

func orSystem(caFile string) string {
	if caFile == "" {
		return "(none: the system roots)"
	}
	return caFile
}

// withHint adds connHint's explanation of err to a log line's args.
func withHint(args []any, err error, c Config) []any {
	if h := connHint(err, c); h != "" {
		args = append(args, "hint", h)
	}
	return args
}

// Package pki makes a site's public-key infrastructure for mutual TLS with
// Go's standard crypto: a CA, a server certificate for the broker's host
// names and addresses, and one client certificate per site whose CN is the
// site id (the identity the broker's ACL uses). Keys are ECDSA P-256,
// written PKCS#8 PEM with mode 0600; certificates are PEM with mode 0644.
//
// Layout of a site directory (MakeSite):
//
//	ca.crt  ca.key               the site CA (keep ca.key offline once done)
//	server.crt  server.key       the broker's certificate
//	clients/<id>.crt  <id>.key   one per site, and one for the aggregator
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/edgefl/edgefl/proto/wire"
)

// Default validities.
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultLeafValidity = 825 * 24 * time.Hour // the longest browsers ever accepted; plenty for a gateway
)

// CA is a certificate authority able to issue certificates.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA makes a self-signed ECDSA P-256 CA named name, valid from now for
// validity (<= 0: DefaultCAValidity).
func NewCA(name string, now time.Time, validity time.Duration) (*CA, error) {
	if name == "" {
		return nil, errors.New("pki: empty CA name")
	}
	if validity <= 0 {
		validity = DefaultCAValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"edgefl"}},
		NotBefore:             now.Add(-5 * time.Minute),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate: %w", err)
	}
	return &CA{Cert: cert, Key: key}, nil
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("pki: serial: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}

// Kind is what a leaf certificate is for.
type Kind int

// Leaf kinds.
const (
	Server Kind = iota + 1 // TLS server (the broker): ExtKeyUsageServerAuth, SANs from hosts
	Client                 // TLS client (a site or the aggregator): ExtKeyUsageClientAuth, CN = id
)

// Issue makes a certificate and its new ECDSA P-256 key. For Client, cn must
// be a valid edgefl id (it becomes the site's identity). For Server, hosts
// are DNS names and IP addresses (at least one); cn defaults to the first.
func (ca *CA) Issue(kind Kind, cn string, hosts []string, now time.Time, validity time.Duration) (*x509.Certificate, crypto.Signer, error) {
	if validity <= 0 {
		validity = DefaultLeafValidity
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		NotBefore:             now.Add(-5 * time.Minute),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	if na := ca.Cert.NotAfter; tmpl.NotAfter.After(na) {
		tmpl.NotAfter = na
	}
	switch kind {
	case Client:
		if err := wire.ValidID(cn); err != nil {
			return nil, nil, fmt.Errorf("pki: client certificate CN: %w", err)
		}
		tmpl.Subject = pkix.Name{CommonName: cn, Organization: []string{"edgefl"}}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	case Server:
		if len(hosts) == 0 {
			return nil, nil, errors.New("pki: a server certificate needs at least one host name or IP address")
		}
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else if h != "" {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
		if cn == "" {
			cn = hosts[0]
		}
		tmpl.Subject = pkix.Name{CommonName: cn, Organization: []string{"edgefl"}}
		// Client auth too: the nodes of a broker cluster (deploy/nats)
		// dial each other's routes with this certificate, and NATS checks
		// the dialing node's certificate like a server's.
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	default:
		return nil, nil, fmt.Errorf("pki: unknown certificate kind %d", kind)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: key: %w", err)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: certificate %q: %w", cn, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: certificate %q: %w", cn, err)
	}
	return cert, key, nil
}

// CertPEM encodes a certificate as PEM.
func CertPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// KeyPEM encodes a private key as PKCS#8 PEM.
func KeyPEM(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("pki: encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// WriteFiles writes cert (0644) and key (0600) to certFile and keyFile. It
// refuses to overwrite an existing file unless force is set.
func WriteFiles(certFile, keyFile string, cert *x509.Certificate, key crypto.Signer, force bool) error {
	kp, err := KeyPEM(key)
	if err != nil {
		return err
	}
	if err := writeFile(keyFile, kp, 0o600, force); err != nil {
		return err
	}
	return writeFile(certFile, CertPEM(cert), 0o644, force)
}

func writeFile(path string, data []byte, mode os.FileMode, force bool) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	flag := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if force {
		flag = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(path, flag, mode)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("pki: %s exists (use --force to replace it)", path)
		}
		return fmt.Errorf("pki: %w", err)
	}
	if err := f.Chmod(mode); err != nil { // OpenFile's mode is filtered by the umask
		f.Close()
		return fmt.Errorf("pki: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("pki: write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("pki: sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("pki: close %s: %w", path, err)
	}
	return nil
}

// LoadCA reads a CA certificate and key written by WriteFiles.
func LoadCA(certFile, keyFile string) (*CA, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("pki: load CA: %w", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("pki: load CA %s: %w", certFile, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("pki: %s is not a CA certificate", certFile)
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("pki: %s: key cannot sign", keyFile)
	}
	return &CA{Cert: cert, Key: signer}, nil
}

// SiteOptions configure MakeSite.
type SiteOptions struct {
	Dir    string // output directory
	CAName string // default "edgefl site CA"
	// Hosts are the broker's DNS names and IP addresses for the server
	// certificate (default "localhost", "127.0.0.1", "::1").
	Hosts []string
	// Clients are the site ids to issue client certificates for; the
	// aggregator's id belongs here too.
	Clients  []string
	Now      time.Time     // default time.Now()
	Validity time.Duration // leaf validity; <= 0: DefaultLeafValidity
	// Force replaces the server and client certificates that exist (never
	// the CA: delete ca.key and ca.crt by hand to start a new PKI).
	Force bool
}

// Site file names under SiteOptions.Dir.
const (
	CACertFile     = "ca.crt"
	CAKeyFile      = "ca.key"
	ServerCertFile = "server.crt"
	ServerKeyFile  = "server.key"
	ClientsDir     = "clients"
)

// ClientFiles returns the certificate and key paths of client id under dir.
func ClientFiles(dir, id string) (certFile, keyFile string) {
	return filepath.Join(dir, ClientsDir, id+".crt"), filepath.Join(dir, ClientsDir, id+".key")
}

// MakeSite creates (or extends) a site PKI under o.Dir: the CA when absent
// (an existing one is loaded and reused), the server certificate when absent
// (or o.Force), and a client certificate for each id of o.Clients that has
// none (or o.Force). It returns the files it wrote.
func MakeSite(o SiteOptions) ([]string, error) {
	if o.Dir == "" {
		return nil, errors.New("pki: empty directory")
	}
	if o.CAName == "" {
		o.CAName = "edgefl site CA"
	}
	if len(o.Hosts) == 0 {
		o.Hosts = []string{"localhost", "127.0.0.1", "::1"}
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	ids := slices.Clone(o.Clients)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	for _, id := range ids {
		if err := wire.ValidID(id); err != nil {
			return nil, fmt.Errorf("pki: client id: %w", err)
		}
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	var written []string
	caCert, caKey := filepath.Join(o.Dir, CACertFile), filepath.Join(o.Dir, CAKeyFile)
	ca, err := LoadCA(caCert, caKey)
	switch {
	case err == nil:
	case exists(caCert) || exists(caKey):
		return nil, err
	default:
		if ca, err = NewCA(o.CAName, o.Now, 0); err != nil {
			return nil, err
		}
		if err := WriteFiles(caCert, caKey, ca.Cert, ca.Key, false); err != nil {
			return nil, err
		}
		written = append(written, caCert, caKey)
	}
	srvCert, srvKey := filepath.Join(o.Dir, ServerCertFile), filepath.Join(o.Dir, ServerKeyFile)
	if o.Force || !exists(srvCert) {
		cert, key, err := ca.Issue(Server, "", o.Hosts, o.Now, o.Validity)
		if err != nil {
			return written, err
		}
		if err := WriteFiles(srvCert, srvKey, cert, key, o.Force); err != nil {
			return written, err
		}
		written = append(written, srvCert, srvKey)
	}
	for _, id := range ids {
		cf, kf := ClientFiles(o.Dir, id)
		if !o.Force && exists(cf) {
			continue
		}
		cert, key, err := ca.Issue(Client, id, nil, o.Now, o.Validity)
		if err != nil {
			return written, err
		}
		if err := WriteFiles(cf, kf, cert, key, o.Force); err != nil {
			return written, err
		}
		written = append(written, cf, kf)
	}
	return written, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// LoadCertPool reads a PEM file of CA certificates.
func LoadCertPool(caFile string) (*x509.CertPool, error) {
	b, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("pki: CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("pki: %s holds no PEM certificate", caFile)
	}
	return pool, nil
}

// ServerTLSConfig is the broker's TLS configuration: its certificate, and
// when caFile is set, client certificates required and verified against it
// (mutual TLS). TLS 1.2 is the minimum.
func ServerTLSConfig(certFile, keyFile, caFile string) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("pki: server certificate: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := LoadCertPool(caFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// ClientTLSConfig is a client's TLS configuration: the broker is verified
// against caFile (empty: the system roots), and certFile/keyFile, when set,
// are presented for mutual TLS.
func ClientTLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := LoadCertPool(caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("pki: give both a client certificate and its key, or neither")
	}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("pki: client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

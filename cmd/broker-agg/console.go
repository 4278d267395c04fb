package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/edgefl/edgefl/node/aggregator"
	"github.com/edgefl/edgefl/node/broker"
	"github.com/edgefl/edgefl/proto/pki"
)

// The console's guards (`broker-agg run`) and the client side of them
// (`broker-agg status --addr`, `export --addr`).

// consolePasswordEnv holds the password `status --addr` and `export --addr`
// send with --user.
const consolePasswordEnv = "EDGEFL_CONSOLE_PASSWORD"

type consoleFlags struct {
	passwordFile, tlsCert, tlsKey, clientCA, clientNames string
}

func (c *consoleFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.passwordFile, "console-password-file", "", "require HTTP basic auth on --metrics-addr (console, /status, /metrics, /bundle; not /healthz) against this Mosquitto-format password `FILE` (`broker-agg pki passwd --file FILE --user operator`)")
	fs.StringVar(&c.tlsCert, "console-tls-cert", "", "serve --metrics-addr over HTTPS with this certificate `FILE` (e.g. pki/server.crt)")
	fs.StringVar(&c.tlsKey, "console-tls-key", "", "private key `FILE` of --console-tls-cert")
	fs.StringVar(&c.clientCA, "console-client-ca", "", "with --console-tls-cert: require a client certificate signed by this CA `FILE` (the federation's pki/ca.crt) whose CN is in --console-client-names")
	fs.StringVar(&c.clientNames, "console-client-names", "operator", "with --console-client-ca: the client certificate common `NAMES` let in, comma-separated (`broker-agg pki --clients operator` issues one; a site's certificate is from the same CA and is refused)")
}

// apply adds the console's guards to cfg.
func (c *consoleFlags) apply(cfg *aggregator.ServerConfig) error {
	if (c.tlsCert == "") != (c.tlsKey == "") {
		return errors.New("--console-tls-cert and --console-tls-key go together")
	}
	if c.clientCA != "" && c.tlsCert == "" {
		return errors.New("--console-client-ca needs --console-tls-cert and --console-tls-key (client certificates need HTTPS)")
	}
	if cfg.MetricsAddr == "" && (c.tlsCert != "" || c.passwordFile != "") {
		return errors.New("--console-* flags need --metrics-addr (the console's address)")
	}
	if c.tlsCert != "" {
		tc, err := pki.ServerTLSConfig(c.tlsCert, c.tlsKey, c.clientCA)
		if err != nil {
			return fmt.Errorf("--console-tls-cert: %w", err)
		}
		cfg.HTTPTLS = tc
		if c.clientCA != "" {
			cfg.HTTPClientNames = splitList(c.clientNames)
			if len(cfg.HTTPClientNames) == 0 {
				return errors.New("--console-client-names: name at least one certificate (e.g. operator)")
			}
		}
	}
	if c.passwordFile != "" {
		users, err := broker.ReadPasswordFile(c.passwordFile)
		if err != nil {
			return fmt.Errorf("--console-password-file: %w", err)
		}
		if len(users) == 0 {
			return fmt.Errorf("--console-password-file %s has no user", c.passwordFile)
		}
		var anyHash string
		for _, h := range users {
			anyHash = h
			break
		}
		cfg.HTTPAuth = func(user, password string) bool {
			h, ok := users[user]
			if !ok {
				_, _ = broker.VerifyPassword(anyHash, password) // the same cost for an unknown user
				return false
			}
			good, err := broker.VerifyPassword(h, password)
			return err == nil && good
		}
	}
	return nil
}

// daemonClient asks a running daemon's metrics address: plain HTTP, or
// HTTPS (an https:// address) verified against --ca with an optional client
// certificate, and basic auth with --user and $EDGEFL_CONSOLE_PASSWORD.
type daemonClient struct {
	ca, cert, key, user string
}

func (d *daemonClient) register(fs *flag.FlagSet) {
	fs.StringVar(&d.ca, "ca", "", "with an https:// --addr: the CA `FILE` that signed the daemon's --console-tls-cert (default: the system roots)")
	fs.StringVar(&d.cert, "cert", "", "with an https:// --addr: client certificate `FILE` (--console-client-ca; e.g. pki/clients/operator.crt)")
	fs.StringVar(&d.key, "key", "", "private key `FILE` of --cert")
	fs.StringVar(&d.user, "user", "", "basic auth user `NAME` (--console-password-file); the password is read from $"+consolePasswordEnv)
}

// url is the address of path on the daemon at addr (host:port, or a URL
// with its scheme).
func (d *daemonClient) url(addr, path string) string {
	if strings.Contains(addr, "://") {
		return strings.TrimRight(addr, "/") + path
	}
	return "http://" + addr + path
}

func (d *daemonClient) get(ctx context.Context, addr, path string, timeout time.Duration) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.url(addr, path), nil)
	if err != nil {
		cancel()
		return nil, err
	}
	if d.user != "" {
		req.SetBasicAuth(d.user, os.Getenv(consolePasswordEnv))
	}
	client := http.DefaultClient
	if d.ca != "" || d.cert != "" {
		tc, err := pki.ClientTLSConfig(d.ca, d.cert, d.key)
		if err != nil {
			cancel()
			return nil, err
		}
		client = &http.Client{Transport: &http.Transport{TLSClientConfig: tc, Proxy: nil, ForceAttemptHTTP2: true}}
	}
	resp, err := client.Do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelBody{resp.Body, cancel}
	return resp, nil
}

type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error { err := b.ReadCloser.Close(); b.cancel(); return err }

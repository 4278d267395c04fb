package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/edgefl/edgefl/internal/cli"
	"github.com/edgefl/edgefl/node/aggregator"
	"github.com/edgefl/edgefl/node/broker"
	"github.com/edgefl/edgefl/proto/pki"
	"github.com/edgefl/edgefl/proto/wire"
)

// runPKI makes a site PKI (`broker-agg pki`).
func runPKI(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("pki", stderr, `usage: broker-agg pki [flags]
       broker-agg pki passwd --file FILE --user ID [--password-stdin]

Makes (or extends) a site PKI for mutual TLS with ECDSA P-256 keys:
  DIR/ca.crt, ca.key              the CA (made once, reused; keep ca.key offline)
  DIR/server.crt, server.key      the broker's certificate for --hosts (serving, and dialing a
                                  NATS cluster's routes: deploy/nats)
  DIR/clients/ID.crt, ID.key      one per site (CN = site id) and the aggregator
Keys are written with mode 0600. Run the embedded broker with
  broker-agg run --tls-cert DIR/server.crt --tls-key DIR/server.key --tls-client-ca DIR/ca.crt
and give each site its ca.crt, ID.crt and ID.key.

flags:
`)
	dir := fs.String("dir", "pki", "output `DIR`")
	hosts := fs.String("hosts", "localhost,127.0.0.1,::1", "comma-separated host names and IP addresses of the broker (server certificate)")
	clients := fs.String("clients", "", "comma-separated site ids to issue client certificates for (CN = id)")
	aggID := fs.String("aggregator-id", aggregator.DefaultClientID, "the aggregator's id, also issued a client certificate (for an external broker with mutual TLS; \"\": none)")
	caName := fs.String("ca-name", "edgefl site CA", "the CA's common name")
	days := fs.Int("days", int(pki.DefaultLeafValidity/(24*time.Hour)), "validity of the server and client certificates in days")
	force := fs.Bool("force", false, "re-issue existing server and client certificates (never the CA)")
	var cfgFlag string
	if err := parseFlags(fs, args, &cfgFlag); err != nil {
		return err
	}
	ids := splitList(*clients)
	if *aggID != "" {
		ids = append(ids, *aggID)
	}
	if *days <= 0 {
		return errors.New("--days: want > 0")
	}
	written, err := pki.MakeSite(pki.SiteOptions{Dir: *dir, CAName: *caName, Hosts: splitList(*hosts), Clients: ids,
		Validity: time.Duration(*days) * 24 * time.Hour, Force: *force})
	for _, p := range written {
		fmt.Fprintln(stdout, "wrote", p)
	}
	if err != nil {
		return err
	}
	if len(written) == 0 {
		fmt.Fprintln(stdout, "nothing to do: every certificate exists (use --force to re-issue)")
	}
	return nil
}

// runPasswd adds or replaces a site in a Mosquitto-format password file
// (`broker-agg pki passwd`).
func runPasswd(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("pki passwd", stderr, `usage: broker-agg pki passwd --file FILE --user ID [--password-stdin]

Adds a site to a Mosquitto-format password file for the embedded broker's
--password-file (or Mosquitto's), or replaces its password. Without
--password-stdin a random password is generated and printed once: give it to
the site (its password_file).

flags:
`)
	file := fs.String("file", "", "password `FILE` (created with mode 0600)")
	user := fs.String("user", "", "site `ID` (username = MQTT client id = topic id)")
	fromStdin := fs.Bool("password-stdin", false, "read the password from the first line of standard input (default: generate one and print it)")
	iters := fs.Int("iterations", broker.DefaultIterations, "PBKDF2-SHA512 iterations")
	var cfgFlag string
	if err := parseFlags(fs, args, &cfgFlag); err != nil {
		return err
	}
	if *file == "" || *user == "" {
		return errors.New("--file and --user are required")
	}
	if err := wire.ValidID(*user); err != nil {
		return fmt.Errorf("--user: %w", err)
	}
	var pw string
	if *fromStdin {
		line, err := bufio.NewReader(io.LimitReader(os.Stdin, 4096)).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("reading the password: %w", err)
		}
		pw = strings.TrimRight(line, "\r\n")
		if pw == "" {
			return errors.New("empty password on standard input")
		}
	} else {
		b := make([]byte, 18)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		pw = base64.RawURLEncoding.EncodeToString(b)
	}
	if err := broker.SetPassword(*file, *user, pw, *iters); err != nil {
		return err
	}
	if !*fromStdin {
		fmt.Fprintf(stdout, "%s\n", pw)
		fmt.Fprintf(stderr, "password of %s set in %s (printed above once; give it to the site)\n", *user, filepath.Clean(*file))
	}
	return nil
}

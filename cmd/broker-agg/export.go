package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/edgefl/edgefl/data/bundle"
	"github.com/edgefl/edgefl/internal/cli"
	"github.com/edgefl/edgefl/node/aggregator"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/storage"
)

// runExport writes the model bundle of a stored round (`broker-agg
// export`): from the state file when no daemon holds it, else from the
// running daemon's /bundle endpoint, as `status` does.
func runExport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("export", stderr, `usage: broker-agg export --state FILE [--round N] --out FILE

Writes the model bundle (model, schema, fitted preprocessing, federated
evaluation, provenance; see package bundle) of a round stored by a run with
--schema. A run with --dp records its privacy guarantee at that round
(epsilon, delta, clip, noise, sampling rates) instead of the evaluation, and
export prints it. Works while the daemon runs (it asks the daemon's /bundle
endpoint). Use the bundle with edge-agent evaluate / predict.

flags:
`)
	state := fs.String("state", "broker-agg.db", "the daemon's state `FILE`")
	round := fs.Int("round", -1, "the eval round `N` to export: the global model after N aggregations with the sites' evaluation reports of that round (default: the final bundle once the run has finished, else the newest model)")
	out := fs.String("out", "", "write the bundle to `FILE` (required; written atomically)")
	addr := fs.String("addr", "", "ask the running daemon at `ADDR` (its --metrics address) instead of reading the file (default: read the file; if the daemon holds it, ask "+DefaultMetricsAddr+")")
	var dc daemonClient
	dc.register(fs)
	var cfgFlag string
	if err := parseFlags(fs, args, &cfgFlag); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("--out: the bundle's file is required")
	}
	if *round < -1 {
		return fmt.Errorf("--round %d: want a round number >= 0", *round)
	}
	var raw []byte
	var err error
	if *addr != "" {
		raw, err = fetchBundle(ctx, &dc, *addr, *round)
	} else {
		raw, err = exportFromFile(*state, *round)
		if errors.Is(err, storage.ErrLocked) {
			var herr error
			var answered *daemonAnswer
			if raw, herr = fetchBundle(ctx, &dc, DefaultMetricsAddr, *round); errors.As(herr, &answered) {
				return herr // the daemon answered: e.g. the round is not stored
			} else if herr != nil {
				return fmt.Errorf("%s is held by a running daemon and its /bundle endpoint did not answer (%v): pass its --metrics address as --addr", *state, herr)
			}
			err = nil
		}
	}
	if err != nil {
		return err
	}
	b, err := bundle.Unmarshal(raw)
	if err != nil {
		return fmt.Errorf("the exported bundle: %w", err)
	}
	if err := bundle.WriteFileAtomic(*out, raw); err != nil {
		return err
	}
	ev := "no evaluation"
	if e := b.Evaluation; e != nil {
		ev = fmt.Sprintf("evaluation of %d sites, n = %d, loss %.4g", len(e.Sites), e.Federation.N, e.Federation.Loss)
		if e.Federation.Confusion != nil {
			ev += fmt.Sprintf(", accuracy %.4f", e.Federation.Accuracy)
		}
	}
	if p := b.Privacy; p != nil {
		ev = "no evaluation: outside the privacy guarantee"
	}
	fmt.Fprintf(stdout, "wrote %s: round %d of run %s (%s), %d bytes, digest %.16s\n", *out, b.Provenance.Round, b.Provenance.RunID, ev, len(raw), b.Digest)
	if p := b.Privacy; p != nil {
		fmt.Fprintf(stdout, "privacy: %s\n", p)
	}
	return nil
}

func exportFromFile(path string, round int) ([]byte, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("--state: %w", err)
	}
	s, err := aggstore.OpenAgg(path, storage.Options{LockTimeout: 500 * time.Millisecond})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	raw, _, err := aggregator.ExportBundle(s, round, time.Now(), version)
	return raw, err
}

func fetchBundle(ctx context.Context, dc *daemonClient, addr string, round int) ([]byte, error) {
	p := "/bundle"
	if round >= 0 {
		p += "?round=" + url.QueryEscape(strconv.Itoa(round))
	}
	resp, err := dc.get(ctx, addr, p, 30*time.Second)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, bundle.MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s/bundle: %w", addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &daemonAnswer{strings.TrimSpace(string(b))}
	}
	return b, nil
}

// daemonAnswer is the running daemon's one-line refusal.
type daemonAnswer struct{ msg string }

func (e *daemonAnswer) Error() string { return e.msg }

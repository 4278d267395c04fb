package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgefl/edgefl/aggregator"
	"github.com/edgefl/edgefl/dp"
	"github.com/edgefl/edgefl/evaluate"
	"github.com/edgefl/edgefl/internal/cli"
	"github.com/edgefl/edgefl/storage"
)

// runStatus prints the federation's current round and clients: from the
// state file when no daemon holds it, else from the running daemon's
// /status endpoint (bbolt lets one process at a time open the file).
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("status", stderr, "usage: broker-agg status [--state FILE | --addr HOST:PORT|https://HOST:PORT] [--json]\n\nPrints the current round and each client's last-seen and participation; from a\nrunning daemon (--addr) also the run's configuration, recent rounds and each\nsite's figures: the data behind its console.\n\nflags:\n")
	state := fs.String("state", "broker-agg.db", "the daemon's state `FILE`")
	addr := fs.String("addr", "", "ask the running daemon at `ADDR` (its --metrics address) instead of reading the file (default: read the file; if the daemon holds it, ask "+DefaultMetricsAddr+")")
	asJSON := fs.Bool("json", false, "print JSON (from a running daemon: the console's data, /status)")
	var dc daemonClient
	dc.register(fs)
	var cfgFlag string
	if err := parseFlags(fs, args, &cfgFlag); err != nil {
		return err
	}
	var st aggregator.Status
	var err error
	if *addr != "" {
		st, err = fetchStatus(ctx, &dc, *addr)
	} else {
		st, err = readStatusFile(*state)
		if errors.Is(err, storage.ErrLocked) {
			var herr error
			if st, herr = fetchStatus(ctx, &dc, DefaultMetricsAddr); herr != nil {
				return fmt.Errorf("%s is held by a running daemon and its status endpoint did not answer (%v): pass its --metrics address as --addr", *state, herr)
			}
			err = nil
		}
	}
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	return printStatus(stdout, st, time.Now())
}

func readStatusFile(path string) (aggregator.Status, error) {
	if _, err := os.Stat(path); err != nil {
		return aggregator.Status{}, fmt.Errorf("--state: %w", err)
	}
	s, err := storage.OpenAgg(path, storage.Options{LockTimeout: 500 * time.Millisecond})
	if err != nil {
		return aggregator.Status{}, err
	}
	defer s.Close()
	return aggregator.ReadStatus(s)
}

// fetchStatus reads a running daemon's /status: the console's data.
func fetchStatus(ctx context.Context, dc *daemonClient, addr string) (aggregator.Status, error) {
	var st aggregator.Status
	resp, err := dc.get(ctx, addr, "/status?compact=1", 10*time.Second)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return st, fmt.Errorf("%s/status: %s: %s", addr, resp.Status, strings.TrimSpace(string(b)))
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&st); err != nil {
		return st, fmt.Errorf("%s/status: %w", addr, err)
	}
	return st, nil
}

func printStatus(w io.Writer, st aggregator.Status, now time.Time) error {
	if st.Live != nil {
		now = st.Live.Now // the daemon's clock
	}
	fmt.Fprintf(w, "federation %s (%s)  round %d", orDash(st.Federation), orDash(st.Algorithm), st.Round)
	if l := st.Live; l != nil && l.Rounds > 0 {
		fmt.Fprintf(w, " of %d", l.Rounds)
	}
	fmt.Fprintf(w, "  phase %s", st.Phase)
	if st.RoundOpenedAt != nil && st.Phase != aggregator.PhaseFinished {
		fmt.Fprintf(w, " for %s", now.Sub(*st.RoundOpenedAt).Round(time.Second))
	}
	if st.Deadline != nil {
		fmt.Fprintf(w, "  deadline %s (%s)", st.Deadline.UTC().Format(time.RFC3339), rel(*st.Deadline, now))
	}
	if st.RunID != "" {
		fmt.Fprintf(w, "\nrun %s  codec %s, downlink %s", st.RunID, orDash(st.Codec), orDash(st.Downlink))
		if st.Aggregator != "" {
			fmt.Fprintf(w, "  aggregator %s", st.Aggregator)
		}
	}
	if l := st.Live; l != nil {
		fmt.Fprintf(w, "  quorum %d of %d", l.Quorum, l.PerRound)
	}
	fmt.Fprintf(w, "\nselected %d: %s\nreceived %d: %s\n", len(st.Selected), orDash(strings.Join(st.Selected, " ")),
		len(st.Received), orDash(strings.Join(st.Received, " ")))
	c := st.Counters
	fmt.Fprintf(w, "rounds closed %d  accepted %d (late %d, partial %d)  stragglers %d  extensions %d  reselections %d\n",
		c.RoundsClosed, c.Accepted, c.AcceptedLate, c.PartialUpdates, c.Stragglers, c.Extensions, c.Reselections)
	if p := st.Privacy; p != nil {
		budget := "no budget"
		if p.Budget > 0 {
			budget = fmt.Sprintf("budget %g", p.Budget)
		}
		fmt.Fprintf(w, "differential privacy (%s): epsilon %.4g at delta %g after %d rounds (%s; clip %g, noise multiplier %g); per site without amplification %.4g (the most rounds one site contributed to: %d)",
			p.Mode, p.Epsilon, p.Delta, p.Rounds, budget, p.Clip, p.Noise, p.EpsilonUnamplified, p.SiteRounds)
		switch {
		case p.FixedRounds:
			fmt.Fprint(w, "; rounds close at their deadline (--dp-fixed-rounds): their timing is covered")
		case p.Mode == dp.Central.String():
			fmt.Fprint(w, "; round timing not covered (rounds close when every invited site has reported; --dp-fixed-rounds)")
		}
		if st.Schema == "" && st.StopReason != "" {
			fmt.Fprintf(w, "; run ended: %s", st.StopReason) // printFedStatus says it with a schema
		}
		fmt.Fprintln(w)
	}
	if sa := st.SecAgg; sa != nil {
		fmt.Fprintf(w, "secure aggregation: phase %s, session %d  messages %d  aborted sessions %d  (threshold %d, clip %g, scale 2^%d)\n",
			sa.Phase, sa.Attempt, sa.Messages, sa.Aborts, sa.Threshold, sa.Clip, sa.ScaleBits)
		if sa.LastAbort != "" {
			fmt.Fprintf(w, "  last abort: %s\n", sa.LastAbort)
		}
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CLIENT\tONLINE\tLAST SEEN\tSAMPLES\tUPDATES\tLAST ROUND\tTHIS ROUND")
	for _, ci := range st.Clients {
		seen := "-"
		if ci.LastSeen != nil {
			seen = ci.LastSeen.UTC().Format("2006-01-02 15:04:05") + " (" + rel(*ci.LastSeen, now) + ")"
		}
		this := "-"
		switch {
		case ci.Reported:
			this = "reported"
		case ci.Selected:
			this = "waiting"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\n", ci.ID, yesNo(ci.Online), seen, ci.Samples, ci.Participation, ci.LastRound, this)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	printDuplicates(w, st.DuplicateInstances)
	if err := printLive(w, st); err != nil {
		return err
	}
	return printFedStatus(w, st)
}

// printLive prints what only a running daemon knows: each site's straggled
// and partial rounds, its last work report and rejections, and the last
// rounds of the history.
func printLive(w io.Writer, st aggregator.Status) error {
	l := st.Live
	if l == nil {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "\nsites over the last %d rounds:\n", len(l.History))
	fmt.Fprintln(tw, "CLIENT\tSTRAGGLED\tPARTIAL\tLAST GAMMA\tEPOCHS\tREJECTED")
	for _, ci := range st.Clients {
		gamma, epochs := "-", "-"
		if lw := ci.LastWork; lw != nil {
			gamma, epochs = fmt.Sprintf("%.3g", lw.Gamma), strconv.FormatUint(lw.Epochs, 10)
		}
		var rej []string
		for _, r := range slices.Sorted(maps.Keys(ci.Rejections)) {
			rej = append(rej, fmt.Sprintf("%s %d", r, ci.Rejections[r]))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", ci.ID, ci.Straggled, ci.Partial, gamma, epochs, orDash(strings.Join(rej, ", ")))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	h := l.History
	if len(h) == 0 {
		return nil
	}
	if len(h) > 5 {
		h = h[len(h)-5:]
	}
	fmt.Fprintln(w, "\nrecent rounds:")
	fmt.Fprintln(tw, "ROUND\tPARTICIPANTS\tSTRAGGLERS\tPARTIAL\tBYTES UP\tBYTES DOWN\t||x'-x||")
	opt := func(p *uint64) string {
		if p == nil {
			return "-"
		}
		return strconv.FormatUint(*p, 10)
	}
	for _, r := range h {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\n", r.Round, r.Participants, orDash(strings.Join(r.Stragglers, " ")),
			orDash(strings.Join(r.Partial, " ")), opt(r.BytesUp), opt(r.BytesDown), optG(r.DeltaNorm))
	}
	return tw.Flush()
}

// printFedStatus prints a run's schema, statistics, evaluation, site errors
// and final bundle (nothing for a run without a schema and site errors).
func printFedStatus(w io.Writer, st aggregator.Status) error {
	var errs []string
	for _, ci := range st.Clients {
		if ci.Error != nil {
			errs = append(errs, fmt.Sprintf("  %s: %s: %s", ci.ID, ci.Error.Reason, ci.Error.Message))
		}
	}
	if len(errs) > 0 {
		fmt.Fprintf(w, "\nsite errors:\n%s\n", strings.Join(errs, "\n"))
	}
	if st.Schema == "" {
		return nil
	}
	if len(st.StatisticsSites) == 0 && st.Model != nil {
		// A fitted transform has at least one statistics site.
		fmt.Fprintf(w, "\nschema %.16s  preprocessing declared by the schema (no statistics phase)\n", st.Schema)
	} else {
		fmt.Fprintf(w, "\nschema %.16s  statistics from %d sites: %s\n", st.Schema, len(st.StatisticsSites), orDash(strings.Join(st.StatisticsSites, " ")))
	}
	if r := st.StatisticsReview; r != nil && len(r.Findings) > 0 {
		stopped := ""
		if r.Stopped {
			stopped = "; the run stopped before round 1 (--stats-review): fix the schema and start a new run, or restart without --stats-review"
		}
		fmt.Fprintf(w, "statistics review: %d findings%s:\n  %s\n", len(r.Findings), stopped, strings.Join(r.Findings, "\n  "))
	}
	if m := st.Model; m != nil {
		fmt.Fprintf(w, "model %s, %d inputs after the federation's preprocessing", m.Kind, m.Inputs)
		if m.Classes > 0 {
			fmt.Fprintf(w, ", %d classes", m.Classes)
		}
		fmt.Fprintln(w)
	}
	if ev := st.Evaluation; ev != nil {
		only := ""
		if st.Privacy != nil {
			only = " (the operator's only under --dp: no bundle carries it)"
		}
		fmt.Fprintf(w, "evaluation of round %d (the model after %d aggregations) on the sites' held-out rows%s:\n", ev.Round, ev.Round, only)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		cls := ev.Federation.Confusion != nil
		if cls {
			fmt.Fprintln(tw, "SITE\tN\tLOSS\tACCURACY\tBALANCED\tAUC")
		} else {
			fmt.Fprintln(tw, "SITE\tN\tLOSS\tRMSE\tR2")
		}
		row := func(name string, r evaluate.Report) {
			if cls {
				fmt.Fprintf(tw, "%s\t%d\t%.4g\t%.4f\t%.4f\t%s\n", name, r.N, r.Loss, r.Accuracy, r.BalancedAccuracy, optF(r.AUC))
			} else {
				fmt.Fprintf(tw, "%s\t%d\t%.4g\t%.4g\t%s\n", name, r.N, r.Loss, r.RMSE, optF(r.R2))
			}
		}
		for _, id := range slices.Sorted(maps.Keys(ev.Sites)) {
			row(id, ev.Sites[id])
		}
		row("federation", ev.Federation)
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if st.StopReason != "" {
		fmt.Fprintf(w, "run ended: %s\n", st.StopReason)
	}
	if b := st.FinalBundle; b != nil {
		fmt.Fprintf(w, "final bundle: round %d, %d bytes, digest %.16s (broker-agg export --state FILE --out FILE)\n", b.Round, b.Bytes, b.Digest)
	}
	return nil
}

// printDuplicates lists the sites a second installation uses.
func printDuplicates(w io.Writer, ds []aggregator.DuplicateInstance) {
	if len(ds) == 0 {
		return
	}
	fmt.Fprintf(w, "\nsecond installations with one site id (set aside; a cloned gateway? give each its own site_id):\n")
	for _, d := range ds {
		var others []string
		for _, o := range d.Others {
			others = append(others, fmt.Sprintf("%s (last seen %s)", o.ID, o.LastSeen.UTC().Format(time.RFC3339)))
		}
		fmt.Fprintf(w, "  %s: held by instance %s; set aside: %s, %d messages\n", d.Site, d.Instance, strings.Join(others, ", "), d.SetAside)
	}
}

func optF(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.4f", *v)
}

func rel(t, now time.Time) string {
	d := now.Sub(t).Round(time.Second)
	if d < 0 {
		return "in " + (-d).String()
	}
	return d.String() + " ago"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func optG(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.4g", *v)
}

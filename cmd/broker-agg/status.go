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

	"github.com/edgefl/edgefl/internal/cli"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/learn/evaluate"
	"github.com/edgefl/edgefl/node/aggregator"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/wire"
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
	s, err := aggstore.OpenAgg(path, storage.Options{LockTimeout: 500 * time.Millisecond})
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

// printStatus prints a federation's status (a daemon's, or a state file's).
func printStatus(w io.Writer, st aggregator.Status, now time.Time) error {
	if st.Live != nil {
		now = st.Live.Now // the daemon's clock
	}
	printRound(w, st, now)
	if st.Privacy != nil {
		printPrivacy(w, st)
	}
	if st.SecAgg != nil {
		printSecAgg(w, st.SecAgg)
	}
	if err := printClients(w, st, now); err != nil {
		return err
	}
	printAbsent(w, st, now)
	printDuplicates(w, st.DuplicateInstances)
	if err := printFedSplitScreen(w, st); err != nil {
		return err
	}
	if err := printLive(w, st); err != nil {
		return err
	}
	return printFedStatus(w, st)
}

// printRound prints the round header: federation, round and phase, the
// run, the sites selected and received, and the round counters.
func printRound(w io.Writer, st aggregator.Status, now time.Time) {
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
		if st.ServerOpt != "" {
			fmt.Fprintf(w, "  server-opt %s", st.ServerOpt)
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
}

// printPrivacy prints the run's differential privacy: epsilon spent, what
// the round timing and the sampling cover, and how the run ended.
func printPrivacy(w io.Writer, st aggregator.Status) {
	p := st.Privacy
	budget := "no budget"
	if p.Budget > 0 {
		budget = fmt.Sprintf("budget %g", p.Budget)
	}
	fmt.Fprintf(w, "differential privacy (%s): epsilon %.4g at delta %g after %d rounds (%s; clip %g, noise multiplier %g); per site without amplification %.4g (the most rounds one site contributed to: %d)",
		p.Mode, p.Epsilon, p.Delta, p.Rounds, budget, p.Clip, p.Noise, p.EpsilonUnamplified, p.SiteRounds)
	switch {
	case p.FixedRounds:
		fmt.Fprint(w, "; rounds close at their deadline (--dp-fixed-rounds): their timing is covered")
	case p.Mode == dp.Central.String() && !p.Amplified:
		fmt.Fprint(w, "; rounds close when every invited site has reported (--dp-fixed-rounds=false): their timing tells the draw's size")
	case p.Mode == dp.Central.String():
		fmt.Fprint(w, "; round timing not covered (rounds close when every invited site has reported; --dp-fixed-rounds)")
	}
	if p.Amplified {
		fmt.Fprint(w, "; epsilon amplified by Poisson sampling (q < 1 per round)")
	} else {
		fmt.Fprint(w, "; epsilon charged at q = 1 every round (no amplification)")
	}
	if p.HoldsAgainst != "" {
		fmt.Fprintf(w, "; epsilon holds against %s", p.HoldsAgainst)
	}
	if st.Schema == "" && st.StopReason != "" {
		fmt.Fprintf(w, "; run ended: %s", st.StopReason) // printFedStatus says it with a schema
	}
	fmt.Fprintln(w)
}

// printSecAgg prints the secure aggregation session and its trust model.
func printSecAgg(w io.Writer, sa *aggregator.SecAggStatus) {
	fmt.Fprintf(w, "secure aggregation: phase %s, session %d  messages %d  aborted sessions %d  (threshold %d, clip %g, scale 2^%d)\n",
		sa.Phase, sa.Attempt, sa.Messages, sa.Aborts, sa.Threshold, sa.Clip, sa.ScaleBits)
	switch sa.Model {
	case aggregator.SecAggModelSigned:
		fmt.Fprintf(w, "  model: signed (all %d sites of the last key list signed their keys; each site checks every key against the federation CA)\n", sa.ListedKeys)
	case aggregator.SecAggModelHBC:
		fmt.Fprintf(w, "  model: honest-but-curious aggregator (%d of %d sites of the last key list signed their keys)\n", sa.SignedKeys, sa.ListedKeys)
	}
	if sa.LastAbort != "" {
		fmt.Fprintf(w, "  last abort: %s\n", sa.LastAbort)
	}
}

// printClients prints the table of sites: online, last seen, samples,
// updates and this round's part.
func printClients(w io.Writer, st aggregator.Status, now time.Time) error {
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
		online := yesNo(ci.Online)
		switch {
		case ci.LivenessUnknown:
			online = "unknown"
		case ci.NeverConnected:
			online = "never connected"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\n", ci.ID, online, seen, ci.Samples, ci.Participation, ci.LastRound, this)
	}
	return tw.Flush()
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
	fmt.Fprintf(w, "(PARTIAL: rounds whose update %s)\n", wire.PartialMeans)
	printSamplesCapped(w, st.Clients)
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
	printSiteErrors(w, st.Clients)
	if st.Schema == "" {
		return nil
	}
	printSchema(w, st)
	if st.Evaluation != nil {
		if err := printEvaluation(w, st.Evaluation, st.Privacy != nil); err != nil {
			return err
		}
	}
	printRunEnd(w, st)
	return nil
}

// printSiteErrors prints the errors the sites reported.
func printSiteErrors(w io.Writer, clients []aggregator.ClientInfo) {
	var errs []string
	for _, ci := range clients {
		if ci.Error != nil {
			errs = append(errs, fmt.Sprintf("  %s: %s: %s", ci.ID, ci.Error.Reason, ci.Error.Message))
		}
	}
	if len(errs) > 0 {
		fmt.Fprintf(w, "\nsite errors:\n%s\n", strings.Join(errs, "\n"))
	}
}

// printSchema prints the run's schema, the statistics phase and its
// review, the sites left out of the preprocessing and the model.
func printSchema(w io.Writer, st aggregator.Status) {
	if len(st.StatisticsSites) == 0 && st.Model != nil {
		// A fitted transform has at least one statistics site.
		fmt.Fprintf(w, "\nschema %.16s  preprocessing declared by the schema (no statistics phase)\n", st.Schema)
	} else {
		fmt.Fprintf(w, "\nschema %.16s  statistics from %d sites: %s\n", st.Schema, len(st.StatisticsSites), orDash(strings.Join(st.StatisticsSites, " ")))
	}
	var late []string
	for _, ci := range st.Clients {
		if ci.NotInPreprocessing {
			late = append(late, ci.ID)
		}
	}
	if len(late) > 0 {
		fmt.Fprintf(w, "not in the preprocessing (joined after the statistics phase; trained with the others' preprocessing): %s\n", strings.Join(late, " "))
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
}

// printEvaluation prints the evaluation of the last model on the sites'
// held-out rows, a row per site and the federation's, marking the rows
// below the baseline; underDP says the run is under --dp.
func printEvaluation(w io.Writer, ev *aggregator.EvalStatus, underDP bool) error {
	only := ""
	if underDP {
		only = " (the operator's only under --dp: no bundle carries it)"
	}
	fmt.Fprintf(w, "evaluation of round %d (the model after %d aggregations) on the sites' held-out rows%s:\n", ev.Round, ev.Round, only)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	cls := ev.Federation.Confusion != nil
	if cls {
		fmt.Fprintln(tw, "SITE\tN\tLOSS\tACCURACY\tBALANCED\tBASELINE\tAUC\t")
	} else {
		fmt.Fprintln(tw, "SITE\tN\tLOSS\tRMSE\tR2\t")
	}
	below := 0
	row := func(name string, r evaluate.Report) {
		mark := ""
		if b := r.WithBaseline().Baseline; b != nil && !b.Beaten {
			mark = "below baseline"
			below++
		}
		if cls {
			base := "-"
			if b := r.WithBaseline().Baseline; b != nil {
				base = fmt.Sprintf("%.4f", b.Accuracy)
			}
			fmt.Fprintf(tw, "%s\t%d\t%.4g\t%.4f\t%.4f\t%s\t%s\t%s\n", name, r.N, r.Loss, r.Accuracy, r.BalancedAccuracy, base, optF(r.AUC), mark)
		} else {
			fmt.Fprintf(tw, "%s\t%d\t%.4g\t%.4g\t%s\t%s\n", name, r.N, r.Loss, r.RMSE, optF(r.R2), mark)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(ev.Sites)) {
		row(id, ev.Sites[id])
	}
	row("federation", ev.Federation)
	if err := tw.Flush(); err != nil {
		return err
	}
	if below > 0 && cls {
		fmt.Fprintln(w, "below baseline: the accuracy does not beat always predicting the rows' majority class (BASELINE)")
	} else if below > 0 {
		fmt.Fprintln(w, "below baseline: R2 is not above 0, no better than predicting the rows' own mean")
	}
	return nil
}

// printRunEnd prints why the run ended and its final bundle.
func printRunEnd(w io.Writer, st aggregator.Status) {
	if st.StopReason != "" {
		fmt.Fprintf(w, "run ended: %s\n", st.StopReason)
	}
	if b := st.FinalBundle; b != nil {
		fmt.Fprintf(w, "final bundle: round %d, %d bytes, digest %.16s (broker-agg export --state FILE --out FILE)\n", b.Round, b.Bytes, b.Digest)
		if len(b.EvalSites) > 0 || len(b.EvalMissing) > 0 {
			fmt.Fprintf(w, "  its evaluation covers %d sites: %s", len(b.EvalSites), orDash(strings.Join(b.EvalSites, " ")))
			if len(b.EvalMissing) > 0 {
				fmt.Fprintf(w, "; awaited without a report by its deadline: %s", strings.Join(b.EvalMissing, " "))
			}
			fmt.Fprintln(w)
		}
	}
}

// printAbsent says why sites are absent: the aggregator's own broker
// connection, the broker's refusals (roster sites and identities that are
// not sites), a statistics phase past its deadline below quorum.
func printAbsent(w io.Writer, st aggregator.Status, now time.Time) {
	if b := st.Broker; b != nil && !b.Connected {
		fmt.Fprintf(w, "\nthe aggregator is NOT connected to the broker %s", b.URL)
		if b.LastError != "" {
			fmt.Fprintf(w, ": %s", b.LastError)
		}
		fmt.Fprintf(w, " (%d failed attempts); the sites' liveness is unknown\n", b.ConnectFailures)
	}
	var refused []string
	for _, ci := range st.Clients {
		if r := ci.LastRefusal; r != nil {
			refused = append(refused, fmt.Sprintf("  %s: %s (%s, %d times)", ci.ID, r.Reason, rel(r.At, now), r.Count))
		}
	}
	for _, r := range st.Refused {
		id := r.ID
		if id == "" {
			id = "(no identity)"
		}
		refused = append(refused, fmt.Sprintf("  %s (not a site): %s (%s, %d times)", id, r.Reason, rel(r.At, now), r.Count))
	}
	if len(refused) > 0 {
		fmt.Fprintf(w, "\nconnections refused by the broker:\n%s\n", strings.Join(refused, "\n"))
	}
	if o := st.StatisticsOverdue; o != nil {
		fmt.Fprintf(w, "\nstatistics phase past its deadline (%s) below quorum: %d of %d sites sent theirs; missing:\n",
			rel(o.Deadline, now), len(o.Received), o.Quorum)
		for _, m := range o.Missing {
			fmt.Fprintf(w, "  %s: %s\n", m.ID, m.Why)
		}
	}
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

// printSamplesCapped names the sites whose updates were weighted by less
// than the sample count they reported (FedAvg's cap relative to the other
// sites' median, or the site's first reported count), when there are any.
func printSamplesCapped(w io.Writer, clients []aggregator.ClientInfo) {
	var capped []string
	for _, ci := range clients {
		if ci.SamplesCapped > 0 {
			capped = append(capped, fmt.Sprintf("%s %d", ci.ID, ci.SamplesCapped))
		}
	}
	if len(capped) > 0 {
		fmt.Fprintf(w, "sample counts capped (updates weighted below the count they reported): %s\n", strings.Join(capped, ", "))
	}
}

// printFedSplitScreen prints, for each site the robust FedSplit server
// step clipped or left out, in how many rounds, the latest of them and why.
func printFedSplitScreen(w io.Writer, st aggregator.Status) error {
	if st.FedSplitDiverging > 0 {
		fmt.Fprintf(w, "\nWARNING: the FedSplit iterate has been diverging since round %d (the sites' steps of z grow every round); the model is not to be trusted\n", st.FedSplitDiverging)
		if st.Phase == aggregator.PhaseFinished {
			fmt.Fprintf(w, "WARNING: the run ended while the model was diverging: not a normal finish\n")
		}
	}
	if st.FedSplitNonFinite > 0 {
		fmt.Fprintf(w, "\nWARNING: %d FedSplit server steps produced a value that is not a finite number; the model of the round before was kept\n", st.FedSplitNonFinite)
	}
	var any bool
	for _, ci := range st.Clients {
		any = any || ci.FedSplit != nil
	}
	if !any {
		return nil
	}
	fmt.Fprintln(w, "\nFedSplit step bound (sites clipped or left out):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CLIENT\tCLIPPED\tLEFT OUT\tNOW\tRECENT ROUNDS\tLATEST")
	for _, ci := range st.Clients {
		sc := ci.FedSplit
		if sc == nil {
			continue
		}
		now := "in"
		if sc.AsideNow {
			now = "left out"
		}
		var rounds []string
		for _, r := range sc.Rounds {
			rounds = append(rounds, strconv.Itoa(r))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", ci.ID, sc.Clipped, sc.Aside, now, orDash(strings.Join(rounds, " ")), orDash(sc.Reason))
	}
	return tw.Flush()
}

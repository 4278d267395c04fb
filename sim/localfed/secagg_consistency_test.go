package localfed

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/data/sitedata"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/node/agent"
	"github.com/edgefl/edgefl/node/aggregator"
	"github.com/edgefl/edgefl/proto/secagg"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
	"github.com/edgefl/edgefl/testkit/secaggid"
)

// TestSecAggSignedSurvivorSet: signed secure aggregation's consistency
// round over MQTT (the embedded broker, four real agents with certificates
// of one federation CA, threshold 3, the aggregator). Between one site (the
// victim) and the broker a man in the middle, as an operator who controls
// the broker can, lies to the victim alone about the first session's
// survivor set U3:
//
//   - a live site claimed dropped (U3 without site-4, in the consistency
//     and the unmask announcements, its signature left out): the victim would reveal site-3's mask
//     key while the others reveal its self-mask seed. The victim signs the
//     set it was shown; every other survivor finds its signature is not of
//     their U3, the victim finds theirs are not of its own: all refuse
//     before revealing, and the session aborts naming them;
//   - a second survivor set at the unmask (the consistency round honest):
//     the victim refuses, having signed another; the others go on;
//   - a survivor set below the threshold shown in the consistency round:
//     the victim refuses it, and then the true one at the unmask;
//   - the survivors' signatures kept from the victim (a downgrade that skips
//     the round): the victim refuses.
//
// In every case the victim sends no UnmaskResponse in the tampered session,
// its site error (status, log) and its refusal counter say why, and the
// operator's /status shows the refusal (the abort's reason, or the site's
// error); the round completes. Untouched, every site signs U3 (a kind 9
// message) and no session aborts.
func TestSecAggSignedSurvivorSet(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a federation over MQTT")
	}
	const k, thr = 4, 3
	ids := SiteIDs(k, 0)
	victim, live := ids[0], ids[3]
	fed := secaggid.New(t, time.Now(), ids...)
	without := func(v []string, id string) []string {
		return slices.DeleteFunc(slices.Clone(v), func(s string) bool { return s == id })
	}
	for _, tc := range []struct {
		name   string
		tamper func(*testing.T, mqtt.Message, *atomic.Int32) mqtt.Message
		want   string // the victim's refusal; "" = no tampering
		abort  bool   // the session aborts (every site refuses)
	}{
		{"none", nil, "", false},
		{"a live site claimed dropped", survivorsTamper(func(_ wire.SecAggPhase, req *secagg.UnmaskRequest, s []uplink.SignedKey) []uplink.SignedKey {
			req.Survivors = without(req.Survivors, live)
			return without2(s, live) // the live site's signature would give the lie away at once
		}, true), "the survivor set is not consistent: site " + ids[1] + ": the signature is not its certificate's", true},
		{"a second survivor set at the unmask", survivorsTamper(func(phase wire.SecAggPhase, req *secagg.UnmaskRequest, s []uplink.SignedKey) []uplink.SignedKey {
			if phase == wire.SecAggPhase_SECAGG_PHASE_UNMASK {
				req.Survivors = without(req.Survivors, live)
				return without2(s, live)
			}
			return s
		}, true), "shown a second survivor set in the session", false},
		{"a survivor set below the threshold", survivorsTamper(func(phase wire.SecAggPhase, req *secagg.UnmaskRequest, s []uplink.SignedKey) []uplink.SignedKey {
			if phase == wire.SecAggPhase_SECAGG_PHASE_CONSISTENCY {
				req.Survivors = []string{victim, live}
			}
			return s
		}, true), "2 survivors, threshold 3", false},
		{"the survivors' signatures kept from the victim", survivorsTamper(func(phase wire.SecAggPhase, _ *secagg.UnmaskRequest, s []uplink.SignedKey) []uplink.SignedKey {
			if phase == wire.SecAggPhase_SECAGG_PHASE_UNMASK {
				return nil
			}
			return s
		}, true), "0 of 4 survivors signed the survivor set, threshold 3", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fd, sites, log, logs := syntheticSites(t, k, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			var tampered atomic.Int32
			mitms := map[string]*mitmClient{}
			var mu sync.Mutex
			// The cost of the consistency round as the victim sees it: when
			// each phase's announcement arrived, and its size.
			type arrival struct {
				at         time.Time
				size, sigs int
			}
			arrived := map[wire.SecAggPhase]arrival{}
			newClient := func(site string, o *mqtt.ClientOptions) mqtt.Client {
				if site == victim && tc.tamper == nil {
					orig := o.DefaultPublishHandler
					o.SetDefaultPublishHandler(func(c mqtt.Client, m mqtt.Message) {
						if a, err := wire.DecodeRound(m.Payload(), wire.Limits{}); err == nil && a.Secagg != nil && a.Secagg.Attempt == 0 {
							mu.Lock()
							if _, ok := arrived[a.SecaggPhase]; !ok {
								arrived[a.SecaggPhase] = arrival{time.Now(), len(m.Payload()), len(a.SecaggSurvivorSignatures)}
							}
							mu.Unlock()
						}
						orig(c, m)
					})
				}
				if site == victim && tc.tamper != nil {
					orig := o.DefaultPublishHandler
					o.SetDefaultPublishHandler(func(c mqtt.Client, m mqtt.Message) {
						orig(c, tc.tamper(t, m, &tampered))
					})
				}
				c := &mitmClient{Client: mqtt.NewClient(o)}
				mu.Lock()
				mitms[site] = c
				mu.Unlock()
				return c
			}
			siteErrs := map[string]string{}
			var rounds atomic.Int32
			lf, err := Start(ctx, Config{Dir: t.TempDir(), Sites: sites, Seed: 1, Logger: log,
				SecAggIdentity: fed.Get, NewClient: newClient,
				Observe: func(site string, ev agent.Event) {
					var se *sitedata.SiteError
					if ev.Kind == agent.EventSiteError && errors.As(ev.Err, &se) && se.Reason == sitedata.ReasonSecAgg {
						mu.Lock()
						siteErrs[site] += se.Public() + "\n" // every refusal, in order
						mu.Unlock()
					}
				},
				Server: aggregator.ServerConfig{K: k, QuorumFraction: 1, RoundTimeout: 30 * time.Second, Settle: 50 * time.Millisecond,
					MaxReselections: -1, Rounds: 1, Seed: 1, Algorithm: aggregator.AlgoFedAvg,
					Params:  aggregator.Params{Solver: "lbfgs", Gamma: 1e-3, MaxEpochs: 2},
					Model:   model.Spec{Kind: model.KindLogReg, Inputs: fd.D, Classes: fd.Classes, L2: 0.01},
					SecAgg:  &aggregator.SecAggConfig{Clip: 1, Threshold: thr, Timeout: 20 * time.Second},
					OnRound: func(aggregator.RoundReport) { rounds.Add(1) }}})
			if err != nil {
				t.Fatal(err)
			}
			finished := lf.Wait(ctx)
			rec := httptest.NewRecorder()
			lf.Server.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/status", nil))
			victimStats, _ := lf.SiteStats(victim)
			if err := lf.Stop(); err != nil {
				t.Errorf("Stop: %v", err)
			}
			var st aggregator.Status
			if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
				t.Fatal(err)
			}
			if !finished || rounds.Load() != 1 {
				t.Fatalf("finished %v after %d rounds", finished, rounds.Load())
			}
			sa := st.SecAgg
			if sa == nil || sa.Model != aggregator.SecAggModelSigned {
				t.Fatalf("/status secagg %+v: want the signed model", sa)
			}
			// Every site that took part in the first session signed the
			// survivor set it was shown (the consistency round ran).
			for _, id := range ids {
				if id == victim && tc.name == "a survivor set below the threshold" {
					continue // it refused to sign
				}
				if !slices.Contains(mitms[id].sentSecAgg(), [2]uint32{0, wire.SecAggKindSurvivors}) {
					t.Errorf("%s sent no signed survivor set in the first session", id)
				}
			}
			if tc.tamper == nil {
				// Not asserted (a measurement): the consistency round's
				// extra phase and bytes, K = 4.
				var sent int
				for _, b := range mitms[victim].sent {
					if m, err := wire.DecodeSecAgg(b, wire.Limits{}); err == nil && m.Kind == wire.SecAggKindSurvivors {
						sent = len(b)
					}
				}
				c, u, mk := arrived[wire.SecAggPhase_SECAGG_PHASE_CONSISTENCY], arrived[wire.SecAggPhase_SECAGG_PHASE_UNMASK], arrived[wire.SecAggPhase_SECAGG_PHASE_MASKED]
				t.Logf("consistency round, K = %d: the site's signed survivor set %d bytes; the consistency announcement %d bytes; the unmask announcement %d bytes, of which %d of survivor signatures; masked -> consistency %v, consistency -> unmask announcement %v",
					k, sent, c.size, u.size, u.sigs, c.at.Sub(mk.at).Round(time.Millisecond), u.at.Sub(c.at).Round(time.Millisecond))
				if sa.Aborts != 0 || len(siteErrs) != 0 {
					t.Fatalf("untouched: %d sessions aborted (%s), site errors %v", sa.Aborts, sa.LastAbort, siteErrs)
				}
				return
			}
			if tampered.Load() == 0 {
				t.Fatal("nothing was tampered with")
			}
			mu.Lock()
			got := siteErrs[victim]
			mu.Unlock()
			if !strings.Contains(got, "unmask refused") || !strings.Contains(got, tc.want) {
				t.Fatalf("the victim's site error %q, want %q", got, tc.want)
			}
			if victimStats.SecAggRefusals == 0 {
				t.Fatalf("the victim's counters %+v: no secagg refusal counted", victimStats)
			}
			if !strings.Contains(logs.String(), "this site cannot take part") {
				t.Fatal("no site log line says the session was refused")
			}
			for _, m := range mitms[victim].sentSecAgg() {
				if m[0] == 0 && m[1] == wire.SecAggKindUnmaskResponse {
					t.Fatal("the victim sent an UnmaskResponse in the tampered session")
				}
			}
			t.Logf("the operator's view: %d aborts, last %q; the victim's error %q", sa.Aborts, sa.LastAbort, got)
			if tc.abort {
				if sa.Aborts != 1 || !strings.Contains(sa.LastAbort, "refused by ") || !strings.Contains(sa.LastAbort, victim+": ") ||
					!strings.Contains(sa.LastAbort, ids[1]+": ") || !strings.Contains(sa.LastAbort, "the survivor set is not consistent") {
					t.Fatalf("/status secagg: %d aborts, last %q; want one naming the refusals of the survivor set", sa.Aborts, sa.LastAbort)
				}
				if !strings.Contains(logs.String(), "secure aggregation aborted") {
					t.Fatal("no aggregator log line says the session aborted")
				}
				for _, id := range ids {
					for _, m := range mitms[id].sentSecAgg() {
						if m[0] == 0 && m[1] == wire.SecAggKindUnmaskResponse {
							t.Fatalf("%s revealed shares in the session whose survivor set was a lie", id)
						}
					}
				}
				return
			}
			// The others went on without the victim: the operator sees
			// its refusal in the site's status.
			if sa.Aborts != 0 {
				t.Fatalf("/status secagg: %d aborts (%s), want none (t sites remained)", sa.Aborts, sa.LastAbort)
			}
			var seen bool
			for _, c := range st.Clients {
				if c.ID == victim && c.Error != nil && strings.Contains(c.Error.Message, "the survivor set is not consistent") {
					seen = true
				}
			}
			if !seen {
				t.Fatalf("/status clients %+v: the victim's refusal is not shown", st.Clients)
			}
		})
	}
}

func without2(s []uplink.SignedKey, id string) []uplink.SignedKey {
	return slices.DeleteFunc(slices.Clone(s), func(k uplink.SignedKey) bool { return k.ID == id })
}

// survivorsTamper rewrites the first session's CONSISTENCY and UNMASK
// announcements for one site: their UnmaskRequest (U3) and the survivor
// signatures relayed with the unmask, replaced by tamper's result when
// sigsToo (else they pass unchanged: the lie is in U3 alone).
func survivorsTamper(tamper func(wire.SecAggPhase, *secagg.UnmaskRequest, []uplink.SignedKey) []uplink.SignedKey, sigsToo bool) func(*testing.T, mqtt.Message, *atomic.Int32) mqtt.Message {
	return func(t *testing.T, m mqtt.Message, n *atomic.Int32) mqtt.Message {
		a, err := wire.DecodeRound(m.Payload(), wire.Limits{})
		if err != nil || a.Secagg == nil || a.Secagg.Attempt != 0 ||
			(a.SecaggPhase != wire.SecAggPhase_SECAGG_PHASE_UNMASK && a.SecaggPhase != wire.SecAggPhase_SECAGG_PHASE_CONSISTENCY) {
			return m
		}
		p, err := secagg.Decode(a.SecaggBroadcast)
		if err != nil {
			t.Errorf("the unmask request: %v", err)
			return m
		}
		req := p.(*secagg.UnmaskRequest)
		var sigs []uplink.SignedKey
		if len(a.SecaggSurvivorSignatures) > 0 {
			if sigs, err = uplink.DecodeSignedKeys(a.SecaggSurvivorSignatures); err != nil {
				t.Errorf("the survivor signatures: %v", err)
				return m
			}
		}
		out := tamper(a.SecaggPhase, req, sigs)
		a.SecaggBroadcast = secagg.Encode(req)
		if sigsToo {
			a.SecaggSurvivorSignatures = nil
			if len(out) > 0 {
				a.SecaggSurvivorSignatures = uplink.EncodeSignedKeys(out)
			}
		}
		return reencode(t, m, a, n)
	}
}

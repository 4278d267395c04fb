package localfed

import (
	"context"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"net/http/httptest"
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

// tamperedMsg is a message as a man in the middle hands it to one site.
type tamperedMsg struct {
	mqtt.Message
	payload []byte
}

func (m tamperedMsg) Payload() []byte { return m.payload }

// mitmClient stands between one site and the broker, as an aggregator's
// operator who controls the (embedded) broker can: every message the site
// receives goes through tamper first, and what the site publishes is
// recorded.
type mitmClient struct {
	mqtt.Client
	mu   sync.Mutex
	sent [][]byte
}

func (c *mitmClient) Publish(topic string, qos byte, retained bool, payload any) mqtt.Token {
	if b, ok := payload.([]byte); ok {
		c.mu.Lock()
		c.sent = append(c.sent, append([]byte(nil), b...))
		c.mu.Unlock()
	}
	return c.Client.Publish(topic, qos, retained, payload)
}

// sentSecAgg lists the (attempt, kind) of every secagg message the site
// published.
func (c *mitmClient) sentSecAgg() [][2]uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out [][2]uint32
	for _, b := range c.sent {
		if m, err := wire.DecodeSecAgg(b, wire.Limits{}); err == nil {
			out = append(out, [2]uint32{m.Attempt, m.Kind})
		}
	}
	return out
}

// TestSecAggSignedEquivocation: signed secure aggregation over MQTT (the
// embedded broker, real agents with their certificates from one federation
// CA, the aggregator). Between one site (the victim) and the broker, a man
// in the middle rewrites the first session's key list as an equivocating
// aggregator would, for that site only: a substituted key of another site
// (whose box the operator could then open), an invented site whose key is
// signed by a certificate of the operator's own CA, a site's slot filled
// with another site's genuine signed key, or the signatures stripped
// (a downgrade to the unsigned model). The victim refuses the key list
// before sending any share, says why in its status, and the session
// aborts with the reason in the operator's status; the next session,
// untouched, completes the round. Without tampering the run's sessions
// report the signed model.
func TestSecAggSignedEquivocation(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a federation over MQTT")
	}
	ids := SiteIDs(4, 0)
	victim := ids[0]
	now := time.Now()
	fed := secaggid.New(t, now, ids...)
	rogue := secaggid.New(t, now, "site-x")
	type tamperFn func(t *testing.T, m mqtt.Message, n *atomic.Int32) mqtt.Message
	for _, tc := range []struct {
		name   string
		k, t   int // sites, secagg threshold
		tamper tamperFn
		want   string // in the abort reason; "" = no tampering
	}{
		{"none", 3, 3, nil, ""},
		{"forged key for one site", 3, 3, keyListTamper(func(t *testing.T, kl *secagg.KeyList, s []uplink.SignedKey) []uplink.SignedKey {
			if _, err := crand.Read(kl.Sites[1].EncKey[:]); err != nil {
				t.Fatal(err)
			}
			return s
		}), "key list refused: uplink: secure aggregation: the key list is not signed by its sites: site " + ids[1] + ": the signature is not its certificate's"},
		{"invented site signed by another CA", 3, 3, keyListTamper(func(t *testing.T, kl *secagg.KeyList, s []uplink.SignedKey) []uplink.SignedKey {
			x := kl.Sites[1]
			x.ID = "site-x"
			if _, err := crand.Read(x.EncKey[:]); err != nil {
				t.Fatal(err)
			}
			kl.Sites = append(kl.Sites, x) // sorted: site-x after site-1..
			sig, _ := rogue.Get("site-x").Sign(uplink.SecAggAdvertDigest(kl.Session, x), crand.Reader)
			return append(s, uplink.SignedKey{ID: "site-x", Cert: rogue.Get("site-x").Cert, Sig: sig})
		}), "site site-x: its certificate is not the federation CA's"},
		{"another site's signed key in a slot", 3, 3, keyListTamper(func(t *testing.T, kl *secagg.KeyList, s []uplink.SignedKey) []uplink.SignedKey {
			keep := kl.Sites[1].ID
			kl.Sites[1] = kl.Sites[2]
			kl.Sites[1].ID = keep
			for i := range s {
				if s[i].ID == keep {
					s[i] = s[2]
					s[i].ID = keep
				}
			}
			return s
		}), "the certificate is \"" + ids[2] + "\"'s"},
		{"signatures stripped", 3, 3, keyListTamper(func(t *testing.T, _ *secagg.KeyList, _ []uplink.SignedKey) []uplink.SignedKey {
			return nil
		}), "key carries no signature"},
		// A different KeyList for one subscriber, every key in it genuine
		// and signed but one site left out, is not a forgery the key
		// signatures can see: an honest aggregator refuses the victim's
		// ShareKeys (a box short), and the consistency check of the views
		// catches it in a malicious one (uplink TestCheckViewsEquivocation).
		// The survivors' view signatures kept from the victim (or a
		// survivor claimed that sent none).
		{"survivors' views stripped", 3, 3, unmaskTamper(func(_ *secagg.UnmaskRequest, _ []uplink.SignedKey) []uplink.SignedKey { return nil }), "survivor " + ids[0] + " signed no view"},
		{"a survivor that sent no masked input", 3, 3, unmaskTamper(func(req *secagg.UnmaskRequest, s []uplink.SignedKey) []uplink.SignedKey {
			req.Survivors = append(req.Survivors, "site-x")
			return s
		}), "survivor site-x signed no view"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fd, sites, log, logs := syntheticSites(t, tc.k, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			var mitm *mitmClient
			var tampered atomic.Int32
			newClient := func(site string, o *mqtt.ClientOptions) mqtt.Client {
				if site != victim || tc.tamper == nil {
					return mqtt.NewClient(o)
				}
				orig := o.DefaultPublishHandler
				o.SetDefaultPublishHandler(func(c mqtt.Client, m mqtt.Message) {
					orig(c, tc.tamper(t, m, &tampered))
				})
				mitm = &mitmClient{Client: mqtt.NewClient(o)}
				return mitm
			}
			var mu sync.Mutex
			siteErrs := map[string]string{}
			var rounds atomic.Int32
			lf, err := Start(ctx, Config{Dir: t.TempDir(), Sites: sites, Seed: 1, Logger: log,
				SecAggIdentity: fed.Get, NewClient: newClient,
				Observe: func(site string, ev agent.Event) {
					var se *sitedata.SiteError
					if ev.Kind == agent.EventSiteError && errors.As(ev.Err, &se) && se.Reason == sitedata.ReasonSecAgg {
						mu.Lock()
						siteErrs[site] = se.Public()
						mu.Unlock()
					}
				},
				Server: aggregator.ServerConfig{K: tc.k, QuorumFraction: 1, RoundTimeout: 30 * time.Second, Settle: 50 * time.Millisecond,
					MaxReselections: -1, Rounds: 1, Seed: 1, Algorithm: aggregator.AlgoFedAvg,
					Params:  aggregator.Params{Solver: "lbfgs", Gamma: 1e-3, MaxEpochs: 2},
					Model:   model.Spec{Kind: model.KindLogReg, Inputs: fd.D, Classes: fd.Classes, L2: 0.01},
					SecAgg:  &aggregator.SecAggConfig{Clip: 1, Threshold: tc.t, Timeout: 20 * time.Second},
					OnRound: func(aggregator.RoundReport) { rounds.Add(1) }}})
			if err != nil {
				t.Fatal(err)
			}
			finished := lf.Wait(ctx)
			rec := httptest.NewRecorder()
			lf.Server.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/status", nil))
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
			if sa == nil || sa.Model != aggregator.SecAggModelSigned || sa.SignedKeys != tc.k || sa.ListedKeys != tc.k {
				t.Fatalf("/status secagg %+v: want the signed model, %d of %d keys signed", sa, tc.k, tc.k)
			}
			if tc.tamper == nil {
				if sa.Aborts != 0 {
					t.Fatalf("untouched: %d sessions aborted (%s)", sa.Aborts, sa.LastAbort)
				}
				return
			}
			t.Logf("the abort, as the operator reads it: %s", sa.LastAbort)
			if tampered.Load() == 0 {
				t.Fatal("nothing was tampered with")
			}
			if sa.Aborts != 1 || !strings.Contains(sa.LastAbort, "refused by "+victim) || !strings.Contains(sa.LastAbort, tc.want) {
				t.Fatalf("/status secagg: %d aborts, last %q; want one naming %s's refusal and %q", sa.Aborts, sa.LastAbort, victim, tc.want)
			}
			mu.Lock()
			got := siteErrs[victim]
			mu.Unlock()
			if !strings.Contains(got, tc.want) {
				t.Fatalf("the victim's site error %q, want %q", got, tc.want)
			}
			if !strings.Contains(logs.String(), "secure aggregation aborted") {
				t.Fatal("no log line says the session aborted")
			}
			// The victim revealed nothing in the tampered session: no
			// UnmaskResponse (nor, if its key list was refused, any
			// ShareKeys or masked input).
			for _, m := range mitm.sentSecAgg() {
				if m[0] == 0 && m[1] == wire.SecAggKindUnmaskResponse {
					t.Fatal("the victim sent an UnmaskResponse in the tampered session")
				}
				if m[0] == 0 && m[1] != wire.SecAggKindAdvertiseKeys && strings.Contains(tc.want, "key list refused") {
					t.Fatalf("the victim sent a message of kind %d after refusing the key list", m[1])
				}
			}
		})
	}
}

// keyListTamper rewrites the first session's SHARE_KEYS announcement (a
// retained round message) with tamper; anything else passes.
func keyListTamper(tamper func(*testing.T, *secagg.KeyList, []uplink.SignedKey) []uplink.SignedKey) func(*testing.T, mqtt.Message, *atomic.Int32) mqtt.Message {
	return func(t *testing.T, m mqtt.Message, n *atomic.Int32) mqtt.Message {
		a, err := wire.DecodeRound(m.Payload(), wire.Limits{})
		if err != nil || a.Secagg == nil || a.Secagg.Attempt != 0 || a.SecaggPhase != wire.SecAggPhase_SECAGG_PHASE_SHARE_KEYS {
			return m
		}
		p, err := secagg.Decode(a.SecaggBroadcast)
		if err != nil {
			t.Errorf("the key list: %v", err)
			return m
		}
		kl := p.(*secagg.KeyList)
		signed, err := uplink.DecodeSignedKeys(a.SecaggSignedKeys)
		if err != nil {
			t.Errorf("the signed keys: %v", err)
			return m
		}
		signed = tamper(t, kl, signed)
		a.SecaggBroadcast = secagg.Encode(kl)
		a.SecaggSignedKeys = nil
		if len(signed) > 0 {
			a.SecaggSignedKeys = uplink.EncodeSignedKeys(signed)
		}
		return reencode(t, m, a, n)
	}
}

// unmaskTamper rewrites the first session's UNMASK announcement: its
// UnmaskRequest and the survivors' view signatures.
func unmaskTamper(tamper func(*secagg.UnmaskRequest, []uplink.SignedKey) []uplink.SignedKey) func(*testing.T, mqtt.Message, *atomic.Int32) mqtt.Message {
	return func(t *testing.T, m mqtt.Message, n *atomic.Int32) mqtt.Message {
		a, err := wire.DecodeRound(m.Payload(), wire.Limits{})
		if err != nil || a.Secagg == nil || a.Secagg.Attempt != 0 || a.SecaggPhase != wire.SecAggPhase_SECAGG_PHASE_UNMASK {
			return m
		}
		p, err := secagg.Decode(a.SecaggBroadcast)
		if err != nil {
			t.Errorf("the unmask request: %v", err)
			return m
		}
		req := p.(*secagg.UnmaskRequest)
		views, err := uplink.DecodeSignedKeys(a.SecaggViewSignatures)
		if err != nil {
			t.Errorf("the view signatures: %v", err)
			return m
		}
		views = tamper(req, views)
		a.SecaggBroadcast = secagg.Encode(req)
		a.SecaggViewSignatures = nil
		if len(views) > 0 {
			a.SecaggViewSignatures = uplink.EncodeSignedKeys(views)
		}
		return reencode(t, m, a, n)
	}
}

func reencode(t *testing.T, m mqtt.Message, w wire.Message, n *atomic.Int32) mqtt.Message {
	b, err := wire.Encode(w)
	if err != nil {
		t.Errorf("encode: %v", err)
		return m
	}
	n.Add(1)
	return tamperedMsg{Message: m, payload: b}
}

// TestSecAggSignedRestartInUnmask: the survivors' view signatures and
// their signed survivor sets outlive the aggregator. Signed sites; every
// site is kept from seeing the first UNMASK (or CONSISTENCY) announcement,
// the whole federation (broker, aggregator, agents) is stopped once it was
// published, and started again on its state files: the resumed aggregator
// announces the phase again (at the unmask with the view and survivor
// signatures it stored), every site's check passes, and the
// round completes without an abort.
func TestSecAggSignedRestartInUnmask(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a federation over MQTT")
	}
	for _, hide := range []wire.SecAggPhase{wire.SecAggPhase_SECAGG_PHASE_UNMASK, wire.SecAggPhase_SECAGG_PHASE_CONSISTENCY} {
		t.Run(hide.String(), func(t *testing.T) { signedRestartIn(t, hide) })
	}
}

func signedRestartIn(t *testing.T, hide wire.SecAggPhase) {
	const k = 3
	fd, sites, log, _ := syntheticSites(t, k, 1)
	fed := secaggid.New(t, time.Now(), SiteIDs(k, 0)...)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var hiding atomic.Bool
	hiding.Store(true)
	seen := make(chan struct{}, k)
	newClient := func(_ string, o *mqtt.ClientOptions) mqtt.Client {
		orig := o.DefaultPublishHandler
		o.SetDefaultPublishHandler(func(c mqtt.Client, m mqtt.Message) {
			if a, err := wire.DecodeRound(m.Payload(), wire.Limits{}); err == nil && a.SecaggPhase == hide && hiding.Load() {
				if hide == wire.SecAggPhase_SECAGG_PHASE_UNMASK && (len(a.SecaggViewSignatures) == 0 || len(a.SecaggSurvivorSignatures) == 0) {
					t.Error("an unmask announcement without the survivors' views or signed survivor sets")
				}
				select {
				case seen <- struct{}{}:
				default:
				}
				return
			}
			orig(c, m)
		})
		return mqtt.NewClient(o)
	}
	var rounds atomic.Int32
	dir := t.TempDir()
	cfg := Config{Dir: dir, Sites: sites, Seed: 1, Logger: log, SecAggIdentity: fed.Get, NewClient: newClient,
		Server: aggregator.ServerConfig{K: k, QuorumFraction: 1, RoundTimeout: 30 * time.Second, Settle: 50 * time.Millisecond,
			MaxReselections: -1, Rounds: 1, Seed: 1, Algorithm: aggregator.AlgoFedAvg,
			Params:  aggregator.Params{Solver: "lbfgs", Gamma: 1e-3, MaxEpochs: 2},
			Model:   model.Spec{Kind: model.KindLogReg, Inputs: fd.D, Classes: fd.Classes, L2: 0.01},
			SecAgg:  &aggregator.SecAggConfig{Clip: 1, Timeout: 20 * time.Second},
			OnRound: func(aggregator.RoundReport) { rounds.Add(1) }}}
	lf, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-seen:
	case <-ctx.Done():
		t.Fatalf("no %v announcement", hide)
	}
	// The aggregator first: stopped first, the sites would go offline
	// under a running aggregator, which closes the phase early (an abort:
	// no site answers) before the restart it is meant to survive.
	if err := lf.StopAggregatorFirst(); err != nil {
		t.Logf("stopping the federation: %v", err)
	}
	if rounds.Load() != 0 {
		t.Fatalf("the round closed while every site was kept from its %v phase", hide)
	}
	hiding.Store(false)
	if lf, err = Start(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	finished := lf.Wait(ctx)
	rec := httptest.NewRecorder()
	lf.Server.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/status", nil))
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
	if sa := st.SecAgg; sa == nil || sa.Aborts != 0 || sa.Attempt != 0 || sa.Model != aggregator.SecAggModelSigned {
		t.Fatalf("/status secagg %+v: want the first session completed, signed, no abort", st.SecAgg)
	}
}

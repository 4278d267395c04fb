package localfed

import (
	"context"
	"math"
	"net"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/node/aggregator"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/wire"
)

// observer records, as a superuser watching every topic of the federation,
// the round announcements and the invitations the broker carries.
type observer struct {
	mu        sync.Mutex
	anns      []*wire.RoundAnnouncement
	invited   map[int]map[string]bool // round -> sites invited
	otherMsgs int
}

func (o *observer) watch(t *testing.T, lf *Federation, fed string) mqtt.Client {
	t.Helper()
	topics, err := wire.ForFederation(fed)
	if err != nil {
		t.Fatal(err)
	}
	opts := mqtt.NewClientOptions().AddBroker("tcp://in-process").SetClientID("observer").SetCleanSession(true).
		SetProtocolVersion(4).SetOrderMatters(false).
		SetCustomOpenConnectionFn(func(*url.URL, mqtt.ClientOptions) (net.Conn, error) { return lf.Broker.Dial() })
	c := mqtt.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("observer connect: %v", tok.Error())
	}
	tok := c.Subscribe(topics.Prefix()+"#", 1, func(_ mqtt.Client, m mqtt.Message) {
		kind, msg, err := topics.Decode(m.Topic(), m.Payload(), wire.Limits{})
		o.mu.Lock()
		defer o.mu.Unlock()
		switch {
		case err != nil:
			o.otherMsgs++
		case kind == wire.KindRound:
			o.anns = append(o.anns, msg.(*wire.RoundAnnouncement))
		case kind == wire.KindReceipt:
			r := msg.(*wire.Receipt)
			if r.GetSubject() == wire.ReceiptSubject_RECEIPT_SUBJECT_INVITATION {
				if o.invited[int(r.Round)] == nil {
					o.invited[int(r.Round)] = map[string]bool{}
				}
				o.invited[int(r.Round)][r.ClientId] = true
			}
		}
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("observer subscribe: %v", tok.Error())
	}
	return c
}

// TestPrivateSelectionOverMQTT: a --dp federation (poisson:q=0.5, real
// broker, aggregator and agents) keeps its selection off every channel the
// sites share: no round announcement, retained or not, names anyone; each
// selected site, and only it, is invited on its receipts topic and
// contributes, so every round closes with exactly its selection (quorum
// fraction 1, no deadline on the fake clocks: a site that missed its
// invitation would stall the run). Then the aggregator, the broker and
// every site are stopped in the middle of round 3, after its invitations
// went out to sites that are gone and before any site answered; restarted
// (new broker: no session kept, the sites' invitations lost), the
// aggregator invites the selected sites again as they come online and the
// run finishes.
func TestPrivateSelectionOverMQTT(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a federation over MQTT")
	}
	const rounds, n = 6, 6
	fd, sites, log, _ := syntheticSites(t, n, 1)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	selKey := dp.TestSelectionKey(11)

	var (
		mu       sync.Mutex
		selected = map[int][]string{}       // round -> contributors + stragglers (the aggregator's selection)
		current  atomic.Pointer[Federation] // the running federation, stored once Start returned
		started  = make(chan struct{})
		stopped  = make(chan struct{})
	)
	obs := &observer{invited: map[int]map[string]bool{}}
	srvCfg := aggregator.ServerConfig{
		K: n, QuorumFraction: 1, RoundTimeout: 10 * time.Minute, Rounds: rounds, Seed: 1,
		Algorithm: aggregator.AlgoFedProx, Selector: "poisson:q=0.5",
		Params:        aggregator.Params{Mu: 1, Solver: "lbfgs", Gamma: 1e-3, MaxEpochs: 2},
		Model:         model.Spec{Kind: model.KindLogReg, Inputs: fd.D, Classes: fd.Classes, L2: 0.01},
		PrivacyConfig: aggregator.PrivacyConfig{DP: &dp.Config{Clip: 0.5, Noise: 1, Delta: 1e-5}, DPTestSelectionKey: &selKey},
		Clock:         clock.NewFake(t0), Logger: log.With("party", "aggregator"),
		OnRound: func(rr aggregator.RoundReport) {
			mu.Lock()
			selected[rr.Round] = slices.Sorted(slices.Values(append(slices.Clone(rr.Contributors), rr.Stragglers...)))
			mu.Unlock()
			if rr.Round == 2 {
				// Every site goes down before the aggregator draws round 3:
				// the draw (on this goroutine, once OnRound returns) still
				// sees them online and invites sites that are gone.
				<-started
				if err := current.Load().StopAgents(); err != nil {
					t.Errorf("stopping the sites: %v", err)
				}
				close(stopped)
			}
		},
	}
	start := func() *Federation {
		lf, err := Start(ctx, Config{Federation: "privsel", Dir: dir, Sites: sites, Seed: 1,
			ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second, Observers: []string{"observer"},
			NewClock: func() clock.Clock { return clock.NewFake(t0) }, Logger: log, Server: srvCfg,
			Serving: func(lf *Federation) {
				c := obs.watch(t, lf, "privsel")
				t.Cleanup(func() { c.Disconnect(0) })
			}})
		if err != nil {
			t.Fatal(err)
		}
		return lf
	}
	lf := start()
	current.Store(lf)
	close(started)
	select {
	case <-stopped:
	case <-ctx.Done():
		t.Fatal("round 2 was never aggregated")
	}
	// The draw of round 3 happens right after OnRound: wait for it.
	for {
		v, changed := lf.Server.Watch()
		if v.Round == 3 && v.Phase == aggregator.PhaseCollecting {
			break
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("round 3 was not drawn: round %d, phase %s", v.Round, v.Phase)
		}
	}
	checkRetained(t, ctx, lf, 3)
	if err := lf.Stop(); err != nil {
		t.Logf("stopping the federation: %v", err)
	}
	st := readStatus(t, lf.StatePath)
	if st.Round != 3 || st.Phase != aggregator.PhaseCollecting || len(st.Selected) == 0 || len(st.Received) != 0 {
		t.Fatalf("stopped in round %d, phase %s, selected %v, received %v: want round 3 collecting, invitations out, nothing received",
			st.Round, st.Phase, st.Selected, st.Received)
	}
	round3 := st.Selected
	lf = start()
	finished := lf.Wait(ctx)
	if finished {
		checkRetained(t, ctx, lf, rounds)
	}
	if err := lf.Stop(); err != nil {
		t.Error(err)
	}
	if !finished {
		t.Fatal("the federation did not finish after the restart")
	}

	obs.mu.Lock()
	defer obs.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	if len(obs.anns) < rounds {
		t.Fatalf("observed %d announcements, want at least %d", len(obs.anns), rounds)
	}
	for _, a := range obs.anns {
		if len(a.Selected) != 0 || !a.PrivateSelection {
			t.Fatalf("round %d's announcement (phase %v) names %v (private_selection %v)", a.Round, a.GetPhase(), a.Selected, a.PrivateSelection)
		}
	}
	store, err := aggstore.OpenAgg(lf.StatePath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	partial := false
	for r := 1; r <= rounds; r++ {
		var sent []string
		if err := store.ForEachUpdate(uint64(r), func(u aggstore.Update) error {
			sent = append(sent, u.ClientID)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		slices.Sort(sent)
		invited := slices.Sorted(func(yield func(string) bool) {
			for id := range obs.invited[r] {
				if !yield(id) {
					return
				}
			}
		})
		if len(sent) == 0 {
			sent = nil
		}
		if !slices.Equal(sent, selected[r]) || !slices.Equal(invited, selected[r]) && !(len(invited) == 0 && len(selected[r]) == 0) {
			t.Errorf("round %d: selected %v, invited %v, updates from %v: want all three equal", r, selected[r], invited, sent)
		}
		if len(selected[r]) < n {
			partial = true
		}
	}
	if !slices.Equal(selected[3], round3) {
		t.Errorf("round 3 closed with %v, drawn before the restart as %v", selected[3], round3)
	}
	if !partial {
		t.Errorf("every round selected every site (%v): the test shows nothing about who is not invited", selected)
	}
	// The rounds closed once every invited site had reported (a fake
	// clock, no fixed-length rounds), so their timing told the draws: every
	// round is charged at q = 1 (dp.Config.EarlyClose), which bounds the
	// per-site figure over the fewer rounds any one site took part in.
	if fin, err := aggregator.ReadStatus(store); err != nil || fin.Privacy == nil || fin.Privacy.Amplified ||
		math.Abs(fin.Privacy.Epsilon-dp.EpsilonAfter(1, 1, rounds, 1e-5, nil)) > 1e-9*fin.Privacy.Epsilon || fin.Privacy.EpsilonUnamplified > fin.Privacy.Epsilon {
		t.Errorf("privacy at the end: %+v, want %d rounds charged at q = 1, not amplified, and the per-site figure below it", fin.Privacy, rounds)
	}
}

// checkRetained reads the retained round announcement as a new subscriber
// would (any site can): it must be of round and name nobody.
func checkRetained(t *testing.T, ctx context.Context, lf *Federation, round uint64) {
	t.Helper()
	// The server's view can show the round drawn before its announcement
	// reaches the broker: read the retained message again until it is
	// round's; every one read must name nobody.
	for {
		a := retained(t, ctx, lf)
		if len(a.Selected) != 0 || !a.PrivateSelection {
			t.Errorf("the retained announcement of round %d names %v, private_selection %v; want nobody named", a.Round, a.Selected, a.PrivateSelection)
		}
		if a.Round == round {
			return
		}
		if a.Round > round {
			t.Fatalf("the retained announcement is round %d, want %d", a.Round, round)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the retained announcement stayed at round %d, want %d", a.Round, round)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// retained reads the retained round announcement with a new subscription.
func retained(t *testing.T, ctx context.Context, lf *Federation) *wire.RoundAnnouncement {
	t.Helper()
	topics, _ := wire.ForFederation("privsel")
	got := make(chan *wire.RoundAnnouncement, 1)
	opts := mqtt.NewClientOptions().AddBroker("tcp://in-process").SetClientID("observer-2").SetCleanSession(true).
		SetProtocolVersion(4).
		SetCustomOpenConnectionFn(func(*url.URL, mqtt.ClientOptions) (net.Conn, error) { return lf.Broker.Dial() })
	c := mqtt.NewClient(opts)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer c.Disconnect(0)
	tok := c.Subscribe(topics.Round(), 1, func(_ mqtt.Client, m mqtt.Message) {
		if a, err := wire.DecodeRound(m.Payload(), wire.Limits{}); err == nil && m.Retained() {
			select {
			case got <- a:
			default:
			}
		}
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	select {
	case a := <-got:
		return a
	case <-ctx.Done():
		t.Fatal("no retained announcement")
		return nil
	}
}

func readStatus(t *testing.T, path string) aggregator.Status {
	t.Helper()
	store, err := aggstore.OpenAgg(path, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	st, err := aggregator.ReadStatus(store)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

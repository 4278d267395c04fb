// Package localfed runs a federation on one machine, in one process: an
// embedded MQTT broker (package broker) with per-site passwords and the
// federation's ACL, the aggregator (package aggregator) on the broker's
// in-process connection, and N edge agents (package agent) connecting over
// loopback TCP exactly as remote sites would. Every party keeps its own
// bbolt state file in one directory.
//
// It owns that wiring and the shutdown order: the agents first, then the
// aggregator, then the broker, so that no site sees its aggregator vanish
// before it stops. `broker-agg demo` (with and without --schema), the
// load generator e2e/cmd/loadtest (its agents, against Mosquitto and a
// broker-agg process: StartAgents) and the simulator's live test share it.
// What the parties compute, and how the data is split into sites, is the
// caller's.
package localfed

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/edgefl/edgefl/internal/clock"
	"github.com/edgefl/edgefl/learn/model"
	"github.com/edgefl/edgefl/node/agent"
	"github.com/edgefl/edgefl/node/aggregator"
	"github.com/edgefl/edgefl/node/broker"
	"github.com/edgefl/edgefl/proto/uplink"
	"github.com/edgefl/edgefl/proto/wire"
)

// DefaultReconnectMin is the agents' first retry interval: short, as the
// broker is on loopback.
const DefaultReconnectMin = 200 * time.Millisecond

// Site is one edge agent.
type Site struct {
	// ID is the site id: MQTT client id and username.
	ID string
	// Data is the site's training data (nil: the agent loads Source).
	Data *model.Data
	// Source is the agent's data source spec when Data is nil (csv:PATH,
	// read by the federation's schema).
	Source string
	// EvalSource is the agent's eval_data (a CSV of held-out rows read by
	// the federation's schema; "": the schema's holdout share of Source).
	EvalSource string
	// ModelOut is where the agent writes the final bundle ("": next to its
	// state file).
	ModelOut string
}

// SiteIDs returns n site ids, site-1..site-n with the numbers padded to
// digits.
func SiteIDs(n, digits int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("site-%0*d", digits, i+1)
	}
	return ids
}

// Passwords returns a random password for every user.
func Passwords(users []string) (map[string]string, error) {
	pw := make(map[string]string, len(users))
	for _, u := range users {
		b := make([]byte, 12)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		pw[u] = base64.RawURLEncoding.EncodeToString(b)
	}
	return pw, nil
}

// StateDir returns dir, created if missing, or with dir "" a new temporary
// directory named by pattern (os.MkdirTemp's); cleanup removes the
// temporary one (and nothing else).
func StateDir(dir, pattern string) (path string, cleanup func(), err error) {
	if dir != "" {
		return dir, func() {}, os.MkdirAll(dir, 0o755)
	}
	if dir, err = os.MkdirTemp("", pattern); err != nil {
		return "", nil, err
	}
	return dir, func() { os.RemoveAll(dir) }, nil
}

// AgentsConfig is what StartAgents needs.
type AgentsConfig struct {
	Federation string
	Brokers    []string
	// Passwords maps each site id (its username) to its password.
	Passwords map[string]string
	// Dir holds the state files, Dir/ID.db.
	Dir   string
	Sites []Site
	// Seed seeds site i's agent with Seed+i.
	Seed uint64
	// ReconnectMin (0: DefaultReconnectMin) and ReconnectMax (0: the
	// agent's default) are the agents' reconnect backoff.
	ReconnectMin, ReconnectMax time.Duration
	// NewClock gives each agent its clock (nil: the wall clock).
	NewClock func() clock.Clock
	Logger   *slog.Logger
	// SecAggRand, when set, is each site's secure-aggregation randomness
	// instead of crypto/rand (agent.Deps.SecAggRand): tests only.
	SecAggRand func(site string, round uint64) io.Reader
	// Observe, when set, sees each site's agent events
	// (agent.Deps.Observe); it must not block.
	Observe func(site string, ev agent.Event)
	// SecAggNoiseKey, when set, gives each site its distributed-DP noise
	// key instead of crypto/rand (agent.Deps.SecAggNoiseKey): tests only.
	SecAggNoiseKey func(site string) *[32]byte
	// SecAggIdentity, when set, gives each site its signing identity for
	// signed secure aggregation (agent.Deps.SecAggIdentity; nil for a site:
	// unsigned).
	SecAggIdentity func(site string) *uplink.SecAggIdentity
	// NewClient, when set, makes each site's MQTT client (agent.Deps.NewClient):
	// for tests that stand between one site and the broker.
	NewClient func(site string, o *mqtt.ClientOptions) mqtt.Client
}

// Agents are running edge agents.
type Agents struct {
	ctx    context.Context
	cancel context.CancelFunc
	sites  map[string]*siteRun // each site's own run
	wg     sync.WaitGroup
	mu     sync.Mutex
	err    error
}

// siteRun is one site's agent: how to make it, and its current run.
type siteRun struct {
	cfg   agent.Config
	deps  agent.Deps
	agent *agent.Agent // the current run's
	stop  context.CancelFunc
	done  chan struct{}
}

// StartAgents starts one agent per site, each running until Stop. If one
// cannot be made, the ones started are stopped and the error returned.
func StartAgents(ctx context.Context, c AgentsConfig) (*Agents, error) {
	ctx, cancel := context.WithCancel(ctx)
	as := &Agents{ctx: ctx, cancel: cancel, sites: map[string]*siteRun{}}
	for i, s := range c.Sites {
		cfg := agent.DefaultConfig()
		cfg.SiteID, cfg.Federation, cfg.Brokers = s.ID, c.Federation, c.Brokers
		cfg.Username, cfg.Password = s.ID, c.Passwords[s.ID]
		cfg.StateFile = filepath.Join(c.Dir, s.ID+".db")
		cfg.Seed = c.Seed + uint64(i)
		cfg.ReconnectMin = DefaultReconnectMin
		if c.ReconnectMin > 0 {
			cfg.ReconnectMin = c.ReconnectMin
		}
		cfg.ReconnectMax = c.ReconnectMax
		cfg.Data, cfg.EvalData, cfg.ModelOut = s.Source, s.EvalSource, s.ModelOut
		// Simulated sites of one process (demo --dir run again after
		// removing state files): no gateway's identity to protect.
		cfg.FreshState = true
		deps := agent.Deps{Data: s.Data, Logger: c.Logger}
		if f := c.SecAggRand; f != nil {
			id := s.ID
			deps.SecAggRand = func(round uint64) io.Reader { return f(id, round) }
		}
		if f := c.Observe; f != nil {
			id := s.ID
			deps.Observe = func(ev agent.Event) { f(id, ev) }
		}
		if f := c.SecAggNoiseKey; f != nil {
			deps.SecAggNoiseKey = f(s.ID)
		}
		if f := c.SecAggIdentity; f != nil {
			deps.SecAggIdentity = f(s.ID)
		}
		if f := c.NewClient; f != nil {
			id := s.ID
			deps.NewClient = func(o *mqtt.ClientOptions) mqtt.Client { return f(id, o) }
		}
		if c.NewClock != nil {
			deps.Clock = c.NewClock()
		}
		sr := &siteRun{cfg: cfg, deps: deps}
		as.sites[s.ID] = sr
		if err := as.run(sr); err != nil {
			return nil, errors.Join(fmt.Errorf("agent %s: %w", s.ID, err), as.Stop())
		}
	}
	return as, nil
}

// run starts a new run of sr's agent (a.mu not held).
func (as *Agents) run(sr *siteRun) error {
	a, err := agent.New(sr.cfg, sr.deps)
	if err != nil {
		return err
	}
	siteCtx, stop := context.WithCancel(as.ctx)
	done := make(chan struct{})
	as.mu.Lock()
	sr.stop, sr.done, sr.agent = stop, done, a
	as.mu.Unlock()
	as.wg.Add(1)
	go func() {
		defer as.wg.Done()
		defer close(done)
		defer stop()
		if err := a.Run(siteCtx); err != nil {
			as.fail(fmt.Errorf("agent %s: %w", sr.cfg.SiteID, err))
		}
	}()
	return nil
}

// SiteStats is the counters of site id's current agent (ok false for an
// unknown id).
func (as *Agents) SiteStats(id string) (agent.Stats, bool) {
	as.mu.Lock()
	sr := as.sites[id]
	var a *agent.Agent
	if sr != nil {
		a = sr.agent
	}
	as.mu.Unlock()
	if a == nil {
		return agent.Stats{}, false
	}
	return a.Stats(), true
}

func (as *Agents) fail(err error) {
	as.mu.Lock()
	defer as.mu.Unlock()
	if as.err == nil {
		as.err = err
	}
}

// Err is the first error an agent returned so far (nil: none).
func (as *Agents) Err() error {
	as.mu.Lock()
	defer as.mu.Unlock()
	return as.err
}

// StopSite stops one site's agent (as at shutdown: its offline status
// goes out) without waiting for it; an unknown id does nothing. Safe from
// an Observe callback.
func (as *Agents) StopSite(id string) {
	as.mu.Lock()
	var stop context.CancelFunc
	if sr := as.sites[id]; sr != nil {
		stop = sr.stop
	}
	as.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// RestartSite stops one site's agent (if running), waits for it to exit
// and starts it again on its state file, as a site restarted by its
// operator. Not from an Observe callback (it waits for the agent).
func (as *Agents) RestartSite(id string) error {
	as.mu.Lock()
	sr := as.sites[id]
	as.mu.Unlock()
	if sr == nil {
		return fmt.Errorf("localfed: no site %q", id)
	}
	as.StopSite(id)
	<-sr.done
	if as.ctx.Err() != nil {
		return as.ctx.Err()
	}
	return as.run(sr)
}

// Stop stops every agent, waits for them, and returns the first error one
// returned.
func (as *Agents) Stop() error {
	as.cancel()
	as.wg.Wait()
	return as.Err()
}

// Config is what Start needs.
type Config struct {
	// Federation names the federation ("" = "demo").
	Federation string
	// Dir holds every party's state file: Dir/aggregator.db and Dir/ID.db.
	Dir   string
	Sites []Site
	// Seed seeds the agents (site i: Seed+i).
	Seed uint64
	// Server is the aggregator's configuration; Start sets its Federation,
	// its connection (the broker's in-process one) and, when empty, its
	// StatePath.
	Server aggregator.ServerConfig
	// Serving, when set, is called once the aggregator serves (or failed
	// to start), before the agents start: no round can have closed yet.
	Serving func(*Federation)
	// ReconnectMin and ReconnectMax are the agents' (AgentsConfig's).
	ReconnectMin, ReconnectMax time.Duration
	// NewClock gives each agent its clock (nil: the wall clock).
	NewClock func() clock.Clock
	Logger   *slog.Logger
	// SecAggRand, Observe and SecAggNoiseKey are the agents'
	// (AgentsConfig's).
	SecAggRand     func(site string, round uint64) io.Reader
	Observe        func(site string, ev agent.Event)
	SecAggNoiseKey func(site string) *[32]byte
	// SecAggIdentity and NewClient are the agents' (AgentsConfig's).
	SecAggIdentity func(site string) *uplink.SecAggIdentity
	NewClient      func(site string, o *mqtt.ClientOptions) mqtt.Client
	// Observers are extra superuser client ids, for tests that watch
	// every topic through Broker.Dial.
	Observers []string
}

// Federation is a running local federation.
type Federation struct {
	Broker    *broker.Broker
	Server    *aggregator.Server
	StatePath string // the aggregator's

	cancel  context.CancelFunc
	srvDone chan error
	srvErr  error
	agents  *Agents
}

// Start starts the broker, the aggregator and the agents. Wait for the run
// and Stop it.
func Start(ctx context.Context, c Config) (*Federation, error) {
	if c.Federation == "" {
		c.Federation = "demo"
	}
	topics, err := wire.ForFederation(c.Federation)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(c.Sites))
	for i, s := range c.Sites {
		ids[i] = s.ID
	}
	pw, err := Passwords(ids)
	if err != nil {
		return nil, err
	}
	superuser := c.Server.ClientID
	if superuser == "" {
		superuser = aggregator.DefaultClientID
	}
	brk, err := broker.Start(broker.Config{Addr: "127.0.0.1:0", Prefix: topics.Prefix(), Users: pw,
		Superusers: append([]string{superuser}, c.Observers...), Logger: c.Logger})
	if err != nil {
		return nil, err
	}
	f := &Federation{Broker: brk, srvDone: make(chan error, 1)}
	sc := c.Server
	sc.Federation, sc.Dial = c.Federation, brk.Dial
	if sc.StatePath == "" {
		sc.StatePath = filepath.Join(c.Dir, "aggregator.db")
	}
	if sc.Logger == nil {
		sc.Logger = c.Logger
	}
	f.StatePath = sc.StatePath
	if f.Server, err = aggregator.NewServer(sc); err != nil {
		brk.Close()
		return nil, err
	}
	ctx, f.cancel = context.WithCancel(ctx)
	go func() { f.srvDone <- f.Server.Run(ctx) }()
	f.waitServing(ctx)
	if c.Serving != nil {
		c.Serving(f)
	}
	f.agents, err = StartAgents(ctx, AgentsConfig{Federation: c.Federation, Brokers: []string{brk.URL()}, Passwords: pw,
		Dir: c.Dir, Sites: c.Sites, Seed: c.Seed, ReconnectMin: c.ReconnectMin, ReconnectMax: c.ReconnectMax,
		NewClock: c.NewClock, Logger: c.Logger, SecAggRand: c.SecAggRand, Observe: c.Observe, SecAggNoiseKey: c.SecAggNoiseKey,
		SecAggIdentity: c.SecAggIdentity, NewClient: c.NewClient})
	if err != nil {
		f.cancel()
		<-f.srvDone
		brk.Close()
		return nil, err
	}
	return f, nil
}

// waitServing waits until the aggregator serves, fails or ctx is done.
func (f *Federation) waitServing(ctx context.Context) {
	select {
	case <-f.Server.Ready():
	case err := <-f.srvDone:
		f.srvDone <- err
	case <-ctx.Done():
	}
}

// StopAgents stops the agents alone (Stop stops them too): the aggregator
// and the broker keep running, as when every site goes down.
func (f *Federation) StopAgents() error { return f.agents.Stop() }

// Wait blocks until the run finished (true), the aggregator stopped
// (Stop returns its error) or ctx is done.
func (f *Federation) Wait(ctx context.Context) (finished bool) {
	select {
	case <-f.Server.Finished():
		return true
	case err := <-f.srvDone:
		f.srvErr = err
		f.srvDone <- err
	case <-ctx.Done():
	}
	return false
}

// Stop ends the federation: the agents first, then the aggregator, then
// the broker. It returns the aggregator's error that ended the run, or
// else the first error any party returned.
func (f *Federation) Stop() error {
	err := f.srvErr
	if aerr := f.agents.Stop(); aerr != nil && err == nil {
		err = aerr
	}
	f.cancel()
	if serr := <-f.srvDone; serr != nil && err == nil {
		err = serr
	}
	return errors.Join(err, f.Broker.Close())
}

// StopAggregatorFirst ends the federation in the other order: the
// aggregator, then the agents, then the broker. A test that restarts the
// federation with a round frozen in a phase uses it: stopped first, the
// agents go offline while the aggregator still runs, and a phase that
// closes early once every site it expects has answered or gone offline
// would close (or abort) before the restart.
func (f *Federation) StopAggregatorFirst() error {
	f.cancel()
	err := <-f.srvDone
	if aerr := f.agents.Stop(); aerr != nil && err == nil {
		err = aerr
	}
	return errors.Join(err, f.Broker.Close())
}

// StopSite stops one site's agent (Agents.StopSite).
func (f *Federation) StopSite(id string) { f.agents.StopSite(id) }

// SiteStats is site id's agent's counters (Agents.SiteStats).
func (f *Federation) SiteStats(id string) (agent.Stats, bool) { return f.agents.SiteStats(id) }

package agent

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/edgefl/edgefl/proto/wire"
	"github.com/edgefl/edgefl/testkit"
)

// onlineAfter is the next online status of another connection or
// installation than prev's.
func onlineAfter(f *fakeAgg, prev *wire.ClientStatus) *wire.ClientStatus {
	f.t.Helper()
	for {
		st := f.nextStatus()
		if st.Online && (st.Connection != prev.Connection || st.InstanceId != prev.InstanceId) {
			return st
		}
	}
}

// Every status (the last will too) and update of an installation carries
// the instance id of its state file: the same after a restart, another for
// another state file (a cloned gateway) and after --reset-state.
func TestAgentInstanceID(t *testing.T) {
	_, url := testkit.StartBroker(t)
	agg := newFakeAgg(t, url)
	dir := t.TempDir()
	state := filepath.Join(dir, "edge.db")
	data := testData(2, 60)

	ra := startAgent(t, url, state, data)
	st := agg.nextStatus()
	inst := st.InstanceId
	if !st.Online || len(inst) != 26 {
		t.Fatalf("online status %v: want a 26-character instance id", st)
	}
	ra.wait(t, "connected", isKind(EventConnected))
	agg.announce(announce(t, 1, AlgoFedSplit, f32(testGlobal(1))))
	if _, u := agg.nextUpdate(); u.InstanceId != inst {
		t.Fatalf("update instance %q, status %q", u.InstanceId, inst)
	}
	agg.receipt(accepted(1))
	ra.wait(t, "receipt", receiptOf(1))
	ra.stop()
	if off := agg.statusAfter(st); off.Online || off.InstanceId != inst {
		t.Fatalf("offline status %v", off)
	}
	store := openStore(t, state)
	if id, err := store.Identity(); err != nil || id.InstanceID != inst {
		t.Fatalf("stored identity %+v, %v; want instance %s", id, err, inst)
	}
	store.Close()

	// Restarted: the same installation.
	ra = startAgent(t, url, state, data)
	st2 := onlineAfter(agg, st)
	if st2.InstanceId != inst {
		t.Fatalf("status after a restart %v, want instance %s", st2, inst)
	}
	ra.stop()

	// Another state file with the same site id (a clone), and the state
	// file reset: other installations.
	clone := startAgent(t, url, filepath.Join(dir, "clone.db"), data)
	st3 := onlineAfter(agg, st2)
	if st3.InstanceId == inst || len(st3.InstanceId) != 26 {
		t.Fatalf("the clone's status %v (first installation %s)", st3, inst)
	}
	clone.stop()
	if _, err := ResetState(state, time.Unix(1800000000, 0)); err != nil {
		t.Fatal(err)
	}
	// edge-agent run --reset-state also sets FreshState: the copy moved
	// aside would otherwise be a trace that refuses the new file.
	cfg := DefaultConfig()
	cfg.SiteID, cfg.Federation, cfg.Brokers, cfg.StateFile = testSite, testFed, []string{url}, state
	cfg.ReconnectMin, cfg.ReconnectMax = 100*time.Millisecond, time.Second
	cfg.FreshState = true
	ra = runAgent(t, cfg, &data)
	st4 := onlineAfter(agg, st3)
	if st4.InstanceId == inst || st4.InstanceId == st3.InstanceId {
		t.Fatalf("status after --reset-state %v (before: %s, clone %s)", st4, inst, st3.InstanceId)
	}
	ra.stop()
}

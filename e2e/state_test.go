package e2e

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/edgefl/edgefl/learn/quant"
	agg "github.com/edgefl/edgefl/node/aggregator"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/edgestore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/wire"
)

// copyState copies a state file of a stopped process to a fresh path, so
// that the checks open a copy and can never write to the original.
func copyState(t *testing.T, path string) string {
	t.Helper()
	src, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst := filepath.Join(t.TempDir(), filepath.Base(path)+".copy")
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, src); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

// aggState is what a test checks in the aggregator's state file.
type aggState struct {
	current   aggstore.Round
	phase     string
	coordRnd  int
	updates   map[uint64]map[string]aggstore.Update // round -> client -> update
	z         map[string]zAt                        // client -> latest z
	final     []float64                             // the latest checkpoint
	finalR    uint64
	rejected  map[string]uint64 // the coordinator's rejections by reason
	accepted  uint64
	stragglrs uint64
	extended  uint64
	closed    uint64
}

type zAt struct {
	round uint64
	z     []float64
}

// readAggState opens a copy of a stopped aggregator's state file.
func readAggState(t *testing.T, path string) aggState {
	t.Helper()
	s, err := aggstore.OpenAgg(copyState(t, path), storage.Options{LockTimeout: time.Second})
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer s.Close()
	if err := s.Check(); err != nil {
		t.Fatalf("%s: bbolt check: %v", path, err)
	}
	st := aggState{updates: map[uint64]map[string]aggstore.Update{}, z: map[string]zAt{}}
	if st.current, err = s.CurrentRound(); err != nil {
		t.Fatalf("%s: current round: %v", path, err)
	}
	// The state a restart resumes from: the stored one and the messages
	// stored since (the replay log, node/aggregator/coordinator/coordinator_replay.go).
	coord, err := agg.StoredState(s)
	if err != nil {
		t.Fatalf("%s: coordinator state: %v", path, err)
	}
	st.phase, st.coordRnd = string(coord.Phase), coord.Round
	st.rejected = map[string]uint64{}
	for r, n := range coord.Counters.Rejected {
		st.rejected[r.String()] = n
	}
	st.accepted, st.stragglrs = coord.Counters.Accepted, coord.Counters.Stragglers
	st.extended, st.closed = coord.Counters.Extensions, coord.Counters.RoundsClosed
	for r := uint64(1); r <= st.current.Number; r++ {
		ups, err := s.Updates(r)
		if err != nil {
			t.Fatalf("%s: updates of round %d: %v", path, r, err)
		}
		if len(ups) > 0 {
			st.updates[r] = map[string]aggstore.Update{}
		}
		for _, u := range ups {
			st.updates[r][u.ClientID] = u
		}
	}
	clients, err := s.Clients()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range clients {
		r, z, err := s.ClientZ(c.ID)
		if errors.Is(err, storage.ErrNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		st.z[c.ID] = zAt{r, z}
	}
	if st.finalR, st.final, err = s.LatestCheckpoint(); err != nil {
		t.Fatalf("%s: latest checkpoint: %v", path, err)
	}
	return st
}

// contributors lists the clients with a stored update for round r, sorted.
func (s aggState) contributors(r uint64) []string {
	var ids []string
	for id := range s.updates[r] {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// edgeState is what a test checks in a site's state file.
type edgeState struct {
	applied, seen uint64
	zRound        uint64
	z             []float64
	// The site's copy of the aggregator's z (FedSplit), which must equal
	// the aggregator's bit for bit.
	copyRound uint64
	copyZ     []float64
	outbox    []edgestore.OutboxEntry
}

func readEdgeState(t *testing.T, path string) edgeState {
	t.Helper()
	s, err := edgestore.OpenEdge(copyState(t, path), storage.Options{LockTimeout: time.Second})
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer s.Close()
	if err := s.Check(); err != nil {
		t.Fatalf("%s: bbolt check: %v", path, err)
	}
	var st edgeState
	if st.applied, err = s.AppliedRound(); err != nil {
		t.Fatal(err)
	}
	if st.seen, err = s.SeenRound(); err != nil {
		t.Fatal(err)
	}
	st.zRound, st.z, err = s.Z()
	if err != nil && !errors.Is(err, storage.ErrNotFound) {
		t.Fatal(err)
	}
	st.copyRound, st.copyZ, err = s.ServerZ()
	if err != nil && !errors.Is(err, storage.ErrNotFound) {
		t.Fatal(err)
	}
	if st.outbox, err = s.Outbox(); err != nil {
		t.Fatal(err)
	}
	return st
}

// decodeStored decodes the vector of a stored update.
func decodeStored(t *testing.T, u aggstore.Update) (*wire.ClientUpdate, []float64) {
	t.Helper()
	m, err := wire.DecodeUpdate(u.Msg, wire.Limits{})
	if err != nil {
		t.Fatalf("stored update (%d, %s): %v", u.Round, u.ClientID, err)
	}
	c, err := quant.Parse("fp32")
	if err != nil {
		t.Fatal(err)
	}
	v, err := c.Decode(m.Vector.Payload, nil)
	if err != nil {
		t.Fatalf("stored update (%d, %s): vector: %v", u.Round, u.ClientID, err)
	}
	return m, v
}

// checkSiteCopy reads e's state file and checks that its copy of the
// aggregator's z equals the aggregator's z for it (st), bit for bit, that
// its outbox is empty and, if applied > 0, that it applied that round last.
func checkSiteCopy(t *testing.T, e *edge, st aggState, applied uint64) {
	t.Helper()
	es := readEdgeState(t, e.state)
	az, ok := st.z[e.id]
	switch {
	case !ok:
		t.Errorf("%s: the aggregator holds no z", e.id)
	case es.copyRound != az.round || !bitsEqual(es.copyZ, az.z):
		t.Errorf("%s: site's copy of z of round %d, aggregator's z of round %d, equal %v", e.id, es.copyRound, az.round, bitsEqual(es.copyZ, az.z))
	}
	if len(es.outbox) != 0 {
		t.Errorf("%s: %d unreceipted updates", e.id, len(es.outbox))
	}
	if applied > 0 && es.applied != applied {
		t.Errorf("%s: applied round %d, want %d", e.id, es.applied, applied)
	}
}

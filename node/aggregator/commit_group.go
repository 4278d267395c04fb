package aggregator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/edgefl/edgefl/node/aggregator/coordinator"
	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/storage"
)

// Group commit. A write transaction costs an fsync (a few milliseconds on
// an ordinary disk), so one transaction per update held the aggregator to a
// few hundred durable updates a second whatever the CPU. The loop now takes
// the updates that arrived while it was busy into one transaction:
//
//   - It proposes the first update as before and, while the coordinator
//     answers each with a lone accept (coordinator.Replayable: nothing but
//     the accept, the state a replay of the message rebuilds), steps Stored
//     with the replay log index the update will have once written (the
//     next index of the log, plus its place in the group) and takes the next
//     waiting update, up to group updates.
//   - Nothing of the group is visible before its transaction: no receipt,
//     no announcement, no acknowledgement to the broker (a request is done
//     only once answered). aggstore.PutUpdates writes the group's updates
//     and their replay log entries in one fsynced transaction, checking that
//     each got the index the coordinator applied it with; then the batches
//     are carried out in order (each update's receipt).
//   - The first batch that is not a lone accept ends the group: a rejection
//     (decided on the state the group's updates made), an update that
//     cannot be stored (out of range, a base this server does not hold), an
//     accept that closes the round, or a request that is not an update. The
//     group is committed and receipted first; that batch is then carried out
//     as before (apply: the state is written, then what it sends). So a
//     decision that depends on an earlier update of the group goes out only
//     once that update is durable.
//
// The coordinator applies a group's updates before they are durable, and
// state only moves forward; that is safe because no one sees it: after a
// crash before the commit the restart restores the last state written plus
// the replay log (coordinator_replay.go), which is exactly the state before
// the group, and the sites, which got neither a receipt nor an
// acknowledgement, send the updates again. A commit that fails cannot be
// undone in memory, so it ends the run with an error (the daemon exits; a
// restart resumes from the file), rather than answering the group's sites
// from a state the file does not hold.
//
// The FedSplit family's updates are grouped too: each also writes its
// site's new z_j (aggstore.PutUpdatesZ, in the group's transaction). The
// next update of that site reads that z_j as its base, so an update of a
// site that is already in the group, that is stored already, or that is
// older than its site's stored z_j (each needs the file as the one-update
// path sees it) ends the group: the group is committed first and that
// update takes the one-update path. Sum mode keeps one transaction per
// update.

// defaultCommitGroup bounds a group: a larger one waits longer for its
// fsync while holding every update's decoded vector.
const defaultCommitGroup = 256

// grouped says whether updates go through group commit.
func (s *Server) grouped() bool {
	return s.group > 1 && s.sum == nil
}

// splitAlone says whether a FedSplit update u must not join group g (see
// above): its site is in g, or the file holds u or a newer z_j of its
// site. A read error says so too (the one-update path reports it).
func (s *Server) splitAlone(g *commitGroup, u *inUpdate) bool {
	if !isSplit(s.fam) {
		return false
	}
	if _, in := g.clients[u.msg.ClientId]; in {
		return true
	}
	if _, err := s.store.GetUpdate(u.msg.Round, u.msg.ClientId); !errors.Is(err, storage.ErrNotFound) {
		return true
	}
	r, err := s.store.ClientZRound(u.msg.ClientId)
	return (err != nil && !errors.Is(err, storage.ErrNotFound)) || r > u.msg.Round
}

// commitGroup is the group being built: the updates to write, from replay
// log index first, and the lone accepts to carry out once they are durable.
type commitGroup struct {
	first   uint64
	puts    []aggstore.Update
	zs      [][]float64         // the FedSplit family's z_j of each put (nil otherwise)
	clients map[string]struct{} // the FedSplit family: the sites in the group
	staged  []stagedUpdate
}

// stagedUpdate is an update of the group and the batch Stored returned for
// it (a lone accept).
type stagedUpdate struct {
	r  *request
	ds []coordinator.Decision
	at time.Time
}

// serveUpdates handles the update r and, while each batch is a lone
// accept, the updates waiting behind it (see above). Every request it took
// is done when it returns nil.
func (s *Server) serveUpdates(ctx context.Context, r *request) error {
	first, err := s.store.NextLogIndex()
	if err != nil {
		// The one-update path reports a storage error for this update
		// alone (its site retries).
		err := s.onUpdate(ctx, r.update)
		close(r.done)
		return err
	}
	g := &commitGroup{first: first}
	for {
		u := r.update
		if s.splitAlone(g, u) {
			if err := s.commit(g); err != nil {
				return err
			}
			err := s.onUpdate(ctx, u)
			close(r.done)
			return err
		}
		ev := updateEvent(u.msg, s.clock.Now())
		ds := s.coord.Propose(ev)
		if !s.coord.Pending() {
			if err := s.commit(g); err != nil {
				return err
			}
			err := s.apply(ctx, ds, u, time.Time{})
			close(r.done)
			return err
		}
		at := coordinator.EventTime(ev)
		if rd, c := acceptedOf(ds[0]); int(u.msg.Round) != rd || u.msg.ClientId != c {
			return fmt.Errorf("%w: %#v", errNotGiven, ds[0])
		}
		rec, v, err := s.updateRecord(u, at)
		if err != nil {
			s.coord.Step(coordinator.StoreFailed{At: at})
			if err := s.commit(g); err != nil {
				return err
			}
			s.refuseUpdate(u, err)
			s.refreshView()
			close(r.done)
			return nil
		}
		g.puts = append(g.puts, rec)
		if isSplit(s.fam) {
			g.zs = append(g.zs, v)
			if g.clients == nil {
				g.clients = map[string]struct{}{}
			}
			g.clients[u.msg.ClientId] = struct{}{}
		}
		ds = s.coord.Step(coordinator.Stored{At: at, Index: g.first + uint64(len(g.puts)-1)})
		if !coordinator.Replayable(ds) {
			// It goes further (closes the round, say): its state is
			// written after the group is durable, as after any update.
			if err := s.commit(g); err != nil {
				return err
			}
			err := s.apply(ctx, ds, u, at)
			close(r.done)
			return err
		}
		g.staged = append(g.staged, stagedUpdate{r: r, ds: ds, at: at})
		if len(g.puts) >= s.group {
			return s.commit(g)
		}
		select {
		case next := <-s.reqs:
			if next.update != nil {
				r = next
				continue
			}
			if err := s.commit(g); err != nil {
				return err
			}
			return s.serve(ctx, next)
		default:
			return s.commit(g) // nothing waiting: write what there is
		}
	}
}

// beforeGroupCommit, set by tests only, runs just before a group's write
// (to make it fail).
var beforeGroupCommit func(*Server)

// commit writes g's updates in one transaction and then carries out their
// batches in order; g is empty after it. A failed write ends the run (see
// above): the requests stay unanswered and unacknowledged.
func (s *Server) commit(g *commitGroup) error {
	if len(g.puts) == 0 {
		return nil
	}
	if beforeGroupCommit != nil {
		beforeGroupCommit(s)
	}
	if err := s.store.PutUpdatesZ(g.first, g.puts, g.zs); err != nil {
		s.storageErrors.Add(1)
		s.log.Error("group commit failed: stopping (the restart resumes from the state file; the sites re-send)", "updates", len(g.puts), "err", err)
		return fmt.Errorf("aggregator: group commit of %d updates: %w", len(g.puts), err)
	}
	s.log.Debug("updates committed together", "updates", len(g.puts))
	for _, st := range g.staged {
		if _, _, err := s.carryOut(st.ds, st.r.update, st.at); err != nil {
			return err
		}
		close(st.r.done)
	}
	g.first += uint64(len(g.puts))
	g.puts, g.staged = g.puts[:0], g.staged[:0]
	if g.zs != nil {
		g.zs = g.zs[:0]
	}
	clear(g.clients)
	s.refreshView()
	return nil
}

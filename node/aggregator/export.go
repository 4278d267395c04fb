package aggregator

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/edgefl/edgefl/node/aggstore"
	"github.com/edgefl/edgefl/node/storage"
	"github.com/edgefl/edgefl/proto/wire"
)

// ErrNotStored: the bundle asked for cannot be made from the state file.
var ErrNotStored = errors.New("not stored")

// notStored is a one-line ErrNotStored.
type notStored struct{ msg string }

func (e *notStored) Error() string        { return e.msg }
func (e *notStored) Is(target error) bool { return target == ErrNotStored }

func errNotStored(format string, a ...any) error { return &notStored{fmt.Sprintf(format, a...)} }

// ExportBundle makes the model bundle of eval round `round` of a run with a
// federation schema from its state file: the global model after that many
// aggregations (the checkpoint of round+1) with the stored evaluation
// reports of that round. round < 0 asks for the newest: the stored final
// bundle once the run has finished, else the newest checkpoint's. It
// returns the bundle and its round; an error is one line (ErrNotStored
// when the round is not there).
func ExportBundle(store *aggstore.AggStore, round int, now time.Time, version string) ([]byte, int, error) {
	first, err := store.Round(1)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, 0, errNotStored("%s holds no round yet", store.Path())
	}
	if err != nil {
		return nil, 0, err
	}
	var sc storedConfig
	if err := json.Unmarshal(first.Config, &sc); err != nil {
		return nil, 0, fmt.Errorf("%s: stored configuration: %w", store.Path(), err)
	}
	if sc.SchemaDigest == "" {
		return nil, 0, errNotStored("%s is a run without a federation schema: it has no bundles (--schema makes them)", store.Path())
	}
	b, err := store.Fit()
	if errors.Is(err, storage.ErrNotFound) {
		return nil, 0, errNotStored("%s is still in the statistics phase: no model yet", store.Path())
	}
	if err != nil {
		return nil, 0, err
	}
	rec, err := parseFit(b)
	if err != nil {
		return nil, 0, err
	}
	last, _, err := store.LatestCheckpoint()
	if err != nil {
		return nil, 0, err
	}
	if round < 0 {
		if raw, err := store.FinalBundle(); err == nil {
			var head struct {
				Provenance struct {
					Round int `json:"round"`
				} `json:"provenance"`
			}
			_ = json.Unmarshal(raw, &head)
			return raw, head.Provenance.Round, nil
		} else if !errors.Is(err, storage.ErrNotFound) {
			return nil, 0, err
		}
		round = int(last) - 1
	}
	x, err := store.Checkpoint(uint64(round) + 1)
	if errors.Is(err, storage.ErrNotFound) || round < 0 {
		return nil, 0, errNotStored("round %d is not stored in %s (stored: rounds 0..%d, the model after that many aggregations)",
			round, store.Path(), int(last)-1)
	}
	if err != nil {
		return nil, 0, err
	}
	fig, err := evalFigures(store, rec.schema, round, wire.Limits{})
	if err != nil {
		return nil, 0, err
	}
	priv, err := storedPrivacy(store, sc, round)
	if err != nil {
		return nil, 0, err
	}
	raw, err := makeBundle(sc, rec, rec.Model, x, fig, priv, round, now, version)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: round %d: %w", store.Path(), round, err)
	}
	return raw, round, nil
}

// serveBundle is GET /bundle[?round=N]: ExportBundle of the running
// daemon's state file (for `broker-agg export` while the daemon holds it).
func (s *Server) serveBundle(w http.ResponseWriter, r *http.Request) {
	round := -1
	if q := r.URL.Query().Get("round"); q != "" {
		n, err := strconv.Atoi(q)
		if err != nil || n < 0 {
			http.Error(w, fmt.Sprintf("round %q: want a round number >= 0", q), http.StatusBadRequest)
			return
		}
		round = n
	}
	raw, n, err := ExportBundle(s.store, round, s.clock.Now(), s.cfg.Version)
	switch {
	case errors.Is(err, ErrNotStored):
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Edgefl-Round", strconv.Itoa(n))
	_, _ = w.Write(raw)
}

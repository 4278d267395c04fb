package dataset

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/edgefl/edgefl/learn/model"
)

// SplitOptions says how to cut each natural client into train and test.
type SplitOptions struct {
	// TestFraction of each client's samples is held out (0 means 0.1).
	TestFraction float64
	Seed         uint64
}

// leafFile is the LEAF JSON layout.
type leafFile struct {
	Users      []string            `json:"users"`
	NumSamples []int               `json:"num_samples"`
	UserData   map[string]leafUser `json:"user_data"`
}

type leafUser struct {
	X [][]float64 `json:"x"`
	Y []float64   `json:"y"`
}

// leafUsers accumulates users over files in order of first appearance.
type leafUsers struct {
	ids   []string
	index map[string]int
	data  []model.Data
	d     int
	maxY  int
}

// LoadLEAF reads a LEAF JSON file ({"users": [...], "num_samples": [...],
// "user_data": {"u": {"x": [[...]], "y": [...]}}}) or every *.json file of a
// directory (not recursing, in name order), and returns one client per
// user, in the order the users are listed, each shuffled and split into
// train and test. A user found in several files (LEAF's train/ and test/
// files of the same users, say) has its samples concatenated. Features must
// be numeric vectors of one length and labels class indices (integers >= 0):
// text data sets such as Shakespeare need a tokeniser first.
func LoadLEAF(path string, opt SplitOptions) (*Federated, error) {
	frac, err := testFraction(opt.TestFraction)
	if err != nil {
		return nil, err
	}
	files, err := leafFiles(path)
	if err != nil {
		return nil, err
	}
	u := &leafUsers{index: map[string]int{}}
	for _, f := range files {
		if err := u.readFile(f); err != nil {
			return nil, err
		}
	}
	if len(u.ids) == 0 {
		return nil, fmt.Errorf("leaf %s: no users", path)
	}
	rng := newRand(opt.Seed, streamSplit)
	fed := &Federated{
		Name:    strings.TrimSuffix(filepath.Base(filepath.Clean(path)), ".json"),
		D:       u.d,
		Classes: u.maxY + 1,
		Clients: make([]Client, len(u.ids)),
	}
	for i, id := range u.ids {
		fed.Clients[i] = splitClient(id, u.data[i], seq(u.data[i].N), frac, rng)
		u.data[i] = model.Data{}
	}
	return fed, nil
}

// leafFiles lists the JSON files of path.
func leafFiles(path string) ([]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, wrapErr("leaf", err)
	}
	if !st.IsDir() {
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, wrapErr("leaf", err)
	}
	var files []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(strings.ToLower(e.Name()), ".json") {
			files = append(files, filepath.Join(path, e.Name()))
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("leaf %s: no .json files in the directory", path)
	}
	slices.Sort(files)
	return files, nil
}

func (u *leafUsers) readFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return wrapErr("leaf", err)
	}
	defer f.Close()
	if err := u.read(f); err != nil {
		return fmt.Errorf("leaf %s: %w", path, err)
	}
	return nil
}

// read decodes one LEAF document and appends its users.
func (u *leafUsers) read(r io.Reader) error {
	var lf leafFile
	dec := json.NewDecoder(r)
	if err := dec.Decode(&lf); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("empty file: expected a LEAF JSON object")
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("%w (expected users: [names], num_samples: [counts], user_data: {name: {x: [[numbers]], y: [class indices]}}; text features need a tokeniser first)", err)
		}
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("data after the JSON object")
	}
	users := lf.Users
	if len(users) == 0 && len(lf.UserData) > 0 {
		for id := range lf.UserData {
			users = append(users, id)
		}
		slices.Sort(users)
	}
	if len(lf.NumSamples) != 0 && len(lf.NumSamples) != len(users) {
		return fmt.Errorf("%d users but %d num_samples entries", len(users), len(lf.NumSamples))
	}
	if len(lf.UserData) != len(users) {
		return fmt.Errorf("%d users listed but user_data has %d", len(users), len(lf.UserData))
	}
	seen := make(map[string]bool, len(users))
	for i, id := range users {
		if seen[id] {
			return fmt.Errorf("user %q listed twice", id)
		}
		seen[id] = true
		ud, ok := lf.UserData[id]
		if !ok {
			return fmt.Errorf("user %q is listed but has no user_data", id)
		}
		if len(ud.X) != len(ud.Y) {
			return fmt.Errorf("user %q has %d x rows and %d y labels", id, len(ud.X), len(ud.Y))
		}
		if len(lf.NumSamples) != 0 && lf.NumSamples[i] != len(ud.Y) {
			return fmt.Errorf("user %q: num_samples says %d, user_data has %d", id, lf.NumSamples[i], len(ud.Y))
		}
		if len(ud.Y) == 0 {
			return fmt.Errorf("user %q has no samples", id)
		}
		if err := u.add(id, ud); err != nil {
			return err
		}
	}
	return nil
}

// add appends one user's samples, checking dimensions and labels.
func (u *leafUsers) add(id string, ud leafUser) error {
	if u.d == 0 {
		u.d = len(ud.X[0])
		if u.d == 0 {
			return fmt.Errorf("user %q sample 0 has no features", id)
		}
	}
	k, ok := u.index[id]
	if !ok {
		k = len(u.ids)
		u.index[id] = k
		u.ids = append(u.ids, id)
		u.data = append(u.data, model.Data{D: u.d})
	}
	d := &u.data[k]
	for i, x := range ud.X {
		if len(x) != u.d {
			return fmt.Errorf("user %q sample %d has %d features, expected %d", id, i, len(x), u.d)
		}
		y := ud.Y[i]
		if y < 0 || y > MaxClassLabel || y != math.Trunc(y) {
			return fmt.Errorf("user %q sample %d has label %v, expected a class index (an integer in 0..%d)", id, i, y, MaxClassLabel)
		}
		u.maxY = max(u.maxY, int(y))
		d.X = append(d.X, x...)
		d.Y = append(d.Y, y)
		d.N++
	}
	return nil
}

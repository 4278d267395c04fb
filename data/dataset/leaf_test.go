package dataset

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/learn/model"
)

func TestLoadLEAF(t *testing.T) {
	for _, tc := range []struct {
		path    string
		name    string
		d       int
		classes int
		ids     []string
		sizes   []int
	}{
		{"testdata/leaf/mini.json", "mini", 2, 4, []string{"f_0", "f_1", "f_2"}, []int{4, 3, 5}},
		// u2 is in both files: its samples are concatenated. README.txt is
		// not a .json file and is ignored.
		{"testdata/leafdir", "leafdir", 3, 5, []string{"u1", "u2", "u3"}, []int{3, 3, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := LoadLEAF(tc.path, SplitOptions{Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			if f.Name != tc.name || f.D != tc.d || f.Classes != tc.classes || len(f.Clients) != len(tc.ids) {
				t.Fatalf("got %s D=%d classes=%d clients=%d; want %s %d %d %d", f.Name, f.D, f.Classes, len(f.Clients), tc.name, tc.d, tc.classes, len(tc.ids))
			}
			for i, c := range f.Clients {
				if c.ID != tc.ids[i] || c.Train.N+c.Test.N != tc.sizes[i] {
					t.Errorf("client %d: %s with %d+%d samples, want %s with %d", i, c.ID, c.Train.N, c.Test.N, tc.ids[i], tc.sizes[i])
				}
			}
			checkSplits(t, f, 0.1)
		})
	}
	// The samples keep their features and labels: f_1's are (10,11)->2,
	// (12,13)->2, (14,15)->1 in some order.
	f, err := LoadLEAF("testdata/leaf/mini.json", SplitOptions{Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	c := f.Clients[1]
	var got []string
	for _, d := range []model.Data{c.Train, c.Test} {
		for i := range d.N {
			got = append(got, fmt.Sprintf("%v,%v->%v", d.X[2*i], d.X[2*i+1], d.Y[i]))
		}
	}
	slices.Sort(got)
	if want := []string{"10,11->2", "12,13->2", "14,15->1"}; !slices.Equal(got, want) {
		t.Errorf("f_1 samples %v, want %v", got, want)
	}
}

func TestLoadLEAFErrors(t *testing.T) {
	for _, tc := range []struct {
		file, want string
	}{
		{"text.json", "text features need a tokeniser first"},
		{"numsamples.json", `user "a": num_samples says 3, user_data has 2`},
		{"ragged.json", `user "a" sample 1 has 1 features, expected 2`},
		{"fraclabel.json", `user "a" sample 1 has label 0.5, expected a class index`},
		{"missinguser.json", `user "b" is listed but has no user_data`},
		{"xy.json", `user "a" has 3 x rows and 2 y labels`},
		{"truncated.json", "unexpected EOF"},
		{"empty.json", "empty file"},
		{"trailing.json", "data after the JSON object"},
		{"nosuchfile.json", "nosuchfile.json"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			f, err := LoadLEAF("testdata/leafbad/"+tc.file, SplitOptions{})
			if err == nil {
				t.Fatalf("got %d clients, want an error containing %q", len(f.Clients), tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.file) {
				t.Errorf("error %q, want it to name %s and contain %q", err, tc.file, tc.want)
			}
			checkOneLine(t, err)
		})
	}
	if _, err := LoadLEAF("testdata/csv", SplitOptions{}); err == nil || !strings.Contains(err.Error(), "no .json files") {
		t.Errorf("directory without JSON: %v", err)
	}
	if _, err := LoadLEAF("testdata/leaf/mini.json", SplitOptions{TestFraction: -0.5}); err == nil {
		t.Error("negative test fraction accepted")
	}
}

func TestLoadLEAFDeterminism(t *testing.T) {
	a, _ := LoadLEAF("testdata/leaf/mini.json", SplitOptions{Seed: 9})
	b, _ := LoadLEAF("testdata/leaf/mini.json", SplitOptions{Seed: 9})
	if a == nil || b == nil || fingerprint(a) != fingerprint(b) {
		t.Fatal("same seed, different splits")
	}
	// Another seed shuffles differently (f_2 has 5! orders of its samples).
	differs := false
	for seed := uint64(10); seed < 20 && !differs; seed++ {
		c, _ := LoadLEAF("testdata/leaf/mini.json", SplitOptions{Seed: seed})
		differs = fingerprint(a) != fingerprint(c)
	}
	if !differs {
		t.Error("ten other seeds all give the seed-9 split")
	}
}

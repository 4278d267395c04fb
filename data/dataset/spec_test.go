package dataset

import (
	"errors"
	"strings"
	"testing"
)

func TestParseSource(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Source
		back string // String(), when it differs from in
	}{
		{"synthetic:1,1", Source{Kind: SourceSynthetic, Alpha: 1, Beta: 1}, ""},
		{" synthetic:0.5, 0 ", Source{Kind: SourceSynthetic, Alpha: 0.5}, "synthetic:0.5,0"},
		{"synthetic:0,0", Source{Kind: SourceSynthetic}, ""},
		{"synthetic-iid", Source{Kind: SourceSyntheticIID}, ""},
		{"idx:/usr/share/datasets/fashion-mnist", Source{Kind: SourceIDX, Path: "/usr/share/datasets/fashion-mnist"}, ""},
		{"csv:data/heart.csv:label=target", Source{Kind: SourceCSV, Path: "data/heart.csv", Label: "target"}, ""},
		{"csv:C:\\data\\a.csv:label=3:regression", Source{Kind: SourceCSV, Path: "C:\\data\\a.csv", Label: "3", Regression: true}, ""},
		{"csv:odd:label=name.csv:label=y", Source{Kind: SourceCSV, Path: "odd:label=name.csv", Label: "y"}, ""},
		{"leaf:data/femnist/train", Source{Kind: SourceLEAF, Path: "data/femnist/train"}, ""},
	} {
		got, err := ParseSource(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseSource(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			continue
		}
		back := tc.back
		if back == "" {
			back = tc.in
		}
		if got.String() != back {
			t.Errorf("ParseSource(%q).String() = %q, want %q", tc.in, got.String(), back)
		}
		if again, err := ParseSource(got.String()); err != nil || again != got {
			t.Errorf("round trip of %q: %+v, %v", tc.in, again, err)
		}
	}
}

func TestParseSourceErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "unknown source, expected synthetic:ALPHA,BETA"},
		{"mnist", `source "mnist": unknown source`},
		{"synthetic", "expected synthetic:ALPHA,BETA (e.g. synthetic:1,1) or synthetic-iid"},
		{"synthetic:1", "expected synthetic:ALPHA,BETA"},
		{"synthetic:x,1", `alpha: "x" is not a finite number >= 0`},
		{"synthetic:1,-1", `beta: "-1" is not a finite number >= 0`},
		{"synthetic:NaN,1", `alpha: "NaN"`},
		{"synthetic:1,inf", `beta: "inf"`},
		{"synthetic-iid:1,1", "synthetic-iid takes no arguments"},
		{"idx:", "expected idx:DIR"},
		{"leaf:", "expected leaf:PATH"},
		{"csv:a.csv", "expected csv:PATH:label=COLUMN[:regression]"},
		{"csv::label=y", "no file"},
		{"csv:a.csv:label=", `label "": expected label=COLUMN`},
		{"csv:a.csv:label=y:regresion", `label "y:regresion"`},
	} {
		_, err := ParseSource(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrSpec) {
			t.Errorf("ParseSource(%q): error %v, want ErrSpec containing %q", tc.in, err, tc.want)
		}
		checkOneLine(t, err)
	}
}

func TestParsePartition(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Partition
	}{
		{"natural", Partition{Kind: PartNatural}},
		{"iid", Partition{Kind: PartIID}},
		{"dirichlet:0.1", Partition{Kind: PartDirichlet, Alpha: 0.1}},
		{" dirichlet: 2 ", Partition{Kind: PartDirichlet, Alpha: 2}},
		{"classes:2", Partition{Kind: PartClasses, K: 2}},
	} {
		got, err := ParsePartition(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParsePartition(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		if again, err := ParsePartition(got.String()); err != nil || again != got {
			t.Errorf("round trip of %q via %q: %+v, %v", tc.in, got.String(), again, err)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"", "unknown partition, expected natural, iid, dirichlet:ALPHA or classes:K"},
		{"pathological", `partition "pathological": unknown partition`},
		{"iid:3", "iid takes no arguments"},
		{"natural:1", "natural takes no arguments"},
		{"dirichlet", "expected dirichlet:ALPHA with ALPHA a number > 0"},
		{"dirichlet:0", "expected dirichlet:ALPHA"},
		{"dirichlet:-1", "expected dirichlet:ALPHA"},
		{"dirichlet:NaN", "expected dirichlet:ALPHA"},
		{"dirichlet:Inf", "expected dirichlet:ALPHA"},
		{"classes", "expected classes:K with K an integer >= 1"},
		{"classes:0", "expected classes:K"},
		{"classes:1.5", "expected classes:K"},
	} {
		_, err := ParsePartition(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrSpec) {
			t.Errorf("ParsePartition(%q): error %v, want ErrSpec containing %q", tc.in, err, tc.want)
		}
		checkOneLine(t, err)
	}
}

func mustBuild(t *testing.T, src, part string, opt BuildOptions) (*Federated, error) {
	t.Helper()
	s, err := ParseSource(src)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParsePartition(part)
	if err != nil {
		t.Fatal(err)
	}
	return Build(s, p, opt)
}

func TestBuild(t *testing.T) {
	for _, tc := range []struct {
		src, part    string
		opt          BuildOptions
		name         string
		clients      int
		d, classes   int
		samples      int // total, 0 = do not check
		standardized string
	}{
		{"synthetic:1,1", "natural", BuildOptions{Seed: 1}, "synthetic(1,1), natural", 30, 60, 10, 0, ""},
		{"synthetic:0.5,0.5", "natural", BuildOptions{Clients: 12, SyntheticDevices: 12, Seed: 1}, "synthetic(0.5,0.5), natural", 12, 60, 10, 0, ""},
		{"synthetic-iid", "natural", BuildOptions{Clients: 5, Seed: 1, SyntheticMaxSamples: 60}, "synthetic-iid, natural", 5, 60, 10, 0, ""},
		{"synthetic:1,1", "iid", BuildOptions{Clients: 7, SyntheticDevices: 10, Seed: 2}, "synthetic(1,1), iid", 7, 60, 10, 0, ""},
		{"synthetic:1,1", "dirichlet:0.5", BuildOptions{Clients: 4, Seed: 2, Standardize: "global"}, "synthetic(1,1), dirichlet:0.5", 4, 60, 10, 0, "global"},
		{"idx:testdata/idx", "iid", BuildOptions{Clients: 3}, "idx, iid", 3, 6, 3, 9, ""},
		{"idx:testdata/idx", "classes:1", BuildOptions{Clients: 3, PerClass: 1}, "idx, classes:1", 3, 6, 3, 9, ""},
		{"csv:testdata/csv/clinic.csv:label=diagnosis", "iid", BuildOptions{Clients: 2}, "clinic, iid", 2, 3, 3, 6, "client"},
		{"csv:testdata/csv/clinic.csv:label=score:regression", "iid", BuildOptions{Clients: 3, Standardize: "none"}, "clinic, iid", 3, 3, 0, 6, ""},
		{"leaf:testdata/leaf/mini.json", "natural", BuildOptions{}, "mini, natural", 3, 2, 4, 12, "client"},
		{"leaf:testdata/leafdir", "natural", BuildOptions{Clients: 3}, "leafdir, natural", 3, 3, 5, 8, "client"},
		{"leaf:testdata/leaf/mini.json", "iid", BuildOptions{Clients: 2, TestFraction: 0.5}, "mini, iid", 2, 2, 4, 12, "client"},
	} {
		t.Run(tc.src+" "+tc.part, func(t *testing.T) {
			f, err := mustBuild(t, tc.src, tc.part, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			if f.Name != tc.name || len(f.Clients) != tc.clients || f.D != tc.d || f.Classes != tc.classes || f.Standardized != tc.standardized {
				t.Errorf("got %q with %d clients, D=%d, %d classes, standardized %q; want %q %d %d %d %q",
					f.Name, len(f.Clients), f.D, f.Classes, f.Standardized, tc.name, tc.clients, tc.d, tc.classes, tc.standardized)
			}
			train, test := f.Pooled()
			if tc.samples != 0 && train.N+test.N != tc.samples {
				t.Errorf("%d+%d samples, want %d", train.N, test.N, tc.samples)
			}
			frac := tc.opt.TestFraction
			if frac == 0 {
				frac = DefaultTestFraction
			}
			checkSplits(t, f, frac)
			if tc.src == "csv:testdata/csv/clinic.csv:label=diagnosis" && len(f.FeatureNames) != 3 {
				t.Errorf("feature names %q", f.FeatureNames)
			}
		})
	}
}

func TestBuildDeterminism(t *testing.T) {
	for _, tc := range []struct{ src, part string }{
		{"synthetic:1,1", "natural"},
		{"synthetic-iid", "dirichlet:0.3"},
		{"synthetic:0,0", "classes:2"},
		{"leaf:testdata/leaf/mini.json", "natural"},
	} {
		opt := BuildOptions{Clients: 10, SyntheticDevices: 10, Seed: 100}
		if tc.part == "natural" {
			opt.Clients = 0
		}
		a, errA := mustBuild(t, tc.src, tc.part, opt)
		b, errB := mustBuild(t, tc.src, tc.part, opt)
		opt.Seed = 101
		c, errC := mustBuild(t, tc.src, tc.part, opt)
		if err := errors.Join(errA, errB, errC); err != nil {
			t.Fatal(err)
		}
		if fingerprint(a) != fingerprint(b) {
			t.Errorf("%s %s: same seed, different bytes", tc.src, tc.part)
		}
		if fingerprint(a) == fingerprint(c) {
			t.Errorf("%s %s: seeds 100 and 101 give the same bytes", tc.src, tc.part)
		}
	}
}

func TestBuildErrors(t *testing.T) {
	for _, tc := range []struct {
		src, part string
		opt       BuildOptions
		want      string
		spec      bool // errors.Is(err, ErrSpec)
	}{
		{"csv:testdata/csv/clinic.csv:label=diagnosis", "natural", BuildOptions{}, "partition natural of csv:testdata/csv/clinic.csv:label=diagnosis: only synthetic and leaf sources have natural clients", true},
		{"idx:testdata/idx", "natural", BuildOptions{}, "only synthetic and leaf sources have natural clients", true},
		{"idx:testdata/idx", "iid", BuildOptions{}, "partition iid of idx:testdata/idx needs the number of clients", true},
		{"idx:testdata/idx", "iid", BuildOptions{Clients: 10}, "10 clients but data set idx has only 9 samples", true},
		{"idx:testdata/idx", "classes:4", BuildOptions{Clients: 2}, "k must be in 1..3", true},
		{"idx:testdata/nowhere", "iid", BuildOptions{Clients: 2}, "testdata/nowhere", false},
		{"csv:testdata/csv/ragged.csv:label=y", "iid", BuildOptions{Clients: 2}, "testdata/csv/ragged.csv:4:", false},
		{"csv:testdata/csv/clinic.csv:label=score:regression", "dirichlet:1", BuildOptions{Clients: 2}, "regression target", true},
		{"leaf:testdata/leaf/mini.json", "natural", BuildOptions{Clients: 30}, "it has 3 users, so the clients must be 3 (or 0), not 30", true},
		{"leaf:testdata/leafbad/text.json", "natural", BuildOptions{}, "testdata/leafbad/text.json", false},
		{"synthetic:1,1", "natural", BuildOptions{Clients: 5, SyntheticDevices: 6}, "5 clients but 6 synthetic devices", true},
		{"synthetic:1,1", "iid", BuildOptions{Clients: 2, Standardize: "zscore"}, `standardize "zscore", expected none, client or global`, true},
		{"synthetic:1,1", "iid", BuildOptions{Clients: 2, TestFraction: 1}, "test fraction 1, expected a number in (0, 1)", true},
		{"synthetic:1,1", "iid", BuildOptions{Clients: -2}, "-2 clients", true},
	} {
		t.Run(tc.src+" "+tc.part, func(t *testing.T) {
			f, err := mustBuild(t, tc.src, tc.part, tc.opt)
			if err == nil {
				t.Fatalf("got %d clients, want an error containing %q", len(f.Clients), tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) || errors.Is(err, ErrSpec) != tc.spec {
				t.Errorf("error %q (ErrSpec %v), want one containing %q (ErrSpec %v)", err, errors.Is(err, ErrSpec), tc.want, tc.spec)
			}
			checkOneLine(t, err)
		})
	}
	if _, err := Build(Source{Kind: "parquet"}, Partition{Kind: PartIID}, BuildOptions{Clients: 2}); err == nil || !errors.Is(err, ErrSpec) {
		t.Errorf("unknown source kind: %v", err)
	}
	if _, err := Build(Source{Kind: SourceSyntheticIID}, Partition{Kind: "random"}, BuildOptions{Clients: 2}); err == nil || !errors.Is(err, ErrSpec) {
		t.Errorf("unknown partition kind: %v", err)
	}
}

package bundle

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgefl/edgefl/learn/dp"
	"github.com/edgefl/edgefl/testkit"
)

func privateBundle(t *testing.T) *Bundle {
	t.Helper()
	b := testBundle(t)
	rs := []dp.Rate{{Q: 0.5, Noise: 2, Rounds: 4}, {Q: 1, Noise: 2, Rounds: 3}}
	p, err := NewPrivacy(dp.Config{Clip: 0.5, Noise: 2, Delta: 1e-5, Budget: 9}, rs, 7)
	if err != nil {
		t.Fatal(err)
	}
	b.Privacy, b.Evaluation = p, nil
	return b
}

// TestPrivacyRoundTrip: a bundle with a privacy guarantee is version 2 and
// reads back with it; its epsilon is the accountant's after its rounds.
func TestPrivacyRoundTrip(t *testing.T) {
	b := privateBundle(t)
	path := filepath.Join(t.TempDir(), "b.json")
	if err := Write(path, b); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != 2 || got.Privacy == nil || got.Evaluation != nil {
		t.Fatalf("version %d, privacy %+v, evaluation %+v", got.Version, got.Privacy, got.Evaluation)
	}
	a := dp.NewAccountant(nil)
	for range 4 {
		_ = a.Step(0.5, 2)
	}
	for range 3 {
		_ = a.Step(1, 2)
	}
	want, _ := a.Epsilon(1e-5)
	p := got.Privacy
	if p.Epsilon != want || p.Rounds != 7 || p.Mode != "central" || p.ClipNorm != 0.5 || p.NoiseMultiplier != 2 || p.Delta != 1e-5 ||
		p.EpsilonBudget != 9 || len(p.SamplingRates) != 2 || p.Accountant != AccountantRDP || p.Conversion != ConversionBalle2020 {
		t.Fatalf("privacy %+v, want epsilon %v", p, want)
	}
	if s := p.String(); !strings.Contains(s, "epsilon ") || !strings.Contains(s, "after 7 rounds") || !strings.Contains(s, "sampling rates 0.5..1") {
		t.Fatalf("String: %s", s)
	}
	// Round timing: covered only with fixed-length rounds.
	if !strings.Contains(p.Covers, "Not covered: round timing") {
		t.Fatalf("covers without fixed rounds: %s", p.Covers)
	}
	if pf, err := NewPrivacy(dp.Config{Clip: 0.5, Noise: 2, Delta: 1e-5, FixedRounds: true}, p.SamplingRates, 7); err != nil ||
		!strings.Contains(pf.Covers, "closed at their deadline") || strings.Contains(pf.Covers, "Not covered") {
		t.Fatalf("covers with fixed rounds: %v %+v", err, pf)
	}
	// After 3 rounds: the prefix of the history.
	p3, err := NewPrivacy(dp.Config{Clip: 0.5, Noise: 2, Delta: 1e-5}, p.SamplingRates, 3)
	if err != nil || p3.Rounds != 3 || p3.Epsilon != dp.EpsilonAfter(0.5, 2, 3, 1e-5, nil) || len(p3.SamplingRates) != 1 {
		t.Fatalf("privacy after 3 rounds: %+v %v", p3, err)
	}
	if _, err := NewPrivacy(dp.Config{Clip: 0.5, Noise: 2, Delta: 1e-5}, p.SamplingRates, 8); err == nil {
		t.Fatal("privacy after more rounds than the history records")
	}
	// A bundle of a run without --dp is still written as version 1.
	raw, err := testBundle(t).Marshal()
	if err != nil || !bytes.Contains(raw, []byte(`"version":1,`)) || bytes.Contains(raw, []byte("privacy")) {
		t.Fatalf("a plain bundle: %v %.80s", err, raw)
	}
}

// TestVersion1BundleStillLoads: a bundle written by the version-1 code
// (testdata/v1.bundle.json: testBundle's, frozen) reads as it was.
func TestVersion1BundleStillLoads(t *testing.T) {
	b, err := Read("testdata/v1.bundle.json")
	if err != nil {
		t.Fatal(err)
	}
	if b.Version != 1 || b.Privacy != nil || b.Evaluation == nil || len(b.Evaluation.Sites) != 2 {
		t.Fatalf("version %d, privacy %v, evaluation %+v", b.Version, b.Privacy, b.Evaluation)
	}
	raw, _ := os.ReadFile("testdata/v1.bundle.json")
	again, err := testBundle(t).Marshal()
	if err != nil || !bytes.Equal(again, raw) {
		t.Fatal("a bundle without privacy no longer encodes as version 1 did")
	}
}

func TestPrivacyRefused(t *testing.T) {
	raw, err := privateBundle(t).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	// Edits keep the digest valid: the content check must refuse them.
	for _, c := range []struct{ name, want string }{
		{"version 1", "version 1 with a privacy field"},
		{"evaluation", "carries no evaluation"},
		{"rates", "cover 6 rounds, not 7"},
		{"mode", `privacy mode "distributed"`},
		{"no statement", "no statement"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := Unmarshal(raw)
			if err != nil {
				t.Fatal(err)
			}
			switch c.name {
			case "version 1":
				b.Version = 1
			case "evaluation":
				b.Evaluation = testBundle(t).Evaluation
			case "rates":
				b.Privacy.SamplingRates[1].Rounds--
			case "mode":
				b.Privacy.Mode = "distributed"
			case "no statement":
				b.Privacy.Covers = ""
			}
			b.Digest, _ = b.digest()
			out, err := json2(b)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "b.json")
			testkit.WriteFile(t, path, string(out))
			if _, err := Read(path); err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("Read: %v, want one line with %q", err, c.want)
			}
		})
	}
	if _, err := (&Bundle{Privacy: privateBundle(t).Privacy}).Marshal(); err == nil {
		t.Fatal("Marshal of an incomplete bundle")
	}
	withEval := privateBundle(t)
	withEval.Evaluation = testBundle(t).Evaluation
	if _, err := withEval.Marshal(); err == nil || !strings.Contains(err.Error(), "carries no evaluation") {
		t.Fatalf("Marshal of a private bundle with an evaluation: %v", err)
	}
}

// json2 encodes b as Marshal does, without its checks and version.
func json2(b *Bundle) ([]byte, error) { return json.Marshal(b) }

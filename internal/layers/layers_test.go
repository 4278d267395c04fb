package layers

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

type listed struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// TestModuleLayers lists every package of the module with `go list` and
// checks each import, the tests' included, against the layer rule.
func TestModuleLayers(t *testing.T) {
	cmd := exec.Command("go", "list", "-json", Module+"/...")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	n := 0
	for dec.More() {
		var p listed
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		n++
		vs := Check(p.ImportPath, p.Imports, false)
		vs = append(vs, Check(p.ImportPath, append(p.TestImports, p.XTestImports...), true)...)
		for _, v := range vs {
			t.Errorf("%s", describe(v))
		}
	}
	if n < 30 {
		t.Fatalf("go list found %d packages; the module has more than 30", n)
	}
}

func describe(v Violation) string {
	kind := "imports"
	if v.Test {
		kind = "imports in a test"
	}
	return fmt.Sprintf("%s %s %s: a package imports only from its own layer or below (internal/layers.Ranks)",
		strings.TrimPrefix(v.From, Module+"/"), kind, strings.TrimPrefix(v.To, Module+"/"))
}

// TestCheckRule plants upward imports and checks each is reported, and the
// allowed directions are not.
func TestCheckRule(t *testing.T) {
	m := func(s string) string { return Module + "/" + s }
	cases := []struct {
		name  string
		from  string
		to    string
		test  bool
		wrong bool
	}{
		{"down", m("node/agent"), m("learn/model"), false, false},
		{"same layer", m("learn/proxsolver"), m("learn/model"), false, false},
		{"up one", m("learn/model"), m("data/schema"), false, true},
		{"math to daemon", m("learn/aggregate"), m("node/aggregator"), false, true},
		{"daemon to sim", m("node/aggregator"), m("sim/localfed"), false, true},
		{"up in a test", m("data/sitedata"), m("node/agent"), true, true},
		{"testkit from a test", m("learn/quant"), m("testkit"), true, false},
		{"testkit from code", m("cmd/broker-agg"), m("testkit/fedbroker"), false, true},
		{"unknown folder", m("node/agent"), m("misc/thing"), false, true},
		{"outside the module", m("learn/model"), "gonum.org/v1/gonum/blas", false, false},
	}
	for _, c := range cases {
		got := len(Check(c.from, []string{c.to}, c.test)) > 0
		if got != c.wrong {
			t.Errorf("%s: %s -> %s reported %v, want %v", c.name, c.from, c.to, got, c.wrong)
		}
	}
}

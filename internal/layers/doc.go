// Package layers is the module's import rule of record: the top-level
// folders are layers, and a package imports only from its own layer or the
// layers below it (ARCHITECTURE.md, "Layers"). layers_test.go checks every
// package of the module against Rank with `go list`, so an upward import
// fails the tests instead of a review.
package layers

import "strings"

// Module is the module path the rule applies to.
const Module = "github.com/edgefl/edgefl"

// Ranks orders the top-level folders from the bottom up. internal holds the
// leaf utilities (clock, flags, rate limits, metrics), learn the pure math,
// data the site's tables and the model bundle, proto what travels between
// nodes, node the daemons and their stores, sim the in-process federations,
// testkit what tests share; cmd, e2e and scripts sit on top.
var Ranks = map[string]int{
	"internal": 0,
	"learn":    1,
	"data":     2,
	"proto":    3,
	"node":     4,
	"sim":      5,
	"testkit":  6,
	"cmd":      7,
	"e2e":      7,
	"scripts":  7,
}

// Rank returns the layer of a module package path (with or without the
// module prefix) and whether its top-level folder is a known layer.
func Rank(pkg string) (int, bool) {
	pkg = strings.TrimPrefix(strings.TrimPrefix(pkg, Module), "/")
	top, _, _ := strings.Cut(pkg, "/")
	r, ok := Ranks[top]
	return r, ok
}

// Violation is one import that breaks the rule.
type Violation struct {
	From, To string
	Test     bool // the import is in a _test.go file
}

// Check returns the imports of a package that break the rule: an import of
// a higher layer, an import from an unknown folder, and testkit imported by
// non-test code. Imports outside the module are not checked here (the
// edge-agent's dependency guard, cmd/edge-agent/deps_test.go, does that).
func Check(from string, imports []string, test bool) []Violation {
	var out []Violation
	rf, okf := Rank(from)
	for _, to := range imports {
		if to != Module && !strings.HasPrefix(to, Module+"/") {
			continue
		}
		rt, okt := Rank(to)
		top, _, _ := strings.Cut(strings.TrimPrefix(to, Module+"/"), "/")
		switch {
		case !okf || !okt:
			out = append(out, Violation{from, to, test})
		case top == "testkit" && !test:
			out = append(out, Violation{from, to, test})
		case rt > rf && !(test && top == "testkit"):
			out = append(out, Violation{from, to, test})
		}
	}
	return out
}

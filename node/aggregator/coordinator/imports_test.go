package coordinator

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The coordinator is pure: events in, decisions out, time only as the
// values events carry. It reads no file, socket, broker or clock, so what
// it decides is a function of its inputs (replay, the property tests and
// simulate rely on that). These tests hold it to that with its import list
// and its calls into package time.

const module = "github.com/edgefl/edgefl"

// directBanned are packages the coordinator's own files may not import:
// the doors to files, sockets, processes and logs. (fmt and encoding/json
// reach os and io inside the standard library; that is not a door the
// coordinator opens, so only direct imports of these are refused.)
var directBanned = []string{"os", "io", "net", "bufio", "syscall", "log", "embed", "unsafe", "runtime", "crypto/rand", "math/rand"}

// depBanned are packages nothing the coordinator links may reach: the
// store, the brokers and MQTT clients, the network, and every package of
// the node and sim layers (the coordinator is the shell's core, not a
// client of it) or above.
var depBanned = []string{
	"net", "net/http", "os/exec",
	module + "/node", module + "/sim", module + "/cmd", module + "/e2e", module + "/testkit",
	module + "/internal/mqttstore",
	"github.com/eclipse/paho.mqtt.golang", "github.com/mochi-mqtt/server", "go.etcd.io/bbolt",
}

// under says whether path is prefix or a package below it.
func under(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// importViolations lists the imports of a package that break the rule:
// direct are its files' imports, deps everything it links (go list -deps),
// self its own import path (listed by -deps, not a violation).
func importViolations(self string, direct, deps []string) []string {
	var bad []string
	for _, p := range direct {
		for _, b := range directBanned {
			if under(p, b) {
				bad = append(bad, "imports "+p)
				break
			}
		}
	}
	for _, p := range deps {
		if p == self {
			continue
		}
		for _, b := range depBanned {
			if under(p, b) {
				bad = append(bad, "links "+p)
				break
			}
		}
	}
	return bad
}

func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		t.Fatalf("go list %v: %v", args, err)
	}
	return strings.Fields(string(out))
}

// TestCoordinatorImports lists the package's imports with go list and
// refuses any door to the outside world.
func TestCoordinatorImports(t *testing.T) {
	self := goList(t, "-f", "{{.ImportPath}}", ".")
	direct := goList(t, "-f", `{{join .Imports " "}}`, ".")
	deps := goList(t, "-deps", ".")
	if len(self) != 1 || !slices.Contains(deps, self[0]) || !slices.Contains(direct, "time") {
		t.Fatalf("go list: package %v, imports %v, deps %d: not the coordinator's listing", self, direct, len(deps))
	}
	t.Logf("imports: %s", strings.Join(direct, " "))
	for _, v := range importViolations(self[0], direct, deps) {
		t.Errorf("the coordinator %s: it is pure (events in, decisions out); I/O belongs to the aggregator's shell", v)
	}
}

// TestImportRuleRefuses plants imports the rule must refuse, and ones it
// must let through.
func TestImportRuleRefuses(t *testing.T) {
	self := module + "/node/aggregator/coordinator"
	for _, tc := range []struct {
		direct, deps []string
		bad          int
	}{
		{direct: []string{"fmt", "time", module + "/learn/dp"}, deps: []string{"os", "io", "fmt", self}, bad: 0},
		{direct: []string{"os"}, bad: 1},
		{direct: []string{"io"}, bad: 1},
		{direct: []string{"io/fs"}, bad: 1},
		{direct: []string{"net/http"}, deps: []string{"net/http", "net"}, bad: 3},
		{direct: []string{"log/slog"}, bad: 1},
		{deps: []string{module + "/node/storage"}, bad: 1},
		{deps: []string{module + "/node/aggregator"}, bad: 1},
		{deps: []string{module + "/sim/localfed"}, bad: 1},
		{deps: []string{"github.com/eclipse/paho.mqtt.golang/packets"}, bad: 1},
		{deps: []string{"github.com/mochi-mqtt/server/v2"}, bad: 1},
		{deps: []string{"go.etcd.io/bbolt"}, bad: 1},
		{direct: []string{"iter", "ioutilx"}, deps: []string{module + "/nodes"}, bad: 0}, // prefixes, not packages
	} {
		if got := importViolations(self, tc.direct, tc.deps); len(got) != tc.bad {
			t.Errorf("direct %v deps %v: violations %v, want %d", tc.direct, tc.deps, got, tc.bad)
		}
	}
}

// clockReads are the functions of package time that read or wait on the
// wall clock; the coordinator gets the time from its events.
var clockReads = []string{"Now", "Since", "Until", "Sleep", "After", "AfterFunc", "Tick", "NewTimer", "NewTicker"}

// TestCoordinatorReadsNoClock parses the package's files and refuses any
// call that reads the clock.
func TestCoordinatorReadsNoClock(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	n := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		n++
		ast.Inspect(f, func(x ast.Node) bool {
			sel, ok := x.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == "time" && slices.Contains(clockReads, sel.Sel.Name) {
				t.Errorf("%s: time.%s: the coordinator takes the time from its events", fset.Position(sel.Pos()), sel.Sel.Name)
			}
			return true
		})
	}
	if n < 5 {
		t.Fatalf("parsed %d files; the coordinator has more", n)
	}
}

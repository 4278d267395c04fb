package main

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The dependency guard (in the style of tailscale's tstest/deptest): edge-agent
// is flashed onto Raspberry Pis and Jetsons as one small static binary, so
// what it links is checked for every target we ship, with `go list -deps`.
// It runs on whatever the command imports today and catches regressions as
// the agent grows.

const modulePath = "github.com/edgefl/edgefl"

// edgeTargets are the GOOS/GOARCH[/GOARM] the binary is built for
// (scripts/cross-compile.sh). Build tags can change the dependency graph per
// architecture, so each is listed.
var edgeTargets = []struct{ goos, goarch, goarm string }{
	{"linux", "arm64", ""},
	{"linux", "arm", "7"},
	{"linux", "amd64", ""},
}

// forbiddenDeps must never be linked into edge-agent. A pattern ending in
// "/..." matches the package and everything below it, as in go list. A
// dependency listed in unless (when set) makes the entry moot: it links the
// package itself, and we do not control that.
var forbiddenDeps = []struct {
	pattern, why, unless string
}{
	// Plotting (broker-agg simulate writes results.png) and what it drags in.
	{pattern: "gonum.org/v1/plot/...", why: "plotting belongs to broker-agg simulate (sim/plot.go), not to the gateway"},
	{pattern: "codeberg.org/go-fonts/...", why: "fonts embedded for gonum/plot: megabytes of TTF data"},
	{pattern: "codeberg.org/go-latex/...", why: "gonum/plot's LaTeX text rendering"},
	{pattern: "codeberg.org/go-pdf/...", why: "gonum/plot's PDF backend"},
	{pattern: "git.sr.ht/~sbinet/gg", why: "gonum/plot's raster canvas"},
	{pattern: "github.com/ajstarks/svgo", why: "gonum/plot's SVG backend"},
	{pattern: "github.com/golang/freetype/...", why: "font rasterisation for plots"},
	{pattern: "golang.org/x/image/...", why: "font and image code for plots"},
	{pattern: "image/...", why: "image encoding is for plots; the agent trains on feature vectors"},

	// The embedded MQTT broker runs inside broker-agg on the on-prem box;
	// gateways are clients of it (or of Mosquitto).
	{pattern: "github.com/mochi-mqtt/...", why: "the embedded MQTT broker (mochi-mqtt) is broker-agg's; edge-agent is an MQTT client only"},
	{pattern: "github.com/rs/xid", why: "mochi-mqtt's id generator: its presence means the broker crept in"},

	// Servers. paho.mqtt.golang imports net/http itself (netconn.go takes
	// http.Header for its websocket transport, via gorilla/websocket), so
	// net/http is forbidden only until paho links it; what we would add on
	// top of it stays forbidden.
	{pattern: "net/http", why: "an HTTP server or client (dashboards, metrics, downloads) on the gateway", unless: "github.com/eclipse/paho.mqtt.golang"},
	{pattern: "net/http/pprof", why: "an unauthenticated profiling endpoint has no place on a hospital gateway"},
	{pattern: "expvar", why: "publishes /debug/vars on http.DefaultServeMux"},
	{pattern: "html/template", why: "dashboards are broker-agg's"},
	{pattern: "testing", why: "test helpers in the binary (it also registers the test flags)"},

	// Our own server-side and test-only packages (ARCHITECTURE.md, Dependency rules: the agent must not
	// know aggregator internals).
	{pattern: modulePath + "/node/aggregator/...", why: "the on-prem round coordinator: aggregator internals stay on the server"},
	{pattern: modulePath + "/node/aggstore/...", why: "the aggregator's store (registry, rounds, updates, round log, rollback): the agent links node/storage and node/edgestore only"},
	{pattern: modulePath + "/learn/aggregate/...", why: "server-side aggregators (and gonum/mat with them); the agent shares only the sketch package"},
	{pattern: modulePath + "/sim/...", why: "the in-process simulator (virtual clients, plots) is broker-agg simulate's"},
	{pattern: modulePath + "/node/broker/...", why: "the embedded-broker wrapper is broker-agg's"},
	{pattern: modulePath + "/internal/crossarch/...", why: "test helpers for the qemu tests"},
	{pattern: modulePath + "/testkit/...", why: "the shared test kit (test logger, embedded test broker, leak check)"},
}

// allowedModules are the only modules other than the standard library and
// this one edge-agent may link. A new one needs a reason here, and its cost
// checked with scripts/cross-compile.sh (8 MiB limit for linux/arm64).
var allowedModules = map[string]string{
	"github.com/eclipse/paho.mqtt.golang": "the MQTT client (ARCHITECTURE.md, Libraries and how we use them)",
	"github.com/gorilla/websocket":        "paho's websocket transport (ws://, wss://), imported by paho unconditionally",
	"golang.org/x/net":                    "paho's proxy dialer (golang.org/x/net/proxy)",
	"golang.org/x/sync":                   "paho's semaphore",
	"go.etcd.io/bbolt":                    "the edge state and outbox (node/storage, node/edgestore)",
	"golang.org/x/sys":                    "bbolt's mmap, flock and fdatasync; learn/model's CPU feature check",
	"github.com/klauspost/compress":       "zstd framing of updates (quant/)",
	"google.golang.org/protobuf":          "the message envelopes (wire/)",
	"gonum.org/v1/gonum":                  "BLAS kernels of model/ (pure Go on ARM)",
}

// wantDeps must be linked: if they are missing the guard is looking at the
// wrong thing.
var wantDeps = []string{
	modulePath + "/learn/model",
	modulePath + "/learn/proxsolver",
	modulePath + "/node/edgestore",
}

func matchPattern(pattern, pkg string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == prefix || strings.HasPrefix(pkg, prefix+"/")
	}
	return pkg == pattern
}

func TestMatchPattern(t *testing.T) {
	tests := []struct {
		pattern, pkg string
		want         bool
	}{
		{"image/...", "image", true},
		{"image/...", "image/png", true},
		{"image/...", "imagex", false},
		{"net/http", "net/http", true},
		{"net/http", "net/http/pprof", false},
		{"net/http", "net", false},
		{modulePath + "/sim/...", modulePath + "/sim", true},
		{modulePath + "/sim/...", modulePath + "/simple", false},
	}
	for _, tt := range tests {
		if got := matchPattern(tt.pattern, tt.pkg); got != tt.want {
			t.Errorf("matchPattern(%q, %q) = %v, want %v", tt.pattern, tt.pkg, got, tt.want)
		}
	}
}

// listDeps returns the dependencies of the package in dir (relative to this
// one's) for one target: import path to module path ("std" for the standard
// library).
func listDeps(t *testing.T, dir, goos, goarch, goarm string) map[string]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps",
		"-f", `{{.ImportPath}}{{"\t"}}{{if .Standard}}std{{else}}{{with .Module}}{{.Path}}{{end}}{{end}}`, dir)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch, "GOARM="+goarm)
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps %s for %s/%s: %v\n%s", dir, goos, goarch, err, stderr)
	}
	deps := map[string]string{}
	for line := range strings.Lines(string(out)) {
		pkg, mod, _ := strings.Cut(strings.TrimSuffix(line, "\n"), "\t")
		deps[pkg] = mod
	}
	return deps
}

// depViolations returns what is wrong with deps, one message per problem,
// sorted.
func depViolations(deps map[string]string) []string {
	var bad []string
	for _, want := range wantDeps {
		if _, ok := deps[want]; !ok {
			bad = append(bad, fmt.Sprintf("%s is not a dependency: is the guard looking at edge-agent?", want))
		}
	}
	for pkg, mod := range deps {
		for _, f := range forbiddenDeps {
			if !matchPattern(f.pattern, pkg) {
				continue
			}
			if _, moot := deps[f.unless]; f.unless != "" && moot {
				continue
			}
			bad = append(bad, fmt.Sprintf("links %s (forbidden: %s): %s", pkg, f.pattern, f.why))
		}
		if mod == "std" || mod == modulePath {
			continue
		}
		if _, ok := allowedModules[mod]; !ok {
			bad = append(bad, fmt.Sprintf("links %s from module %q, which is not in allowedModules: "+
				"check its size with scripts/cross-compile.sh and add it with a reason", pkg, mod))
		}
	}
	slices.Sort(bad)
	return bad
}

func TestDeps(t *testing.T) {
	for _, target := range edgeTargets {
		t.Run(target.goos+"-"+target.goarch, func(t *testing.T) {
			t.Parallel()
			deps := listDeps(t, ".", target.goos, target.goarch, target.goarm)
			if _, ok := deps[modulePath+"/cmd/edge-agent"]; !ok {
				t.Fatalf("go list -deps . did not list edge-agent itself: %v", deps)
			}
			for _, v := range depViolations(deps) {
				t.Errorf("edge-agent for %s/%s %s", target.goos, target.goarch, v)
			}
		})
	}
}

// The guard bites: broker-agg links the simulator, its plots and (once
// wired) the embedded broker, all of which the guard reports.
func TestDepsGuardCatchesBrokerAgg(t *testing.T) {
	t.Parallel()
	got := strings.Join(depViolations(listDeps(t, "../broker-agg", "linux", "arm64", "")), "\n")
	for _, want := range []string{
		"links " + modulePath + "/sim (forbidden",
		"links gonum.org/v1/plot (forbidden",
		"links image/png (forbidden",
		"links codeberg.org/go-fonts/liberation",
		"links " + modulePath + "/node/aggstore (forbidden",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the guard did not report %q for broker-agg; it reported:\n%s", want, got)
		}
	}
}

// sizeBudget is edge-agent's budget for linux/arm64 (scripts/cross-compile.sh
// fails above it too): 8 MiB.
const sizeBudget = 8 << 20

// TestSizeBudget builds the linux/arm64 release binary with the release
// flags (scripts/cross-compile.sh's, but for -X main.version, a few dozen
// bytes) and fails above sizeBudget. The file grows in whole 64 KiB pages:
// each ELF segment is 64 KiB aligned, so a segment 1 byte past a boundary
// costs a page. The test prints each segment's size and its margin to its
// next boundary, which is how much code or data can still land for free.
func TestSizeBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("builds edge-agent for linux/arm64")
	}
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "edge-agent")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64", "GOARM=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build for linux/arm64: %v\n%s", err, out)
	}
	fi, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	segs, err := loadSegments(bin)
	if err != nil {
		t.Fatal(err)
	}
	report := segmentReport(segs)
	if fi.Size() > sizeBudget {
		t.Fatalf("edge-agent for linux/arm64 is %d bytes, %d over its %d-byte (8 MiB) budget:\n%s"+
			"find where the bytes go with go tool nm -size -sort size on a build without -s -w",
			fi.Size(), fi.Size()-sizeBudget, sizeBudget, report)
	}
	t.Logf("edge-agent for linux/arm64 is %d bytes, %d under its %d-byte budget:\n%s",
		fi.Size(), sizeBudget-fi.Size(), sizeBudget, report)
}

// segment is one PT_LOAD segment of an ELF file.
type segment struct {
	flags      elf.ProgFlag
	size, page uint64 // file size and alignment
}

func loadSegments(path string) ([]segment, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var segs []segment
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			segs = append(segs, segment{flags: p.Flags, size: p.Filesz, page: p.Align})
		}
	}
	return segs, nil
}

// segmentReport is one line per segment: its flags, its size, the pages it
// takes, how far it reaches into its last page (what a cut must save to
// drop that page) and its margin to the next boundary.
func segmentReport(segs []segment) string {
	var b strings.Builder
	for _, s := range segs {
		name := map[elf.ProgFlag]string{elf.PF_R | elf.PF_X: "text", elf.PF_R: "rodata", elf.PF_R | elf.PF_W: "data"}[s.flags]
		fmt.Fprintf(&b, "  %-6s %-11s %#9x = %8d bytes: %s\n", name, s.flags, s.size, s.size, pageMargin(s.size, s.page))
	}
	return b.String()
}

// pageMargin says how many pages of align bytes size takes and how far it
// is from the next boundary.
func pageMargin(size, align uint64) string {
	if align <= 1 {
		return "not page aligned"
	}
	pages := (size + align - 1) / align
	if pages == 0 {
		return "empty"
	}
	return fmt.Sprintf("%d pages of %d KiB, %d bytes into the last, %d below the next boundary",
		pages, align>>10, size-(pages-1)*align, pages*align-size)
}

func TestPageMargin(t *testing.T) {
	tests := []struct {
		size, align uint64
		want        string
	}{
		{0x381d24, 0x10000, "57 pages of 64 KiB, 7460 bytes into the last, 58076 below the next boundary"},
		{0x380000, 0x10000, "56 pages of 64 KiB, 65536 bytes into the last, 0 below the next boundary"},
		{0x380001, 0x10000, "57 pages of 64 KiB, 1 bytes into the last, 65535 below the next boundary"},
		{0, 0x10000, "empty"},
		{10, 1, "not page aligned"},
	}
	for _, tt := range tests {
		if got := pageMargin(tt.size, tt.align); got != tt.want {
			t.Errorf("pageMargin(%#x, %#x) = %q, want %q", tt.size, tt.align, got, tt.want)
		}
	}
}

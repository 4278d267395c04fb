package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docSection returns the lines of the markdown file's (path from the
// repository's root) section under heading up to the next heading of the
// same or a higher level, and that heading.
func docSection(t *testing.T, file, heading string) (body, next string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", file))
	if err != nil {
		t.Fatal(err)
	}
	level := strings.Index(heading, " ")
	var b strings.Builder
	in, fence := false, false
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if !fence && strings.HasPrefix(line, "#") {
			l := strings.Index(line, " ")
			if in && l > 0 && l <= level {
				return b.String(), line
			}
			if line == heading {
				in = true
				continue
			}
		}
		if in {
			b.WriteString(line + "\n")
		}
	}
	if !in {
		t.Fatalf("%s has no %q section", file, heading)
	}
	return b.String(), ""
}

// TestReadmeInstallAggregator: docs/operations.md says how to build and
// install broker-agg on the aggregator box, right before "## Deploy to a gateway",
// with the paths the systemd unit and the example configuration use, and
// its build command builds a binary that prints the version it was given.
func TestReadmeInstallAggregator(t *testing.T) {
	sec, next := docSection(t, "docs/operations.md", "## Install the aggregator")
	if next != "## Deploy to a gateway" {
		t.Errorf("the section is followed by %q, want it right before \"## Deploy to a gateway\"", next)
	}
	unit, err := os.ReadFile("../../deploy/systemd/broker-agg.service")
	if err != nil {
		t.Fatal(err)
	}
	var exec0, config, stateDir string
	sc := bufio.NewScanner(strings.NewReader(string(unit)))
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "ExecStart="); ok {
			f := strings.Fields(v)
			exec0 = f[0]
			for i := range f[:len(f)-1] {
				if f[i] == "--config" {
					config = f[i+1]
				}
			}
		}
		if v, ok := strings.CutPrefix(line, "StateDirectory="); ok {
			stateDir = "/var/lib/" + strings.TrimSpace(v)
		}
	}
	if exec0 == "" || config == "" || stateDir == "" {
		t.Fatalf("the unit's ExecStart (%q, --config %q) or StateDirectory (%q) not found", exec0, config, stateDir)
	}
	conf, err := os.ReadFile("../../deploy/broker-agg.example.conf")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^state_file = (\S+)$`).FindSubmatch(conf)
	if m == nil || filepath.Dir(string(m[1])) != stateDir {
		t.Errorf("deploy/broker-agg.example.conf's state_file %q is not in the unit's state directory %s", m, stateDir)
	}
	for _, want := range []string{
		"go build", "-trimpath", "-X main.version=", "./cmd/broker-agg",
		"install -m 0755 broker-agg " + exec0,
		"deploy/broker-agg.example.conf " + config,
		"deploy/systemd/broker-agg.service /etc/systemd/system/",
		"systemctl enable --now broker-agg",
		stateDir,
	} {
		if !strings.Contains(sec, want) {
			t.Errorf("the section does not say %q", want)
		}
	}
	if testing.Short() {
		return
	}
	// The build command, as written, with the output in a temporary
	// directory and a fixed version.
	line := regexp.MustCompile(`(?m)^CGO_ENABLED=0 go build .*$`).FindString(sec)
	if line == "" {
		t.Fatal("no `CGO_ENABLED=0 go build` line")
	}
	bin := filepath.Join(t.TempDir(), "broker-agg")
	line = regexp.MustCompile(`\$\(git describe[^)]*\)`).ReplaceAllString(line, "readme-test")
	line = strings.Replace(line, "-o broker-agg ", "-o "+bin+" ", 1)
	cmd := exec.Command("sh", "-c", line)
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", line, err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil || strings.TrimSpace(string(out)) != "broker-agg readme-test" {
		t.Fatalf("%s version: %q, %v", bin, out, err)
	}
}

// TestReadmeCommands: README.md stays a few screens (at most 250 lines) and
// opens with the two commands: the demo on its defaults and the test
// command, which is exactly what CI runs (.ci/run).
func TestReadmeCommands(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	if n := strings.Count(readme, "\n"); n > 250 {
		t.Errorf("README.md has %d lines, want at most 250 (details go to docs/)", n)
	}
	first := regexp.MustCompile("(?s)```sh\n(.*?)```").FindStringSubmatch(readme)
	if first == nil {
		t.Fatal("README.md has no ```sh block")
	}
	var cmds []string
	for _, line := range strings.Split(strings.TrimSpace(first[1]), "\n") {
		cmd, _, _ := strings.Cut(line, "#")
		cmds = append(cmds, strings.TrimSpace(cmd))
	}
	if len(cmds) != 2 || cmds[0] != "go run ./cmd/broker-agg demo" || cmds[1] != "scripts/test.sh" {
		t.Errorf("README.md's first commands are %q, want the demo and scripts/test.sh", cmds)
	}
	ci, err := os.ReadFile("../../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^exec scripts/test\.sh$`).Match(ci) {
		t.Errorf(".ci/run does not run the README's test command scripts/test.sh:\n%s", ci)
	}
}

// headingAnchors are the anchors a markdown renderer (GitHub's rule) gives
// the headings of a file: lower case, punctuation but '-' and '_' dropped,
// spaces as '-'.
func headingAnchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	drop := regexp.MustCompile(`[^\p{L}\p{N}_\- ]`)
	anchors := map[string]bool{}
	fence := false
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if h, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && !fence && strings.HasPrefix(line, "#") {
			anchors[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), ""), " ", "-")] = true
		}
	}
	return anchors
}

// TestReadmeLinks: every relative link of README.md and of the docs/ pages
// leads to a file of the repository and, with a #fragment, to one of its
// headings, so the sections that moved out of the README stay reachable.
func TestReadmeLinks(t *testing.T) {
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "../../README.md")
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, page := range pages {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(raw), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links to %s: %v", page, target, err)
				continue
			}
			if frag != "" && !headingAnchors(t, path)[frag] {
				t.Errorf("%s links to %s: no heading of %s has the anchor %q", page, target, path, frag)
			}
		}
	}
}

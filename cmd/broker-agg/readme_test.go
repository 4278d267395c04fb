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

// readmeSection returns the lines of README.md's section under heading up
// to the next heading of the same or a higher level, and that heading.
func readmeSection(t *testing.T, heading string) (body, next string) {
	t.Helper()
	raw, err := os.ReadFile("../../README.md")
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
		t.Fatalf("README.md has no %q section", heading)
	}
	return b.String(), ""
}

// TestReadmeInstallAggregator: README.md says how to build and install
// broker-agg on the aggregator box, right before "## Deploy to a gateway",
// with the paths the systemd unit and the example configuration use, and
// its build command builds a binary that prints the version it was given.
func TestReadmeInstallAggregator(t *testing.T) {
	sec, next := readmeSection(t, "### Install the aggregator")
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

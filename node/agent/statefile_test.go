package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A missing state file where the site ran before is refused, naming the
// trace and --fresh-state; a new installation (no trace) and a deliberate
// start over (FreshState) go ahead; an existing state file is never
// refused.
func TestCheckStateFile(t *testing.T) {
	const (
		fstab = "# <file system> <mount point> <type> <options>\n" +
			"UUID=1 / ext4 defaults 0 1\n" +
			"UUID=2 /srv/edge\\040data ext4 defaults,nofail 0 2\n" +
			"UUID=3 none swap sw 0 0\n"
		mountedRoot = "22 1 179:2 / / rw,relatime shared:1 - ext4 /dev/mmcblk0p2 rw\n"
		mountedData = "23 22 8:1 / /srv/edge\\040data rw,relatime shared:2 - ext4 /dev/sda1 rw\n"
	)
	for _, c := range []struct {
		name      string
		state     bool   // the state file exists
		modelOut  bool   // model_out exists
		damaged   bool   // a copy moved aside exists
		onData    bool   // the state file lies under /srv/edge data
		mountinfo string // /proc/self/mountinfo
		fresh     bool
		want      string // "" = allowed, else a part of the refusal
	}{
		{name: "a new installation", mountinfo: mountedRoot},
		{name: "the state file exists", state: true, modelOut: true, damaged: true, onData: true, mountinfo: mountedRoot},
		{name: "model_out exists", modelOut: true, mountinfo: mountedRoot, want: "model_out"},
		{name: "a copy moved aside", damaged: true, mountinfo: mountedRoot, want: ".damaged-1700000000"},
		{name: "the data partition is not mounted", onData: true, mountinfo: mountedRoot, want: "its file system /srv/edge data"},
		{name: "the data partition is mounted, the file is new", onData: true, mountinfo: mountedRoot + mountedData},
		{name: "fresh start asked", modelOut: true, damaged: true, onData: true, mountinfo: mountedRoot, fresh: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "var")
			if c.onData {
				// The test's stand-in for /srv/edge data: fstab names the
				// temp directory's path.
				dir = filepath.Join(root, "srv", "edge data")
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			fstabPath = filepath.Join(root, "fstab")
			mountinfoPath = filepath.Join(root, "mountinfo")
			t.Cleanup(func() { fstabPath, mountinfoPath = "/etc/fstab", "/proc/self/mountinfo" })
			srv := strings.ReplaceAll(filepath.Join(root, "srv", "edge"), " ", "\\040") + "\\040data"
			write(t, fstabPath, strings.ReplaceAll(fstab, "/srv/edge\\040data", srv))
			write(t, mountinfoPath, strings.ReplaceAll(c.mountinfo, "/srv/edge\\040data", srv))
			cfg := Config{StateFile: filepath.Join(dir, "edge-agent.db"), ModelOut: filepath.Join(root, "out", "final.bundle.json"), FreshState: c.fresh}
			if c.state {
				write(t, cfg.StateFile, "x")
			}
			if c.modelOut {
				write(t, cfg.ModelOut, "{}")
			}
			if c.damaged {
				write(t, cfg.StateFile+".damaged-1700000000", "x")
			}
			err := CheckStateFile(cfg)
			if c.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			want := c.want
			if c.onData {
				want = "its file system " + filepath.Join(root, "srv", "edge data")
			}
			if !errors.Is(err, ErrStateMissing) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "--fresh-state") ||
				!strings.Contains(err.Error(), cfg.StateFile) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("CheckStateFile = %v, want a one-line refusal naming %q", err, want)
			}
		})
	}
}

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

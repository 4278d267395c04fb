package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A missing state file is normally a new installation: the agent creates
// it and draws a new identity. When the site has run here before (the data
// partition is not mounted, state_file points elsewhere), doing so would
// silently give the gateway a new identity and drop its outbox and its
// FedSplit state; the aggregator would see an installation replaced.
// CheckStateFile refuses that unless told to start fresh.

// Paths read by stateTraces; tests point them at fixtures.
var (
	fstabPath     = "/etc/fstab"
	mountinfoPath = "/proc/self/mountinfo"
)

// ErrStateMissing is CheckStateFile's refusal.
var ErrStateMissing = errors.New("the state file is missing but this site has run here before")

// CheckStateFile returns nil when the state file exists, or when it is
// missing and nothing shows that this site ran here before, or when
// c.FreshState says to start over. Otherwise it returns an error wrapping
// ErrStateMissing that names the traces and the ways out. Traces: a file
// at model_out (the final model of a finished run), a copy of the state
// file moved aside (FILE.damaged-*, --reset-state), and a file system in
// /etc/fstab holding the state file's path that is not mounted.
func CheckStateFile(c Config) error {
	if _, err := os.Lstat(c.StateFile); !errors.Is(err, fs.ErrNotExist) || c.FreshState {
		return nil
	}
	traces := stateTraces(c)
	if len(traces) == 0 {
		return nil
	}
	return fmt.Errorf("agent: state file %s: %w (%s) (hint: mount the data partition or fix state_file; to start this site over, start once with --fresh-state)",
		c.StateFile, ErrStateMissing, strings.Join(traces, "; "))
}

// stateTraces lists what shows that the site has run with c's state file.
func stateTraces(c Config) []string {
	var traces []string
	if c.ModelOut != "" {
		if fi, err := os.Stat(c.ModelOut); err == nil && fi.Mode().IsRegular() {
			traces = append(traces, "its model_out "+c.ModelOut+" exists")
		}
	}
	dir, base := filepath.Split(c.StateFile)
	if dir == "" {
		dir = "."
	}
	if ents, err := os.ReadDir(dir); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), base+".damaged-") {
				traces = append(traces, "a copy moved aside, "+filepath.Join(dir, e.Name())+", exists")
				break
			}
		}
	}
	if mp := unmountedFS(c.StateFile); mp != "" {
		traces = append(traces, "its file system "+mp+" (in "+fstabPath+") is not mounted")
	}
	return traces
}

// unmountedFS is the mount point of the file system /etc/fstab gives path
// (the longest mount point above it, "/" excluded) when that file system
// is not mounted; "" when it is, when none is listed, or when either file
// cannot be read.
func unmountedFS(path string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return ""
	}
	paths := []string{abs}
	// Also through symbolic links (systemd's DynamicUser makes
	// /var/lib/edgefl a link to /var/lib/private/edgefl).
	if dir, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil && dir != filepath.Dir(abs) {
		paths = append(paths, filepath.Join(dir, filepath.Base(abs)))
	}
	listed, err := mountPoints(fstabPath, 1)
	if err != nil {
		return ""
	}
	best := ""
	for _, mp := range listed {
		if mp == "/" || !filepath.IsAbs(mp) {
			continue
		}
		for _, p := range paths {
			if (p == mp || strings.HasPrefix(p, mp+"/")) && len(mp) > len(best) {
				best = mp
			}
		}
	}
	if best == "" {
		return ""
	}
	mounted, err := mountPoints(mountinfoPath, 4)
	if err != nil {
		return ""
	}
	for _, mp := range mounted {
		if mp == best {
			return ""
		}
	}
	return best
}

// mountPoints reads field (0-based, whitespace-separated) of every line of
// an fstab or mountinfo file, comments skipped, octal escapes (\040 for a
// space) decoded, cleaned.
func mountPoints(path string, field int) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) <= field {
			continue
		}
		if field == 1 && len(fields) > 2 && fields[2] == "swap" {
			continue
		}
		out = append(out, filepath.Clean(unescapeOctal(fields[field])))
	}
	return out, sc.Err()
}

// unescapeOctal decodes fstab's and mountinfo's \NNN escapes.
func unescapeOctal(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

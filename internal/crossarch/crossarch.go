// Package crossarch holds the test helpers that build Go code for the
// gateways' architectures (linux/arm64, 32-bit linux/arm v7) and run it under
// qemu user-mode emulation, so that the ordinary `go test ./...` on an amd64
// machine or CI runner exercises the binaries and packages as they run on a
// Raspberry Pi or a Jetson. Its own tests run the storage and quant package
// tests on 32-bit ARM.
//
// qemu-user is a functional check, not a performance one: timings under
// emulation say nothing about a real device.
//
// The tests fail when qemu-user is missing (scripts/test.sh installs
// qemu-user-static), and skip under -short or on a host that is not Linux
// (qemu-user is Linux-only).
package crossarch

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Target is a platform the gateways run.
type Target struct {
	GOOS, GOARCH, GOARM string
	Emulators           []string    // qemu-user binaries that run it, in order of preference
	Machine             elf.Machine // the ELF machine its binaries declare
	Class               elf.Class
}

// The gateways' targets.
var (
	ARM64 = Target{GOOS: "linux", GOARCH: "arm64", Emulators: []string{"qemu-aarch64-static", "qemu-aarch64"}, Machine: elf.EM_AARCH64, Class: elf.ELFCLASS64}
	ARMv7 = Target{GOOS: "linux", GOARCH: "arm", GOARM: "7", Emulators: []string{"qemu-arm-static", "qemu-arm"}, Machine: elf.EM_ARM, Class: elf.ELFCLASS32}
)

// Name is "linux-arm64" or "linux-armv7".
func (t Target) Name() string {
	if t.GOARM != "" {
		return t.GOOS + "-" + t.GOARCH + "v" + t.GOARM
	}
	return t.GOOS + "-" + t.GOARCH
}

// Env is the environment for building for t: static (CGO_ENABLED=0).
func (t Target) Env() []string {
	return append(os.Environ(), "CGO_ENABLED=0", "GOOS="+t.GOOS, "GOARCH="+t.GOARCH, "GOARM="+t.GOARM)
}

// Native reports whether this host runs t's binaries without emulation.
func (t Target) Native() bool {
	return runtime.GOOS == t.GOOS && runtime.GOARCH == t.GOARCH
}

// ErrNoEmulator is wrapped by Emulator's error when no qemu-user binary is
// installed for the target.
var ErrNoEmulator = errors.New("no qemu-user emulator")

// Emulator returns the command prefix that runs t's binaries here: nothing
// on a native host, else the path of the first of t.Emulators on PATH.
func (t Target) Emulator() ([]string, error) {
	if t.Native() {
		return nil, nil
	}
	for _, name := range t.Emulators {
		if p, err := exec.LookPath(name); err == nil {
			return []string{p}, nil
		}
	}
	return nil, fmt.Errorf("%w for %s: none of %s on PATH (apt-get install qemu-user-static; scripts/test.sh does)",
		ErrNoEmulator, t.Name(), strings.Join(t.Emulators, ", "))
}

// Require skips tb under -short or on a non-Linux host, and fails it when no
// emulator for t is installed; it returns the emulator's command prefix.
func Require(tb testing.TB, t Target) []string {
	tb.Helper()
	if testing.Short() {
		tb.Skipf("-short: skipping the %s build and emulated run", t.Name())
	}
	if runtime.GOOS != "linux" {
		tb.Skipf("qemu user-mode emulation needs a Linux host, not %s", runtime.GOOS)
	}
	emu, err := t.Emulator()
	if err != nil {
		tb.Fatal(err)
	}
	return emu
}

// Timeout bounds every build and emulated run: a cold build cache for a
// foreign architecture compiles the standard library first.
const Timeout = 5 * time.Minute

// Go runs the go command with args for target t in dir ("" = the current
// directory) and returns its combined output; it fails tb on error.
func Go(tb testing.TB, t Target, dir string, args ...string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir, cmd.Env = dir, t.Env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		tb.Fatalf("GOOS=%s GOARCH=%s GOARM=%s go %s: %v\n%s", t.GOOS, t.GOARCH, t.GOARM, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Build builds the package pkg for t into a file in tb.TempDir() with the
// release flags of scripts/cross-compile.sh (-trimpath, stripped) and main.version
// set to version, checks that it is a static ELF binary for t, and returns its
// path.
func Build(tb testing.TB, t Target, pkg, version string) string {
	tb.Helper()
	out := tb.TempDir() + "/" + t.Name() + ".bin"
	Go(tb, t, "", "build", "-trimpath", "-ldflags", "-s -w -X main.version="+version, "-o", out, pkg)
	if err := CheckStatic(out, t); err != nil {
		tb.Fatal(err)
	}
	return out
}

// CheckStatic reports whether the ELF file at path is a statically linked
// executable for t: the right machine and class, and no program interpreter
// or shared libraries.
func CheckStatic(path string, t Target) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("crossarch: %w", err)
	}
	defer f.Close()
	if f.Machine != t.Machine || f.Class != t.Class {
		return fmt.Errorf("crossarch: %s is %v %v, want %v %v", path, f.Machine, f.Class, t.Machine, t.Class)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("crossarch: %s has a program interpreter: dynamically linked", path)
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return fmt.Errorf("crossarch: %s: %w", path, err)
	}
	if len(libs) > 0 {
		return fmt.Errorf("crossarch: %s needs shared libraries %v", path, libs)
	}
	return nil
}

// Run runs the binary bin (built for t) with args under the emulator emu
// (nil = natively) in dir, and returns its stdout; it fails tb when it exits
// non-zero, with its stderr.
func Run(tb testing.TB, emu []string, dir, bin string, args ...string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	argv := append(append(append([]string(nil), emu...), bin), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(argv, " "), err, out, stderr.String())
	}
	return string(out)
}

// BinfmtRegistered reports whether the kernel runs t's binaries through qemu
// by itself (binfmt_misc), which a test needs when its binary re-executes
// itself as a child process: without it the child's exec fails with "exec
// format error" under qemu-user.
func BinfmtRegistered(t Target) bool {
	if t.Native() {
		return true
	}
	name := map[string]string{"arm64": "qemu-aarch64", "arm": "qemu-arm"}[t.GOARCH]
	b, err := os.ReadFile("/proc/sys/fs/binfmt_misc/" + name)
	return err == nil && strings.HasPrefix(string(b), "enabled")
}

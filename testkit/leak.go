package testkit

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The goroutine-leak check. The daemons (agent, aggregator, broker) own
// goroutines: paho's connection and router, mochi's listeners and clients,
// the aggregator's event loop and ingest workers, the agent's handler and
// retry timers. A test that stops a daemon must leave none of them running;
// one left behind is a Close or a cancel that does not reach it, which in
// the daemon is a leak per reconnect or per restart.
//
// It is written here with runtime.Stack rather than taken from
// go.uber.org/goleak: what we need is the goroutines that were not there
// before, polled until they exit, minus a short list of the runtime's and
// the testing package's own, which is some 100 lines; goleak would be a new
// module in go.mod for the same check (ARCHITECTURE.md, Dependency rules:
// no module without a reason), and its options (IgnoreTopFunction,
// IgnoreCurrent) map one to one onto ignored and NoLeaks below.

// leakWait bounds how long a check waits for goroutines to exit. Stopping
// a daemon returns before every goroutine it ended has returned (paho's
// Disconnect waits for its quiesce period, mochi closes its clients
// asynchronously, a net/http connection notices its peer's close), so the
// check polls; nothing in the check times anything.
const leakWait = 10 * time.Second

// ignored are goroutines that are not the tests' to stop: a frame of any of
// these functions marks a goroutine of the runtime, of the testing package,
// or one that the standard library keeps for the process (signal.Notify's
// loop).
var ignored = []string{
	"testing.(*M).",
	"testing.tRunner",
	"testing.(*T).Run",
	"testing.(*T).Parallel",
	"testing.(*F).Fuzz",
	"testing.runFuzzing",
	"testing.runFuzzTests",
	"os/signal.signal_recv",
	"os/signal.loop",
	"runtime.ensureSigM",
	"runtime/trace.Start",
	"runtime.ReadTrace",
}

// VerifyMain is a package's TestMain: it runs the tests and, when they
// passed, fails the package if goroutines that the tests started are still
// running once they have all finished (after polling for up to leakWait).
// It is skipped under -fuzz, whose coordinator and workers keep their own
// goroutines. Use it as
//
//	func TestMain(m *testing.M) { testkit.VerifyMain(m) }
func VerifyMain(m *testing.M) {
	before := goroutines()
	code := m.Run()
	if code == 0 && !fuzzing() {
		if leaks := leakedSince(before, leakWait); len(leaks) > 0 {
			fmt.Fprintf(os.Stderr, "testkit: %d goroutine(s) still running after the tests passed:\n\n%s\n",
				len(leaks), strings.Join(leaks, "\n\n"))
			code = 1
		}
	}
	os.Exit(code)
}

// NoLeaks fails t if goroutines started during the test are still running
// when it ends. Call it first in the test: its cleanup then runs after every
// other (servers stopped, brokers closed). It must not be used in a test
// that calls t.Parallel or runs parallel subtests, whose goroutines would
// count as leaks.
func NoLeaks(t testing.TB) {
	t.Helper()
	before := goroutines()
	t.Cleanup(func() {
		if leaks := leakedSince(before, leakWait); len(leaks) > 0 {
			t.Errorf("%d goroutine(s) started by the test still running:\n\n%s", len(leaks), strings.Join(leaks, "\n\n"))
		}
	})
}

func fuzzing() bool {
	for _, name := range []string{"test.fuzz", "test.fuzzworker"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" && f.Value.String() != "false" {
			return true
		}
	}
	return false
}

// leakedSince polls, with a growing pause, until no goroutine outside
// before (by id) and outside ignored is running, or wait has passed; it
// returns the stacks of those still running.
func leakedSince(before map[int]string, wait time.Duration) []string {
	deadline := time.Now().Add(wait)
	pause := time.Millisecond
	for {
		var leaks []string
		for id, stack := range goroutines() {
			if _, ok := before[id]; !ok && !isIgnored(stack) {
				leaks = append(leaks, stack)
			}
		}
		if len(leaks) == 0 || time.Now().After(deadline) {
			return leaks
		}
		time.Sleep(pause) // polling goroutines' exit: there is no event to wait on
		pause = min(2*pause, 100*time.Millisecond)
	}
}

func isIgnored(stack string) bool {
	for _, fn := range ignored {
		if strings.Contains(stack, "\n"+fn) {
			return true
		}
	}
	return false
}

// goroutines returns every goroutine's stack by id, except the caller's.
func goroutines() map[int]string {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return parseStacks(string(buf))
}

// parseStacks splits runtime.Stack(all) output into goroutines by id,
// leaving out the first (the caller's).
func parseStacks(dump string) map[int]string {
	out := map[int]string{}
	for i, block := range strings.Split(strings.TrimSpace(dump), "\n\n") {
		if i == 0 {
			continue
		}
		head, _, _ := strings.Cut(block, " [")
		id, err := strconv.Atoi(strings.TrimPrefix(head, "goroutine "))
		if err != nil {
			continue
		}
		out[id] = block
	}
	return out
}

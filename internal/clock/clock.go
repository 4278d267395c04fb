// Package clock owns the notion of "now" for every part of edgefl that must
// be testable without sleeping: solvers' deadlines, the aggregator's round
// timers and the agent's retry and backoff timers all read time and arm
// timers only through a Clock. Real is the wall clock; Fake moves only when a
// test tells it to and fires the timers that come due (ARCHITECTURE.md,
// "Time").
package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock tells the time and arms timers. Implementations must be safe for
// concurrent use.
type Clock interface {
	Now() time.Time
	// Since returns the time elapsed since t on this clock.
	Since(t time.Time) time.Duration
	// NewTimer returns a timer whose channel receives once d has elapsed
	// (at once when d <= 0).
	NewTimer(d time.Duration) Timer
	// AfterFunc calls f in its own goroutine (Real) or from the call that
	// moves the clock past the deadline (Fake) once d has elapsed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a timer armed by a Clock.
type Timer interface {
	// C is the channel the timer fires on; nil for AfterFunc timers.
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it stopped
	// the timer before it fired.
	Stop() bool
}

// Real is the wall clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// Since returns time.Since(t).
func (Real) Since(t time.Time) time.Duration { return time.Since(t) }

// NewTimer arms a time.Timer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{t: time.NewTimer(d)} }

// AfterFunc arms time.AfterFunc.
func (Real) AfterFunc(d time.Duration, f func()) Timer {
	return realTimer{t: time.AfterFunc(d, f)}
}

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }
func (r realTimer) Stop() bool          { return r.t.Stop() }

// Fake is a clock that moves only when told to (Advance, Set), for tests.
// Moving it fires every timer that has come due, in the order of their
// deadlines: channel timers by a non-blocking send on a buffered channel,
// AfterFunc timers by calling their function synchronously, after the
// clock's lock is released, so a callback may read or arm the clock.
//
// Each call to Now first advances the clock by Tick (zero by default),
// which lets a test model "every check of the clock costs this much time"
// deterministically.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	armed  chan struct{} // closed and replaced when a timer is armed
	seq    int

	// Tick is added to the clock by every call to Now.
	Tick time.Duration
}

type fakeTimer struct {
	c    *Fake
	at   time.Time
	seq  int
	ch   chan time.Time
	f    func()
	done bool
}

// NewFake returns a fake clock reading start.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start, armed: make(chan struct{})}
}

// Now returns the fake time, after advancing it by Tick.
func (c *Fake) Now() time.Time {
	c.mu.Lock()
	if c.Tick == 0 {
		defer c.mu.Unlock()
		return c.now
	}
	fire := c.setLocked(c.now.Add(c.Tick))
	now := c.now
	c.mu.Unlock()
	runAll(fire)
	return now
}

// Since returns Now().Sub(t).
func (c *Fake) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// NewTimer implements Clock.
func (c *Fake) NewTimer(d time.Duration) Timer { return c.arm(d, nil) }

// AfterFunc implements Clock.
func (c *Fake) AfterFunc(d time.Duration, f func()) Timer { return c.arm(d, f) }

func (c *Fake) arm(d time.Duration, f func()) Timer {
	c.mu.Lock()
	c.seq++
	t := &fakeTimer{c: c, at: c.now.Add(d), seq: c.seq, f: f}
	if f == nil {
		t.ch = make(chan time.Time, 1)
	}
	var fire []func()
	if d <= 0 {
		t.done = true
		if t.ch != nil {
			t.ch <- c.now
		} else {
			fire = append(fire, f)
		}
	} else {
		c.timers = append(c.timers, t)
	}
	if c.armed == nil {
		c.armed = make(chan struct{})
	}
	close(c.armed)
	c.armed = make(chan struct{})
	c.mu.Unlock()
	runAll(fire)
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.done
	t.done = true
	return was
}

// Armed returns a channel closed the next time a timer is armed, and the
// deadlines of the timers pending now, for tests that must advance only
// after the code under test has armed its timer.
func (c *Fake) Armed() (<-chan struct{}, []time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.armed == nil {
		c.armed = make(chan struct{})
	}
	var ats []time.Time
	for _, t := range c.timers {
		if !t.done {
			ats = append(ats, t.at)
		}
	}
	return c.armed, ats
}

// Advance moves the clock forward by d and fires the timers due.
func (c *Fake) Advance(d time.Duration) {
	c.mu.Lock()
	fire := c.setLocked(c.now.Add(d))
	c.mu.Unlock()
	runAll(fire)
}

// Set moves the clock to t (forward or back) and fires the timers due.
func (c *Fake) Set(t time.Time) {
	c.mu.Lock()
	fire := c.setLocked(t)
	c.mu.Unlock()
	runAll(fire)
}

// setLocked moves the clock, sends on the channel timers due and returns
// the AfterFunc callbacks due, to be run once the lock is released.
func (c *Fake) setLocked(t time.Time) []func() {
	c.now = t
	var due []*fakeTimer
	keep := c.timers[:0]
	for _, tm := range c.timers {
		switch {
		case tm.done:
		case !tm.at.After(t):
			due = append(due, tm)
		default:
			keep = append(keep, tm)
		}
	}
	clear(c.timers[len(keep):])
	c.timers = keep
	sort.Slice(due, func(i, j int) bool {
		if !due[i].at.Equal(due[j].at) {
			return due[i].at.Before(due[j].at)
		}
		return due[i].seq < due[j].seq
	})
	var fire []func()
	for _, tm := range due {
		tm.done = true
		if tm.ch != nil {
			tm.ch <- t
		} else {
			fire = append(fire, tm.f)
		}
	}
	return fire
}

func runAll(fs []func()) {
	for _, f := range fs {
		f()
	}
}

package aggregator

import (
	"sync"
	"time"
)

// Clock is the shell's time source: the time of events and the one timer
// the coordinator asks for (SetTimer). RealClock in production, ManualClock
// in tests.
type Clock interface {
	Now() time.Time
	// At returns a channel that receives once the clock reaches at (at
	// once when it has), and a function that stops the timer.
	At(at time.Time) (<-chan time.Time, func())
}

// RealClock is the wall clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// At arms a time.Timer for at.
func (RealClock) At(at time.Time) (<-chan time.Time, func()) {
	t := time.NewTimer(time.Until(at))
	return t.C, func() { t.Stop() }
}

// ManualClock is a clock that moves only when told to, for tests: Advance
// and Set fire every timer whose time has come. Safe for concurrent use.
type ManualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*manualTimer
	armed  chan struct{} // closed and replaced when a timer is armed
}

type manualTimer struct {
	at   time.Time
	ch   chan time.Time
	done bool
}

// NewManualClock returns a clock reading start.
func NewManualClock(start time.Time) *ManualClock {
	return &ManualClock{now: start, armed: make(chan struct{})}
}

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// At implements Clock.
func (c *ManualClock) At(at time.Time) (<-chan time.Time, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{at: at, ch: make(chan time.Time, 1)}
	if !at.After(c.now) {
		t.done = true
		t.ch <- c.now
	} else {
		c.timers = append(c.timers, t)
	}
	close(c.armed)
	c.armed = make(chan struct{})
	return t.ch, func() {
		c.mu.Lock()
		t.done = true
		c.mu.Unlock()
	}
}

// Armed returns a channel closed the next time a timer is armed, and the
// pending timers' times now (for tests that must advance only after the
// shell has armed its timer).
func (c *ManualClock) Armed() (<-chan struct{}, []time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ats []time.Time
	for _, t := range c.timers {
		if !t.done {
			ats = append(ats, t.at)
		}
	}
	return c.armed, ats
}

// Advance moves the clock forward by d and fires the timers due.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.setLocked(c.now.Add(d))
	c.mu.Unlock()
}

// Set moves the clock to t (forward or back) and fires the timers due.
func (c *ManualClock) Set(t time.Time) {
	c.mu.Lock()
	c.setLocked(t)
	c.mu.Unlock()
}

func (c *ManualClock) setLocked(t time.Time) {
	c.now = t
	keep := c.timers[:0]
	for _, tm := range c.timers {
		switch {
		case tm.done:
		case !tm.at.After(t):
			tm.done = true
			tm.ch <- t
		default:
			keep = append(keep, tm)
		}
	}
	clear(c.timers[len(keep):])
	c.timers = keep
}

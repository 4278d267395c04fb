// Package clock owns the notion of "now" handed to code that must be testable
// without sleeping: solvers' deadlines and the aggregator's round timers read
// time only through a Clock.
package clock

import (
	"sync"
	"time"
)

// Clock tells the time. Implementations must be safe for concurrent use.
type Clock interface {
	Now() time.Time
}

// Real is the wall clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// Fake is a manually driven clock for tests. Each call to Now first advances
// the clock by Tick (zero by default), which lets a test model "every check of
// the clock costs this much time" deterministically.
type Fake struct {
	mu   sync.Mutex
	now  time.Time
	Tick time.Duration
}

// NewFake returns a fake clock set to start.
func NewFake(start time.Time) *Fake { return &Fake{now: start} }

// Now returns the fake time, after advancing it by Tick.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(f.Tick)
	return f.now
}

// Advance moves the clock forward by d.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

// Set moves the clock to t.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	f.now = t
	f.mu.Unlock()
}

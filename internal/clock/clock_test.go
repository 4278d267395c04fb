package clock

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestFakeFiresTimersInDeadlineOrder(t *testing.T) {
	c := NewFake(t0)
	var order []string
	c.AfterFunc(3*time.Second, func() { order = append(order, "c") })
	c.AfterFunc(time.Second, func() { order = append(order, "a") })
	tm := c.NewTimer(2 * time.Second)
	stopped := c.AfterFunc(2*time.Second, func() { order = append(order, "stopped") })
	if !stopped.Stop() {
		t.Fatal("Stop of a pending timer reported false")
	}
	c.Advance(1500 * time.Millisecond)
	select {
	case <-tm.C():
		t.Fatal("timer fired before its deadline")
	default:
	}
	c.Advance(2 * time.Second)
	select {
	case at := <-tm.C():
		if !at.Equal(t0.Add(3500 * time.Millisecond)) {
			t.Fatalf("fired at %v", at)
		}
	default:
		t.Fatal("timer did not fire")
	}
	if got := len(order); got != 2 || order[0] != "a" || order[1] != "c" {
		t.Fatalf("order %v, want [a c]", order)
	}
	if tm.Stop() {
		t.Fatal("Stop of a fired timer reported true")
	}
}

func TestFakeCallbackMayArmTheClock(t *testing.T) {
	c := NewFake(t0)
	n := 0
	var tick func()
	tick = func() {
		n++
		c.AfterFunc(time.Second, tick)
	}
	c.AfterFunc(time.Second, tick)
	for i := 0; i < 5; i++ {
		c.Advance(time.Second)
	}
	if n != 5 {
		t.Fatalf("callback ran %d times, want 5", n)
	}
}

func TestFakeArmedAndTick(t *testing.T) {
	c := NewFake(t0)
	armed, pending := c.Armed()
	if len(pending) != 0 {
		t.Fatalf("pending %v", pending)
	}
	tm := c.NewTimer(10 * time.Millisecond)
	select {
	case <-armed:
	default:
		t.Fatal("Armed channel not closed by NewTimer")
	}
	c.Tick = 4 * time.Millisecond
	c.Now()
	c.Now()
	if got := c.Since(t0); got != 12*time.Millisecond {
		t.Fatalf("Since = %v, want 12ms (three ticks)", got)
	}
	select {
	case <-tm.C():
	default:
		t.Fatal("Tick moved the clock past the deadline without firing")
	}
	if d := c.NewTimer(0); len(d.C()) != 1 {
		t.Fatal("a timer armed for 0 did not fire at once")
	}
}

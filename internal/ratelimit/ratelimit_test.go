package ratelimit

import (
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 27, 8, 0, 0, 0, time.UTC)

func mustNew(t *testing.T, l Limits) *Limiter {
	t.Helper()
	r, err := New(l)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestAllow(t *testing.T) {
	type msg struct {
		id   string
		at   time.Duration // after t0
		n    int
		want bool
	}
	tests := []struct {
		name   string
		limits Limits
		msgs   []msg
	}{
		{"burst then rate", Limits{Messages: 2, Burst: 3, Bytes: 1e9}, []msg{
			{"a", 0, 1, true}, {"a", 0, 1, true}, {"a", 0, 1, true}, {"a", 0, 1, false},
			{"a", 400 * time.Millisecond, 1, false}, // 0.8 of a token
			{"a", 500 * time.Millisecond, 1, true},  // 1.0
			{"a", 500 * time.Millisecond, 1, false},
			{"a", 10 * time.Second, 1, true}, {"a", 10 * time.Second, 1, true}, {"a", 10 * time.Second, 1, true},
			{"a", 10 * time.Second, 1, false}, // refilled to the burst, not beyond
		}},
		{"sites are separate", Limits{Messages: 1, Burst: 1, Bytes: 1e9}, []msg{
			{"a", 0, 1, true}, {"a", 0, 1, false}, {"b", 0, 1, true}, {"b", 0, 1, false},
		}},
		{"bytes", Limits{Messages: 100, Burst: 100, Bytes: 1000, MaxMessageBytes: 500}, []msg{
			{"a", 0, 600, true}, {"a", 0, 400, true}, {"a", 0, 1, false},
			{"a", time.Second, 1001, false}, // never more than max(Bytes, MaxMessageBytes) at once
			{"a", time.Second, 1000, true},
		}},
		{"one message of the largest size fits", Limits{Messages: 100, Burst: 100, Bytes: 10, MaxMessageBytes: 5000}, []msg{
			{"a", 0, 5000, true}, {"a", time.Second, 11, false}, {"a", time.Second, 10, true}, {"a", 600 * time.Second, 5000, true},
		}},
		{"a drop charges nothing", Limits{Messages: 1, Burst: 2, Bytes: 100}, []msg{
			{"a", 0, 101, false}, {"a", 0, 50, true}, {"a", 0, 50, true}, {"a", 0, 1, false},
		}},
		{"time going back", Limits{Messages: 1, Burst: 1, Bytes: 1e9}, []msg{
			{"a", time.Second, 1, true}, {"a", 0, 1, false}, {"a", 1500 * time.Millisecond, 1, false}, {"a", 2 * time.Second, 1, true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustNew(t, tt.limits)
			for i, m := range tt.msgs {
				if got := r.Allow(m.id, m.n, t0.Add(m.at)); got.OK != m.want {
					t.Fatalf("message %d (%+v): ok %v", i, m, got.OK)
				}
			}
		})
	}
}

// A drop is reported for logging at once, then at most every LogEvery with
// the drops in between.
func TestLogEvery(t *testing.T) {
	r := mustNew(t, Limits{Messages: 1, Burst: 1, Bytes: 1e9, LogEvery: 10 * time.Second})
	if v := r.Allow("a", 1, t0); !v.OK {
		t.Fatal("first message dropped")
	}
	var logged, total uint64
	var lines int
	for i := range 1000 { // 100 s at 10 messages a second
		v := r.Allow("a", 1, t0.Add(time.Duration(i)*100*time.Millisecond))
		if !v.OK {
			total++
		}
		if v.LogNow {
			lines++
			logged += v.Dropped
		}
	}
	if lines < 10 || lines > 11 {
		t.Errorf("%d log lines over 100 s, want one per 10 s", lines)
	}
	// The drops since the last line are reported with the next one.
	if v := r.Allow("a", 1, t0.Add(time.Hour)); !v.OK {
		t.Fatal("no refill after an hour")
	}
	for !r.Allow("a", 1, t0.Add(time.Hour)).LogNow {
	}
	if logged > total || total-logged > 100 {
		t.Errorf("logged %d of %d drops", logged, total)
	}
}

func TestDefaultsAndValidate(t *testing.T) {
	r := mustNew(t, Limits{})
	if l := r.Limits(); l.Messages != DefaultMessages || l.Burst != DefaultBurst || l.Bytes != DefaultBytes || l.LogEvery != DefaultLogEvery {
		t.Errorf("defaults %+v", l)
	}
	for _, l := range []Limits{{Messages: -1}, {Burst: -1}, {Bytes: -1}, {MaxMessageBytes: -1}, {LogEvery: -1}, {Messages: math.NaN()}} {
		if _, err := New(l); err == nil {
			t.Errorf("%+v accepted", l)
		}
	}
}

// The map of sites is bounded: a flood of made-up ids costs no memory
// beyond maxSites entries.
func TestSitesBounded(t *testing.T) {
	r := mustNew(t, Limits{})
	for i := range maxSites + 10 {
		r.Allow(string(rune('a'+i%26))+string(rune(i)), 1, t0)
	}
	if n := len(r.sites); n > maxSites {
		t.Errorf("%d sites kept", n)
	}
}

package ratelimit

import (
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 27, 8, 0, 0, 0, time.UTC)

// payload is a message of n bytes, distinct for each tag (for n >= 2).
func payload(n, tag int) []byte {
	b := make([]byte, n)
	for i := 0; i < n && i < 4; i++ {
		b[i] = byte(tag >> (8 * i))
	}
	return b
}

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
				// Every message is new content (distinct payloads).
				if got := r.Allow(m.id, payload(m.n, i), t0.Add(m.at)); got.OK != m.want {
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
	if v := r.Allow("a", payload(1, 0), t0); !v.OK {
		t.Fatal("first message dropped")
	}
	var logged, total uint64
	var lines int
	for i := range 1000 { // 100 s at 10 messages a second
		v := r.Allow("a", payload(1, 0), t0.Add(time.Duration(i)*100*time.Millisecond))
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
	if v := r.Allow("a", payload(1, 0), t0.Add(time.Hour)); !v.OK {
		t.Fatal("no refill after an hour")
	}
	for !r.Allow("a", payload(1, 0), t0.Add(time.Hour)).LogNow {
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
		r.Allow(string(rune('a'+i%26))+string(rune(i)), payload(1, 0), t0)
	}
	if n := len(r.sites); n > maxSites {
		t.Errorf("%d sites kept", n)
	}
}

// A site flooding copies of one message cannot crowd out its own next
// message: duplicates pass only while the buckets hold more than the
// reserve kept for new content, so the first copy of each new message
// passes at once, however long the flood lasts (a flooding site used to
// lose its next update, and its round waited for it until the deadline).
// What passes in all stays within the limits.
func TestDuplicateFloodKeepsNewMessages(t *testing.T) {
	tests := []struct {
		name      string
		limits    Limits
		size      int
		perSecond int // the flood's rate
	}{
		{"defaults, 2.5 kB updates", Limits{MaxMessageBytes: 16 << 20}, 2536, 10000},
		{"byte-bound, 2 MB updates", Limits{MaxMessageBytes: 16 << 20}, 2 << 20, 100},
		{"small burst", Limits{Messages: 5, Burst: 10, Bytes: 1e9}, 100, 10000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustNew(t, tt.limits)
			l := r.Limits()
			const seconds = 30
			perSecond := tt.perSecond
			var passed, newPassed, newSent int
			cur := payload(tt.size, 0)
			if !r.Allow("flooder", cur, t0).OK {
				t.Fatal("first message dropped")
			}
			for i := 1; i < perSecond*seconds; i++ {
				now := t0.Add(time.Duration(i) * time.Second / time.Duration(perSecond))
				isNew := i%(perSecond*3/2) == 0 // every 1.5 s its next update, then copies of it
				if isNew {
					cur = payload(tt.size, i)
					newSent++
				}
				v := r.Allow("flooder", cur, now)
				if v.OK {
					passed++
				}
				if isNew {
					if !v.OK {
						t.Fatalf("message %d: the first copy of a new message was dropped under the flood", i)
					}
					if v.Duplicate {
						t.Fatalf("message %d: a new message taken for a duplicate", i)
					}
					newPassed++
				}
			}
			if newPassed != newSent {
				t.Errorf("%d of %d new messages passed", newPassed, newSent)
			}
			byteBurst := max(l.Bytes, float64(l.MaxMessageBytes))
			maxMsgs := float64(l.Burst) + l.Messages*seconds
			maxBytes := (byteBurst + l.Bytes*seconds) / float64(tt.size)
			if limit := min(maxMsgs, maxBytes); float64(passed+1) > limit+1 {
				t.Errorf("%d messages passed in %d s, the limits allow %v", passed+1, seconds, limit)
			}
			// The duplicates still go through at about the rate the
			// limits allow less the reserve: the flood is limited, not
			// shut out (an honest re-send is a duplicate too).
			if passed < seconds {
				t.Errorf("only %d messages passed in %d s", passed, seconds)
			}
		})
	}
}

// A duplicate passes like any message while the site is within its limits
// (an honest re-send of an unreceipted update after a reconnect is one);
// one dropped is counted as a duplicate.
func TestDuplicateWithinLimits(t *testing.T) {
	r := mustNew(t, Limits{Messages: 20, Burst: 100, Bytes: 1e9})
	m := payload(100, 7)
	for i := range 90 {
		if v := r.Allow("a", m, t0); !v.OK || v.Duplicate != (i > 0) {
			t.Fatalf("copy %d: %+v", i, v)
		}
	}
	// 10 tokens left, the reserve: copies are dropped, new messages pass.
	if v := r.Allow("a", m, t0); v.OK || !v.Duplicate {
		t.Fatalf("copy over the reserve: %+v", v)
	}
	for i := range 10 {
		if v := r.Allow("a", payload(100, 100+i), t0); !v.OK {
			t.Fatalf("new message %d within the reserve dropped", i)
		}
	}
	if v := r.Allow("a", payload(100, 200), t0); v.OK {
		t.Fatal("a new message over the whole burst passed")
	}
	// The fingerprints are per site: another site's copy is new to it.
	if v := r.Allow("b", m, t0); !v.OK || v.Duplicate {
		t.Fatalf("site b: %+v", v)
	}
}

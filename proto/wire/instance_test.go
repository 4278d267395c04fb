package wire

import (
	"strings"
	"testing"
)

// The instance id of a status or an update (a cloned gateway):
// empty (not told) or an id's characters, at most MaxIDLen bytes; it
// survives a round trip.
func TestValidateInstanceID(t *testing.T) {
	tests := []struct {
		name, id string
		ok       bool
	}{
		{"not told", "", true},
		{"random text", "INSTANCE234567ABCDEFGHIJKL", true},
		{"64 bytes", strings.Repeat("a", MaxIDLen), true},
		{"65 bytes", strings.Repeat("a", MaxIDLen+1), false},
		{"a slash", "a/b", false},
		{"a space", "a b", false},
		{"control character", "a\x00", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := sampleStatus()
			st.InstanceId = tt.id
			checkValidity(t, st, tt.ok, Limits{})
			u := sampleUpdate()
			u.InstanceId = tt.id
			checkValidity(t, u, tt.ok, Limits{})
			if !tt.ok {
				return
			}
			b, err := Encode(st)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeStatus(b, Limits{})
			if err != nil || got.InstanceId != tt.id {
				t.Fatalf("status round trip: %q, %v", got.GetInstanceId(), err)
			}
			if b, err = Encode(u); err != nil {
				t.Fatal(err)
			}
			gu, err := DecodeUpdate(b, Limits{})
			if err != nil || gu.InstanceId != tt.id {
				t.Fatalf("update round trip: %q, %v", gu.GetInstanceId(), err)
			}
		})
	}
}

package agent

import (
	"errors"
	"testing"
)

// roundErr and wrap stand for fmt.Errorf calls at many error paths: the
// same text, and the cause still found by errors.Is.
func TestErrWrapHelpers(t *testing.T) {
	cause := errors.New("disk full")
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"roundErr", roundErr(7, cause), "agent: round 7: disk full"},
		{"wrap", wrap("agent: data", cause), "agent: data: disk full"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.err.Error(); got != tc.want {
				t.Errorf("Error() = %q, want %q", got, tc.want)
			}
			if !errors.Is(tc.err, cause) {
				t.Errorf("errors.Is(%v, cause) = false", tc.err)
			}
		})
	}
}

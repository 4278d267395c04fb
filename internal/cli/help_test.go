package cli

import (
	"strings"
	"testing"
)

func TestHelpProblems(t *testing.T) {
	good := "usage: x cmd [flags]\n       x cmd other\n\nDoes a thing. More.\n\nflags:\n  -n int\n    \tcount (default 1)\n  -v\n    \tverbose\n"
	if p := HelpProblems("x", "cmd", good); len(p) != 0 {
		t.Errorf("good help: %v", p)
	}
	for _, tc := range []struct{ help, want string }{
		{"Usage of cmd:\n  -n int\n", "not a synopsis"},
		{"usage: x cmd\n  -n int\n", "no description"},
		{"usage: x cmd\n\nlowercase start.\n", "does not start with a sentence"},
		{"usage: x cmd\n\nNo full stop\n", "no full sentence"},
		{"usage: x cmd\n\nFine.\n\nflags:\n  -n value\n    \tcount\n", `flag -n shows its type as "value"`},
		{"usage: x cmdx\n\nFine.\n", "not a synopsis"},
	} {
		p := HelpProblems("x", "cmd", tc.help)
		if !strings.Contains(strings.Join(p, "; "), tc.want) {
			t.Errorf("%q: %v, want %q", tc.help, p, tc.want)
		}
	}
}

package cli

import (
	"fmt"
	"strings"
	"unicode"
)

// HelpProblems lists what is wrong with the --help text of `name cmd`
// (empty: nothing): it must start with a synopsis line "usage: name cmd
// ...", then, after a blank line, a description whose first sentence
// starts with a capital letter and ends with a full stop, and no flag may
// show its type as "value" (a flag.Value the flag package cannot name: give
// it a `TYPE` in its usage, or print the flags by hand).
func HelpProblems(name, cmd, help string) []string {
	var out []string
	lines := strings.Split(strings.TrimRight(help, "\n"), "\n")
	want := "usage: " + name + " " + cmd
	if first := lines[0]; first != want && !strings.HasPrefix(first, want+" ") {
		out = append(out, fmt.Sprintf("first line %q is not a synopsis %q", first, want+" ..."))
	}
	i := 1
	for i < len(lines) && strings.TrimSpace(lines[i]) != "" {
		i++ // the synopsis may go on (alternative forms)
	}
	var para []string
	for i++; i < len(lines) && strings.TrimSpace(lines[i]) != ""; i++ {
		para = append(para, strings.TrimSpace(lines[i]))
	}
	desc := strings.Join(para, " ")
	switch {
	case desc == "":
		out = append(out, "no description after the synopsis")
	case !unicode.IsUpper([]rune(desc)[0]):
		out = append(out, fmt.Sprintf("the description %q does not start with a sentence", trunc(desc)))
	case !strings.Contains(desc, ". ") && !strings.HasSuffix(desc, ".") && !strings.HasSuffix(desc, ":"):
		out = append(out, fmt.Sprintf("the description %q has no full sentence", trunc(desc)))
	}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) >= 2 && strings.HasPrefix(f[0], "-") && len(f[0]) > 1 && f[1] == "value" && strings.HasPrefix(l, "  -") {
			out = append(out, fmt.Sprintf("flag %s shows its type as \"value\"", f[0]))
		}
	}
	return out
}

func trunc(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

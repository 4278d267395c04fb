package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testSyntax knows the keys a, b and m (m may repeat).
var testSyntax = Syntax{
	Key: func(k string) (string, bool) {
		k = strings.ReplaceAll(k, "-", "_")
		return k, k == "a" || k == "b" || k == "m"
	},
	Multi:    func(k string) bool { return k == "m" },
	NoEquals: func(where, line string) error { return fmt.Errorf("%s: no = in %q", where, line) },
	Unknown:  func(where, key string) error { return fmt.Errorf("%s: unknown %q", where, key) },
	Repeated: func(where, key string, first Setting) error {
		return fmt.Errorf("%s: %s first at %s", where, key, first.Where)
	},
	ReadFailed: func(err error) error { return fmt.Errorf("read: %w", err) },
}

func TestReadConfig(t *testing.T) {
	tests := []struct {
		name, text string
		want       string // the settings as key=value@line, or the error
	}{
		{"empty", "", ""},
		{"comments and blanks", "# c\n\n  # d\n", ""},
		{"trimmed", "  a =  1 2  \nb=x=y\n", "a=1 2@1 b=x=y@2"},
		{"key spelled otherwise", "m = 1\nm = 2\n", "m=1@1 m=2@2"},
		{"hyphen key", "a = 1\n", "a=1@1"},
		{"empty value", "a =\n", "a=@1"},
		{"no equals", "a = 1\nb 2\n", `f:2: no = in "b 2"`},
		{"unknown", "\nzz = 1\n", `f:2: unknown "zz"`},
		{"repeated", "a = 1\nb = 2\na = 3\n", "f:3: a first at f:1"},
		{"long line", "a = " + strings.Repeat("x", 70<<10) + "\n", "read: bufio.Scanner: token too long"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			err := ReadConfig(strings.NewReader(tt.text), "f", testSyntax, func(s Setting) error {
				got = append(got, fmt.Sprintf("%s=%s@%d", s.Key, s.Value, s.Line))
				return nil
			})
			out := strings.Join(got, " ")
			if err != nil {
				out = err.Error()
			}
			if out != tt.want {
				t.Errorf("got %q, want %q", out, tt.want)
			}
		})
	}
}

// TestReadConfigStopsAtCallbackError: the callback's error ends the parse
// at its line (a bad value before a later bad key is the one reported).
func TestReadConfigStopsAtCallbackError(t *testing.T) {
	bad := errors.New("bad value")
	err := ReadConfig(strings.NewReader("a = 1\nzz = 2\n"), "f", testSyntax, func(Setting) error { return bad })
	if !errors.Is(err, bad) {
		t.Fatalf("got %v, want the callback's error", err)
	}
}

func TestParseFlags(t *testing.T) {
	alias := func(n string) string {
		if n == "k" {
			return "per-round"
		}
		return n
	}
	newFS := func() (*flag.FlagSet, *string, *int, *string) {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg := fs.String("config", "", "")
		k := fs.Int("per-round", 1, "")
		fs.Var(fs.Lookup("per-round").Value, "k", "")
		name := fs.String("name", "", "")
		fs.String("only-here", "", "")
		return fs, cfg, k, name
	}
	dir := t.TempDir()
	write := func(text string) string {
		p := filepath.Join(dir, fmt.Sprintf("c%d.conf", len(text)))
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name     string
		file     string
		args     []string
		wantK    int
		wantName string
		wantErr  string
	}{
		{"file only", "per_round = 3\nname = n\n", nil, 3, "n", ""},
		{"alias in the file", "k = 4\n", nil, 4, "", ""},
		{"flag wins", "per_round = 3\n", []string{"--k", "5"}, 5, "", ""},
		{"bad value", "per_round = x\n", nil, 0, "", `:1: per-round: parse error`},
		{"command line only", "only_here = 1\n", nil, 0, "", `:1: unknown key "only_here"`},
		{"config in config", "config = y\n", nil, 0, "", `:1: unknown key "config"`},
		{"repeat by alias", "k = 1\nper-round = 2\n", nil, 0, "", ":2: per-round repeats line 1"},
		{"no equals", "k 1\n", nil, 0, "", ":1: want key = value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs, cfg, k, name := newFS()
			args := append([]string{"--config", write(tt.file)}, tt.args...)
			err := ParseFlags(fs, args, cfg, alias, "only-here")
			switch {
			case tt.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
			case err != nil:
				t.Fatal(err)
			case *k != tt.wantK || *name != tt.wantName:
				t.Fatalf("per-round %d name %q, want %d %q", *k, *name, tt.wantK, tt.wantName)
			}
		})
	}
	fs, cfg, _, _ := newFS()
	if err := ParseFlags(fs, []string{"--nope"}, cfg, alias); !errors.Is(err, ErrUsage) {
		t.Errorf("unknown flag: %v, want ErrUsage", err)
	}
	fs, cfg, _, _ = newFS()
	if err := ParseFlags(fs, []string{"stray"}, cfg, alias); err == nil || !strings.Contains(err.Error(), `unexpected argument "stray"`) {
		t.Errorf("stray argument: %v", err)
	}
}

// TestSubcommandDispatch: `NAME COMMAND SUB` runs the subcommand, with the
// command's error prefix; other arguments go to the command.
func TestSubcommandDispatch(t *testing.T) {
	var ran string
	cmds := []Command{{Name: "pki", Run: func(_ context.Context, args []string, _, _ io.Writer) error {
		ran = "pki " + strings.Join(args, " ")
		return nil
	}, Sub: []Command{{Name: "passwd", Run: func(_ context.Context, args []string, _, _ io.Writer) error {
		ran = "passwd " + strings.Join(args, " ")
		return errors.New("boom")
	}}}}}
	var stderr bytes.Buffer
	if code := Run(context.Background(), "b", cmds, []string{"pki", "passwd", "--x"}, io.Discard, &stderr); code != 1 || ran != "passwd --x" || stderr.String() != "b pki: boom\n" {
		t.Errorf("pki passwd: code %d ran %q stderr %q", code, ran, stderr.String())
	}
	if code := Run(context.Background(), "b", cmds, []string{"pki", "--dir", "d"}, io.Discard, io.Discard); code != 0 || ran != "pki --dir d" {
		t.Errorf("pki: code %d ran %q", code, ran)
	}
}

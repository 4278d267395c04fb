package cli

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// The configuration files of both binaries are plain text, one setting per
// line:
//
//	# a comment
//	key = value
//
// Blank lines and lines starting with '#' are skipped; the key and the
// value are trimmed; the value runs to the end of the line. ReadConfig is
// the one parser of that syntax; each binary names its keys (Syntax.Key)
// and words its errors (Syntax's messages), which its tests pin.

// Setting is one key = value line of a configuration file (or, for
// edge-agent, one --flag given on the command line).
type Setting struct {
	Key   string // the option's canonical name (Syntax.Key's)
	Value string // trimmed
	Where string // FILE:LINE (or --flag)
	Line  int    // 1-based; 0 for a flag
}

// Syntax is what a binary's configuration files accept, and how their
// errors read.
type Syntax struct {
	// Key maps a key as written (trimmed) to the option's canonical name;
	// ok false: no such option.
	Key func(key string) (name string, ok bool)
	// Multi reports an option that may repeat (nil: none may).
	Multi func(name string) bool
	// NoEquals is the error of a line without '=' (where is FILE:LINE).
	NoEquals func(where, line string) error
	// Unknown is the error of a key Key does not know.
	Unknown func(where, key string) error
	// Repeated is the error of an option set twice; first is its
	// first setting.
	Repeated func(where, name string, first Setting) error
	// ReadFailed is the error of a failed read (a line over MaxLine).
	ReadFailed func(err error) error
	// MaxLine is the longest line accepted (0: bufio's default, 64 KiB).
	MaxLine int
}

// ReadConfig parses the key = value text r of the file name and calls
// each with every setting, in file order; it stops at the first error,
// its own (the Syntax's wording) or each's. A read error is worded by
// syn.ReadFailed.
func ReadConfig(r io.Reader, name string, syn Syntax, each func(Setting) error) error {
	seen := map[string]Setting{}
	sc := bufio.NewScanner(r)
	if syn.MaxLine > 0 {
		sc.Buffer(make([]byte, 64<<10), syn.MaxLine)
	}
	for n := 1; sc.Scan(); n++ {
		where := fmt.Sprintf("%s:%d", name, n)
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return syn.NoEquals(where, line)
		}
		k = strings.TrimSpace(k)
		key, ok := syn.Key(k)
		if !ok {
			return syn.Unknown(where, k)
		}
		first, dup := seen[key]
		if dup && (syn.Multi == nil || !syn.Multi(key)) {
			return syn.Repeated(where, key, first)
		}
		s := Setting{Key: key, Value: strings.TrimSpace(v), Where: where, Line: n}
		if !dup {
			seen[key] = s
		}
		if err := each(s); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return syn.ReadFailed(err)
	}
	return nil
}

// FlagSyntax is the syntax of broker-agg's --config file path: keys
// named as the flags of fs (underscores may replace hyphens; alias maps a
// flag's other names to its canonical one), except the exclude ones,
// which are command line only.
func FlagSyntax(fs *flag.FlagSet, path string, alias func(string) string, exclude ...string) Syntax {
	return Syntax{
		Key: func(k string) (string, bool) {
			name := alias(strings.ReplaceAll(k, "_", "-"))
			if fs.Lookup(name) == nil || slices.Contains(exclude, name) {
				return "", false
			}
			return name, true
		},
		NoEquals: func(where, _ string) error { return fmt.Errorf("%s: want key = value", where) },
		Unknown:  func(where, key string) error { return fmt.Errorf("%s: unknown key %q", where, key) },
		Repeated: func(where, name string, first Setting) error {
			return fmt.Errorf("%s: %s repeats line %d", where, name, first.Line)
		},
		ReadFailed: func(err error) error { return fmt.Errorf("--config %s: %w", path, err) },
	}
}

// ParseFlags parses args into fs and then, when *config names a file, sets
// the flags the command line did not set from that file's key = value
// lines (FlagSyntax: keys named as the flags, alias resolving their other
// names; "config" and the exclude flags are command line only). A flag
// error the flag package reported returns ErrUsage (or flag.ErrHelp).
func ParseFlags(fs *flag.FlagSet, args []string, config *string, alias func(string) string, exclude ...string) error {
	if err := Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *config == "" {
		return nil
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[alias(f.Name)] = true })
	fh, err := os.Open(*config)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	defer fh.Close()
	syn := FlagSyntax(fs, *config, alias, append(exclude, "config")...)
	return ReadConfig(io.LimitReader(fh, 1<<20), *config, syn, func(s Setting) error {
		if set[s.Key] {
			return nil // the command line wins
		}
		if err := fs.Set(s.Key, s.Value); err != nil {
			return fmt.Errorf("%s: %s: %w", s.Where, s.Key, err)
		}
		return nil
	})
}

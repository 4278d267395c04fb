package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A text is an error or log message written in the source: the format
// string of an errors.New or fmt.Errorf call, or a log/slog message.
type text struct {
	Pos  string // file:line
	Kind string // errors.New, fmt.Errorf, slog
	Text string
}

// Len is the text's length in characters.
func (t text) Len() int { return utf8.RuneCountInString(t.Text) }

// slogMsgArg is the index of the message among a log/slog call's
// arguments, by method name.
var slogMsgArg = map[string]int{
	"Debug": 0, "Info": 0, "Warn": 0, "Error": 0,
	"DebugContext": 1, "InfoContext": 1, "WarnContext": 1, "ErrorContext": 1,
	"Log": 2,
}

// scan returns the error and log texts of the non-test Go files under
// root, skipping hidden directories and testdata.
func scan(root string) ([]text, error) {
	var out []text
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			n := d.Name()
			if p != root && (strings.HasPrefix(n, ".") || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			kind, arg := textArg(call)
			if arg < 0 || arg >= len(call.Args) {
				return true
			}
			if s, ok := literal(call.Args[arg]); ok {
				out = append(out, text{Pos: rel + ":" + strconv.Itoa(fset.Position(call.Pos()).Line), Kind: kind, Text: s})
			}
			return true
		})
		return nil
	})
	return out, err
}

// textArg says whether a call writes an error or log text, and which of
// its arguments it is (-1: none).
func textArg(call *ast.CallExpr) (string, int) {
	var sel *ast.SelectorExpr
	switch fn := call.Fun.(type) {
	case *ast.Ident:
		if i, ok := errorHelpers[fn.Name]; ok {
			return fn.Name, i
		}
		return "", -1
	case *ast.SelectorExpr:
		if i, ok := errorHelpers[fn.Sel.Name]; ok {
			return fn.Sel.Name, i
		}
		sel = fn
	default:
		return "", -1
	}
	if pkg, ok := sel.X.(*ast.Ident); ok {
		switch pkg.Name + "." + sel.Sel.Name {
		case "errors.New", "fmt.Errorf":
			return pkg.Name + "." + sel.Sel.Name, 0
		}
	}
	if i, ok := slogMsgArg[sel.Sel.Name]; ok {
		return "slog", i
	}
	return "", -1
}

// errorHelpers are the packages' own error constructors that take a
// format string, with its index among their arguments.
var errorHelpers = map[string]int{
	"configErr":    0, // node/agent
	"errNotStored": 0, // node/aggregator
	"refuse":       0, // node/aggregator, secure aggregation's checks
	"specf":        0, // data/dataset
	"corrupt":      0, // learn/quant
	"errorf":       1, // proto/wire/internal/proto3: line, format
	"fail":         0, // proto/secagg's reader
}

// literal returns the value of a string literal or of a concatenation of
// string literals.
func literal(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		a, ok := literal(e.X)
		if !ok {
			return "", false
		}
		b, ok := literal(e.Y)
		return a + b, ok
	case *ast.ParenExpr:
		return literal(e.X)
	}
	return "", false
}

// MaxLen is the longest an error or log text may be, in characters: a
// short stable message plus, where it helps, a hint.
const MaxLen = 160

// Package proto3 parses the restricted subset of proto3 that proto/wire/edgefl.proto
// uses, for wire's code generator (proto/wire/internal/gen) and for the test that
// builds protobuf-go's descriptor of the same schema (proto/wire/protobufgo_test.go).
// It uses the standard library only.
//
// The subset: `syntax = "proto3";`, one `package`, `option NAME = VALUE;` at
// file level, top-level `enum`s (the first value 0) and top-level `message`s
// whose fields are singular or repeated scalars of the types in Kind, enum or
// message references, and `oneof` groups of message fields. Comments are `//`
// lines; a comment block right above a declaration is its doc, a comment after
// a field or enum value on the same line is its trailing comment. Anything else
// (nested types, `optional`, `map`, `reserved`, field options, imports, other
// scalar types, block comments) is an error that names the line, so that the
// generator never silently drops part of the schema.
package proto3

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Kind is a field's type.
type Kind int

// The field types of the subset. A repeated field may be KindString,
// KindUint32 or KindDouble (the numeric ones packed).
const (
	KindDouble Kind = iota + 1
	KindUint32
	KindUint64
	KindInt64
	KindBool
	KindString
	KindBytes
	KindEnum
	KindMessage
)

var scalarKinds = map[string]Kind{
	"double": KindDouble, "uint32": KindUint32, "uint64": KindUint64, "int64": KindInt64,
	"bool": KindBool, "string": KindString, "bytes": KindBytes,
}

// repeatable are the kinds a repeated field may have.
var repeatable = []Kind{KindString, KindUint32, KindDouble}

// File is a parsed .proto file.
type File struct {
	Name      string // as given to Parse
	Package   string // e.g. "edgefl.wire.v1"
	Options   map[string]string
	Doc       []string // the comment block above `syntax`, one line each without "//"
	Enums     []*Enum
	Messages  []*Message
	enumByNam map[string]*Enum
	msgByName map[string]*Message
}

// Message returns the message named name, or nil.
func (f *File) Message(name string) *Message { return f.msgByName[name] }

// Enum is a top-level enum.
type Enum struct {
	Name   string
	Doc    []string
	Values []*EnumValue
}

// EnumValue is one value of an enum.
type EnumValue struct {
	Name    string
	Number  int32
	Doc     []string
	Comment string // trailing comment, "" if none
}

// Message is a top-level message.
type Message struct {
	Name   string
	Doc    []string
	Fields []*Field // in declaration order, oneof members included
	Oneofs []*Oneof
}

// Oneof is a oneof group; its fields are also in Message.Fields.
type Oneof struct {
	Name   string
	Doc    []string
	Fields []*Field
	Index  int // in Message.Oneofs
}

// Field is one field of a message.
type Field struct {
	Name     string
	Number   int32
	Kind     Kind
	TypeName string   // the scalar type, or the enum's or message's name
	Enum     *Enum    // KindEnum
	Message  *Message // KindMessage
	Repeated bool
	Oneof    *Oneof // nil unless a member of a oneof
	Doc      []string
	Comment  string
	line     int
}

// Parse parses src, the contents of the file name.
func Parse(name string, src []byte) (*File, error) {
	p := &parser{name: name, f: &File{Name: name, Options: map[string]string{},
		enumByNam: map[string]*Enum{}, msgByName: map[string]*Message{}}}
	if err := p.lex(string(src)); err != nil {
		return nil, err
	}
	if err := p.file(); err != nil {
		return nil, err
	}
	if err := p.resolve(); err != nil {
		return nil, err
	}
	return p.f, nil
}

type token struct {
	text string
	line int // 1-based
	str  bool
}

type parser struct {
	name     string
	f        *File
	toks     []token
	pos      int
	comments map[int]string // line -> text of its // comment (without //)
	code     map[int]bool   // lines holding a token
	names    map[string]int // top-level names -> line
}

func (p *parser) errorf(line int, format string, args ...any) error {
	return fmt.Errorf("%s:%d: %s", p.name, line, fmt.Sprintf(format, args...))
}

func (p *parser) lex(src string) error {
	p.comments, p.code = map[int]string{}, map[int]bool{}
	for i, ln := range strings.Split(src, "\n") {
		line := i + 1
		for j := 0; j < len(ln); {
			c := ln[j]
			switch {
			case c == ' ' || c == '\t' || c == '\r':
				j++
			case strings.HasPrefix(ln[j:], "//"):
				p.comments[line] = ln[j+2:]
				j = len(ln)
			case strings.HasPrefix(ln[j:], "/*"):
				return p.errorf(line, "block comments are not supported; use //")
			case c == '"' || c == '\'':
				k := j + 1
				for k < len(ln) && ln[k] != c {
					if ln[k] == '\\' {
						k++
					}
					k++
				}
				if k >= len(ln) {
					return p.errorf(line, "unterminated string")
				}
				s, err := strconv.Unquote(`"` + ln[j+1:k] + `"`)
				if err != nil {
					return p.errorf(line, "bad string %s: %v", ln[j:k+1], err)
				}
				p.toks = append(p.toks, token{text: s, line: line, str: true})
				p.code[line] = true
				j = k + 1
			case isIdent(c) || c >= '0' && c <= '9' || c == '-':
				k := j + 1
				for k < len(ln) && (isIdent(ln[k]) || ln[k] >= '0' && ln[k] <= '9' || ln[k] == '.') {
					k++
				}
				p.toks = append(p.toks, token{text: ln[j:k], line: line})
				p.code[line] = true
				j = k
			case strings.ContainsRune("{}=;[]()<>,", rune(c)):
				p.toks = append(p.toks, token{text: string(c), line: line})
				p.code[line] = true
				j++
			default:
				return p.errorf(line, "unexpected character %q", c)
			}
		}
	}
	return nil
}

func isIdent(c byte) bool { return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

func validIdent(s string) bool {
	if s == "" || !isIdent(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if !isIdent(s[i]) && (s[i] < '0' || s[i] > '9') {
			return false
		}
	}
	return true
}

func (p *parser) peek() token {
	if p.pos < len(p.toks) {
		return p.toks[p.pos]
	}
	line := 1
	if len(p.toks) > 0 {
		line = p.toks[len(p.toks)-1].line
	}
	return token{line: line}
}

func (p *parser) next() token {
	t := p.peek()
	if p.pos < len(p.toks) {
		p.pos++
	}
	return t
}

func (p *parser) expect(want string) (token, error) {
	t := p.next()
	if t.str || t.text != want {
		return t, p.errorf(t.line, "expected %q, found %q", want, t.text)
	}
	return t, nil
}

func (p *parser) ident(what string) (token, error) {
	t := p.next()
	if t.str || !validIdent(t.text) {
		return t, p.errorf(t.line, "expected %s, found %q", what, t.text)
	}
	return t, nil
}

// doc returns the comment block on the lines right above line (no blank
// line or code in between).
func (p *parser) doc(line int) []string {
	var d []string
	for l := line - 1; l > 0; l-- {
		c, ok := p.comments[l]
		if !ok || p.code[l] {
			break
		}
		d = append(d, c)
	}
	slices.Reverse(d)
	return d
}

// trailing returns the comment after the code on line.
func (p *parser) trailing(line int) string {
	if p.code[line] {
		return p.comments[line]
	}
	return ""
}

func (p *parser) file() error {
	p.names = map[string]int{}
	first := p.peek()
	if first.text != "syntax" {
		return p.errorf(first.line, `the file must start with syntax = "proto3";`)
	}
	p.f.Doc = p.doc(first.line)
	p.next()
	if _, err := p.expect("="); err != nil {
		return err
	}
	if t := p.next(); !t.str || t.text != "proto3" {
		return p.errorf(t.line, `only syntax = "proto3" is supported`)
	}
	if _, err := p.expect(";"); err != nil {
		return err
	}
	for p.pos < len(p.toks) {
		t := p.next()
		switch t.text {
		case "package":
			if p.f.Package != "" {
				return p.errorf(t.line, "second package statement")
			}
			n := p.next()
			if n.str || n.text == "" {
				return p.errorf(n.line, "expected a package name")
			}
			p.f.Package = n.text
			if _, err := p.expect(";"); err != nil {
				return err
			}
		case "option":
			n, err := p.ident("an option name")
			if err != nil {
				return err
			}
			if _, err := p.expect("="); err != nil {
				return err
			}
			v := p.next()
			p.f.Options[n.text] = v.text
			if _, err := p.expect(";"); err != nil {
				return err
			}
		case "enum":
			if err := p.enum(t); err != nil {
				return err
			}
		case "message":
			if err := p.message(t); err != nil {
				return err
			}
		default:
			return p.errorf(t.line, "%q is not supported by wire's generator (package, option, enum and message are)", t.text)
		}
	}
	if p.f.Package == "" {
		return p.errorf(p.peek().line, "no package statement")
	}
	return nil
}

func (p *parser) declare(name token) error {
	if l, ok := p.names[name.text]; ok {
		return p.errorf(name.line, "%s already declared on line %d", name.text, l)
	}
	p.names[name.text] = name.line
	return nil
}

func (p *parser) number(what string) (int32, token, error) {
	t := p.next()
	n, err := strconv.ParseInt(t.text, 10, 32)
	if t.str || err != nil {
		return 0, t, p.errorf(t.line, "expected %s, found %q", what, t.text)
	}
	return int32(n), t, nil
}

func (p *parser) enum(kw token) error {
	name, err := p.ident("an enum name")
	if err != nil {
		return err
	}
	if err := p.declare(name); err != nil {
		return err
	}
	e := &Enum{Name: name.text, Doc: p.doc(kw.line)}
	if _, err := p.expect("{"); err != nil {
		return err
	}
	seen := map[int32]string{}
	for {
		t := p.peek()
		if t.text == "}" && !t.str {
			p.next()
			break
		}
		if t.text == "option" || t.text == "reserved" {
			return p.errorf(t.line, "%s in an enum is not supported", t.text)
		}
		v, err := p.ident("an enum value name")
		if err != nil {
			return err
		}
		if _, err := p.expect("="); err != nil {
			return err
		}
		n, nt, err := p.number("an enum value number")
		if err != nil {
			return err
		}
		end, err := p.expect(";")
		if err != nil {
			return p.errorf(nt.line, "expected ; after %s = %d (value options are not supported)", v.text, n)
		}
		if len(e.Values) == 0 && n != 0 {
			return p.errorf(v.line, "the first value of proto3 enum %s must be 0", e.Name)
		}
		if other, ok := seen[n]; ok {
			return p.errorf(v.line, "%s and %s have the same number %d (aliases are not supported)", other, v.text, n)
		}
		seen[n] = v.text
		if err := p.declare(v); err != nil { // enum values share the package scope
			return err
		}
		e.Values = append(e.Values, &EnumValue{Name: v.text, Number: n, Doc: p.doc(v.line), Comment: p.trailing(end.line)})
	}
	if len(e.Values) == 0 {
		return p.errorf(name.line, "enum %s has no values", e.Name)
	}
	p.f.Enums = append(p.f.Enums, e)
	p.f.enumByNam[e.Name] = e
	return nil
}

func (p *parser) message(kw token) error {
	name, err := p.ident("a message name")
	if err != nil {
		return err
	}
	if err := p.declare(name); err != nil {
		return err
	}
	m := &Message{Name: name.text, Doc: p.doc(kw.line)}
	if _, err := p.expect("{"); err != nil {
		return err
	}
	if err := p.fields(m, nil); err != nil {
		return err
	}
	p.f.Messages = append(p.f.Messages, m)
	p.f.msgByName[m.Name] = m
	return nil
}

// fields parses fields up to the closing brace, into oneof o if not nil.
func (p *parser) fields(m *Message, o *Oneof) error {
	for {
		t := p.peek()
		if t.text == "}" && !t.str {
			p.next()
			return nil
		}
		switch t.text {
		case "oneof":
			if o != nil {
				return p.errorf(t.line, "nested oneof")
			}
			p.next()
			n, err := p.ident("a oneof name")
			if err != nil {
				return err
			}
			if _, err := p.expect("{"); err != nil {
				return err
			}
			one := &Oneof{Name: n.text, Doc: p.doc(t.line), Index: len(m.Oneofs)}
			m.Oneofs = append(m.Oneofs, one)
			if err := p.fields(m, one); err != nil {
				return err
			}
			if len(one.Fields) == 0 {
				return p.errorf(n.line, "oneof %s is empty", n.text)
			}
			continue
		case "message", "enum", "optional", "map", "reserved", "option", "extensions", "extend", "group", "required":
			return p.errorf(t.line, "%q in a message is not supported by wire's generator", t.text)
		}
		f := &Field{line: t.line, Oneof: o, Doc: p.doc(t.line)}
		if t.text == "repeated" {
			if o != nil {
				return p.errorf(t.line, "repeated field in a oneof")
			}
			f.Repeated = true
			p.next()
		}
		typ := p.next()
		if typ.str || !validIdent(typ.text) {
			return p.errorf(typ.line, "expected a field type (an unqualified name), found %q", typ.text)
		}
		f.TypeName = typ.text
		n, err := p.ident("a field name")
		if err != nil {
			return err
		}
		f.Name = n.text
		if _, err := p.expect("="); err != nil {
			return err
		}
		f.Number, _, err = p.number("a field number")
		if err != nil {
			return err
		}
		end := p.next()
		if end.text != ";" || end.str {
			return p.errorf(end.line, "expected ; after field %s (field options are not supported), found %q", f.Name, end.text)
		}
		f.Comment = p.trailing(end.line)
		for _, g := range m.Fields {
			if g.Name == f.Name {
				return p.errorf(f.line, "field %s.%s declared twice", m.Name, f.Name)
			}
			if g.Number == f.Number {
				return p.errorf(f.line, "fields %s and %s of %s have the same number %d", g.Name, f.Name, m.Name, f.Number)
			}
		}
		if f.Number < 1 || f.Number > 1<<29-1 || f.Number >= 19000 && f.Number <= 19999 {
			return p.errorf(f.line, "field %s.%s: number %d is not a valid field number", m.Name, f.Name, f.Number)
		}
		m.Fields = append(m.Fields, f)
		if o != nil {
			o.Fields = append(o.Fields, f)
		}
	}
}

func (p *parser) resolve() error {
	for _, m := range p.f.Messages {
		for _, f := range m.Fields {
			if k, ok := scalarKinds[f.TypeName]; ok {
				f.Kind = k
			} else if e := p.f.enumByNam[f.TypeName]; e != nil {
				f.Kind, f.Enum = KindEnum, e
			} else if sub := p.f.msgByName[f.TypeName]; sub != nil {
				f.Kind, f.Message = KindMessage, sub
			} else {
				return p.errorf(f.line, "field %s.%s: type %s is not supported or not declared (supported: double, uint32, uint64, int64, bool, string, bytes, the file's enums and messages)", m.Name, f.Name, f.TypeName)
			}
			if f.Repeated && !slices.Contains(repeatable, f.Kind) {
				return p.errorf(f.line, "field %s.%s: repeated %s is not supported by wire's generator (repeated string, uint32 and double are)", m.Name, f.Name, f.TypeName)
			}
			if f.Oneof != nil && f.Kind != KindMessage {
				return p.errorf(f.line, "field %s.%s: only message fields are supported in a oneof", m.Name, f.Name)
			}
		}
		if err := p.checkCycle(m, nil); err != nil {
			return err
		}
	}
	return nil
}

// checkCycle rejects a message that contains itself: the decoder's nesting
// is bounded by the schema only.
func (p *parser) checkCycle(m *Message, path []string) error {
	if slices.Contains(path, m.Name) {
		return fmt.Errorf("%s: message %s contains itself (%s): recursion is not supported", p.name, m.Name, strings.Join(append(path, m.Name), " > "))
	}
	for _, f := range m.Fields {
		if f.Message != nil {
			if err := p.checkCycle(f.Message, append(path, m.Name)); err != nil {
				return err
			}
		}
	}
	return nil
}

// GoName is protoc-gen-go's Go name of a proto identifier (GoCamelCase):
// client_id -> ClientId, l2 -> L2.
func GoName(s string) string {
	var b []byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '.' && i+1 < len(s) && isLower(s[i+1]):
		case c == '.':
			b = append(b, '_')
		case c == '_' && (i == 0 || s[i-1] == '.'):
			b = append(b, 'X')
		case c == '_' && i+1 < len(s) && isLower(s[i+1]):
		case c >= '0' && c <= '9':
			b = append(b, c)
		default:
			if isLower(c) {
				c -= 'a' - 'A'
			}
			b = append(b, c)
			for ; i+1 < len(s) && isLower(s[i+1]); i++ {
				b = append(b, s[i+1])
			}
		}
	}
	return string(b)
}

func isLower(c byte) bool { return c >= 'a' && c <= 'z' }

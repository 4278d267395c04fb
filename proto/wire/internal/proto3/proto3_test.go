package proto3

import (
	"os"
	"strings"
	"testing"
)

const head = "syntax = \"proto3\";\npackage p.v1;\n"

func TestParse(t *testing.T) {
	src := head + `
// Doc of E.
enum E {
  E_ZERO = 0; // zero
  // Doc of one.
  E_ONE = 1;
}

message Sub { repeated double d = 1; }

// Doc of M
// on two lines.
message M {
  string s = 1;    // trailing
  // Doc of e.
  E e = 2;
  repeated uint32 u = 3;
  oneof body {
    Sub sub = 4;
  }
  bytes b = 5;
}
`
	f, err := Parse("x.proto", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if f.Package != "p.v1" || len(f.Enums) != 1 || len(f.Messages) != 2 {
		t.Fatalf("parsed %+v", f)
	}
	e := f.Enums[0]
	if strings.Join(e.Doc, "|") != " Doc of E." || e.Values[0].Comment != " zero" || e.Values[1].Doc[0] != " Doc of one." || e.Values[1].Number != 1 {
		t.Errorf("enum %+v %+v %+v", e, e.Values[0], e.Values[1])
	}
	m := f.Message("M")
	if strings.Join(m.Doc, "|") != " Doc of M| on two lines." || len(m.Fields) != 5 || len(m.Oneofs) != 1 {
		t.Fatalf("message %+v", m)
	}
	want := []struct {
		name     string
		num      int32
		kind     Kind
		repeated bool
		oneof    bool
	}{{"s", 1, KindString, false, false}, {"e", 2, KindEnum, false, false}, {"u", 3, KindUint32, true, false},
		{"sub", 4, KindMessage, false, true}, {"b", 5, KindBytes, false, false}}
	for i, w := range want {
		fl := m.Fields[i]
		if fl.Name != w.name || fl.Number != w.num || fl.Kind != w.kind || fl.Repeated != w.repeated || (fl.Oneof != nil) != w.oneof {
			t.Errorf("field %d = %+v, want %+v", i, fl, w)
		}
	}
	if m.Fields[0].Comment != " trailing" || m.Fields[1].Doc[0] != " Doc of e." || m.Fields[1].Enum != e || m.Fields[3].Message != f.Message("Sub") {
		t.Errorf("fields %+v %+v", m.Fields[0], m.Fields[1])
	}
}

// TestParseRejects: everything outside the subset is an error naming the
// line, never silently dropped.
func TestParseRejects(t *testing.T) {
	for name, tc := range map[string]struct{ src, want string }{
		"proto2":          {"syntax = \"proto2\";", "proto3"},
		"no syntax":       {"package p;", "syntax"},
		"no package":      {"syntax = \"proto3\";\nmessage M {}", "no package"},
		"import":          {head + "import \"x.proto\";", `"import" is not supported`},
		"nested message":  {head + "message M {\n message N {}\n}", `:4: "message" in a message is not supported`},
		"optional":        {head + "message M { optional string s = 1; }", `"optional"`},
		"map":             {head + "message M { map<string, string> m = 1; }", `"map"`},
		"reserved":        {head + "message M { reserved 2; }", `"reserved"`},
		"field option":    {head + "message M { repeated double d = 1 [packed = false]; }", "field options are not supported"},
		"int32":           {head + "message M { int32 i = 1; }", "type int32 is not supported"},
		"unknown type":    {head + "message M { Foo f = 1; }", "type Foo"},
		"repeated bytes":  {head + "message M { repeated bytes b = 1; }", "repeated bytes is not supported"},
		"repeated msg":    {head + "message S {}\nmessage M { repeated S s = 1; }", "repeated S is not supported"},
		"scalar oneof":    {head + "message M { oneof o { string s = 1; } }", "only message fields"},
		"duplicate num":   {head + "message M { string a = 1; string b = 1; }", "same number 1"},
		"duplicate name":  {head + "message M { string a = 1; string a = 2; }", "declared twice"},
		"number 0":        {head + "message M { string a = 0; }", "not a valid field number"},
		"reserved range":  {head + "message M { string a = 19000; }", "not a valid field number"},
		"enum not zero":   {head + "enum E { A = 1; }", "must be 0"},
		"enum alias":      {head + "enum E { A = 0; B = 0; }", "same number"},
		"duplicate type":  {head + "message M {}\nenum M { A = 0; }", "already declared"},
		"recursion":       {head + "message M { M m = 1; }", "contains itself"},
		"block comment":   {head + "/* x */", "block comments"},
		"unterminated":    {head + "option go_package = \"x;", "unterminated"},
		"missing semi":    {head + "message M { string a = 1 }", "expected ;"},
		"unclosed":        {head + "message M { string a = 1;", "expected a field type"},
		"qualified type":  {head + "message M { p.v1.S s = 1; }", "unqualified"},
		"bad character":   {head + "message M { string a = 1; } $", "unexpected character"},
		"second package":  {head + "package q;", "second package"},
		"empty oneof":     {head + "message M { oneof o { } }", "empty"},
		"nested oneof":    {head + "message S {}\nmessage M { oneof o { oneof p { S s = 1; } } }", "nested oneof"},
		"repeated oneof":  {head + "message S {}\nmessage M { oneof o { repeated S s = 1; } }", "repeated field in a oneof"},
		"enum value opts": {head + "enum E { A = 0 [deprecated = true]; }", "value options"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("x.proto", []byte(tc.src))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestParseEdgefl parses the real schema.
func TestParseEdgefl(t *testing.T) {
	src, err := os.ReadFile("../../edgefl.proto")
	if err != nil {
		t.Fatal(err)
	}
	f, err := Parse("edgefl.proto", src)
	if err != nil {
		t.Fatal(err)
	}
	if f.Package != "edgefl.wire.v1" || f.Message("Envelope") == nil || f.Options["go_package"] == "" {
		t.Fatalf("parsed %q, options %v", f.Package, f.Options)
	}
}

func TestGoName(t *testing.T) {
	for in, want := range map[string]string{
		"client_id": "ClientId", "l2": "L2", "max_grad_evals": "MaxGradEvals", "lr": "Lr",
		"run_id": "RunId", "a_1": "A_1", "foo2bar": "Foo2Bar", "_x": "XX", "Envelope": "Envelope",
	} {
		if got := GoName(in); got != want {
			t.Errorf("GoName(%q) = %q, want %q", in, got, want)
		}
	}
}

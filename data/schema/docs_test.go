package schema

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestDocsFieldReference: docs/schema.md has a table row for every JSON
// field a schema accepts (the fields of Schema, Feature, Label and Class),
// and its example parses.
func TestDocsFieldReference(t *testing.T) {
	raw, err := os.ReadFile("../../docs/schema.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	for _, typ := range []reflect.Type{reflect.TypeFor[Schema](), reflect.TypeFor[Feature](), reflect.TypeFor[Label](), reflect.TypeFor[Class]()} {
		for f := range typ.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				continue
			}
			if !strings.Contains(doc, "\n| `"+name+"` |") {
				t.Errorf("docs/schema.md has no row for %s's field %q", typ.Name(), name)
			}
		}
	}
	_, rest, ok := strings.Cut(doc, "```json\n")
	example, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/schema.md has no ```json example")
	}
	if _, err := Parse([]byte(example)); err != nil {
		t.Errorf("docs/schema.md's example: %v", err)
	}
}

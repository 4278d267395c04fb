package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// Unknown fields are refused (a misspelt option must not silently take its
// default); encoding/json names only the key, so Parse finds where it is
// (unknownField) and says what that object takes instead.

// fieldHints are the mistakes worth a sentence: a key that belongs to
// another object, keyed by the object's path pattern and the key.
var fieldHints = map[[2]string]string{
	{"label", "name"}:            `the label column is "column"`,
	{"label", "values"}:          `a label's raw values go in "classes": [{"name": ..., "values": [...]}]`,
	{"features[]", "column"}:     `a feature's column is "name"`,
	{"features[]", "kind"}:       `a feature's kind is "type": numeric or categorical`,
	{"label.classes[]", "value"}: `a class's raw values are "values": [...]`,
	{"", "label_column"}:         `the label is "label": {"column": ...}`,
	{"", "target"}:               `the label is "label": {"column": ...}`,
}

// unknownField walks b (a schema that encoding/json refused for an
// unknown key) and returns the first unknown key's error: its JSON path,
// the key, and what the object takes; nil when it finds none.
func unknownField(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	_, err := findUnknown(dec, reflect.TypeOf(rawSchema{}), "", "")
	return err
}

// findUnknown reads one value of type t from dec (path: its JSON path,
// pattern: the path with indices dropped) and returns the first unknown
// key in it; ok is false when the JSON ends or breaks (encoding/json's
// error then stands).
func findUnknown(dec *json.Decoder, t reflect.Type, path, pattern string) (ok bool, err error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, terr := dec.Token()
	if terr != nil {
		return false, nil
	}
	delim, isDelim := tok.(json.Delim)
	switch {
	case isDelim && delim == '{' && t.Kind() == reflect.Struct:
		for dec.More() {
			kt, kerr := dec.Token()
			key, isKey := kt.(string)
			if kerr != nil || !isKey {
				return false, nil
			}
			ft, known := jsonField(t, key)
			if !known {
				return true, unknownFieldError(t, path, pattern, key)
			}
			sub, subPattern := key, key
			if path != "" {
				sub, subPattern = path+"."+key, pattern+"."+key
			}
			if ok, err := findUnknown(dec, ft, sub, subPattern); err != nil || !ok {
				return ok, err
			}
		}
	case isDelim && delim == '[' && t.Kind() == reflect.Slice:
		for i := 0; dec.More(); i++ {
			if ok, err := findUnknown(dec, t.Elem(), fmt.Sprintf("%s[%d]", path, i), pattern+"[]"); err != nil || !ok {
				return ok, err
			}
		}
	case isDelim && (delim == '{' || delim == '['):
		// Not what t is (encoding/json says so): skip the value.
		for depth := 1; depth > 0; {
			tok, terr := dec.Token()
			if terr != nil {
				return false, nil
			}
			if d, ok := tok.(json.Delim); ok {
				if d == '{' || d == '[' {
					depth++
				} else {
					depth--
				}
			}
		}
		return true, nil
	default:
		return true, nil // a scalar
	}
	if _, terr := dec.Token(); terr != nil { // the closing delimiter
		return false, nil
	}
	return true, nil
}

// jsonField is the type of t's field whose JSON name is key, matched
// case-insensitively as encoding/json matches it.
func jsonField(t reflect.Type, key string) (reflect.Type, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if name := jsonName(f); name != "" && strings.EqualFold(name, key) {
			return f.Type, true
		}
	}
	return nil, false
}

func jsonName(f reflect.StructField) string {
	tag := f.Tag.Get("json")
	if tag == "-" || !f.IsExported() {
		return ""
	}
	if name, _, _ := strings.Cut(tag, ","); name != "" {
		return name
	}
	return f.Name
}

// unknownFieldError says where key is, why it may be there, and the keys
// the object takes.
func unknownFieldError(t reflect.Type, path, pattern, key string) error {
	var names []string
	for i := range t.NumField() {
		if n := jsonName(t.Field(i)); n != "" {
			names = append(names, n)
		}
	}
	what := "the schema"
	switch pattern {
	case "label":
		what = "label"
	case "features[]":
		what = "a feature"
	case "label.classes[]":
		what = "a class"
	}
	msg := fmt.Sprintf("unknown field %q", key)
	if path != "" {
		msg = path + ": " + msg
	}
	if h, ok := fieldHints[[2]string{pattern, strings.ToLower(key)}]; ok {
		msg += "; " + h
	} else if near := nearest(key, names); near != "" {
		msg += fmt.Sprintf("; did you mean %q?", near)
	}
	return fmt.Errorf("%s (%s takes %s)", msg, what, strings.Join(names, ", "))
}

// nearest is the name within two edits of key, if any.
func nearest(key string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		if d := editDistance(strings.ToLower(key), n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			cur[j] = min(c, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

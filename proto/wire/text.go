package wire

// The text form of the messages, written by their String methods (generated
// in text_gen.go, which call text below): one line in the style of
// the protobuf text format (field:value, sub-messages in braces, fields at
// their default value left out), for logs and test failures. Like
// protobuf-go's, it is not meant to be parsed and may change.

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
)

type textWriter struct{ b []byte }

// name is out of line: it is called for every field of every message and
// inlined copies of its appends cost edge-agent kilobytes of text.
//
//go:noinline
func (w *textWriter) name(n string) {
	if len(w.b) > 0 && w.b[len(w.b)-1] != '{' {
		w.b = append(w.b, ' ')
	}
	w.b = append(w.b, n...)
	w.b = append(w.b, ':')
}

func (w *textWriter) str(n, v string) {
	if v != "" {
		w.name(n)
		w.b = strconv.AppendQuote(w.b, v)
	}
}

func (w *textWriter) bytes(n string, v []byte) {
	if len(v) > 0 {
		w.name(n)
		w.b = strconv.AppendQuote(w.b, string(v))
	}
}

func (w *textWriter) uint(n string, v uint64) {
	if v != 0 {
		w.name(n)
		w.b = strconv.AppendUint(w.b, v, 10)
	}
}

func (w *textWriter) int(n string, v int64) {
	if v != 0 {
		w.name(n)
		w.b = strconv.AppendInt(w.b, v, 10)
	}
}

func (w *textWriter) boolean(n string, v bool) {
	if v {
		w.name(n)
		w.b = append(w.b, "true"...)
	}
}

func (w *textWriter) appendFloat(v float64) {
	switch {
	case math.IsInf(v, 1):
		w.b = append(w.b, "inf"...)
	case math.IsInf(v, -1):
		w.b = append(w.b, "-inf"...)
	case math.IsNaN(v):
		w.b = append(w.b, "nan"...)
	default:
		w.b = strconv.AppendFloat(w.b, v, 'g', -1, 64)
	}
}

func (w *textWriter) float(n string, v float64) {
	if !isZeroDouble(v) {
		w.name(n)
		w.appendFloat(v)
	}
}

// text is the text form of the message m (a pointer to one of the
// generated structs), written by walking its fields by reflection in
// declaration order (the schema's), each named by its json tag (the proto
// field name; a oneof's wrapper by its field's lower-cased Go name, which
// is the proto name for every oneof of this schema). One writer instead of
// a generated one per message: edge-agent links the String methods (fmt
// may call them) and the per-message writers cost it ~15 kB of text.
func text(present bool, m any) string {
	if !present {
		return "<nil>"
	}
	var w textWriter
	w.fields(reflect.ValueOf(m).Elem())
	return string(w.b)
}

func (w *textWriter) fields(v reflect.Value) {
	t := v.Type()
	for i := range t.NumField() {
		f, fv := t.Field(i), v.Field(i)
		if f.Type.Kind() == reflect.Interface { // a oneof: *Wrapper{Field *Message}
			if fv.IsNil() || fv.Elem().IsNil() {
				continue
			}
			o := fv.Elem().Elem()
			w.field(strings.ToLower(o.Type().Field(0).Name), o.Field(0))
			continue
		}
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" {
			w.field(name, fv)
		}
	}
}

// field writes one field n of value v as the generated writers did: a
// field at its default value is left out.
func (w *textWriter) field(n string, v reflect.Value) {
	switch v.Kind() {
	case reflect.String:
		w.str(n, v.String())
	case reflect.Uint32, reflect.Uint64:
		w.uint(n, v.Uint())
	case reflect.Int64:
		w.int(n, v.Int())
	case reflect.Int32: // an enum, by name (by number if unknown)
		if v.Int() != 0 {
			w.name(n)
			w.b = append(w.b, v.Interface().(fmt.Stringer).String()...)
		}
	case reflect.Bool:
		w.boolean(n, v.Bool())
	case reflect.Float64:
		w.float(n, v.Float())
	case reflect.Pointer:
		if !v.IsNil() {
			w.name(n)
			w.b = append(w.b, '{')
			w.fields(v.Elem())
			w.b = append(w.b, '}')
		}
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			w.bytes(n, v.Bytes())
			return
		}
		for i := range v.Len() {
			w.name(n)
			switch e := v.Index(i); e.Kind() {
			case reflect.String:
				w.b = strconv.AppendQuote(w.b, e.String())
			case reflect.Uint32:
				w.b = strconv.AppendUint(w.b, e.Uint(), 10)
			default:
				w.appendFloat(e.Float())
			}
		}
	}
}

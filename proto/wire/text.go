package wire

// The text form of the messages, written by their String methods (generated
// in text_gen.go, which calls the writers below): one line in the style of
// the protobuf text format (field:value, sub-messages in braces, fields at
// their default value left out), for logs and test failures. Like
// protobuf-go's, it is not meant to be parsed and may change.

import (
	"math"
	"strconv"
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

func (w *textWriter) strs(n string, vs []string) {
	for _, v := range vs {
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

func (w *textWriter) floats(n string, vs []float64) {
	for _, v := range vs {
		w.name(n)
		w.appendFloat(v)
	}
}

func (w *textWriter) uints(n string, vs []uint32) {
	for _, v := range vs {
		w.name(n)
		w.b = strconv.AppendUint(w.b, uint64(v), 10)
	}
}

// enum writes a non-zero enum value by name (by number if unknown).
func (w *textWriter) enum(n string, v int32, names map[int32]string) {
	if v != 0 {
		w.name(n)
		w.b = append(w.b, enumString(names, v)...)
	}
}

type texter interface{ appendText(w *textWriter) }

// msg writes a present sub-message in braces.
func (w *textWriter) msg(n string, present bool, m texter) {
	if present {
		w.name(n)
		w.b = append(w.b, '{')
		m.appendText(w)
		w.b = append(w.b, '}')
	}
}

func text(present bool, m texter) string {
	if !present {
		return "<nil>"
	}
	var w textWriter
	m.appendText(&w)
	return string(w.b)
}

package wire

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// Per-field fixtures: testdata/golden/fields/<Message>.<field>.bin holds,
// for every field of edgefl.proto outside the envelope's oneof, the message
// with only that field set to an edge value (edgeValue), marshalled without
// validation. They are derived from the schema, so a new field gets its
// fixture from `go test ./proto/wire/ -run Golden -update` without a test edit,
// and no other fixture changes; TestProtobufGoAgrees checks each against
// protobuf-go. The oneof members are pinned by rawGolden's
// raw_envelope_*0.bin.

// messageTypes returns the Go type of every message reachable from the
// envelope, by name (a generated type is named as its message).
func messageTypes() map[string]reflect.Type {
	types := map[string]reflect.Type{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		if _, ok := types[t.Name()]; ok {
			return
		}
		types[t.Name()] = t
		for i := range t.NumField() {
			if f := t.Field(i).Type; f.Kind() == reflect.Pointer && f.Elem().Kind() == reflect.Struct {
				walk(f.Elem())
			}
		}
	}
	walk(reflect.TypeFor[Envelope]())
	for _, body := range []Message{&RoundAnnouncement{}, &ClientStatus{}, &ClientUpdate{}, &Receipt{},
		&SiteStatistics{}, &EvalReport{}, &SecAggMessage{}, &RunSpec{}} {
		walk(reflect.TypeOf(body).Elem())
	}
	return types
}

// edgeValue is the value a per-field fixture gives a field of type t: the
// extremes of its encoding (10-byte varints, -0, every byte value, UTF-8
// beyond ASCII) and, for a sub-message, a present but empty one.
func edgeValue(t reflect.Type) reflect.Value {
	v := reflect.New(t).Elem()
	switch t.Kind() {
	case reflect.String:
		v.SetString("edge ✓ 𝄞 \"q\"")
	case reflect.Uint32:
		v.SetUint(math.MaxUint32)
	case reflect.Uint64:
		v.SetUint(math.MaxUint64)
	case reflect.Int64:
		v.SetInt(math.MinInt64)
	case reflect.Int32: // an enum: negative values are sign-extended to 10 bytes
		v.SetInt(math.MinInt32)
	case reflect.Float64:
		v.SetFloat(negZero)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Pointer:
		v.Set(reflect.New(t.Elem()))
	case reflect.Slice:
		switch t.Elem().Kind() {
		case reflect.Uint8:
			v.SetBytes(allBytes())
		case reflect.String:
			v.Set(reflect.ValueOf([]string{"", "edge ✓"}))
		case reflect.Uint32:
			v.Set(reflect.ValueOf([]uint32{0, math.MaxUint32}))
		case reflect.Float64:
			v.Set(reflect.ValueOf([]float64{negZero, math.Inf(-1), math.SmallestNonzeroFloat64}))
		default:
			panic("edgeValue: " + t.String())
		}
	default:
		panic("edgeValue: " + t.String())
	}
	return v
}

// fieldGolden returns the per-field fixtures by file name under
// testdata/golden/.
func fieldGolden(t testing.TB) map[string]rawEntry {
	t.Helper()
	types := messageTypes()
	out := map[string]rawEntry{}
	for _, m := range parseSchema(t).Messages {
		typ, ok := types[m.Name]
		if !ok {
			t.Fatalf("message %s is not reachable from the envelope", m.Name)
		}
		for _, f := range m.Fields {
			if f.Oneof != nil {
				continue
			}
			sf, ok := jsonField(typ, f.Name)
			if !ok {
				t.Fatalf("%s has no Go field for %s", typ, f.Name)
			}
			msg := reflect.New(typ)
			msg.Elem().FieldByIndex(sf.Index).Set(edgeValue(sf.Type))
			out[filepath.Join("fields", m.Name+"."+f.Name+".bin")] = rawEntry{
				msg.Interface().(rawMsg), func() rawMsg { return reflect.New(typ).Interface().(rawMsg) }}
		}
	}
	return out
}

// jsonField finds the Go field of proto field name by its json tag.
func jsonField(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if tag, _, _ := strings.Cut(f.Tag.Get("json"), ","); tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// TestGoldenFields checks the per-field fixtures as TestGoldenRaw checks
// rawGolden's, and against protobuf-go.
func TestGoldenFields(t *testing.T) {
	file := edgeflDescriptor(t)
	fixtures := fieldGolden(t)
	for name, e := range fixtures {
		t.Run(name, func(t *testing.T) {
			protobufGoAgrees(t, file, e.msg, checkRawGolden(t, name, e.msg, e.empty))
		})
	}
	// Every file in fields/ is one of them.
	names, err := os.ReadDir(filepath.Join("testdata", "golden", "fields"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if _, ok := fixtures[filepath.Join("fields", n.Name())]; !ok {
			t.Errorf("testdata/golden/fields/%s is not a field of edgefl.proto: a field was renamed or removed (never do that; see edgefl.proto)", n.Name())
		}
	}
}

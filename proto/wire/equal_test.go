package wire

import (
	"math"
	"reflect"
)

// msgEqual reports whether two messages (or any values built from the wire
// types) hold the same field values, with proto3's view of presence: a nil
// and an empty repeated field or bytes are equal, a nil and an empty
// sub-message are not. Floats compare by their bits, so -0 and 0 differ and
// a NaN equals the same NaN. Unexported fields are ignored.
func msgEqual(a, b any) bool {
	return valueEqual(reflect.ValueOf(a), reflect.ValueOf(b))
}

func valueEqual(a, b reflect.Value) bool {
	if a.IsValid() != b.IsValid() {
		return false
	}
	if !a.IsValid() {
		return true
	}
	if a.Type() != b.Type() {
		return false
	}
	switch a.Kind() {
	case reflect.Pointer, reflect.Interface:
		if a.IsNil() || b.IsNil() {
			return a.IsNil() == b.IsNil()
		}
		return valueEqual(a.Elem(), b.Elem())
	case reflect.Struct:
		for i := 0; i < a.NumField(); i++ {
			if !a.Type().Field(i).IsExported() {
				continue
			}
			if !valueEqual(a.Field(i), b.Field(i)) {
				return false
			}
		}
		return true
	case reflect.Slice:
		if a.Len() != b.Len() {
			return false
		}
		for i := 0; i < a.Len(); i++ {
			if !valueEqual(a.Index(i), b.Index(i)) {
				return false
			}
		}
		return true
	case reflect.Float64:
		return math.Float64bits(a.Float()) == math.Float64bits(b.Float())
	case reflect.String:
		return a.String() == b.String()
	case reflect.Bool:
		return a.Bool() == b.Bool()
	case reflect.Int32, reflect.Int64:
		return a.Int() == b.Int()
	case reflect.Uint32, reflect.Uint64, reflect.Uint8:
		return a.Uint() == b.Uint()
	}
	panic("msgEqual: unexpected kind " + a.Kind().String())
}

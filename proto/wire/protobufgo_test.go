package wire

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/edgefl/edgefl/proto/wire/internal/proto3"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// The descriptor of edgefl.proto for protobuf-go's own codec (dynamicpb,
// deterministic Marshal), built from the same parse of edgefl.proto that the
// generator (proto/wire/internal/gen) reads, so that every field of the schema is
// checked against the generated codec without a test edit. Only tests link
// protobuf-go's runtime: edge-agent does not.

var pbKinds = map[proto3.Kind]descriptorpb.FieldDescriptorProto_Type{
	proto3.KindDouble:  descriptorpb.FieldDescriptorProto_TYPE_DOUBLE,
	proto3.KindUint32:  descriptorpb.FieldDescriptorProto_TYPE_UINT32,
	proto3.KindUint64:  descriptorpb.FieldDescriptorProto_TYPE_UINT64,
	proto3.KindInt64:   descriptorpb.FieldDescriptorProto_TYPE_INT64,
	proto3.KindBool:    descriptorpb.FieldDescriptorProto_TYPE_BOOL,
	proto3.KindString:  descriptorpb.FieldDescriptorProto_TYPE_STRING,
	proto3.KindBytes:   descriptorpb.FieldDescriptorProto_TYPE_BYTES,
	proto3.KindEnum:    descriptorpb.FieldDescriptorProto_TYPE_ENUM,
	proto3.KindMessage: descriptorpb.FieldDescriptorProto_TYPE_MESSAGE,
}

// parseSchema parses edgefl.proto as the generator does.
func parseSchema(t testing.TB) *proto3.File {
	t.Helper()
	src, err := os.ReadFile("edgefl.proto")
	if err != nil {
		t.Fatal(err)
	}
	f, err := proto3.Parse("edgefl.proto", src)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// edgeflDescriptor is protobuf-go's descriptor of edgefl.proto.
func edgeflDescriptor(t testing.TB) protoreflect.FileDescriptor {
	t.Helper()
	schema := parseSchema(t)
	file := &descriptorpb.FileDescriptorProto{
		Name:    proto.String(schema.Name),
		Package: proto.String(schema.Package),
		Syntax:  proto.String("proto3"),
	}
	for _, e := range schema.Enums {
		pe := &descriptorpb.EnumDescriptorProto{Name: proto.String(e.Name)}
		for _, v := range e.Values {
			pe.Value = append(pe.Value, &descriptorpb.EnumValueDescriptorProto{Name: proto.String(v.Name), Number: proto.Int32(v.Number)})
		}
		file.EnumType = append(file.EnumType, pe)
	}
	for _, m := range schema.Messages {
		pm := &descriptorpb.DescriptorProto{Name: proto.String(m.Name)}
		for _, o := range m.Oneofs {
			pm.OneofDecl = append(pm.OneofDecl, &descriptorpb.OneofDescriptorProto{Name: proto.String(o.Name)})
		}
		for _, f := range m.Fields {
			label := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL
			if f.Repeated {
				label = descriptorpb.FieldDescriptorProto_LABEL_REPEATED
			}
			pf := &descriptorpb.FieldDescriptorProto{
				Name: proto.String(f.Name), Number: proto.Int32(f.Number), JsonName: proto.String(f.Name),
				Type: pbKinds[f.Kind].Enum(), Label: label.Enum(),
			}
			if f.Kind == proto3.KindEnum || f.Kind == proto3.KindMessage {
				pf.TypeName = proto.String("." + schema.Package + "." + f.TypeName)
			}
			if f.Oneof != nil {
				pf.OneofIndex = proto.Int32(int32(f.Oneof.Index))
			}
			pm.Field = append(pm.Field, pf)
		}
		file.MessageType = append(file.MessageType, pm)
	}
	f, err := protodesc.NewFile(file, nil)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// protobufGoName is the message type of a generated one: the Go type's name
// is the message's.
func protobufGoName(m codec) protoreflect.Name {
	return protoreflect.Name(reflect.TypeOf(m).Elem().Name())
}

// hasUnknown reports whether m or a message below it holds unknown fields:
// a field the descriptor does not have, or one of another wire type.
func hasUnknown(m protoreflect.Message) bool {
	if len(m.GetUnknown()) > 0 {
		return true
	}
	found := false
	m.Range(func(f protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if f.Kind() == protoreflect.MessageKind && !f.IsList() {
			found = hasUnknown(v.Message())
		}
		return !found
	})
	return found
}

// protobufGoAgrees checks that protobuf-go reads enc (the generated codec's
// encoding of m) without unknown fields and writes it back byte for byte.
func protobufGoAgrees(t *testing.T, file protoreflect.FileDescriptor, m codec, enc []byte) {
	t.Helper()
	md := file.Messages().ByName(protobufGoName(m))
	dm := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(enc, dm); err != nil {
		t.Fatalf("protobuf-go cannot read %T: %v", m, err)
	}
	if hasUnknown(dm) {
		t.Fatalf("protobuf-go reads unknown fields in %T: %x", m, enc)
	}
	back, err := proto.MarshalOptions{Deterministic: true}.Marshal(dm)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, enc) {
		t.Fatalf("%T: protobuf-go writes\n%x\nthe generated codec\n%x", m, back, enc)
	}
}

func readGolden(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "golden", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestProtobufGoAgrees checks every golden fixture against protobuf-go's own
// codec on a descriptor of edgefl.proto: the fixtures written by wire's own
// codec (the schema run's and later) are exactly what protoc-gen-go code
// would write.
func TestProtobufGoAgrees(t *testing.T) {
	file := edgeflDescriptor(t)
	for name, m := range validGolden() {
		t.Run(name, func(t *testing.T) {
			env := &Envelope{Version: Version, Body: m.wrap()}
			protobufGoAgrees(t, file, env, readGolden(t, name))
			protobufGoAgrees(t, file, m, marshal(m))
		})
	}
	for name, e := range rawGolden() {
		t.Run(name, func(t *testing.T) {
			protobufGoAgrees(t, file, e.msg, readGolden(t, name))
		})
	}
}

// TestGoldenCoversEveryField checks that every field of edgefl.proto is set
// in at least one golden fixture, so that its encoding is pinned: a field
// added to the schema needs its fixture written (go test ./proto/wire/ -run Golden
// -update writes the per-field one, golden_fields_test.go).
func TestGoldenCoversEveryField(t *testing.T) {
	file := edgeflDescriptor(t)
	set := map[protoreflect.FullName]bool{}
	var walk func(m protoreflect.Message)
	walk = func(m protoreflect.Message) {
		m.Range(func(f protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			set[f.FullName()] = true
			if f.Kind() == protoreflect.MessageKind && !f.IsList() {
				walk(v.Message())
			}
			return true
		})
	}
	read := func(name string, m codec) {
		dm := dynamicpb.NewMessage(file.Messages().ByName(protobufGoName(m)))
		if err := proto.Unmarshal(readGolden(t, name), dm); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		walk(dm)
	}
	for name := range validGolden() {
		read(name, &Envelope{})
	}
	for name, e := range rawGolden() {
		read(name, e.msg)
	}
	for name, e := range fieldGolden(t) {
		read(name, e.msg)
	}
	for _, m := range parseSchema(t).Messages {
		for _, f := range m.Fields {
			if full := file.Messages().ByName(protoreflect.Name(m.Name)).Fields().ByName(protoreflect.Name(f.Name)).FullName(); !set[full] {
				t.Errorf("no golden fixture sets %s: run go test ./proto/wire/ -run Golden -update", full)
			}
		}
	}
}

// FuzzProtobufGo is the differential check: whatever protobuf-go accepts
// as an Envelope, the generated codec reads to a message that it writes
// as protobuf-go does (after protobuf-go's own round trip, which drops
// unknown fields' order-dependence).
func FuzzProtobufGo(f *testing.F) {
	addSeeds(f)
	file := edgeflDescriptor(f)
	md := file.Messages().ByName("Envelope")
	f.Fuzz(func(t *testing.T, b []byte) {
		dm := dynamicpb.NewMessage(md)
		if err := proto.Unmarshal(b, dm); err != nil {
			return
		}
		if hasUnknown(dm) {
			return
		}
		canon, err := proto.MarshalOptions{Deterministic: true}.Marshal(dm)
		if err != nil {
			return
		}
		var env Envelope
		if err := rawUnmarshal(canon, &env); err != nil {
			t.Fatalf("protobuf-go accepts %x, the generated codec: %v", canon, err)
		}
		if got := marshal(&env); !bytes.Equal(got, canon) {
			t.Fatalf("protobuf-go writes\n%x\nthe generated codec\n%x", canon, got)
		}
	})
}

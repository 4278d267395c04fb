package wire

// edgefl.proto is the schema of record: it documents the bytes on the wire.
// The Go code for it is written by hand (messages.go: the types, with the
// names, fields and Get methods protoc-gen-go gave them; codec.go: their
// encoding with google.golang.org/protobuf/encoding/protowire; text.go: their
// String methods), so that edge-agent does not link the protobuf reflection
// runtime, which cost it about 1.8 MB on linux/arm64. protoc is not run.
//
// A change to edgefl.proto must be made by hand in those three files. The
// fixtures in testdata/golden/ were written by the protoc-gen-go code this
// replaced and pin the bytes of every message type with every field set;
// TestGoldenValid and TestGoldenRaw check that the hand-written code
// produces exactly those bytes and decodes them back. Add a fixture (go test
// ./wire -run Golden -update writes missing ones only) for a new field, and
// the field to the descriptor in protobufgo_test.go: TestProtobufGoAgrees
// checks every fixture against protobuf-go's own codec on that descriptor
// (so a fixture the hand-written code wrote, such as issue 11's, is what
// protoc-gen-go code would write), and FuzzProtobufGo compares the two
// codecs on arbitrary input. Only tests link protobuf-go's runtime.

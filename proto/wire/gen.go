package wire

//go:generate go run ./internal/gen -proto edgefl.proto -out .

// edgefl.proto is the schema of record: it documents the bytes on the wire,
// and the Go code for it is generated from it by proto/wire/internal/gen (standard
// library only; `go generate ./proto/wire` runs it): messages_gen.go (the types,
// with the names, fields and Get methods protoc-gen-go gave them),
// codec_gen.go (each message's encoding, calling the field encoders of
// codec.go, which use google.golang.org/protobuf/encoding/protowire) and
// text_gen.go (their String methods, calling text.go). protoc and
// protoc-gen-go are not run, so that edge-agent does not link the protobuf
// reflection runtime, which cost it about 1.8 MB on linux/arm64. What is not
// mechanical stays hand-written: the validation rules (validate.go, including
// the limit of each repeated field, repeatedLimit), the envelope's decoding
// (wire.go) and topics (topics.go).
//
// scripts/test.sh fails when the committed generated files differ from what
// `go generate ./proto/wire` writes, and so does proto/wire/internal/gen's own test
// (TestGeneratedFilesUpToDate). The fixtures in testdata/golden/ were written
// by the protoc-gen-go code this package used before and pin the bytes of
// every message type with every field set; TestGoldenValid and TestGoldenRaw
// check that the generated code produces exactly those bytes and decodes them
// back. TestProtobufGoAgrees checks every fixture against protobuf-go's own
// codec on a descriptor built from the same parsed edgefl.proto (so a new
// field is covered without a test edit), and FuzzProtobufGo compares the two
// codecs on arbitrary input. Only tests link protobuf-go's runtime. Adding a
// field: CONTRIBUTING.md, "Changing the wire schema".

package wire

// The Go code for edgefl.proto is generated and committed; CI does not run
// protoc. To regenerate, install protoc (e.g. apt-get install -y
// protobuf-compiler) and protoc-gen-go at the runtime's version
// (go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12), then:
//
//	go generate ./wire
//
//go:generate protoc --go_out=. --go_opt=paths=source_relative edgefl.proto

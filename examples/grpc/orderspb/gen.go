// Package orderspb is the protobuf service of the gRPC example:
// orders.proto and the code protoc generates from it, committed.
//
// Regenerating needs protoc (Debian: apt-get install protobuf-compiler) and
// the plugins at the versions the generated files name:
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
package orderspb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative orders.proto

package idemgrpc

import (
	"errors"
	"fmt"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// A record is what the server interceptor stores as a key's result: the
// format's version, one byte, then protobuf wire fields, each at most once:
//
//	1 (bytes): the response message's full name (a success)
//	2 (bytes): the response message, deterministically encoded (a success;
//	           absent for an empty message)
//	3 (bytes): the google.rpc.Status of a recorded error (code, message,
//	           details)
//
// A record holds either fields 1 and 2 or field 3.
const recordVersion = 1

const (
	fieldType    protowire.Number = 1
	fieldMessage protowire.Number = 2
	fieldStatus  protowire.Number = 3
)

// errNotRecord: the bytes are not a record of this format.
var errNotRecord = errors.New("idemgrpc: not a recorded response")

// encodeResponse records a successful response message.
func encodeResponse(m proto.Message) ([]byte, error) {
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: encoding the response: %w", err)
	}
	name := m.ProtoReflect().Descriptor().FullName()
	b := make([]byte, 0, 1+len(name)+len(body)+16)
	b = append(b, recordVersion)
	b = protowire.AppendTag(b, fieldType, protowire.BytesType)
	b = protowire.AppendString(b, string(name))
	if len(body) > 0 {
		b = protowire.AppendTag(b, fieldMessage, protowire.BytesType)
		b = protowire.AppendBytes(b, body)
	}
	return b, nil
}

// encodeStatus records an error's status.
func encodeStatus(st *spb.Status) ([]byte, error) {
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: encoding the status: %w", err)
	}
	b := make([]byte, 0, 1+len(body)+8)
	b = append(b, recordVersion)
	b = protowire.AppendTag(b, fieldStatus, protowire.BytesType)
	return protowire.AppendBytes(b, body), nil
}

// decodeRecord returns the response message, or the status of the error, a
// record holds. A success's message type must be registered (generated code
// registers its types with protoregistry.GlobalTypes when its package is
// linked in).
func decodeRecord(data []byte) (proto.Message, *status.Status, error) {
	if len(data) == 0 || data[0] != recordVersion {
		return nil, nil, errNotRecord
	}
	var name, body, st []byte
	var seen [4]bool
	for b := data[1:]; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType || num < fieldType || num > fieldStatus || seen[num] {
			return nil, nil, errNotRecord
		}
		seen[num] = true
		b = b[n:]
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, nil, errNotRecord
		}
		b = b[n:]
		switch num {
		case fieldType:
			name = v
		case fieldMessage:
			body = v
		case fieldStatus:
			st = v
		}
	}
	switch {
	case seen[fieldStatus] && !seen[fieldType] && !seen[fieldMessage]:
		var s spb.Status
		if err := proto.Unmarshal(st, &s); err != nil || codes.Code(s.Code) == codes.OK {
			return nil, nil, errNotRecord
		}
		return nil, status.FromProto(&s), nil
	case seen[fieldType] && !seen[fieldStatus]:
		mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(name))
		if err != nil {
			return nil, nil, fmt.Errorf("idemgrpc: the recorded response's type %q is not linked into this server: %w", name, err)
		}
		m := mt.New().Interface()
		if err := proto.Unmarshal(body, m); err != nil {
			return nil, nil, fmt.Errorf("idemgrpc: decoding the recorded %s: %w", name, err)
		}
		return m, nil, nil
	}
	return nil, nil, errNotRecord
}

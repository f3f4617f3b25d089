package idem

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Codec turns fn's results into the bytes stored in the record and back.
// Marshal receives a T and Unmarshal a *T.
//
// Result.Value is always what Unmarshal makes of the recorded bytes, on the
// first execution as on every replay: the first execution encodes fn's
// value, decodes the encoding and returns that, so the caller gets the same
// value each time (reflect.DeepEqual), even where the encoding loses
// something of fn's own value. A value that encodes but does not decode is
// not recorded: the call fails, and rolls back, as if fn had failed.
//
// Without one (WithCodec), results are stored as JSON with encoding/json,
// except []byte and json.RawMessage results, which are stored as they are
// (a nil one as an empty one). What JSON does not keep is what fn's value
// and Result.Value differ in: a time.Time keeps its instant and offset but
// not its Location (a time in Europe/Paris comes back with a fixed +01:00
// offset, or in time.Local when Local has that offset then) nor its
// monotonic reading; a value in an interface field (any) comes back as
// JSON's own type: a number as a float64, a struct or map as a
// map[string]any, a slice as a []any; unexported fields and fields tagged
// json:"-" are dropped; a custom MarshalJSON is read back by the matching
// UnmarshalJSON; and invalid UTF-8 in strings becomes U+FFFD (return binary
// data as []byte). A nil slice or map stays nil and an empty one empty. A
// value JSON cannot encode (a NaN or infinite float, a channel, a function)
// fails the call, which rolls back as if fn had failed.
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// jsonCodec is the default Codec for values that are not bytes.
type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// encodeValue stores v with codec, or by default as JSON except for []byte
// and json.RawMessage, which are stored as they are.
func encodeValue[T any](codec Codec, v T) ([]byte, error) {
	if codec == nil {
		switch b := any(v).(type) {
		case []byte:
			return nonNil(b), nil
		case json.RawMessage:
			return nonNil(b), nil
		}
		codec = jsonCodec{}
	}
	data, err := codec.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("idem: encoding the result (%T): %w", v, err)
	}
	return nonNil(data), nil
}

// encodeResult encodes v as encodeValue does and refuses an encoding larger
// than cfg's limit (WithMaxResultSize).
func encodeResult[T any](cfg *config, v T) ([]byte, error) {
	data, err := encodeValue(cfg.codec, v)
	if err != nil {
		return nil, err
	}
	if len(data) > cfg.maxResult {
		return nil, fmt.Errorf("%w: the encoded %T is %d bytes, over the limit of %d (WithMaxResultSize)",
			ErrResultTooLarge, v, len(data), cfg.maxResult)
	}
	return data, nil
}

// recordResult encodes v for the record as encodeResult does, and decodes
// the encoding back as a replay will: the first execution returns the
// decoded value, so that it is the value every replay returns. A result
// that encodes but does not decode (an interface field the codec cannot
// fill, say) is refused here rather than recorded, since no replay of it
// could succeed.
func recordResult[T any](cfg *config, v T) ([]byte, T, error) {
	var zero T
	data, err := encodeResult(cfg, v)
	if err != nil {
		return nil, zero, err
	}
	decoded, err := decodeValue[T](cfg.codec, data)
	if err != nil {
		return nil, zero, fmt.Errorf("idem: the encoded %T does not decode, so it cannot be replayed and is not recorded: %w", v, err)
	}
	return data, decoded, nil
}

// failureMessage is what a record stores for a permanent failure: err's
// message, cut to cfg's limit (WithMaxResultSize) at a UTF-8 boundary.
func failureMessage(cfg *config, err error) []byte {
	msg := err.Error()
	if len(msg) > cfg.maxResult {
		msg = strings.ToValidUTF8(msg[:cfg.maxResult], "")
	}
	return []byte(msg)
}

func decodeValue[T any](codec Codec, data []byte) (T, error) {
	var v T
	if codec == nil {
		switch p := any(&v).(type) {
		case *[]byte:
			*p = bytes.Clone(data)
			return v, nil
		case *json.RawMessage:
			*p = bytes.Clone(data)
			return v, nil
		}
		codec = jsonCodec{}
	}
	if err := codec.Unmarshal(data, &v); err != nil {
		return v, fmt.Errorf("idem: decoding the recorded result into %T: %w", v, err)
	}
	return v, nil
}

// nonNil keeps an empty result distinct from "no response" (NULL).
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

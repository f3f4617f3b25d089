package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// jsonCodec is the default Codec for values that are not bytes.
type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// EncodeValue stores v with codec, or by default as JSON except for []byte
// and json.RawMessage, which are stored as they are.
func EncodeValue[T any](codec Codec, v T) ([]byte, error) {
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

// EncodeResult encodes v as EncodeValue does and refuses an encoding larger
// than c's limit (WithMaxResultSize).
func EncodeResult[T any](c *Config, v T) ([]byte, error) {
	data, err := EncodeValue(c.Codec, v)
	if err != nil {
		return nil, err
	}
	if len(data) > c.MaxResult {
		return nil, fmt.Errorf("%w: the encoded %T is %d bytes, over the limit of %d (WithMaxResultSize)",
			ErrResultTooLarge, v, len(data), c.MaxResult)
	}
	return data, nil
}

// RecordResult encodes v for the record as EncodeResult does, and decodes
// the encoding back as a replay will: the first execution returns the
// decoded value, so that it is the value every replay returns. A result
// that encodes but does not decode (an interface field the codec cannot
// fill, say) is refused here rather than recorded, since no replay of it
// could succeed.
func RecordResult[T any](c *Config, v T) ([]byte, T, error) {
	var zero T
	data, err := EncodeResult(c, v)
	if err != nil {
		return nil, zero, err
	}
	decoded, err := DecodeValue[T](c.Codec, data)
	if err != nil {
		return nil, zero, fmt.Errorf("idem: the encoded %T does not decode, so it cannot be replayed and is not recorded: %w", v, err)
	}
	return data, decoded, nil
}

// FailureMessage is what a record stores for a permanent failure: err's
// message, cut to c's limit (WithMaxResultSize) at a UTF-8 boundary.
func FailureMessage(c *Config, err error) []byte {
	msg := err.Error()
	if len(msg) > c.MaxResult {
		msg = strings.ToValidUTF8(msg[:c.MaxResult], "")
	}
	return []byte(msg)
}

// DecodeValue decodes a recorded result as EncodeValue encoded it.
func DecodeValue[T any](codec Codec, data []byte) (T, error) {
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

// Replay turns an existing record into the call's result: the decoded
// value, or the recorded permanent failure. replayed is false only with an
// error.
func Replay[T any](rec Record, c *Config) (v T, replayed bool, err error) {
	switch rec.Status {
	case StatusSucceeded:
		d, err := DecodeValue[T](c.Codec, rec.Response)
		if err != nil {
			return v, false, err // the zero value, not a partial decoding
		}
		return d, true, nil
	case StatusFailed:
		return v, true, &PermanentError{Err: &RecordedError{Message: string(rec.Response)}}
	case StatusProcessing:
		return v, false, ErrInProgress
	default:
		return v, false, fmt.Errorf("idem: record has unexpected status %q", rec.Status)
	}
}

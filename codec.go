package idem

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

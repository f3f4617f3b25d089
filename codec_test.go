package idem

import (
	"github.com/idemkit/idem/internal/protocol"

	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// By default []byte and json.RawMessage are stored as they are, anything else
// as JSON; an empty result is stored as empty, not as NULL.
func TestEncodeValueDefaults(t *testing.T) {
	t.Parallel()

	data, err := protocol.EncodeValue[[]byte](nil, nil)
	require.NoError(t, err)
	require.NotNil(t, data)
	require.Empty(t, data)

	data, err = protocol.EncodeValue[[]byte](nil, []byte{0xff, 0})
	require.NoError(t, err)
	require.Equal(t, []byte{0xff, 0}, data)

	data, err = protocol.EncodeValue(nil, json.RawMessage(`{"a": 1}`))
	require.NoError(t, err)
	require.Equal(t, `{"a": 1}`, string(data)) // not re-encoded

	data, err = protocol.EncodeValue(nil, struct{ A int }{1})
	require.NoError(t, err)
	require.Equal(t, `{"A":1}`, string(data))

	data, err = protocol.EncodeValue(nil, "")
	require.NoError(t, err)
	require.Equal(t, `""`, string(data))
}

// stubCodec records what it is given and can fail.
type stubCodec struct {
	err  error
	seen []any
}

func (c *stubCodec) Marshal(v any) ([]byte, error) {
	c.seen = append(c.seen, v)
	if c.err != nil {
		return nil, c.err
	}
	return []byte("stub"), nil
}

func (c *stubCodec) Unmarshal(data []byte, v any) error {
	c.seen = append(c.seen, v)
	if c.err != nil {
		return c.err
	}
	*v.(*string) = string(data)
	return nil
}

// A codec set with WithCodec gets every value, []byte included, and its
// errors come back wrapped with the type.
func TestCustomCodec(t *testing.T) {
	t.Parallel()

	c := &stubCodec{}
	data, err := protocol.EncodeValue[[]byte](c, []byte("raw"))
	require.NoError(t, err)
	require.Equal(t, "stub", string(data))
	require.Equal(t, []any{[]byte("raw")}, c.seen)

	s, err := protocol.DecodeValue[string](c, []byte("stored"))
	require.NoError(t, err)
	require.Equal(t, "stored", s)

	boom := errors.New("boom")
	c = &stubCodec{err: boom}
	_, err = protocol.EncodeValue(c, 42)
	require.ErrorIs(t, err, boom)
	require.ErrorContains(t, err, "encoding the result (int)")
	_, err = protocol.DecodeValue[string](c, []byte("x"))
	require.ErrorIs(t, err, boom)
	require.ErrorContains(t, err, "decoding the recorded result into string")
}

func TestDecodeValue(t *testing.T) {
	t.Parallel()

	stored := []byte("abc")
	b, err := protocol.DecodeValue[[]byte](nil, stored)
	require.NoError(t, err)
	require.Equal(t, stored, b)
	b[0] = 'X'
	require.Equal(t, "abc", string(stored), "the decoded bytes must not alias the stored ones")

	raw, err := protocol.DecodeValue[json.RawMessage](nil, []byte(`[1]`))
	require.NoError(t, err)
	require.Equal(t, json.RawMessage(`[1]`), raw)

	type receipt struct{ ID int }
	r, err := protocol.DecodeValue[receipt](nil, []byte(`{"ID":7}`))
	require.NoError(t, err)
	require.Equal(t, receipt{7}, r)

	_, err = protocol.DecodeValue[receipt](nil, []byte(`not json`))
	require.ErrorContains(t, err, "decoding the recorded result into idem.receipt")
}

// A result over WithMaxResultSize is refused with ErrResultTooLarge; one at
// the limit is recorded.
func TestEncodeResultLimit(t *testing.T) {
	t.Parallel()

	cfg, err := newConfig([]Option{WithMaxResultSize(4)})
	require.NoError(t, err)
	data, err := protocol.EncodeResult(&cfg, []byte("1234"))
	require.NoError(t, err)
	require.Equal(t, "1234", string(data))

	_, err = protocol.EncodeResult(&cfg, []byte("12345"))
	require.ErrorIs(t, err, ErrResultTooLarge)
	require.ErrorContains(t, err, "5 bytes, over the limit of 4")

	_, err = protocol.EncodeResult(&cfg, "1234") // JSON: 6 bytes with its quotes
	require.ErrorIs(t, err, ErrResultTooLarge)
}

// The message of a permanent failure is cut to the limit, never inside a
// UTF-8 sequence.
func TestFailureMessageIsCut(t *testing.T) {
	t.Parallel()

	cfg, err := newConfig([]Option{WithMaxResultSize(5)})
	require.NoError(t, err)
	require.Equal(t, "short", string(protocol.FailureMessage(&cfg, errors.New("short"))))
	require.Equal(t, "too l", string(protocol.FailureMessage(&cfg, errors.New("too long"))))
	// "a€€" cut at 5 bytes ends inside the second € (3 bytes each).
	require.Equal(t, "a€", string(protocol.FailureMessage(&cfg, errors.New("a€€"))))
	require.Equal(t, "abcd", string(protocol.FailureMessage(&cfg, errors.New("abcd€"))))

	cfg, err = newConfig([]Option(nil))
	require.NoError(t, err)
	long := strings.Repeat("x", DefaultMaxResultSize+1)
	require.Len(t, protocol.FailureMessage(&cfg, errors.New(long)), DefaultMaxResultSize)
}

// benchReceipt is a typical result: an id, a time, an amount and a message.
type benchReceipt struct {
	ID      int64     `json:"id"`
	At      time.Time `json:"at"`
	Amount  int64     `json:"amount"`
	Message string    `json:"message"`
}

// The decode a first execution adds, against the encode it always did:
// go test -run '^$' -bench 'Result' -benchmem .
func BenchmarkEncodeResult(b *testing.B) {
	cfg, _ := newConfig[Option](nil)
	b.Run("int64", func(b *testing.B) {
		for b.Loop() {
			_, _ = protocol.EncodeResult(&cfg, int64(123456))
		}
	})
	b.Run("receipt", func(b *testing.B) {
		v := benchReceipt{ID: 123456, At: time.Now(), Amount: 1999, Message: "you are in"}
		for b.Loop() {
			_, _ = protocol.EncodeResult(&cfg, v)
		}
	})
}

func BenchmarkRecordResult(b *testing.B) {
	cfg, _ := newConfig[Option](nil)
	b.Run("int64", func(b *testing.B) {
		for b.Loop() {
			_, _, _ = protocol.RecordResult(&cfg, int64(123456))
		}
	})
	b.Run("receipt", func(b *testing.B) {
		v := benchReceipt{ID: 123456, At: time.Now(), Amount: 1999, Message: "you are in"}
		for b.Loop() {
			_, _, _ = protocol.RecordResult(&cfg, v)
		}
	})
}

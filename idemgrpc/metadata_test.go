package idemgrpc

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"
)

func TestParseKey(t *testing.T) {
	for _, c := range []struct {
		name   string
		md     metadata.MD
		key    string
		err    error
		detail string
	}{
		{"a uuid", metadata.Pairs(KeyMetadata, "8e03978e-40d5-43e8-bc93-6894a57f9324"), "8e03978e-40d5-43e8-bc93-6894a57f9324", nil, ""},
		{"inner spaces and punctuation", metadata.Pairs(KeyMetadata, `order 42, try "a"`), `order 42, try "a"`, nil, ""},
		{"255 bytes", metadata.Pairs(KeyMetadata, strings.Repeat("k", 255)), strings.Repeat("k", 255), nil, ""},
		{"none", metadata.MD{}, "", ErrNoKey, ""},
		{"nil metadata", nil, "", ErrNoKey, ""},
		{"empty", metadata.Pairs(KeyMetadata, ""), "", ErrBadKey, "The idempotency-key is 0 bytes long: it must be 1 to 255."},
		{"256 bytes", metadata.Pairs(KeyMetadata, strings.Repeat("k", 256)), "", ErrBadKey, "The idempotency-key is 256 bytes long: it must be 1 to 255."},
		{"two values", metadata.Pairs(KeyMetadata, "a", KeyMetadata, "b"), "", ErrBadKey, "The call has 2 idempotency-key values: send exactly one."},
		{"leading space", metadata.Pairs(KeyMetadata, " a"), "", ErrBadKey, "The idempotency-key starts or ends with a space: a key must not."},
		{"non-ASCII", metadata.Pairs(KeyMetadata, "caf\xc3\xa9"), "", ErrBadKey, "The idempotency-key holds a byte outside printable ASCII at position 4: a key is printable ASCII."},
		{"a tab", metadata.Pairs(KeyMetadata, "a\tb"), "", ErrBadKey, "The idempotency-key holds a byte outside printable ASCII at position 2: a key is printable ASCII."},
	} {
		t.Run(c.name, func(t *testing.T) {
			key, err := ParseKey(c.md)
			if c.err == nil {
				require.NoError(t, err)
				require.Equal(t, c.key, key)
				return
			}
			require.ErrorIs(t, err, c.err)
			if c.detail != "" {
				var ke *KeyError
				require.True(t, errors.As(err, &ke))
				require.Equal(t, c.detail, ke.Detail)
			}
		})
	}
}

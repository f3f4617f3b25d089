package idemhttp

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// HeaderName is the request header that carries the idempotency key, as
// defined by the IETF draft "The Idempotency-Key HTTP Header Field".
const HeaderName = "Idempotency-Key"

// ReplayedHeader marks a response replayed from the record of an earlier
// request with the same key.
const ReplayedHeader = "Idempotent-Replayed"

// Errors from ParseKey.
var (
	// ErrNoKey: the request has no Idempotency-Key header.
	ErrNoKey = errors.New("idemhttp: no Idempotency-Key header")
	// ErrRepeatedKey: the request has more than one Idempotency-Key header
	// (or one with several list members), which the draft forbids.
	ErrRepeatedKey = errors.New("idemhttp: repeated Idempotency-Key header")
	// ErrBadKey: the header value is neither a Structured Field string nor
	// a plain token of printable ASCII.
	ErrBadKey = errors.New("idemhttp: malformed Idempotency-Key header")
)

// ParseKey returns the idempotency key of h. The value is a Structured Field
// string (RFC 8941: a quoted string of printable ASCII where only \" and \\
// are escapes), as the draft specifies, or, as many clients send it, the bare
// key: printable ASCII without quotes, commas or surrounding whitespace. The
// key is 1..255 bytes.
func ParseKey(h http.Header) (string, error) {
	values := h.Values(HeaderName)
	switch len(values) {
	case 0:
		return "", ErrNoKey
	case 1:
	default:
		return "", ErrRepeatedKey
	}
	return parseValue(values[0])
}

func parseValue(v string) (string, error) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return "", fmt.Errorf("%w: empty", ErrBadKey)
	}
	var key string
	if v[0] == '"' {
		var b strings.Builder
		i := 1
		for ; i < len(v); i++ {
			c := v[i]
			switch {
			case c == '\\':
				i++
				if i == len(v) || (v[i] != '"' && v[i] != '\\') {
					return "", fmt.Errorf("%w: bad escape", ErrBadKey)
				}
				b.WriteByte(v[i])
			case c == '"':
				if rest := strings.TrimLeft(v[i+1:], " \t"); rest != "" {
					if rest[0] == ',' {
						return "", ErrRepeatedKey
					}
					return "", fmt.Errorf("%w: text after the closing quote", ErrBadKey)
				}
				key = b.String()
				goto done
			case c < 0x20 || c > 0x7e:
				return "", fmt.Errorf("%w: non-printable byte 0x%02x", ErrBadKey, c)
			default:
				b.WriteByte(c)
			}
		}
		return "", fmt.Errorf("%w: no closing quote", ErrBadKey)
	} else {
		for i := 0; i < len(v); i++ {
			c := v[i]
			switch {
			case c == ',':
				return "", ErrRepeatedKey
			case c == '"' || c == '\\':
				return "", fmt.Errorf("%w: quote or backslash in an unquoted key", ErrBadKey)
			case c < 0x21 || c > 0x7e:
				return "", fmt.Errorf("%w: byte 0x%02x in an unquoted key", ErrBadKey, c)
			}
		}
		key = v
	}
done:
	if key == "" || len(key) > 255 {
		return "", fmt.Errorf("%w: the key must be 1 to 255 bytes", ErrBadKey)
	}
	return key, nil
}

// FormatKey renders key as a Structured Field string for the header.
func FormatKey(key string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(key); i++ {
		if key[i] == '"' || key[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(key[i])
	}
	b.WriteByte('"')
	return b.String()
}

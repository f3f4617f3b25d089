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

// Errors from ParseKey. The errors ParseKey returns for a header it refuses
// are *KeyError values, which match ErrRepeatedKey or ErrBadKey.
var (
	// ErrNoKey: the request has no Idempotency-Key header.
	ErrNoKey = errors.New("idemhttp: no Idempotency-Key header")
	// ErrRepeatedKey: the request has more than one Idempotency-Key header,
	// or one whose value is a list (members separated by commas), which the
	// draft forbids.
	ErrRepeatedKey = errors.New("idemhttp: repeated Idempotency-Key header")
	// ErrBadKey: the header value is neither a Structured Field string nor
	// a plain token of printable ASCII, or the key is not 1 to 255 bytes.
	ErrBadKey = errors.New("idemhttp: malformed Idempotency-Key header")
)

// KeyError is why ParseKey refused a request's Idempotency-Key header.
type KeyError struct {
	// Err is ErrRepeatedKey or ErrBadKey.
	Err error
	// Detail says what is wrong, in a sentence for the developer of the
	// client that sent it; the middleware answers it as the problem
	// details' "detail". It never quotes the key, which may be a secret.
	Detail string
}

// Error is Err's text followed by Detail.
func (e *KeyError) Error() string { return e.Err.Error() + ": " + e.Detail }

// Unwrap returns Err.
func (e *KeyError) Unwrap() error { return e.Err }

func badKey(format string, args ...any) error {
	return &KeyError{Err: ErrBadKey, Detail: fmt.Sprintf(format, args...)}
}

// errList is the error of a header value that is a list.
var errList = &KeyError{Err: ErrRepeatedKey, Detail: "The Idempotency-Key header holds a list (members separated by a comma): " +
	"its value must be one key. A key that contains a comma must be sent as a quoted string, such as \"a,b\"."}

// ParseKey returns the idempotency key of h. The value is a Structured Field
// string (RFC 8941: a quoted string of printable ASCII where only \" and \\
// are escapes), as the draft specifies, or, as many clients send it, the bare
// key: printable ASCII without quotes, commas or surrounding whitespace. The
// key is 1..255 bytes. A header ParseKey refuses gives a *KeyError.
func ParseKey(h http.Header) (string, error) {
	values := h.Values(HeaderName)
	switch len(values) {
	case 0:
		return "", ErrNoKey
	case 1:
	default:
		return "", &KeyError{Err: ErrRepeatedKey,
			Detail: fmt.Sprintf("The request has %d Idempotency-Key headers: send exactly one.", len(values))}
	}
	return parseValue(values[0])
}

// describe names byte c for a detail.
func describe(c byte) string {
	switch {
	case c == ' ':
		return "a space"
	case c == '\t':
		return "a tab"
	case c >= 0x80:
		return "a byte outside ASCII"
	default:
		return "a control character"
	}
}

func parseValue(v string) (string, error) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return "", badKey("The Idempotency-Key header is empty: send a key of 1 to 255 printable ASCII characters.")
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
					return "", badKey(`In a quoted key a backslash may only escape a quote (\") or a backslash (\\); the backslash at position %d of the header's value escapes another character.`, i)
				}
				b.WriteByte(v[i])
			case c == '"':
				if rest := strings.TrimLeft(v[i+1:], " \t"); rest != "" {
					if rest[0] == ',' {
						return "", errList
					}
					return "", badKey("The Idempotency-Key header has text after the quoted key's closing quote.")
				}
				key = b.String()
				goto done
			case c < 0x20 || c > 0x7e:
				return "", badKey("The key contains %s at position %d of the header's value: a key is printable ASCII.", describe(c), i+1)
			default:
				b.WriteByte(c)
			}
		}
		return "", badKey("The quoted key has no closing quote.")
	} else {
		for i := 0; i < len(v); i++ {
			c := v[i]
			switch {
			case c == ',':
				return "", errList
			case c == '"' || c == '\\':
				return "", badKey(`The key has a quote or a backslash at position %d of the header's value: send such a key as a quoted string, with \" and \\ for them.`, i+1)
			case c == ' ' || c == '\t':
				return "", badKey("The key contains %s at position %d of the header's value: send a key with spaces as a quoted string, such as \"a b\".", describe(c), i+1)
			case c < 0x21 || c > 0x7e:
				return "", badKey("The key contains %s at position %d of the header's value: a key is printable ASCII.", describe(c), i+1)
			}
		}
		key = v
	}
done:
	if key == "" || len(key) > 255 {
		return "", badKey("The key is %d bytes long: it must be 1 to 255.", len(key))
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

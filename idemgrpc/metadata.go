package idemgrpc

import (
	"errors"
	"fmt"

	"google.golang.org/grpc/metadata"
)

// KeyMetadata is the metadata name that carries the idempotency key of a
// call: the gRPC counterpart of the HTTP header Idempotency-Key.
const KeyMetadata = "idempotency-key"

// ReplayedMetadata is the header metadata a replayed response carries, with
// the value "true". The first response to a key does not carry it.
const ReplayedMetadata = "idempotent-replayed"

// MaxKeyLen is the longest key, in bytes.
const MaxKeyLen = 255

// ErrNoKey is the error of ParseKey for metadata without an
// idempotency-key.
var ErrNoKey = errors.New("idemgrpc: the call has no idempotency-key metadata")

// ErrBadKey is matched by the error of ParseKey (a *KeyError) for an
// idempotency-key that cannot be used.
var ErrBadKey = errors.New("idemgrpc: the idempotency-key metadata is not usable")

// KeyError is the error of ParseKey for an unusable key. Its Detail says
// what is wrong in a sentence for the client's developer, without quoting
// the key, which may be a secret. It matches ErrBadKey.
type KeyError struct {
	// Detail is the sentence the interceptor sends as the status message.
	Detail string
}

func (e *KeyError) Error() string { return "idemgrpc: " + e.Detail }

// Is reports whether target is ErrBadKey.
func (e *KeyError) Is(target error) bool { return target == ErrBadKey }

// ParseKey returns the key of incoming (or outgoing) metadata md: exactly
// one idempotency-key value of 1 to MaxKeyLen bytes of printable ASCII
// (space to '~'), neither starting nor ending with a space, compared byte
// for byte. It returns ErrNoKey when md has none, and a *KeyError when the
// key is repeated or malformed.
func ParseKey(md metadata.MD) (string, error) {
	vs := md.Get(KeyMetadata)
	switch {
	case len(vs) == 0:
		return "", ErrNoKey
	case len(vs) > 1:
		return "", &KeyError{Detail: fmt.Sprintf("The call has %d idempotency-key values: send exactly one.", len(vs))}
	}
	return vs[0], validKey(vs[0])
}

// validKey applies ParseKey's rules to one key.
func validKey(k string) error {
	switch {
	case k == "" || len(k) > MaxKeyLen:
		return &KeyError{Detail: fmt.Sprintf("The idempotency-key is %d bytes long: it must be 1 to %d.", len(k), MaxKeyLen)}
	case k[0] == ' ' || k[len(k)-1] == ' ':
		return &KeyError{Detail: "The idempotency-key starts or ends with a space: a key must not."}
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < 0x20 || c > 0x7e {
			return &KeyError{Detail: fmt.Sprintf("The idempotency-key holds a byte outside printable ASCII at position %d: a key is printable ASCII.", i+1)}
		}
	}
	return nil
}

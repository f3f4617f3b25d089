package idem

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"unicode"
	"unicode/utf8"
)

// MaxKeyLen is the longest Key.Scope or Key.ID accepted, in bytes.
const MaxKeyLen = 255

// Key names one logical operation.
type Key struct {
	// Scope is the owner of the key: a user, a tenant, an endpoint. Keys never
	// match across scopes, so one caller's key can never replay another
	// caller's result. It must be 1..255 bytes of printable UTF-8.
	Scope string
	// ID is the caller's idempotency key, 1..255 bytes of printable UTF-8
	// (letters, marks, numbers, punctuation, symbols and spaces; no control or
	// format characters).
	ID string
	// Fingerprint is an optional digest of the request (SHA-256 of the body,
	// say). When the key was first used with another fingerprint the call
	// fails with ErrKeyReused. nil and empty are the same fingerprint.
	Fingerprint []byte
}

// LogValue makes log/slog print k without its Scope and ID in clear: each
// is replaced by "sha256:" and the first 12 hex digits of its SHA-256, which
// lets log lines about one key be matched without storing the key. The
// digest is not a secret: a key of few possible values can be recovered from
// it by trying them. fmt's verbs still print the fields as they are.
func (k Key) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("scope", KeyDigest(k.Scope)),
		slog.String("id", KeyDigest(k.ID)),
	)
}

// KeyDigest is how logs and traces show a scope or a key ID without it:
// "sha256:" and the first 12 hex digits of its SHA-256. Key.LogValue,
// SlogHooks and the idemotel module all use it, so one key's log lines and
// spans can be matched. The digest is not a secret: a key of few possible
// values can be recovered from it by trying them.
func KeyDigest(s string) string {
	h := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(h[:6])
}

// Validate reports whether k is well formed. It returns an *InvalidKeyError
// (matching ErrInvalidKey) or nil. WithIdempotency and Do call it before any
// SQL.
func (k Key) Validate() error {
	if err := validatePart("Scope", k.Scope); err != nil {
		return err
	}
	return validatePart("ID", k.ID)
}

func validatePart(field, s string) error {
	switch {
	case s == "":
		return &InvalidKeyError{Field: field, Reason: "is empty"}
	case len(s) > MaxKeyLen:
		return &InvalidKeyError{Field: field, Reason: fmt.Sprintf("is %d bytes long; the limit is %d", len(s), MaxKeyLen)}
	}
	if !utf8.ValidString(s) {
		return &InvalidKeyError{Field: field, Reason: "is not valid UTF-8"}
	}
	for i, r := range s {
		switch {
		case r == 0:
			return &InvalidKeyError{Field: field, Reason: fmt.Sprintf("contains NUL (byte %d)", i)}
		case unicode.IsControl(r):
			return &InvalidKeyError{Field: field, Reason: fmt.Sprintf("contains control character %U (byte %d)", r, i)}
		case !unicode.IsGraphic(r):
			return &InvalidKeyError{Field: field, Reason: fmt.Sprintf("contains non-printable character %U (byte %d)", r, i)}
		}
	}
	return nil
}

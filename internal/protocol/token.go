package protocol

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"strings"
)

// A token is tokenRandomBytes random bytes, a dot, and a tag, all base64url
// without padding: 43 + 1 + 12 = 56 bytes. The tag is 9 bytes: 6 that name
// the scope (scopeTag) and 3 that check the random bytes and the scope's 6
// together (checkTag). The check tells a mistyped or made-up token (unknown)
// from one made for another scope, and the scope's bytes tell a token used
// in the wrong scope from one of this scope's, both without a query. Neither
// is a secret: what makes a token valid is its issued record.
const (
	tokenRandomBytes = 32 // the unguessable part: 256 bits
	scopeTagBytes    = 6
	checkTagBytes    = 3
)

var (
	tokenRandomLen = base64.RawURLEncoding.EncodedLen(tokenRandomBytes)
	tokenTagLen    = base64.RawURLEncoding.EncodedLen(scopeTagBytes + checkTagBytes)
	// Tokens issued before the check existed carry the scope's 6 bytes
	// alone (52 bytes in all). They are still accepted for their scope;
	// any other use of one is unknown.
	legacyTagLen = base64.RawURLEncoding.EncodedLen(scopeTagBytes)
)

// NewToken makes a token for scope: 256 random bits from crypto/rand and
// the tag, base64url encoded.
func NewToken(scope string) (string, error) {
	random := make([]byte, tokenRandomBytes)
	if _, err := rand.Read(random); err != nil {
		return "", fmt.Errorf("idem: reading random bytes: %w", err)
	}
	tag := scopeTag(scope)
	tag = append(tag, checkTag(random, tag)...)
	return base64.RawURLEncoding.EncodeToString(random) + "." + base64.RawURLEncoding.EncodeToString(tag), nil
}

// scopeTag binds a token to its scope, so that a token used in another scope
// is told apart from one of this scope's without a query.
func scopeTag(scope string) []byte {
	h := sha256.Sum256([]byte("idem token scope\x00" + scope))
	return h[:scopeTagBytes]
}

// checkTag checks a token's random bytes and scope tag together, so that a
// token with a typo anywhere, or made up, is told apart from one issued for
// another scope.
func checkTag(random, scopeTag []byte) []byte {
	h := sha256.New()
	h.Write([]byte("idem token check\x00"))
	h.Write(random)
	h.Write(scopeTag)
	return h.Sum(nil)[:checkTagBytes]
}

// CheckTokenShape rejects, before any SQL, a Key.ID that is not a token for
// Key.Scope: ErrTokenOtherScope when the token is well formed and its tag
// names another scope, ErrTokenUnknown for anything else (a typo, a made-up
// token, not a token at all).
func CheckTokenShape(key Key) error {
	unknown := &TokenError{Problem: ErrTokenUnknown}
	random, tag, ok := strings.Cut(key.ID, ".")
	if !ok || len(random) != tokenRandomLen {
		return unknown
	}
	want := scopeTag(key.Scope)
	if len(tag) == legacyTagLen {
		if subtle.ConstantTimeCompare([]byte(tag), []byte(base64.RawURLEncoding.EncodeToString(want))) != 1 {
			return unknown
		}
		return nil
	}
	enc := base64.RawURLEncoding.Strict()
	r, err1 := enc.DecodeString(random)
	t, err2 := enc.DecodeString(tag)
	// The decoder skips CR and LF, so the decoded lengths are checked too.
	if err1 != nil || err2 != nil || len(tag) != tokenTagLen ||
		len(r) != tokenRandomBytes || len(t) != scopeTagBytes+checkTagBytes {
		return unknown
	}
	got, check := t[:scopeTagBytes], t[scopeTagBytes:]
	if subtle.ConstantTimeCompare(check, checkTag(r, got)) != 1 {
		return unknown
	}
	if subtle.ConstantTimeCompare(got, want) != 1 {
		return &TokenError{Problem: ErrTokenOtherScope}
	}
	return nil
}

// NewCall checks the arguments of a call that claims a key, before any SQL:
// keyErr is the key's validation (idem.Key.Validate), complete reports that
// the rest of its arguments are there (else ErrInvalidOption saying what op
// needs), then its options and, with RequireIssued, the token's shape. It
// returns the call's Config in dialect d.
func NewCall[O any](d *Dialect, op string, key Key, keyErr error, complete bool, needs string, opts []O) (Config, error) {
	if keyErr != nil {
		return Config{}, keyErr
	}
	if !complete {
		return Config{}, fmt.Errorf("%w: %s needs %s", ErrInvalidOption, op, needs)
	}
	c, err := NewConfig(d, opts)
	if err != nil {
		return c, err
	}
	if c.RequireIssued {
		if err := CheckTokenShape(key); err != nil {
			return c, err
		}
	}
	if c.HoldTimeout > 0 && d.HoldSession != "" && op != "Do" {
		return c, fmt.Errorf("%w: WithHoldTimeout bounds Do alone on %s: its bounds are the session's, which would outlive %s's savepoints and stay on the caller's connection", ErrInvalidOption, d.Name, op)
	}
	c.Op = op
	return c, nil
}

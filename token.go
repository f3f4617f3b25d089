package idem

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Token errors. The error returned is a *TokenError matching ErrTokenRejected
// and one of the others.
var (
	// ErrTokenRejected matches every refused token.
	ErrTokenRejected = errors.New("idem: token rejected")
	// ErrTokenUnknown: the token was never issued (forged, mistyped, or
	// purged long after it expired).
	ErrTokenUnknown = errors.New("idem: token unknown")
	// ErrTokenExpired: the token was issued but its TTL passed before use.
	ErrTokenExpired = errors.New("idem: token expired")
	// ErrTokenOtherScope: the token was issued for another scope (another
	// user, say).
	ErrTokenOtherScope = errors.New("idem: token issued for another scope")
)

// TokenError reports why RequireIssued refused a token.
type TokenError struct {
	Problem error // ErrTokenUnknown, ErrTokenExpired or ErrTokenOtherScope
}

// Error describes the problem.
func (e *TokenError) Error() string { return e.Problem.Error() }

// Is matches ErrTokenRejected and the problem.
func (e *TokenError) Is(target error) bool {
	return target == ErrTokenRejected || target == e.Problem
}

// tokenRandomBytes is the token's unguessable part: 256 bits.
const tokenRandomBytes = 32

// IssueToken hands out a token for scope (a page about to submit a form, say)
// and records it with status issued for ttl. The token is 256 random bits
// from crypto/rand, followed by a tag of the scope, base64url encoded (52
// bytes); use it as Key.ID with the same Scope. With RequireIssued,
// WithIdempotency, Do and Claim accept only such tokens. ttl must be
// positive; the expiry is computed with the database clock.
func IssueToken(ctx context.Context, db DBTX, scope string, ttl time.Duration, opts ...Option) (string, error) {
	if err := validatePart("Scope", scope); err != nil {
		return "", err
	}
	if db == nil || ttl <= 0 {
		return "", fmt.Errorf("%w: IssueToken needs a database and a positive TTL", ErrInvalidOption)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return "", err
	}
	b := make([]byte, tokenRandomBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("idem: reading random bytes: %w", err)
	}
	token := base64.RawURLEncoding.EncodeToString(b) + "." + scopeTag(scope)
	if _, err := db.Exec(ctx, cfg.q.issue, scope, token, ttl.Microseconds()); err != nil {
		return "", err
	}
	return token, nil
}

// scopeTag binds a token to its scope, so that a token used in another scope
// is told apart from a forged one without a query.
func scopeTag(scope string) string {
	h := sha256.Sum256([]byte("idem token scope\x00" + scope))
	return base64.RawURLEncoding.EncodeToString(h[:6])
}

// checkTokenShape rejects, before any SQL, a Key.ID that is not a token
// issued for Key.Scope.
func checkTokenShape(key Key) error {
	random, tag, ok := strings.Cut(key.ID, ".")
	if !ok || len(random) != base64.RawURLEncoding.EncodedLen(tokenRandomBytes) {
		return &TokenError{Problem: ErrTokenUnknown}
	}
	if subtle.ConstantTimeCompare([]byte(tag), []byte(scopeTag(key.Scope))) != 1 {
		return &TokenError{Problem: ErrTokenOtherScope}
	}
	return nil
}

// RequireIssued makes WithIdempotency, Do and Claim accept only keys that
// IssueToken handed out for the key's scope: the token is claimed with an
// UPDATE of the issued record (never an INSERT), a repeat after completion
// is replayed, and an unknown, expired or other-scope token fails with a
// *TokenError before fn runs.
//
// The scope tag inside a token only tells a token used in the wrong scope
// from a forged one; what makes a token valid is its issued record. Calls
// without RequireIssued can create records under any key, so a scope whose
// keys must all be issued should always be used with RequireIssued.
func RequireIssued() Option {
	return func(c *config) { c.requireIssued = true }
}

// tokenError turns what a token claim found into an error, or nil when the
// record may be handled as usual (replayed, in progress, taken over).
func tokenError(found bool, rec *record) error {
	switch {
	case !found:
		return &TokenError{Problem: ErrTokenUnknown}
	case rec.expired:
		return &TokenError{Problem: ErrTokenExpired}
	}
	return nil
}

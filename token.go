package idem

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/protocol"
)

// Token errors. The error returned is a *TokenError matching ErrTokenRejected
// and one of the others.
var (
	// ErrTokenRejected matches every refused token.
	ErrTokenRejected = protocol.ErrTokenRejected
	// ErrTokenUnknown: the token was never issued (forged, mistyped, or
	// purged long after it expired).
	ErrTokenUnknown = protocol.ErrTokenUnknown
	// ErrTokenExpired: the token was issued but its TTL passed before use.
	ErrTokenExpired = protocol.ErrTokenExpired
	// ErrTokenOtherScope: the token was issued for another scope (another
	// user, say). It is told from its tag, without a query; the tag is no
	// secret, so a client that recomputes it for a token it made up gets
	// this answer too, and never anything of another scope.
	ErrTokenOtherScope = protocol.ErrTokenOtherScope
)

// TokenError reports why RequireIssued refused a token. Its Problem is
// ErrTokenUnknown, ErrTokenExpired or ErrTokenOtherScope; it matches
// ErrTokenRejected and its Problem with errors.Is.
type TokenError = protocol.TokenError

// IssueToken hands out a token for scope (a page about to submit a form, say)
// and records it with status issued for ttl. The token is 256 random bits
// from crypto/rand followed by a tag of the scope and a check, base64url
// encoded (56 bytes); use it as Key.ID with the same Scope. With
// RequireIssued, WithIdempotency, Do and Claim accept only such tokens. ttl
// must be positive; the expiry is computed with the database clock.
func IssueToken(ctx context.Context, db DBTX, scope string, ttl time.Duration, opts ...TableOption) (_ string, err error) {
	if err := validatePart("Scope", scope); err != nil {
		return "", err
	}
	if handle.Missing(db) || ttl <= 0 {
		return "", fmt.Errorf("%w: IssueToken needs a database and a positive TTL", ErrInvalidOption)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return "", err
	}
	defer cfg.ExplainMissingTable(&err)
	return protocol.IssueToken(ctx, pgxErrors{}, pgxQuerier{db: db}, scope, ttl, &cfg)
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
func RequireIssued() KeyOption {
	return keyOpt(func(c *config) { c.RequireIssued = true })
}

package idem

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"strings"
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
	random := make([]byte, tokenRandomBytes)
	if _, err := rand.Read(random); err != nil {
		return "", fmt.Errorf("idem: reading random bytes: %w", err)
	}
	tag := scopeTag(scope)
	tag = append(tag, checkTag(random, tag)...)
	token := base64.RawURLEncoding.EncodeToString(random) + "." + base64.RawURLEncoding.EncodeToString(tag)
	if _, err := db.Exec(ctx, cfg.Q.Issue, scope, token, ttl.Microseconds()); err != nil {
		return "", closedHandle("IssueToken", err)
	}
	return token, nil
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

// checkTokenShape rejects, before any SQL, a Key.ID that is not a token for
// Key.Scope: ErrTokenOtherScope when the token is well formed and its tag
// names another scope, ErrTokenUnknown for anything else (a typo, a made-up
// token, not a token at all).
func checkTokenShape(key Key) error {
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

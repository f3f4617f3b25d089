package idemmysql

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/protocol"
)

// IssueToken hands out a token for scope (a page about to submit a form, say)
// and records it with status issued for ttl, as idem.IssueToken does: 256
// random bits followed by a tag of the scope and a check, base64url encoded
// (56 bytes); use it as Key.ID with the same Scope. With idem.RequireIssued,
// Do and WithIdempotency accept only such tokens, each once.
//
// db is a *sql.DB, a *sql.Conn, or a *sql.Tx to issue the token in the
// caller's transaction. ttl must be positive; the expiry is computed with
// the database clock. A malformed scope is an idem.ErrInvalidKey, and a nil
// db, a ttl that is not positive or a rejected option an
// idem.ErrInvalidOption, all before any SQL.
func IssueToken(ctx context.Context, db DBTX, scope string, ttl time.Duration, opts ...idem.TableOption) (_ string, err error) {
	// The key's validation of its Scope; the ID stands in for the token.
	if err := (idem.Key{Scope: scope, ID: "token"}).Validate(); err != nil {
		return "", err
	}
	if ttl <= 0 {
		return "", fmt.Errorf("%w: IssueToken needs a positive TTL", idem.ErrInvalidOption)
	}
	q, d, err := opsQuerier(ctx, "IssueToken", db)
	if err != nil {
		return "", err
	}
	cfg, err := protocol.NewConfig(d, opts)
	if err != nil {
		return "", err
	}
	defer cfg.ExplainMissingTable(&err)
	return protocol.IssueToken(ctx, mysqlErrors{}, q, scope, ttl, &cfg)
}

package idem

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/pgerr"
)

// WithHoldTimeout bounds how long a call of Do or WithIdempotency may hold its
// key while fn runs, so that a holder that hangs with its connection open (fn
// stuck on a call to another service, an application deadlock) cannot block
// the key, and every duplicate waiting for it, for as long as its transaction
// lives. PostgreSQL enforces the bound: once the key is claimed, the
// transaction runs with idle_in_transaction_session_timeout and
// statement_timeout lowered to d (a value already lower is kept).
//
// A holder that sits idle in its transaction for longer than d (fn waiting
// on something outside the database) has its session ended by the server,
// which rolls the transaction back and releases the key: a waiting duplicate
// takes it over and runs fn once, and the holder's call fails with an error
// matching ErrHoldTimeout when it wakes. Its connection is gone; a pool
// replaces it. Through database/sql with lib/pq, which drops the server's
// FATAL error and its SQLSTATE, the holder gets driver.ErrBadConn instead,
// or the network error of the statement fn ran on the closed connection.
//
// A statement of fn's that runs for longer than d (waiting on a lock, say) is
// cancelled with SQLSTATE 57014, which fn sees as its statement's error and
// returns like any other: Do then rolls its transaction back, releasing the
// key; in WithIdempotency fn's writes and the claim are undone, and the key
// is free once the caller's transaction ends.
//
// The settings are local to the transaction (set_config(..., true)), so
// nothing outlives it, through PgBouncer in transaction mode too. In
// WithIdempotency they cover fn and the completion and are put back as they
// were before the call returns, at the cost of one round trip; the bound does
// not cover what the caller's transaction does after WithIdempotency returns.
// In Do they ride in the claim's round trip and last until COMMIT.
//
// By default there is no bound of idem's own: a holder is bounded by the
// server's settings, if any. d must be positive and at most about 24 days
// (PostgreSQL's limit); it is rounded up to whole milliseconds. Lease mode
// (Claim) is bounded by its lease instead.
func WithHoldTimeout(d time.Duration) Option {
	return txOpt(func(c *config) {
		if d <= 0 || d > MaxHoldTimeout {
			c.Fail("WithHoldTimeout(%v): the bound must be positive and at most %v", d, MaxHoldTimeout)
			return
		}
		c.HoldTimeout = d
	})
}

// MaxHoldTimeout is the largest bound WithHoldTimeout takes: the largest
// value of PostgreSQL's two settings, 2^31-1 milliseconds (about 24.8 days).
const MaxHoldTimeout = math.MaxInt32 * time.Millisecond

// holdMillis is d in whole milliseconds, rounded up.
func holdMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// holdBound is an expression that lowers both settings to ms milliseconds
// (a parameter) for the rest of the transaction, keeping a value that is
// already lower (0 means none). It counts the settings it went through, 2.
func holdBound(ms string) string {
	return `(SELECT count(set_config(g.name,
	CASE WHEN g.cur = interval '0' OR g.cur > ` + ms + `::bigint * interval '1 ms' THEN ` + ms + `::text ELSE g.setting END, true))
FROM (SELECT v.name, current_setting(v.name) AS setting, current_setting(v.name)::interval AS cur
	FROM (VALUES ('idle_in_transaction_session_timeout'), ('statement_timeout')) AS v(name)) AS g)`
}

// holdSet is holdBound as a statement of its own, of $1 milliseconds.
var holdSet = `SELECT ` + holdBound("$1")

// holdRead reads the values holdSet replaces, so that WithIdempotency can put
// them back (holdRestore).
const (
	holdRead    = `SELECT current_setting('idle_in_transaction_session_timeout'), current_setting('statement_timeout')`
	holdRestore = `SELECT set_config('idle_in_transaction_session_timeout', $1, true), set_config('statement_timeout', $2, true)`
)

// heldSettings are a transaction's values of the two settings before
// WithHoldTimeout changed them.
type heldSettings struct{ idle, statement string }

// bound applies the hold timeout inside the caller's transaction, after the
// claim, and returns the values to restore at completion.
func bound(ctx context.Context, tx pgx.Tx, d time.Duration) (*heldSettings, error) {
	var prev heldSettings
	b := &pgx.Batch{}
	b.Queue(holdRead).QueryRow(func(r pgx.Row) error { return r.Scan(&prev.idle, &prev.statement) })
	b.Queue(holdSet, holdMillis(d))
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("idem: applying the hold timeout: %w", err)
	}
	return &prev, nil
}

// holdError makes an error that the hold timeout's idle bound caused match
// ErrHoldTimeout: the server ended the session of a transaction that sat
// idle too long (SQLSTATE 25P03), so nothing of it committed. A statement
// the bound cancelled (57014) is left as it is: the same SQLSTATE comes from
// other cancellations, and it does not end the transaction. A Permanent
// error was recorded, so it is not one.
func holdError(cfg *config, err error) error {
	if err == nil || cfg.HoldTimeout == 0 || IsPermanent(err) || pgerr.Code(err) != pgerr.IdleInTxTimeout {
		return err
	}
	return fmt.Errorf("%w: %w", ErrHoldTimeout, err)
}

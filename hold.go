package idem

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

// WithHoldTimeout bounds how long a call of Do or WithIdempotency may hold its
// key while fn runs, so that a holder that hangs with its connection open (fn
// stuck on a call to another service, an application deadlock) cannot block
// the key, and every duplicate waiting for it, for as long as its transaction
// lives. PostgreSQL enforces the bound: once the key is claimed, the
// transaction runs with idle_in_transaction_session_timeout and
// statement_timeout lowered to d (a value already lower is kept). A session
// that then sits idle in the transaction, or runs one statement, for longer
// than d has its transaction ended by the server, which releases the key: a
// waiting duplicate takes it over and runs fn once, and the holder's call
// fails with an error matching ErrHoldTimeout when it wakes. An idle holder
// loses its connection (the server closes the session); a pool replaces it.
// Through database/sql with lib/pq, which reports the server's FATAL error as
// driver.ErrBadConn without its SQLSTATE, the holder gets that error instead.
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
// (Claim) is bounded by its lease instead and ignores it.
func WithHoldTimeout(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 || d > maxHoldTimeout {
			c.fail("WithHoldTimeout(%v): the bound must be positive and at most %v", d, maxHoldTimeout)
			return
		}
		c.holdTimeout = d
	}
}

// maxHoldTimeout is the largest value the two settings take (INT_MAX ms).
const maxHoldTimeout = math.MaxInt32 * time.Millisecond

// holdMillis is d in whole milliseconds, rounded up.
func holdMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// holdSet lowers both settings to $1 milliseconds for the rest of the
// transaction, keeping a value that is already lower (0 means none).
const holdSet = `SELECT set_config(g.name,
	CASE WHEN g.cur = interval '0' OR g.cur > $1::bigint * interval '1 ms' THEN $1::text ELSE g.setting END, true)
FROM (SELECT v.name, current_setting(v.name) AS setting, current_setting(v.name)::interval AS cur
	FROM (VALUES ('idle_in_transaction_session_timeout'), ('statement_timeout')) AS v(name)) AS g`

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

// holdError makes an error that the hold timeout caused match ErrHoldTimeout:
// the server's end of an idle transaction (25P03, which also closes the
// session), or a statement cancelled while ctx was not done, which only the
// statement_timeout does on idem's behalf.
func holdError(ctx context.Context, cfg *config, err error) error {
	if err == nil || cfg.holdTimeout == 0 {
		return err
	}
	switch code := pgCode(err); {
	case code == sqlstateIdleInTxTimeout, code == sqlstateQueryCanceled && ctx.Err() == nil:
		return fmt.Errorf("%w: %w", ErrHoldTimeout, err)
	}
	return err
}

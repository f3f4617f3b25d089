package idem

import (
	"math"
	"time"
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

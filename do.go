package idem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/pgerr"
)

// Do runs fn at most once per key in a transaction of its own: it begins a
// transaction on db, claims the key, runs fn, records the result and commits,
// as WithIdempotency describes. On a *pgxpool.Pool or *pgx.Conn it sends
// BEGIN with the claim and the completion with COMMIT, so a first execution
// costs the round trips of a bare transaction that runs fn's statements, and
// a replay two. When db is a pgx.Tx, Do works in a savepoint of it and
// leaves serialization failures to the enclosing transaction's owner.
//
// Serialization failures (40001) and deadlocks (40P01) are retried with
// jittered exponential backoff (WithRetry); the retry then usually replays
// the result the other transaction committed. WithTxOptions sets the
// isolation level. A Permanent error from fn rolls back fn's writes and
// commits the failure record in a new transaction (if another execution
// committed first, its result is returned instead).
//
// By default Do sets no bound of its own on how long fn may hold the key: a
// holder that hangs with its connection open blocks the key, and every
// duplicate waiting for it, until the server's own settings (if any) end its
// transaction. WithHoldTimeout sets one that PostgreSQL enforces.
//
// Errors are WithIdempotency's, and:
//   - ErrOutcomeUnknown: the connection failed while COMMIT was in flight,
//     so the transaction may or may not have committed. Calling Do again
//     with the same key settles it: the committed result is replayed, or,
//     if nothing committed, fn runs once.
//   - A 40001 or 40P01 that outlasted the retries, as it is.
//   - An error from COMMIT (a deferred constraint, say), wrapped: nothing
//     committed.
//   - A pool the application has closed: an error that says so
//     ("idem: Do: the pool was closed: closed pool").
func Do[T any](ctx context.Context, db TxBeginner, key Key,
	fn func(ctx context.Context, tx pgx.Tx) (T, error), opts ...DoOption) (_ Result[T], err error) {
	var zero Result[T]
	cfg, err := newCall("Do", key, !handle.Missing(db) && fn != nil, "a database and a function", opts)
	if err != nil {
		return zero, err
	}
	defer cfg.explainMissingTable(&err)
	start := time.Now()
	var failure error // a Permanent error from an earlier attempt, to record
	_, isTx := db.(pgx.Tx)
	for attempt := 1; ; attempt++ {
		res, err := doOnce(ctx, db, key, fn, &cfg, &failure, start)
		err = holdError(&cfg, err)
		if err == nil || !IsRetryable(err) || attempt >= cfg.retry.MaxAttempts || isTx {
			// Inside an enclosing transaction (db is a pgx.Tx) a retry
			// would meet the same snapshot: that transaction must retry.
			return res, withContextErr(ctx, err)
		}
		if err := backoff.Sleep(ctx, cfg.retry.backoff(attempt)); err != nil {
			return zero, err
		}
	}
}

// doOnce makes one attempt and reports its event once the attempt has
// committed (or failed).
func doOnce[T any](ctx context.Context, db TxBeginner, key Key,
	fn func(ctx context.Context, tx pgx.Tx) (T, error), cfg *config, failure *error, start time.Time) (Result[T], error) {
	switch d := db.(type) {
	case *pgxpool.Pool:
		pc, err := d.Acquire(ctx)
		if err != nil {
			return Result[T]{}, closedHandle("Do", err)
		}
		defer pc.Release()
		res, err := doOnConn(ctx, pc.Conn(), key, fn, cfg, failure)
		cfg.report(ctx, "Do", key, start, res.Replayed, err)
		return res, err
	case *pgx.Conn:
		res, err := doOnConn(ctx, d, key, fn, cfg, failure)
		cfg.report(ctx, "Do", key, start, res.Replayed, err)
		return res, err
	default:
		// Reported after the commit, like the branches above: an
		// execution whose COMMIT fails is no execution.
		res, err := doOnTx(ctx, db, key, fn, cfg)
		cfg.report(ctx, "Do", key, start, res.Replayed, err)
		return res, err
	}
}

// doOnTx is Do for a TxBeginner that is neither a pool nor a connection: a
// plain transaction around WithIdempotency.
func doOnTx[T any](ctx context.Context, db TxBeginner, key Key,
	fn func(ctx context.Context, tx pgx.Tx) (T, error), cfg *config) (Result[T], error) {
	var zero Result[T]
	var tx pgx.Tx
	var err error
	if b, ok := db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	}); ok {
		tx, err = b.BeginTx(ctx, cfg.txOptions)
	} else if cfg.txOptions != (pgx.TxOptions{}) {
		return zero, fmt.Errorf("%w: WithTxOptions needs a db with BeginTx, not %T", ErrInvalidOption, db)
	} else {
		tx, err = db.Begin(ctx)
	}
	if err != nil {
		return zero, closedHandle("Do", err)
	}
	defer rollback(ctx, tx) //nolint:errcheck // a no-op after Commit
	res, err := withIdempotency(ctx, tx, key, fn, cfg)
	if err != nil && !(IsPermanent(err) && !res.Replayed) {
		return res, err
	}
	if c := tx.Conn(); c != nil && c.IsClosed() {
		return Result[T]{}, fmt.Errorf("idem: connection closed before commit: %w", pgconn.ErrConnClosed)
	}
	if cerr := tx.Commit(ctx); cerr != nil {
		return Result[T]{}, commitError(cerr)
	}
	return res, err
}

// doOnConn is Do on one connection, with BEGIN and COMMIT pipelined.
func doOnConn[T any](ctx context.Context, conn *pgx.Conn, key Key,
	fn func(ctx context.Context, tx pgx.Tx) (T, error), cfg *config, failure *error) (res Result[T], err error) {
	c := &ownTx{conn: conn, q: cfg.q, key: key, opts: cfg.txOptions, hold: cfg.holdTimeout}
	rec, err := claimKey(ctx, c, key, cfg)
	if err != nil {
		return res, err
	}
	if !rec.claimed {
		return replay[T](rec, cfg)
	}
	// Every path that does not commit ends the transaction here.
	defer c.end(ctx)

	var status string
	var data []byte
	if *failure != nil {
		// An earlier attempt's fn failed permanently and was rolled back:
		// record that outcome without running fn again.
		status, data = StatusFailed, failureMessage(cfg, *failure)
	} else {
		g := newGuard(c.tx)
		v, fnErr, panicked := callFn(ctx, g, fn)
		g.close()
		switch {
		case panicked != nil:
			panic(panicked) // the deferred rollback runs as it unwinds
		case fnErr != nil:
			if !IsPermanent(fnErr) {
				return res, fnErr
			}
			*failure = fnErr
			if err := rollback(ctx, c.tx); err != nil {
				// Nothing was recorded: this must not look like a recorded
				// business outcome, so fnErr is reported by message only.
				return res, fmt.Errorf("idem: rolling back before recording the permanent failure %q: %w", fnErr.Error(), err)
			}
			// Claim again in a new transaction and record the failure
			// there; if another execution committed first, its outcome is
			// returned instead.
			return doOnConn(ctx, conn, key, fn, cfg, failure)
		}
		status = StatusSucceeded
		if data, res.Value, err = recordResult(cfg, v); err != nil {
			return res, err
		}
	}

	if conn.IsClosed() {
		return Result[T]{}, fmt.Errorf("idem: connection closed before commit: %w", pgconn.ErrConnClosed)
	}
	if err := c.commit(ctx, status, data, rec.attempt, cmp.Or(cfg.txOptions.CommitQuery, "COMMIT")); err != nil {
		return Result[T]{}, commitError(err)
	}
	if status == StatusFailed {
		return res, *failure
	}
	return res, nil
}

// commitError classifies an error from a batch or command that carried
// COMMIT on a connection that was open when it was sent: a server error, or a
// request that never left (a context done beforehand), means nothing
// committed; any other failure leaves the outcome unknown. "conn closed" is
// unknown too: it is what the rest of a batch reports once a read failure
// closed the connection mid-batch. A server error is recognised by its
// SQLSTATE from any driver; through database/sql, driver.ErrBadConn
// and network errors are unknown like pgx's.
func commitError(err error) error {
	if pgerr.Code(err) != "" || errors.Is(err, pgx.ErrTxCommitRollback) ||
		(pgconn.SafeToRetry(err) && !errors.Is(err, pgconn.ErrConnClosed)) {
		return fmt.Errorf("idem: commit: %w", err)
	}
	return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
}

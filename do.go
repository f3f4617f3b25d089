package idem

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/protocol"
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
	defer cfg.ExplainMissingTable(&err)
	txOpts, _ := cfg.TxOptions.(pgx.TxOptions)
	var conns protocol.Beginner[pgx.Tx]
	switch d := db.(type) {
	case *pgxpool.Pool:
		conns = pgxPool{pool: d, opts: txOpts}
	case *pgx.Conn:
		conns = pgxOneConn{conn: d, opts: txOpts}
	default:
		return doOnTx(ctx, db, key, fn, &cfg)
	}
	v, replayed, err := protocol.Do(ctx, pgxErrors{}, conns, protocol.Key(key), protocol.Fn[pgx.Tx, T](fn), &cfg)
	return Result[T]{Value: v, Replayed: replayed}, err
}

// doOnTx is Do for a TxBeginner that is neither a pool nor a connection: a
// plain transaction around WithIdempotency, retried like Do's own unless db
// is a pgx.Tx: inside an enclosing transaction a retry would meet the same
// snapshot, so that transaction's owner must retry.
func doOnTx[T any](ctx context.Context, db TxBeginner, key Key,
	fn func(ctx context.Context, tx pgx.Tx) (T, error), cfg *config) (Result[T], error) {
	_, isTx := db.(pgx.Tx)
	// Reported after the commit: an execution whose COMMIT fails is no
	// execution.
	v, replayed, err := protocol.Retried(ctx, pgxErrors{}, protocol.Key(key), cfg, !isTx, func() (T, bool, error) {
		res, err := doOnTxOnce(ctx, db, key, fn, cfg)
		return res.Value, res.Replayed, err
	})
	return Result[T]{Value: v, Replayed: replayed}, err
}

// doOnTxOnce is one attempt of doOnTx.
func doOnTxOnce[T any](ctx context.Context, db TxBeginner, key Key,
	fn func(ctx context.Context, tx pgx.Tx) (T, error), cfg *config) (Result[T], error) {
	var zero Result[T]
	var tx pgx.Tx
	var err error
	txOpts, _ := cfg.TxOptions.(pgx.TxOptions)
	if b, ok := db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	}); ok {
		tx, err = b.BeginTx(ctx, txOpts)
	} else if txOpts != (pgx.TxOptions{}) {
		return zero, fmt.Errorf("%w: WithTxOptions needs a db with BeginTx, not %T", ErrInvalidOption, db)
	} else {
		tx, err = db.Begin(ctx)
	}
	if err != nil {
		return zero, closedHandle("Do", err)
	}
	defer rollback(ctx, tx) //nolint:errcheck // a no-op after Commit
	v, replayed, err := protocol.InTx(ctx, pgxErrors{}, pgxTx{tx: tx}, protocol.Key(key), protocol.Fn[pgx.Tx, T](fn), cfg)
	res := Result[T]{Value: v, Replayed: replayed}
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

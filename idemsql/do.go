package idemsql

import (
	"context"
	"database/sql"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/protocol"
)

// Do runs fn at most once per key in a transaction of its own on db: it
// begins a transaction, claims the key, runs fn with the *sql.Tx, records
// fn's result and commits, as idem.Do does on pgx. The statements run one
// after the other, so a first execution costs a few round trips more than a
// bare transaction: BEGIN, the claim, fn's statements, the completion and
// COMMIT.
//
// fn must not commit or roll back tx: Do does, after fn returns. (A
// *sql.Tx cannot refuse it; a call whose fn did anyway fails, and what fn
// committed then has no record of the key: a retry with the key runs fn
// again.) tx is valid only until fn returns.
//
// Options are idem's: idem.WithTxOptions sets the isolation level and
// access mode (its deferrable mode becomes SET TRANSACTION; BeginQuery and
// CommitQuery are not supported), and the rest work as they do for
// idem.Do. ctx bounds the whole transaction, as database/sql's BeginTx does.
//
// Errors are idem.Do's: among them idem.ErrOutcomeUnknown when the
// connection failed while COMMIT was in flight (calling Do again with the
// same key settles it), a 40001 or 40P01 that outlasted the retries,
// ErrInvalidOption for a nil db or fn, and for a closed db an error that
// says so ("idem: Do: the pool was closed: sql: database is closed").
func Do[T any](ctx context.Context, db *sql.DB, key idem.Key,
	fn func(ctx context.Context, tx *sql.Tx) (T, error), opts ...idem.DoOption) (_ idem.Result[T], err error) {
	cfg, err := protocol.NewCall(dialect, "Do", protocol.Key(key), key.Validate(), db != nil && fn != nil, "a database and a function", opts)
	if err != nil {
		return idem.Result[T]{}, err
	}
	defer cfg.ExplainMissingTable(&err)
	v, replayed, err := protocol.Do(ctx, sqlErrors{}, flavor.NewConn(db, cfg.TxOptions, cfg.Q), protocol.Key(key), protocol.Fn[*sql.Tx, T](fn), &cfg)
	return idem.Result[T]{Value: v, Replayed: replayed}, err
}

// WithIdempotency runs fn at most once per key inside the caller's
// transaction tx, and records fn's result in the same transaction, as
// idem.WithIdempotency does on pgx: fn runs in a savepoint, and the caller
// commits or rolls back tx as usual. fn receives tx itself and must not
// commit or roll it back (a *sql.Tx cannot refuse it: the call then fails,
// and a retry with the key runs fn again).
//
// Errors and the state of tx afterwards are idem.WithIdempotency's; a tx
// already committed or rolled back is an ErrInvalidOption.
func WithIdempotency[T any](ctx context.Context, tx *sql.Tx, key idem.Key,
	fn func(ctx context.Context, tx *sql.Tx) (T, error), opts ...idem.Option) (_ idem.Result[T], err error) {
	cfg, err := protocol.NewCall(dialect, "WithIdempotency", protocol.Key(key), key.Validate(), tx != nil && fn != nil, "a transaction and a function", opts)
	if err != nil {
		return idem.Result[T]{}, err
	}
	defer cfg.ExplainMissingTable(&err)
	start := time.Now()
	v, replayed, err := protocol.InTx(ctx, sqlErrors{}, flavor.NewTx(tx), protocol.Key(key), protocol.Fn[*sql.Tx, T](fn), &cfg)
	err = cfg.HoldError(err)
	cfg.Report(ctx, cfg.Op, protocol.Key(key), start, replayed, err)
	return idem.Result[T]{Value: v, Replayed: replayed}, protocol.WithContextErr(ctx, err)
}

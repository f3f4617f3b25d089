package idemmysql

import (
	"context"
	"database/sql"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/protocol"
)

// Do is idem.Do on MySQL: it runs fn at most once per key in a
// transaction of its own on db, records fn's result in the same commit, and
// gives a duplicate the first result back (Result.Replayed). fn receives
// the *sql.Tx and must not commit or roll it back.
//
// It retries, with idem.WithRetry's backoff, an attempt that the
// server rolled back as a whole: when a key's first execution rolls back
// while duplicates wait for it, InnoDB ends all but one of them with a
// deadlock, and the retries end in a replay or in a single run of fn. A ctx
// deadline also bounds the claim's wait on the server (MariaDB), which
// would otherwise keep waiting after the client gave up.
//
// The options are idem's; idem.NoWait and idem.WithHoldTimeout need
// MariaDB. With a hold timeout the server ends a holder that sits idle in
// its transaction past the bound (the holder's call then fails with the
// driver's bad-connection error, driver.ErrBadConn or mysql.ErrInvalidConn)
// and interrupts a statement that runs past it; the transaction runs on a
// connection of its own, whose session settings are put back when it ends
// (the package documentation has the details). idem.WithTxOptions sets the
// isolation level and access mode. Errors are idem.Do's, and a *TxAbortedError that
// outlasted the retries.
func Do[T any](ctx context.Context, db *sql.DB, key idem.Key,
	fn func(ctx context.Context, tx *sql.Tx) (T, error), opts ...idem.DoOption) (_ idem.Result[T], err error) {
	if db == nil || fn == nil {
		_, err := protocol.NewCall(nil, "Do", protocol.Key(key), key.Validate(), false, "a database and a function", opts)
		return idem.Result[T]{}, err
	}
	d, err := dialectOf(ctx, db)
	if err != nil {
		return idem.Result[T]{}, closedHandle("Do", err)
	}
	cfg, err := protocol.NewCall(d, "Do", protocol.Key(key), key.Validate(), true, "", opts)
	if err != nil {
		return idem.Result[T]{}, err
	}
	defer cfg.ExplainMissingTable(&err)
	conn := flavor.NewConn(db, cfg.TxOptions, cfg.Q)
	if cfg.HoldTimeout > 0 {
		// The hold timeout's bounds are the session's: put back on a
		// connection of the transaction's own once it ends.
		conn = conn.Prepared(d.HoldSet).AfterTx(d.HoldSession)
	}
	v, replayed, err := protocol.Do(ctx, mysqlErrors{}, conn, protocol.Key(key), protocol.Fn[*sql.Tx, T](fn), &cfg)
	return idem.Result[T]{Value: v, Replayed: replayed}, wrap(err)
}

// WithIdempotency is idem.WithIdempotency on MySQL: it runs fn at most
// once per key inside the caller's transaction tx (fn receives tx and runs
// in a savepoint), with its result recorded in the same transaction, which
// the caller commits or rolls back as usual.
//
// Every decision comes from a locking read, so under REPEATABLE READ
// (InnoDB's default) a key committed after tx's snapshot is replayed, never
// run again. The claim keeps the key's row locked until tx ends, also when
// it replays. A *TxAbortedError says the server rolled tx back (a deadlock
// while waiting for a first execution that rolled back): roll tx back and
// run the transaction again; idem runs no other statement on it.
// idem.WithHoldTimeout is refused (its bounds would be the session's, and
// outlive the call).
func WithIdempotency[T any](ctx context.Context, tx *sql.Tx, key idem.Key,
	fn func(ctx context.Context, tx *sql.Tx) (T, error), opts ...idem.Option) (_ idem.Result[T], err error) {
	if tx == nil || fn == nil {
		_, err := protocol.NewCall(nil, "WithIdempotency", protocol.Key(key), key.Validate(), false, "a transaction and a function", opts)
		return idem.Result[T]{}, err
	}
	d, err := dialectOf(ctx, tx)
	if err != nil {
		return idem.Result[T]{}, closedHandle("WithIdempotency", err)
	}
	cfg, err := protocol.NewCall(d, "WithIdempotency", protocol.Key(key), key.Validate(), true, "", opts)
	if err != nil {
		return idem.Result[T]{}, err
	}
	defer cfg.ExplainMissingTable(&err)
	start := time.Now()
	v, replayed, err := protocol.InTx(ctx, mysqlErrors{}, flavor.NewTx(tx), protocol.Key(key), protocol.Fn[*sql.Tx, T](fn), &cfg)
	cfg.Report(ctx, cfg.Op, protocol.Key(key), start, replayed, err)
	return idem.Result[T]{Value: v, Replayed: replayed}, wrap(protocol.WithContextErr(ctx, err))
}

// closedHandle explains an error of a closed *sql.DB or an ended *sql.Tx.
func closedHandle(op string, err error) error {
	return protocol.ClosedHandle(op, err, mysqlErrors{}.Closed)
}

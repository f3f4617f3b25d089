package idem

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/protocol"
)

// Result is what a call with an idempotency key produced.
type Result[T any] struct {
	// Value is the recorded result of the execution that first committed
	// with this key, decoded by the codec (see Codec): on that first
	// execution too, so that it equals every replay's Value.
	Value T
	// Replayed reports that Value (or the returned permanent error) comes
	// from an earlier execution's record and fn did not run.
	Replayed bool
}

// TxBeginner begins transactions: *pgxpool.Pool, *pgx.Conn and pgx.Tx (a
// savepoint) all satisfy it. Do pipelines its BEGIN and COMMIT when db is a
// *pgxpool.Pool or a *pgx.Conn.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// DBTX runs statements: *pgxpool.Pool, *pgx.Conn and pgx.Tx all satisfy it.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// WithIdempotency runs fn at most once per key inside the caller's
// transaction tx, and records fn's result in the same transaction.
//
// The first call with a key inserts a processing record, runs fn inside a
// savepoint, stores the encoded result and returns it with Replayed false.
// When tx commits, record and business writes commit together; when it rolls
// back, neither exists and a retry runs fn again. A later call with the key
// does not run fn: it returns the recorded value with Replayed true. A call
// that meets a transaction still holding the key waits for it to end, then
// replays its result (or runs fn, if that transaction rolled back); with
// NoWait it returns ErrInProgress within 50ms.
//
// fn receives tx behind a guard that refuses Commit and Rollback and stops
// working once fn returns. fn must not call WithIdempotency with the same
// key. How long fn may hold the key is bounded only by the transaction's own
// settings unless WithHoldTimeout sets a bound.
//
// Errors:
//   - ErrInvalidKey or ErrInvalidOption, before any SQL, for a malformed key,
//     a nil (or typed-nil) tx or fn, or a rejected option; ErrInvalidOption
//     too, saying so, for a tx already committed or rolled back.
//   - ErrKeyReused: the key was first used with another Fingerprint.
//   - ErrInProgress (NoWait): another transaction holds the key.
//   - fn's own error, as it is: fn's writes and the claim are rolled back.
//   - A Permanent error from fn: fn's writes are rolled back, the failure is
//     recorded, and later calls get it again with Replayed true.
//   - ErrResultTooLarge: the encoded result exceeds WithMaxResultSize;
//     rolled back like an error from fn.
//   - ErrHoldTimeout: the server ended the transaction after fn held the key
//     idle past WithHoldTimeout's bound.
//   - SQLSTATE 40001 (see IsRetryable) under REPEATABLE READ or
//     SERIALIZABLE when a concurrent first execution commits first, and
//     55P03 when the caller's own lock_timeout ends the wait for the key's
//     holder, returned unchanged.
//   - When ctx is done, an error matching ctx.Err() (errors.Is), whatever
//     the driver reported.
//
// A panic in fn rolls back like an error and is raised again. After
// ErrInProgress, ErrKeyReused, a replay and fn's own errors, tx is still
// usable, with its settings and savepoints as they were; after database
// errors (40001, 55P03, a lost connection) it is aborted.
func WithIdempotency[T any](ctx context.Context, tx pgx.Tx, key Key,
	fn func(ctx context.Context, tx pgx.Tx) (T, error), opts ...Option) (_ Result[T], err error) {
	var zero Result[T]
	cfg, err := newCall("WithIdempotency", key, !handle.Missing(tx) && fn != nil, "a transaction and a function", opts)
	if err != nil {
		return zero, err
	}
	defer cfg.ExplainMissingTable(&err)
	start := time.Now()
	v, replayed, err := protocol.InTx(ctx, pgxErrors{}, pgxTx{tx: tx}, protocol.Key(key), protocol.Fn[pgx.Tx, T](fn), &cfg)
	err = cfg.HoldError(err)
	report(&cfg, ctx, cfg.Op, key, start, replayed, err)
	return Result[T]{Value: v, Replayed: replayed}, protocol.WithContextErr(ctx, err)
}

// rollback rolls tx back even when ctx was cancelled.
func rollback(ctx context.Context, tx pgx.Tx) error {
	ctx, cancel := protocol.CleanupContext(ctx)
	defer cancel()
	return tx.Rollback(ctx)
}

// errTxOwned is what fn gets from Commit or Rollback on the transaction idem
// hands it: the transaction belongs to idem (Do) or to the caller
// (WithIdempotency), and ends after fn returns.
var errTxOwned = errors.New("idem: fn must not commit or roll back its transaction; return a value or an error instead")

// guardTx is the pgx.Tx fn receives. It forwards queries to the real
// transaction, refuses Commit and Rollback, and stops working once fn has
// returned, so a leaked handle cannot touch a connection that went back to a
// pool.
//
// Savepoints fn opens with Begin are guarded the same way (their Commit and
// Rollback work) and stop with it. Conn and LargeObjects hand out pgx's own
// objects, which fn must not keep.
//
// It embeds the transaction, so that a method a later pgx release adds to
// pgx.Tx is forwarded as it is (unguarded) instead of breaking the build;
// every method pgx.Tx has today is guarded below.
type guardTx struct {
	pgx.Tx
	closed *atomic.Bool // shared with the savepoints opened through this handle
	top    bool         // the transaction itself: Commit and Rollback are refused
}

var _ pgx.Tx = (*guardTx)(nil)

// guardRoot is the top handle and its flag in one allocation.
type guardRoot struct {
	guardTx
	flag atomic.Bool
}

func newGuard(tx pgx.Tx) *guardTx {
	r := &guardRoot{}
	r.guardTx = guardTx{Tx: tx, closed: &r.flag, top: true}
	return &r.guardTx
}

// close ends the handle and every savepoint handle opened through it.
func (g *guardTx) close() { g.closed.Store(true) }

func (g *guardTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if g.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	sp, err := g.Tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &guardTx{Tx: sp, closed: g.closed}, nil
}

func (g *guardTx) Commit(ctx context.Context) error {
	if g.closed.Load() {
		return pgx.ErrTxClosed
	}
	if g.top {
		return errTxOwned
	}
	return g.Tx.Commit(ctx)
}

func (g *guardTx) Rollback(ctx context.Context) error {
	if g.closed.Load() {
		return pgx.ErrTxClosed
	}
	if g.top {
		return errTxOwned
	}
	return g.Tx.Rollback(ctx)
}

func (g *guardTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if g.closed.Load() {
		return 0, pgx.ErrTxClosed
	}
	return g.Tx.CopyFrom(ctx, table, columns, src)
}

func (g *guardTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if g.closed.Load() {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return g.Tx.SendBatch(ctx, b)
}

func (g *guardTx) LargeObjects() pgx.LargeObjects { return g.Tx.LargeObjects() }

func (g *guardTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if g.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	return g.Tx.Prepare(ctx, name, sql)
}

func (g *guardTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if g.closed.Load() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return g.Tx.Exec(ctx, sql, args...)
}

func (g *guardTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if g.closed.Load() {
		// Rows that carry the error too, as pgx's own ended transactions
		// return: pgx lets callers read Query's error from the Rows.
		return errRows{err: pgx.ErrTxClosed}, pgx.ErrTxClosed
	}
	return g.Tx.Query(ctx, sql, args...)
}

func (g *guardTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if g.closed.Load() {
		return errRow{err: pgx.ErrTxClosed}
	}
	return g.Tx.QueryRow(ctx, sql, args...)
}

func (g *guardTx) Conn() *pgx.Conn { return g.Tx.Conn() }

// errRow is a Row that holds only an error. It embeds pgx.Row (nil), so
// that a method a later pgx release adds does not break the build.
type errRow struct {
	pgx.Row
	err error
}

func (r errRow) Scan(...any) error { return r.err }

// errRows is Rows that hold only an error, embedding pgx.Rows (nil) for the
// same reason as errRow.
type errRows struct {
	pgx.Rows
	err error
}

func (r errRows) Close()                                       {}
func (r errRows) Err() error                                   { return r.err }
func (r errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r errRows) Next() bool                                   { return false }
func (r errRows) Scan(...any) error                            { return r.err }
func (r errRows) Values() ([]any, error)                       { return nil, r.err }
func (r errRows) RawValues() [][]byte                          { return nil }
func (r errRows) Conn() *pgx.Conn                              { return nil }
func (r errRows) TypeMap() *pgtype.Map                         { return nil }

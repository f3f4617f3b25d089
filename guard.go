package idem

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

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
type guardTx struct {
	tx     pgx.Tx
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
	r.guardTx = guardTx{tx: tx, closed: &r.flag, top: true}
	return &r.guardTx
}

// close ends the handle and every savepoint handle opened through it.
func (g *guardTx) close() { g.closed.Store(true) }

func (g *guardTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if g.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	sp, err := g.tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &guardTx{tx: sp, closed: g.closed}, nil
}

func (g *guardTx) Commit(ctx context.Context) error {
	if g.closed.Load() {
		return pgx.ErrTxClosed
	}
	if g.top {
		return errTxOwned
	}
	return g.tx.Commit(ctx)
}

func (g *guardTx) Rollback(ctx context.Context) error {
	if g.closed.Load() {
		return pgx.ErrTxClosed
	}
	if g.top {
		return errTxOwned
	}
	return g.tx.Rollback(ctx)
}

func (g *guardTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if g.closed.Load() {
		return 0, pgx.ErrTxClosed
	}
	return g.tx.CopyFrom(ctx, table, columns, src)
}

func (g *guardTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if g.closed.Load() {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return g.tx.SendBatch(ctx, b)
}

func (g *guardTx) LargeObjects() pgx.LargeObjects { return g.tx.LargeObjects() }

func (g *guardTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if g.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	return g.tx.Prepare(ctx, name, sql)
}

func (g *guardTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if g.closed.Load() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return g.tx.Exec(ctx, sql, args...)
}

func (g *guardTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if g.closed.Load() {
		// Rows that carry the error too, as pgx's own ended transactions
		// return: pgx lets callers read Query's error from the Rows.
		return errRows{pgx.ErrTxClosed}, pgx.ErrTxClosed
	}
	return g.tx.Query(ctx, sql, args...)
}

func (g *guardTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if g.closed.Load() {
		return errRow{pgx.ErrTxClosed}
	}
	return g.tx.QueryRow(ctx, sql, args...)
}

func (g *guardTx) Conn() *pgx.Conn { return g.tx.Conn() }

// Unwrap returns the transaction (or savepoint) the guard forwards to, or
// nil once fn has returned. It lets an adapter find its own transaction
// type behind the guard: idemsql.SQLTx uses it to hand fn the *sql.Tx.
func (g *guardTx) Unwrap() pgx.Tx {
	if g.closed.Load() {
		return nil
	}
	return g.tx
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// errRows is Rows that hold only an error.
type errRows struct{ err error }

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

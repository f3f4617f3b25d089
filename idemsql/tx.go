package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// tx is a *sql.Tx, or a savepoint inside one, as a pgx.Tx. Like pgx's
// transactions it is not safe for concurrent use.
type tx struct {
	stx *sql.Tx
	// ctx is the context the transaction was begun with, when this package
	// began it: database/sql rolls the transaction back when ctx ends.
	ctx    context.Context
	root   *txState
	sp     int64 // savepoint number; 0 for the transaction itself
	closed bool
}

// txState is shared by a transaction and its savepoints.
type txState struct {
	savepoints int64 // the last savepoint number handed out
	closed     bool  // the transaction itself ended
}

var _ pgx.Tx = (*tx)(nil)

func newTx(stx *sql.Tx) *tx {
	return &tx{stx: stx, root: &txState{}}
}

// WrapTx returns tx as a pgx.Tx, for idem.WithIdempotency, idem.ConsumeOnce,
// idem.InsertOrGetTx and the lease calls. The caller keeps owning tx and
// commits or rolls it back as usual, on tx itself or on the returned value:
// its Commit and Rollback end tx (after which they return an error matching
// pgx.ErrTxClosed, so a deferred Rollback is harmless). Begin on the
// returned value opens a savepoint, whose Commit releases it and whose
// Rollback rolls back to it and releases it. A nil tx returns nil.
func WrapTx(stx *sql.Tx) pgx.Tx {
	if stx == nil {
		return nil
	}
	return newTx(stx)
}

// SQLTx returns the *sql.Tx behind t, when t is a transaction or savepoint
// from this package, or idem's guard around one (the pgx.Tx that fn
// receives, which idem unwraps through its Unwrap method). Statements run on
// it belong to the same transaction, inside any savepoints open on it. fn
// must not commit or roll back the *sql.Tx: idem or the caller ends it.
// Once fn has returned, the guard no longer unwraps and SQLTx reports false.
func SQLTx(t pgx.Tx) (*sql.Tx, bool) {
	for t != nil {
		switch v := t.(type) {
		case *tx:
			return v.stx, true
		case interface{ Unwrap() pgx.Tx }:
			t = v.Unwrap()
		default:
			return nil, false
		}
	}
	return nil, false
}

func (t *tx) done() bool { return t.closed || t.root.closed }

// Begin opens a savepoint: a pseudo-nested transaction, as pgx's Begin on a
// transaction does.
func (t *tx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.done() {
		return nil, pgx.ErrTxClosed
	}
	t.root.savepoints++
	n := t.root.savepoints
	if _, err := t.stx.ExecContext(ctx, "SAVEPOINT "+savepointName(n)); err != nil {
		return nil, mapErr(err)
	}
	return &tx{stx: t.stx, ctx: t.ctx, root: t.root, sp: n}, nil
}

func savepointName(n int64) string { return "sp_" + strconv.FormatInt(n, 10) }

// Commit commits the *sql.Tx, or releases the savepoint. database/sql's
// Commit takes no context, so ctx cannot cancel it.
func (t *tx) Commit(ctx context.Context) error {
	if t.done() {
		return pgx.ErrTxClosed
	}
	t.closed = true
	if t.sp != 0 {
		_, err := t.stx.ExecContext(ctx, "RELEASE SAVEPOINT "+savepointName(t.sp))
		return mapErr(err)
	}
	t.root.closed = true
	return t.commitError(t.stx.Commit())
}

// commitError maps the errors of a COMMIT that certainly was not sent to
// errors that say so (pgconn.SafeToRetry reports true), so that idem does not
// report ErrOutcomeUnknown for them; every other error is returned as it is.
func (t *tx) commitError(err error) error {
	switch {
	case err == nil:
		return nil
	case err == context.Canceled || err == context.DeadlineExceeded:
		// database/sql returns the context's error itself, unwrapped,
		// only when the context ended before it sent anything; a driver
		// interrupted mid-commit returns its own error.
		return &notSentError{err: err}
	case errors.Is(err, sql.ErrTxDone) && t.ctx != nil && t.ctx.Err() != nil:
		// The context ended earlier, and database/sql rolled the
		// transaction back then.
		return &notSentError{err: errors.Join(err, t.ctx.Err())}
	case errors.Is(err, sql.ErrTxDone):
		return errTxDone(err)
	default:
		return err
	}
}

// Rollback rolls the *sql.Tx back, or rolls back to the savepoint and
// releases it. After the transaction ended it returns an error matching
// pgx.ErrTxClosed.
func (t *tx) Rollback(ctx context.Context) error {
	if t.done() {
		return pgx.ErrTxClosed
	}
	t.closed = true
	if t.sp != 0 {
		name := savepointName(t.sp)
		// One statement string without arguments: both drivers send it
		// with the simple protocol, and it works in an aborted
		// transaction.
		_, err := t.stx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+name+"; RELEASE SAVEPOINT "+name)
		return mapErr(err)
	}
	t.root.closed = true
	return mapErr(t.stx.Rollback())
}

// CopyFrom inserts the rows one INSERT at a time: database/sql has no COPY.
func (t *tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if t.done() {
		return 0, pgx.ErrTxClosed
	}
	if len(columns) == 0 {
		return 0, errors.New("idemsql: CopyFrom needs columns")
	}
	var q strings.Builder
	q.WriteString("INSERT INTO " + table.Sanitize() + " (")
	for i, c := range columns {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString(pgx.Identifier{c}.Sanitize())
	}
	q.WriteString(") VALUES (")
	for i := range columns {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("$" + strconv.Itoa(i+1))
	}
	q.WriteString(")")
	var n int64
	for src.Next() {
		vals, err := src.Values()
		if err != nil {
			return n, err
		}
		if len(vals) != len(columns) {
			return n, fmt.Errorf("idemsql: CopyFrom: a row has %d values for %d columns", len(vals), len(columns))
		}
		if _, err := execOn(ctx, t.stx, q.String(), vals); err != nil {
			return n, err
		}
		n++
	}
	return n, src.Err()
}

// SendBatch runs b's statements in order in the transaction, calling each
// one's callback with its result. Close returns the first error; a
// statement that fails stops the ones after it, as the transaction is
// aborted anyway.
func (t *tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.done() {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	if err := checkBatch(b); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return newBatchResults(ctx, t.stx, b)
}

// LargeObjects is not supported: it returns a zero pgx.LargeObjects, whose
// methods must not be called.
func (t *tx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

// Prepare is not supported: database/sql keeps prepared statements as
// *sql.Stmt values, which pgx's by-name execution cannot reach.
func (t *tx) Prepare(context.Context, string, string) (*pgconn.StatementDescription, error) {
	return nil, errors.New("idemsql: Prepare is not supported; use the *sql.Tx from SQLTx")
}

// Exec runs sql in the transaction.
func (t *tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.done() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return execOn(ctx, t.stx, sql, args)
}

// Query runs sql in the transaction. The transaction is busy until the rows
// are closed. Rows is never nil.
func (t *tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.done() {
		return errorRows(pgx.ErrTxClosed), pgx.ErrTxClosed
	}
	return queryOn(ctx, t.stx, sql, args)
}

// QueryRow runs sql in the transaction. Scan returns pgx.ErrNoRows when
// there is no row.
func (t *tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.done() {
		return &row{rows: errorRows(pgx.ErrTxClosed)}
	}
	return queryRowOn(ctx, t.stx, sql, args)
}

// Conn returns nil: there is no *pgx.Conn behind database/sql.
func (t *tx) Conn() *pgx.Conn { return nil }

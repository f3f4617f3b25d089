package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/dialect/postgres"
	"github.com/idemkit/idem/internal/pgerr"
	"github.com/idemkit/idem/internal/protocol"
)

// The database/sql driver of idem's claim protocol (internal/protocol), for
// PostgreSQL through lib/pq or pgx's stdlib driver: statements run one after
// the other on the *sql.Tx, and fn receives that *sql.Tx itself. The SQL is
// PostgreSQL's dialect, the same as the pgx driver's.

// dialect is the SQL every call of this package runs.
var dialect = postgres.Dialect

// sqlErrors classifies the errors of PostgreSQL's database/sql drivers.
type sqlErrors struct{}

func (sqlErrors) Retryable(err error) bool { return idem.IsRetryable(err) }

func (sqlErrors) LockTimeout(err error) bool { return pgerr.Code(err) == pgerr.LockNotAvailable }

func (sqlErrors) Closed(err error) (string, bool) {
	switch {
	case errors.Is(err, sql.ErrTxDone):
		return protocol.TxEnded, true
	case err != nil && strings.Contains(err.Error(), "sql: database is closed"):
		// database/sql's own error, which it does not export.
		return protocol.PoolClosed, false
	}
	return "", false
}

// closedHandle explains an error of a closed *sql.DB or an ended *sql.Tx.
func closedHandle(op string, err error) error {
	return protocol.ClosedHandle(op, err, sqlErrors{}.Closed)
}

// sqlQuerier is what statements run on: a *sql.Tx or a *sql.DB.
type sqlQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// run runs stmts on q one after the other, stopping at the first error.
func run(ctx context.Context, q sqlQuerier, stmts []protocol.Stmt) error {
	for i := range stmts {
		if o := stmts[i].OnlyIf; o != nil && !*o {
			continue
		}
		if err := runOne(ctx, q, &stmts[i]); err != nil {
			return err
		}
	}
	return nil
}

func runOne(ctx context.Context, q sqlQuerier, st *protocol.Stmt) error {
	if st.Each != nil {
		rows, err := q.QueryContext(ctx, st.SQL, st.Args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := st.Each(rows.Scan); err != nil {
				return err
			}
		}
		return rows.Err()
	}
	if st.Dest != nil {
		err := q.QueryRowContext(ctx, st.SQL, st.Args...).Scan(st.Dest...)
		if st.Found != nil {
			if errors.Is(err, sql.ErrNoRows) {
				*st.Found = false
				return nil
			}
			*st.Found = err == nil
		}
		return err
	}
	res, err := q.ExecContext(ctx, st.SQL, st.Args...)
	if err != nil || st.Affected == nil {
		return err
	}
	*st.Affected, err = res.RowsAffected()
	return err
}

// InTx reports true: the statements run in the caller's transaction.
func (sqlTx) InTx() bool { return true }

// sqlTx is a *sql.Tx to the protocol: the caller's (WithIdempotency) or one
// of Do's (sqlOwn).
type sqlTx struct{ tx *sql.Tx }

func (t sqlTx) Run(ctx context.Context, stmts ...protocol.Stmt) error { return run(ctx, t.tx, stmts) }

// Fn hands fn the *sql.Tx itself. database/sql's transaction is a struct,
// so nothing can refuse its Commit and Rollback: the documentation of Do and
// WithIdempotency says that fn must not call them, and the completion
// reports it if fn did.
func (t sqlTx) Fn() (*sql.Tx, func()) { return t.tx, func() {} }

// sqlOwn is a transaction Do began.
type sqlOwn struct {
	sqlTx
	ctx context.Context // what the transaction was begun with: database/sql ends it with ctx
}

func (o *sqlOwn) Commit(ctx context.Context, stmts ...protocol.Stmt) (unknown bool, err error) {
	if err := run(ctx, o.tx, stmts); err != nil {
		if errors.Is(err, sql.ErrTxDone) && o.ctx.Err() == nil {
			return false, errFnEndedTx
		}
		return false, err
	}
	if cerr := o.ctx.Err(); cerr != nil {
		// database/sql rolls back a transaction whose context ended and
		// sends no COMMIT.
		_ = o.tx.Rollback()
		return false, &protocol.NotSentError{Err: fmt.Errorf("idemsql: commit not sent: %w", cerr)}
	}
	err = o.tx.Commit()
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, sql.ErrTxDone):
		// database/sql rolled the transaction back already, its context
		// having ended since the check above: no COMMIT went out.
		return false, err
	case pgerr.Code(err) != "" || errors.Is(err, pgx.ErrTxCommitRollback) ||
		(pgconn.SafeToRetry(err) && !errors.Is(err, pgconn.ErrConnClosed)):
		// The server answered, or nothing was sent: nothing committed.
		// (pgx reports "conn closed", safe to retry, for a connection
		// that a failed read closed while COMMIT was in flight.)
		return false, err
	default:
		// The connection failed, or the context ended, while COMMIT was
		// in flight (pgx's stdlib driver runs it under the transaction's
		// context): it may have committed.
		return true, err
	}
}

// errFnEndedTx is the completion's error when fn committed or rolled back
// the *sql.Tx it was given.
var errFnEndedTx = errors.New("idemsql: fn committed or rolled back the *sql.Tx it was given, so its writes (if committed) have no record of the key; fn must return instead")

func (o *sqlOwn) Rollback(ctx context.Context, stmts ...protocol.Stmt) error {
	err := run(ctx, o.tx, stmts)
	if rerr := o.tx.Rollback(); err == nil && !errors.Is(rerr, sql.ErrTxDone) {
		err = rerr
	}
	return err
}

func (o *sqlOwn) End(context.Context) { _ = o.tx.Rollback() }

// sqlConn begins Do's transactions on the database.
type sqlConn struct {
	db   *sql.DB
	opts pgx.TxOptions
}

func (c sqlConn) Begin(ctx context.Context, stmts ...protocol.Stmt) (protocol.Own[*sql.Tx], error) {
	sopts, setTx, err := sqlTxOptions(c.opts)
	if err != nil {
		return nil, err
	}
	stx, err := c.db.BeginTx(ctx, &sopts)
	if err != nil {
		return nil, err
	}
	if setTx != "" {
		stmts = append([]protocol.Stmt{{SQL: setTx}}, stmts...)
	}
	if err := run(ctx, stx, stmts); err != nil {
		_ = stx.Rollback()
		return nil, err
	}
	return &sqlOwn{sqlTx: sqlTx{tx: stx}, ctx: ctx}, nil
}

// Acquire returns the database itself: database/sql picks a connection for
// each transaction.
func (c sqlConn) Acquire(context.Context) (protocol.Conn[*sql.Tx], func(), error) {
	return c, func() {}, nil
}

// DBTX runs statements: *sql.DB, *sql.Tx and *sql.Conn all satisfy it. The
// calls that take one run in the caller's transaction when it is a *sql.Tx,
// and otherwise each in a transaction of their own.
type DBTX interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// querierOf is db to the protocol.
func querierOf(db DBTX) protocol.Querier {
	switch d := db.(type) {
	case *sql.Tx:
		return sqlTx{tx: d}
	case txBeginner:
		return beginQuerier{db: d}
	}
	return dbtxQuerier{db: db}
}

// txBeginner is a DBTX that begins transactions: *sql.DB, *sql.Conn, and
// wrappers of them that keep database/sql's BeginTx.
type txBeginner interface {
	DBTX
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// beginQuerier runs statements on a database or a connection: a lone one
// on its own, a group of several in a transaction of its own, committed
// when none failed.
type beginQuerier struct{ db txBeginner }

func (q beginQuerier) Run(ctx context.Context, stmts ...protocol.Stmt) error {
	if len(stmts) == 1 {
		return runOne(ctx, q.db, &stmts[0])
	}
	tx, err := q.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := run(ctx, tx, stmts); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		if cerr := ctx.Err(); cerr != nil {
			// database/sql ended the transaction when ctx ended: the
			// context is the cause, not a transaction of the caller's.
			return fmt.Errorf("idemsql: %w: %w", cerr, err)
		}
		return err
	}
	return nil
}

func (beginQuerier) InTx() bool { return false }

// dbtxQuerier runs statements on a DBTX that cannot begin a transaction
// (a wrapper of a *sql.Tx, say), one after the other, as the caller's.
type dbtxQuerier struct{ db DBTX }

func (q dbtxQuerier) Run(ctx context.Context, stmts ...protocol.Stmt) error {
	return run(ctx, q.db, stmts)
}

func (dbtxQuerier) InTx() bool { return true }

// sqlTxOptions maps pgx's transaction options to database/sql's, with the
// statement that sets what sql.TxOptions cannot express.
func sqlTxOptions(opts pgx.TxOptions) (sql.TxOptions, string, error) {
	var s sql.TxOptions
	if opts.BeginQuery != "" || opts.CommitQuery != "" {
		return s, "", fmt.Errorf("idemsql: TxOptions.BeginQuery and CommitQuery are not supported through database/sql")
	}
	switch opts.IsoLevel {
	case "":
		s.Isolation = sql.LevelDefault
	case pgx.Serializable:
		s.Isolation = sql.LevelSerializable
	case pgx.RepeatableRead:
		s.Isolation = sql.LevelRepeatableRead
	case pgx.ReadCommitted:
		s.Isolation = sql.LevelReadCommitted
	case pgx.ReadUncommitted:
		s.Isolation = sql.LevelReadUncommitted
	default:
		return s, "", fmt.Errorf("idemsql: unknown isolation level %q", opts.IsoLevel)
	}
	switch opts.AccessMode {
	case "", pgx.ReadWrite:
	case pgx.ReadOnly:
		s.ReadOnly = true
	default:
		return s, "", fmt.Errorf("idemsql: unknown access mode %q", opts.AccessMode)
	}
	switch opts.DeferrableMode {
	case "":
		return s, "", nil
	case pgx.Deferrable:
		return s, "SET TRANSACTION DEFERRABLE", nil
	case pgx.NotDeferrable:
		return s, "SET TRANSACTION NOT DEFERRABLE", nil
	default:
		return s, "", fmt.Errorf("idemsql: unknown deferrable mode %q", opts.DeferrableMode)
	}
}

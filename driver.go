package idem

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"

	"github.com/idemkit/idem/internal/dialect/postgres"
	"github.com/idemkit/idem/internal/pgerr"
	"github.com/idemkit/idem/internal/protocol"
)

// The pgx driver of the claim protocol (internal/protocol): statements go
// in one pgx.Batch per group, BEGIN rides with the claim and COMMIT with
// the completion, and fn receives the transaction behind a guard. The SQL
// is PostgreSQL's dialect.

// dialect is the SQL every call of this package runs.
var dialect = postgres.Dialect

// pgxErrors classifies pgx's errors.
type pgxErrors struct{}

func (pgxErrors) Retryable(err error) bool { return IsRetryable(err) }

func (pgxErrors) LockTimeout(err error) bool { return pgerr.Code(err) == pgerr.LockNotAvailable }

func (pgxErrors) Closed(err error) (string, bool) {
	switch {
	case errors.Is(err, puddle.ErrClosedPool):
		return protocol.PoolClosed, false
	case errors.Is(err, pgx.ErrTxClosed):
		return protocol.TxEnded, true
	}
	return "", false
}

// closedHandle gives an error that a closed pool or an ended transaction
// caused idem's context (protocol.ClosedHandle).
func closedHandle(op string, err error) error {
	return protocol.ClosedHandle(op, err, pgxErrors{}.Closed)
}

// batcher is what a group of statements runs on: a pgx.Tx, or the guard
// around one.
type batcher interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// runStmts runs stmts on q in one batch; a lone statement without
// arguments or destinations goes by Exec, which sends it with the simple
// protocol.
func runStmts(ctx context.Context, q batcher, stmts []protocol.Stmt) error {
	if len(stmts) == 1 && len(stmts[0].Args) == 0 && stmts[0].Dest == nil && stmts[0].Affected == nil && stmts[0].Each == nil {
		_, err := q.Exec(ctx, stmts[0].SQL)
		return err
	}
	b := &pgx.Batch{}
	for i := range stmts {
		if stmts[i].Lazy != nil {
			return errors.New("idem: a statement completed by the ones before it cannot go in a pgx batch")
		}
		queueStmt(b, &stmts[i])
	}
	return q.SendBatch(ctx, b).Close()
}

// queueStmt queues st on b, with what reads its row or its count.
func queueStmt(b *pgx.Batch, st *protocol.Stmt) {
	qq := b.Queue(st.SQL, st.Args...)
	switch {
	case st.Each != nil:
		qq.Query(func(rows pgx.Rows) error {
			for rows.Next() {
				if err := st.Each(rows.Scan); err != nil {
					return err
				}
			}
			return rows.Err()
		})
	case st.Dest != nil:
		qq.QueryRow(func(r pgx.Row) error {
			err := r.Scan(st.Dest...)
			if st.Found != nil {
				if errors.Is(err, pgx.ErrNoRows) {
					*st.Found = false
					return nil
				}
				*st.Found = err == nil
			}
			return err
		})
	case st.Affected != nil:
		qq.Exec(func(tag pgconn.CommandTag) error {
			*st.Affected = tag.RowsAffected()
			return nil
		})
	}
}

// pgxQuerier is what a call that takes a DBTX runs its statements on.
type pgxQuerier struct{ db DBTX }

func (q pgxQuerier) Run(ctx context.Context, stmts ...protocol.Stmt) error {
	return runStmts(ctx, q.db, stmts)
}

func (q pgxQuerier) InTx() bool {
	_, ok := q.db.(pgx.Tx)
	return ok
}

// pgxTx is a pgx transaction to the protocol: the caller's (WithIdempotency)
// or one of Do's (pgxOwn).
type pgxTx struct{ tx pgx.Tx }

func (t pgxTx) Run(ctx context.Context, stmts ...protocol.Stmt) error {
	return runStmts(ctx, t.tx, stmts)
}

// InTx reports true.
func (pgxTx) InTx() bool { return true }

// Fn hands fn the transaction behind a guard (see guardTx).
func (t pgxTx) Fn() (pgx.Tx, func()) {
	g := newGuard(t.tx)
	return g, g.close
}

// pgxOwn is a transaction Do began on conn with a batch.
type pgxOwn struct {
	pgxTx
	conn   *pgx.Conn
	commit string // the statement that commits: COMMIT, or TxOptions.CommitQuery
}

func (o *pgxOwn) Commit(ctx context.Context, stmts ...protocol.Stmt) (unknown bool, err error) {
	if o.conn.IsClosed() {
		return false, &protocol.NotSentError{Err: fmt.Errorf("idem: connection closed before commit: %w", pgconn.ErrConnClosed)}
	}
	var tag pgconn.CommandTag
	b := &pgx.Batch{}
	for i := range stmts {
		queueStmt(b, &stmts[i])
	}
	b.Queue(o.commit).Exec(func(t pgconn.CommandTag) error { tag = t; return nil })
	if err := o.tx.SendBatch(ctx, b).Close(); err != nil {
		return commitUnknown(err), err
	}
	if tag.String() == "ROLLBACK" {
		return false, pgx.ErrTxCommitRollback
	}
	return false, nil
}

func (o *pgxOwn) Rollback(ctx context.Context, stmts ...protocol.Stmt) error {
	if len(stmts) == 0 {
		return rollback(ctx, o.tx)
	}
	b := &pgx.Batch{}
	for i := range stmts {
		queueStmt(b, &stmts[i])
	}
	b.Queue("ROLLBACK")
	err := o.tx.SendBatch(ctx, b).Close()
	if err != nil {
		o.End(ctx)
	}
	return err
}

// End rolls back the transaction, if one is still open on the connection. A
// rollback that fails closes the connection, and a pool drops it.
func (o *pgxOwn) End(ctx context.Context) {
	if !o.conn.IsClosed() && o.conn.PgConn().TxStatus() != 'I' {
		_ = rollback(ctx, o.tx)
	}
}

// pgxConn begins Do's transactions on one connection, sending BEGIN with
// the claim.
type pgxConn struct {
	conn *pgx.Conn
	opts pgx.TxOptions
}

func (c pgxConn) Begin(ctx context.Context, stmts ...protocol.Stmt) (protocol.Own[pgx.Tx], error) {
	b := &pgx.Batch{}
	b.BeginTx(c.opts)
	for i := range stmts {
		queueStmt(b, &stmts[i])
	}
	br := c.conn.SendBatch(ctx, b)
	o := &pgxOwn{pgxTx: pgxTx{tx: br.Tx()}, conn: c.conn, commit: cmp.Or(c.opts.CommitQuery, "COMMIT")}
	if err := br.Close(); err != nil {
		o.End(ctx)
		return nil, err
	}
	return o, nil
}

// pgxPool acquires a connection of the pool for each attempt of Do.
type pgxPool struct {
	pool *pgxpool.Pool
	opts pgx.TxOptions
}

func (p pgxPool) Acquire(ctx context.Context) (protocol.Conn[pgx.Tx], func(error) error, error) {
	pc, err := p.pool.Acquire(ctx)
	if err != nil {
		if pgerr.CannotServe(err) {
			return nil, nil, protocol.Unavailable(err)
		}
		return nil, nil, err
	}
	release := func(err error) error {
		defer pc.Release() // the pool drops a closed connection
		c := pc.Conn()
		lost := c.IsClosed() && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
		if err == nil || !(pgerr.CannotServe(err) || lost) {
			return err
		}
		if !c.IsClosed() {
			// Alive but unusable for writes (a read-only server, say): closed
			// so that the pool dials afresh rather than hand it out again.
			cctx, cancel := protocol.CleanupContext(ctx)
			_ = c.Close(cctx)
			cancel()
		}
		return protocol.Unavailable(err)
	}
	return pgxConn{conn: pc.Conn(), opts: p.opts}, release, nil
}

// pgxOneConn is a *pgx.Conn as Do's Beginner. Its attempts are never
// marked unavailable: there is no other connection to retry on.
type pgxOneConn pgxConn

func (c pgxOneConn) Acquire(context.Context) (protocol.Conn[pgx.Tx], func(error) error, error) {
	return pgxConn(c), func(err error) error { return err }, nil
}

// commitUnknown reports whether a failed batch or command that carried
// COMMIT, on a connection that was open when it was sent, leaves the outcome
// unknown. A server error, or a request that never left (a context done
// beforehand), means nothing committed, except the server ending the
// session (57P01, 57P02: a switchover or shutdown stopping backends, which
// was measured committing the COMMIT it was answering); any other failure
// leaves the outcome unknown. "conn closed" is unknown too: it is what the rest of a
// batch reports once a read failure closed the connection mid-batch. A
// server error is recognised by its SQLSTATE from any driver.
func commitUnknown(err error) bool {
	if pgerr.SessionEnded(err) {
		return true // the server ended the session: COMMIT may have run first
	}
	return !(pgerr.Code(err) != "" || errors.Is(err, pgx.ErrTxCommitRollback) ||
		(pgconn.SafeToRetry(err) && !errors.Is(err, pgconn.ErrConnClosed)))
}

// commitError classifies an error of COMMIT (commitUnknown).
func commitError(err error) error {
	if commitUnknown(err) {
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
	return fmt.Errorf("idem: commit: %w", err)
}

package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"net"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/dialect/postgres"
	"github.com/idemkit/idem/internal/pgerr"
	"github.com/idemkit/idem/internal/protocol"
	"github.com/idemkit/idem/internal/sqldriver"
)

// idemsql runs the claim protocol (internal/protocol) on the shared
// database/sql driver (internal/sqldriver), for PostgreSQL through lib/pq or
// pgx's stdlib driver: statements run one after the other on the *sql.Tx,
// and fn receives that *sql.Tx itself. The SQL is PostgreSQL's dialect, the
// same as the pgx driver's.

// dialect is the SQL every call of this package runs.
var dialect = postgres.Dialect

// sqlErrors classifies the errors of PostgreSQL's database/sql drivers.
type sqlErrors struct{}

func (sqlErrors) Retryable(err error) bool { return idem.IsRetryable(err) }

func (sqlErrors) LockTimeout(err error) bool { return pgerr.Code(err) == pgerr.LockNotAvailable }

func (sqlErrors) Closed(err error) (string, bool) { return sqldriver.Closed(err) }

// closedHandle explains an error of a closed *sql.DB or an ended *sql.Tx.
func closedHandle(op string, err error) error {
	return protocol.ClosedHandle(op, err, sqlErrors{}.Closed)
}

// flavor is what the shared database/sql driver needs of PostgreSQL's
// database/sql drivers.
var flavor = &sqldriver.Flavor{
	Name:          "idemsql",
	Errors:        sqlErrors{},
	CommitUnknown: commitUnknown,
	Unavailable:   unavailable,
	TxOptions: func(opts any) (sql.TxOptions, string, error) {
		return sqldriver.TxOptions("idemsql", opts, true)
	},
}

// unavailable reports that an attempt failed because the database could
// not serve it (pgerr.CannotServe), or that a dial failed through lib/pq.
// database/sql's driver.ErrBadConn is not enough: lib/pq answers it for a
// session the server ended for any reason, the hold timeout's among them,
// without saying which.
func unavailable(err error) bool {
	var oe *net.OpError
	return pgerr.CannotServe(err) || (errors.As(err, &oe) && oe.Op == "dial" &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded))
}

// commitUnknown reports that a failed COMMIT may have committed.
func commitUnknown(err error) bool {
	if pgerr.SessionEnded(err) {
		return true // the server ended the session: COMMIT may have run first
	}
	// The server answered, or nothing was sent: nothing committed. (pgx
	// reports "conn closed", safe to retry, for a connection that a failed
	// read closed while COMMIT was in flight.) Otherwise the connection
	// failed, or the context ended, while COMMIT was in flight (pgx's
	// stdlib driver runs it under the transaction's context): it may have
	// committed.
	return !(pgerr.Code(err) != "" || errors.Is(err, pgx.ErrTxCommitRollback) ||
		(pgconn.SafeToRetry(err) && !errors.Is(err, pgconn.ErrConnClosed)))
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
func querierOf(db DBTX) protocol.Querier { return flavor.Querier(db) }

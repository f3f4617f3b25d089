package idemmysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem"
	dialects "github.com/idemkit/idem/internal/dialect/mysql"
	"github.com/idemkit/idem/internal/protocol"
	"github.com/idemkit/idem/internal/sqldriver"
)

// idemmysql runs the claim protocol (internal/protocol) on the shared
// database/sql driver (internal/sqldriver) with go-sql-driver/mysql, in the
// MySQL dialect (internal/dialect/mysql).

// mysqlErrors classifies go-sql-driver/mysql's errors.
type mysqlErrors struct{}

// Retryable: a deadlock or a snapshot conflict, after which the server has
// rolled the whole transaction back, or any error idem.IsRetryable knows.
func (mysqlErrors) Retryable(err error) bool { return dialects.Aborted(err) || idem.IsRetryable(err) }

// LockTimeout: a claim whose wait was bounded on the server met a holder
// (no-wait, or a lease claim's short bound).
func (mysqlErrors) LockTimeout(err error) bool {
	n := dialects.Number(err)
	return n == dialects.ErLockWaitTimeout || n == dialects.ErNoWait || n == dialects.ErStatementTimeout
}

func (mysqlErrors) Closed(err error) (string, bool) { return sqldriver.Closed(err) }

// flavor is what the shared database/sql driver needs of MySQL.
var flavor = &sqldriver.Flavor{
	Name:          "idemmysql",
	Errors:        mysqlErrors{},
	Bind:          dialects.Bind,
	CommitUnknown: commitUnknown,
	Aborted:       dialects.Aborted,
	Prepare:       true,
	TxOptions: func(opts any) (sql.TxOptions, string, error) {
		return sqldriver.TxOptions("idemmysql", opts, false)
	},
}

// commitUnknown reports that a failed COMMIT may have committed: not when
// the server answered with an error, nor when go-sql-driver reports
// driver.ErrBadConn (it does so only when it wrote nothing); any other
// failure (a connection lost with COMMIT in flight, a context that ended)
// may have committed.
func commitUnknown(err error) bool {
	var me *mysql.MySQLError
	return !errors.As(err, &me) && !errors.Is(err, driver.ErrBadConn)
}

// The dialect of the server this process talks to, asked of the first
// handle a call is given.
var (
	serverMu sync.Mutex
	server   atomic.Pointer[protocol.Dialect]
)

// dialectOf returns the dialect of the server behind q, asking it the
// first time: MariaDB or MySQL. idemmysql assumes that one process talks to
// one kind of server.
func dialectOf(ctx context.Context, q sqldriver.Querier) (*protocol.Dialect, error) {
	if d := server.Load(); d != nil {
		return d, nil
	}
	serverMu.Lock()
	defer serverMu.Unlock()
	if d := server.Load(); d != nil {
		return d, nil
	}
	var version string
	if err := q.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&version); err != nil {
		return nil, fmt.Errorf("idemmysql: asking the server's version: %w", err)
	}
	d := dialects.MySQL8
	if strings.Contains(strings.ToLower(version), "mariadb") {
		d = dialects.MariaDB
	}
	server.Store(d)
	return d, nil
}

// wrap gives an error with which the server rolled the transaction back the
// SQLSTATE 40001 that idem.IsRetryable knows (go-sql-driver's error has no
// SQLState method), and says the transaction is gone. Other errors are
// returned as they are.
func wrap(err error) error {
	var aborted *sqldriver.AbortedError
	if err == nil || !dialects.Aborted(err) || errors.As(err, new(*TxAbortedError)) {
		return err
	}
	if errors.As(err, &aborted) {
		return &TxAbortedError{Err: aborted.Err}
	}
	return &TxAbortedError{Err: err}
}

// TxAbortedError is the error of a call whose transaction the server rolled
// back as a whole: a deadlock (1213), or a snapshot conflict (MariaDB's
// 1020). It reports SQLSTATE 40001, so idem.IsRetryable is true. Do retries
// such attempts itself; after WithIdempotency or ConsumeOnce, roll the
// *sql.Tx back and run the transaction again: database/sql does not know
// the transaction is gone, and would run further statements outside any
// transaction and report Commit as a success.
type TxAbortedError struct {
	Err error
}

func (e *TxAbortedError) Error() string {
	return "idemmysql: the server rolled the transaction back; roll it back and run it again: " + e.Err.Error()
}

func (e *TxAbortedError) Unwrap() error { return e.Err }

// SQLState returns 40001, a transaction to run again.
func (e *TxAbortedError) SQLState() string { return "40001" }

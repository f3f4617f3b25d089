package idemgrpc

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// Driver is the database the server interceptor runs each call's
// transaction on, with the type of transaction its handlers receive: Pgx for
// pgx, SQL for PostgreSQL through database/sql, MySQL for MySQL and MariaDB.
// The interceptor records its responses as bytes, so a Driver runs functions
// that return []byte.
type Driver[TTx any] interface {
	// Do runs fn at most once per key in a transaction of its own, as
	// idem.Do does, and returns its recorded bytes.
	Do(ctx context.Context, key idem.Key, fn func(ctx context.Context, tx TTx) ([]byte, error), opts ...idem.DoOption) (idem.Result[[]byte], error)
	// Aborted reports whether a statement failed in tx, so that nothing of
	// it can commit, when the driver can tell; otherwise false, and the
	// completion reports it (SQLSTATE 25P02).
	Aborted(tx TTx) bool
}

// Pgx is the Driver of a pgx database: a *pgxpool.Pool, a *pgx.Conn, or
// another idem.TxBeginner, idemhttp.Pgx's. Handlers reach the call's
// transaction with Tx. A nil db gives a nil Driver, which
// UnaryServerInterceptor refuses.
func Pgx(db idem.TxBeginner) Driver[pgx.Tx] {
	if d := idemhttp.Pgx(db); d != nil {
		return d
	}
	return nil
}

// SQL is the Driver of a PostgreSQL database through database/sql (pgx's
// stdlib driver, or lib/pq), idemhttp.SQL's: the handler's transaction is a
// *sql.Tx, which it reaches with SQLTx. A nil db gives a nil Driver, which
// UnaryServerInterceptor refuses.
func SQL(db *sql.DB) Driver[*sql.Tx] {
	if d := idemhttp.SQL(db); d != nil {
		return d
	}
	return nil
}

// MySQL is the Driver of a MySQL or MariaDB database (go-sql-driver/mysql),
// idemhttp.MySQL's: the handler's transaction is a *sql.Tx, which it
// reaches with SQLTx. A duplicate in flight is answered Aborted at once on
// MariaDB; on MySQL 8, which idemmysql's no-wait claims do not serve, set
// Config.Wait. There is no hold timeout (Config.HoldTimeout). A nil db
// gives a nil Driver, which UnaryServerInterceptor refuses.
func MySQL(db *sql.DB) Driver[*sql.Tx] {
	if db == nil {
		return nil
	}
	return mysqlDriver{idemhttp.MySQL(db)}
}

// mysqlDriver is idemhttp's MySQL Driver, marked as having no hold timeout.
type mysqlDriver struct{ Driver[*sql.Tx] }

// noHoldTimeout: idemmysql's Driver sets no hold timeout (Config.HoldTimeout).
func (mysqlDriver) noHoldTimeout() {}

// unbounded is a Driver whose database has no hold timeout.
type unbounded interface{ noHoldTimeout() }

type txKey struct{}

// Tx returns the call's transaction inside a handler behind the interceptor
// of a Pgx Driver, or nil when the call passed through without one (a
// method not covered, or no key with Config.Optional). The handler must not
// commit or roll it back.
func Tx(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{}).(pgx.Tx)
	return tx
}

// SQLTx returns the call's *sql.Tx inside a handler behind the interceptor
// of an SQL or MySQL Driver, or nil when the call passed through without
// one. The handler must not commit or roll it back.
func SQLTx(ctx context.Context) *sql.Tx {
	tx, _ := ctx.Value(txKey{}).(*sql.Tx)
	return tx
}

package idemmysql

import (
	"context"
	"fmt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/protocol"
)

// InsertOrGet creates a row once per business key, as idem.InsertOrGet
// does on PostgreSQL: a duplicate sign-up gets the existing row, never an
// error. insert is a plain INSERT of the row, written with ? placeholders
// and run as written; on MariaDB it may end in RETURNING the lookup's
// columns, which saves the lookup when the row is new. lookup is a SELECT
// of those columns by the same business key, ending in LOCK IN SHARE MODE
// (MariaDB rejects FOR SHARE):
//
//	insert: INSERT INTO signup_record (user_id, activity_id) VALUES (?, ?)
//	lookup: SELECT id, created_at FROM signup_record
//	        WHERE user_id = ? AND activity_id = ? LOCK IN SHARE MODE
//
// When insert creates the row, created is true and dest receives the row:
// from RETURNING, or from lookup. When the business key's unique index
// refuses it (error 1062), lookup's row is scanned into dest and created is
// false. A creator still in flight makes insert wait for its commit (1062)
// or its rollback (insert creates the row).
//
// db is a *sql.DB or *sql.Conn, where each statement commits on its own, or
// the caller's *sql.Tx: a 1062 rolls back the INSERT alone, so tx stays
// usable and nothing of it is undone. In a transaction, lookup must be a
// locking read: under REPEATABLE READ (InnoDB's default) a plain SELECT
// reads the transaction's snapshot, which may predate the existing row's
// commit and miss it; LOCK IN SHARE MODE reads the latest commit, and its
// shared lock goes with the one the 1062 left, so that concurrent
// duplicates do not deadlock. A conflict whose row lookup cannot see, twice
// in a row, is an error matching idem.IsRetryable (SQLSTATE 40001): retry
// the transaction. A deadlock that ends tx is a *TxAbortedError.
//
// A nil db, or an insert or lookup without SQL, is an idem.ErrInvalidOption
// before any SQL.
func InsertOrGet(ctx context.Context, db DBTX, insert, lookup idem.Query, dest ...any) (created bool, err error) {
	if handle.Missing(db) || insert.SQL == "" || lookup.SQL == "" {
		return false, fmt.Errorf("%w: InsertOrGet needs a database, an insert and a lookup", idem.ErrInvalidOption)
	}
	d, err := dialectOf(ctx, db)
	if err != nil {
		return false, closedHandle("InsertOrGet", err)
	}
	created, err = protocol.InsertOrGetPlain(ctx, d, mysqlErrors{}, flavor.Querier(db), protocol.Query(insert), protocol.Query(lookup), dest)
	return created, wrap(err)
}

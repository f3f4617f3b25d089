package idemsql

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/protocol"
)

// InsertOrGet creates a row once per business key, as idem.InsertOrGet
// does on pgx. insert must be an INSERT ... ON CONFLICT DO NOTHING
// RETURNING cols; lookup a SELECT of the same cols by the same business
// key, which a unique constraint or index must cover. When insert returns
// the row, it is scanned into dest and created is true. When the unique
// constraint says the row exists (insert returns nothing), lookup's row is
// scanned instead and created is false: a duplicate sign-up gets the
// existing row, not an error. If the row vanishes between the two (a
// concurrent delete), it tries again.
//
// db may be a *sql.DB, a *sql.Conn or a *sql.Tx. insert and lookup run on
// it one after the other; on a *sql.DB each on its own, possibly on
// different connections. No statement fails on a duplicate, so a caller's
// transaction is never aborted by one. A concurrent creator that has not
// committed yet makes insert wait for it; once it has committed, lookup
// (under READ COMMITTED, PostgreSQL's default) sees its row. Under
// REPEATABLE READ or SERIALIZABLE a row committed after the transaction's
// snapshot fails with SQLSTATE 40001 (idem.IsRetryable). For a plain INSERT
// in a transaction of yours, use InsertOrGetTx. A nil db, or an insert or
// lookup without SQL, is an idem.ErrInvalidOption.
func InsertOrGet(ctx context.Context, db DBTX, insert, lookup idem.Query, dest ...any) (created bool, err error) {
	if handle.Missing(db) || insert.SQL == "" || lookup.SQL == "" {
		return false, fmt.Errorf("%w: InsertOrGet needs a database, an insert and a lookup", idem.ErrInvalidOption)
	}
	return protocol.InsertOrGet(ctx, sqlErrors{}, querierOf(db), protocol.Query(insert), protocol.Query(lookup), dest)
}

// InsertOrGetTx is InsertOrGet inside the caller's transaction tx, for a
// plain INSERT ... RETURNING too (one the caller cannot change to ON
// CONFLICT DO NOTHING), as idem.InsertOrGetTx does on pgx: the insert runs
// in a savepoint of tx, and a unique violation (SQLSTATE 23505) rolls back
// to it and runs lookup instead, leaving tx usable. Other errors from
// insert are returned after the savepoint is rolled back, so tx stays
// usable then too. Under REPEATABLE READ or SERIALIZABLE, a row committed
// after tx's snapshot yields an error matching idem.IsRetryable (SQLSTATE
// 40001): retry the transaction. A nil tx, one already committed or rolled
// back, or an insert or lookup without SQL, is an idem.ErrInvalidOption.
func InsertOrGetTx(ctx context.Context, tx *sql.Tx, insert, lookup idem.Query, dest ...any) (created bool, err error) {
	if tx == nil || insert.SQL == "" || lookup.SQL == "" {
		return false, fmt.Errorf("%w: InsertOrGetTx needs a transaction, an insert and a lookup", idem.ErrInvalidOption)
	}
	return protocol.InsertOrGetTx(ctx, dialect, sqlErrors{}, flavor.NewTx(tx), nil, protocol.Query(insert), protocol.Query(lookup), dest)
}

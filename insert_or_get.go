package idem

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/pgerr"
	"github.com/idemkit/idem/internal/protocol"
)

// Query is one SQL statement with its arguments.
type Query struct {
	// SQL is the statement; values go in as $1, $2, ... placeholders.
	SQL string
	// Args are the values of the placeholders, in order.
	Args []any
}

// InsertOrGet creates a row once per business key. insert must be an
// INSERT ... ON CONFLICT DO NOTHING RETURNING cols; lookup a SELECT of the
// same cols by the same business key. When insert returns the row, it is
// scanned into dest and created is true. When a unique constraint says the
// row exists (insert returns nothing), lookup's row is scanned instead and
// created is false: a duplicate sign-up gets the existing row, not an error.
// If the row vanishes between the two (a concurrent delete), it tries again.
//
// No statement fails on a duplicate, so a caller's transaction is never
// aborted by one. A concurrent creator that has not committed yet makes
// insert wait for it. Under REPEATABLE READ or SERIALIZABLE a row committed
// after the transaction's snapshot fails with SQLSTATE 40001 (IsRetryable).
// db may be a pool, a connection or a transaction.
func InsertOrGet(ctx context.Context, db DBTX, insert, lookup Query, dest ...any) (created bool, err error) {
	if handle.Missing(db) || insert.SQL == "" || lookup.SQL == "" {
		return false, fmt.Errorf("%w: InsertOrGet needs a database, an insert and a lookup", ErrInvalidOption)
	}
	return protocol.InsertOrGet(ctx, pgxErrors{}, pgxQuerier{db: db}, protocol.Query(insert), protocol.Query(lookup), dest)
}

// InsertOrGetTx is InsertOrGet for a plain INSERT ... RETURNING that the
// caller cannot change to ON CONFLICT DO NOTHING: the insert runs in a
// savepoint inside tx, and a unique violation (SQLSTATE 23505) rolls back to
// it and runs lookup instead, leaving tx usable. Other errors from insert are
// returned after the savepoint is rolled back, so tx stays usable then too.
// Under REPEATABLE READ or SERIALIZABLE, a row committed after the snapshot
// yields an error matching IsRetryable (SQLSTATE 40001).
func InsertOrGetTx(ctx context.Context, tx pgx.Tx, insert, lookup Query, dest ...any) (created bool, err error) {
	if handle.Missing(tx) || insert.SQL == "" || lookup.SQL == "" {
		return false, fmt.Errorf("%w: InsertOrGetTx needs a transaction, an insert and a lookup", ErrInvalidOption)
	}
	gone := func() bool { c := tx.Conn(); return c != nil && c.IsClosed() }
	created, err = protocol.InsertOrGetTx(ctx, dialect, pgxErrors{}, pgxTx{tx: tx}, gone, protocol.Query(insert), protocol.Query(lookup), dest)
	var snap *protocol.SnapshotError
	if errors.As(err, &snap) {
		// As pgx reports a serialization failure of the server's.
		return false, &pgconn.PgError{Code: pgerr.SerializationFailure, Message: protocol.SnapshotMessage}
	}
	return created, err
}

// UniqueViolation reports whether err is a unique violation (SQLSTATE
// 23505), and the name of the constraint or index that was violated. The
// SQLSTATE is recognised from any driver whose error has a SQLState method
// (lib/pq through database/sql); the name only from pgx's *pgconn.PgError,
// and it is "" otherwise.
func UniqueViolation(err error) (constraint string, ok bool) {
	if pgerr.Code(err) != pgerr.UniqueViolation {
		return "", false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.ConstraintName, true
	}
	return "", true
}

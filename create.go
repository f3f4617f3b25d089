package idem

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Query is one SQL statement with its arguments.
type Query struct {
	SQL  string
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
	if db == nil || insert.SQL == "" || lookup.SQL == "" {
		return false, fmt.Errorf("%w: InsertOrGet needs a database, an insert and a lookup", ErrInvalidOption)
	}
	for range maxClaimTries {
		err := db.QueryRow(ctx, insert.SQL, insert.Args...).Scan(dest...)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return false, err
		}
		err = db.QueryRow(ctx, lookup.SQL, lookup.Args...).Scan(dest...)
		if err == nil {
			return false, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return false, err
		}
	}
	return false, errors.New("idem: InsertOrGet: the row kept vanishing between the insert and the lookup")
}

// spCreate is InsertOrGetTx's savepoint.
const spCreate = "idem_create"

// InsertOrGetTx is InsertOrGet for a plain INSERT ... RETURNING that the
// caller cannot change to ON CONFLICT DO NOTHING: the insert runs in a
// savepoint inside tx, and a unique violation (SQLSTATE 23505) rolls back to
// it and runs lookup instead, leaving tx usable. Other errors from insert are
// returned after the savepoint is rolled back, so tx stays usable then too.
func InsertOrGetTx(ctx context.Context, tx pgx.Tx, insert, lookup Query, dest ...any) (created bool, err error) {
	if tx == nil || insert.SQL == "" || lookup.SQL == "" {
		return false, fmt.Errorf("%w: InsertOrGetTx needs a transaction, an insert and a lookup", ErrInvalidOption)
	}
	for range maxClaimTries {
		b := &pgx.Batch{}
		b.Queue("SAVEPOINT " + spCreate)
		b.Queue(insert.SQL, insert.Args...).QueryRow(func(r pgx.Row) error { return r.Scan(dest...) })
		b.Queue("RELEASE SAVEPOINT " + spCreate)
		err := tx.SendBatch(ctx, b).Close()
		if err == nil {
			return true, nil
		}
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			// The insert ran and returned nothing (it had its own ON
			// CONFLICT DO NOTHING); the savepoint is released already.
		case pgCode(err) == "":
			return false, err // not a statement error: the connection is gone
		default:
			// The server skipped the RELEASE after the failed insert.
			if rerr := rollbackTo(ctx, tx, spCreate); rerr != nil {
				return false, errors.Join(err, rerr)
			}
			if _, ok := UniqueViolation(err); !ok {
				return false, err
			}
		}
		err = tx.QueryRow(ctx, lookup.SQL, lookup.Args...).Scan(dest...)
		if err == nil {
			return false, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return false, err
		}
	}
	return false, errors.New("idem: InsertOrGetTx: the row kept vanishing between the insert and the lookup")
}

// UniqueViolation reports whether err is a unique violation (SQLSTATE
// 23505), and the name of the constraint or index that was violated.
func UniqueViolation(err error) (constraint string, ok bool) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == sqlstateUniqueViolation {
		return pgErr.ConstraintName, true
	}
	return "", false
}

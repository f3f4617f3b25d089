package idem

import (
	"github.com/idemkit/idem/internal/protocol"

	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/pgerr"
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
	for range protocol.MaxClaimTries {
		err := db.QueryRow(ctx, insert.SQL, insert.Args...).Scan(dest...)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return false, closedHandle("InsertOrGet", err)
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
// Under REPEATABLE READ or SERIALIZABLE, a row committed after the snapshot
// yields an error matching IsRetryable (SQLSTATE 40001).
func InsertOrGetTx(ctx context.Context, tx pgx.Tx, insert, lookup Query, dest ...any) (created bool, err error) {
	if handle.Missing(tx) || insert.SQL == "" || lookup.SQL == "" {
		return false, fmt.Errorf("%w: InsertOrGetTx needs a transaction, an insert and a lookup", ErrInvalidOption)
	}
	for range protocol.MaxClaimTries {
		inserted := false
		b := &pgx.Batch{}
		b.Queue("SAVEPOINT " + spCreate)
		b.Queue(insert.SQL, insert.Args...).QueryRow(func(r pgx.Row) error {
			err := r.Scan(dest...)
			inserted = err == nil
			if errors.Is(err, pgx.ErrNoRows) {
				return nil // it had its own ON CONFLICT DO NOTHING
			}
			return err
		})
		err := closedHandle("InsertOrGetTx", tx.SendBatch(ctx, b).Close())
		if err == nil && inserted {
			// Released only now, so that a failed scan is rolled back too.
			if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT "+spCreate); err != nil {
				return false, err
			}
			return true, nil
		}
		if err != nil && pgerr.Code(err) == "" && tx.Conn() != nil && tx.Conn().IsClosed() {
			return false, err // the connection is gone
		}
		if rerr := rollbackTo(ctx, tx, spCreate); rerr != nil {
			return false, errors.Join(err, rerr)
		}
		if err != nil {
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
		// The row that conflicted is not visible: deleted since, or, under
		// REPEATABLE READ and SERIALIZABLE, committed after the snapshot.
		var iso string
		if err := tx.QueryRow(ctx, "SELECT current_setting('transaction_isolation')").Scan(&iso); err != nil {
			return false, err
		}
		if iso != "read committed" {
			return false, &pgconn.PgError{Code: pgerr.SerializationFailure,
				Message: "idem: InsertOrGetTx: the existing row was committed after this transaction's snapshot; retry the transaction"}
		}
	}
	return false, errors.New("idem: InsertOrGetTx: the row kept vanishing between the insert and the lookup")
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

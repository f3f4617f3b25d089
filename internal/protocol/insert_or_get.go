package protocol

import (
	"context"
	"errors"
)

// Create once: InsertOrGet and InsertOrGetTx.
//
// The business key's unique constraint is the lock: an insert that meets a
// concurrent creator still in flight waits for it. When the insert creates
// nothing (ON CONFLICT DO NOTHING) or fails with a unique violation (in a
// savepoint), the lookup reads the row that exists. A row that vanished in
// between (deleted since) sends the call around again, at most
// MaxClaimTries times.

// Query is idem.Query, field for field.
type Query struct {
	SQL  string
	Args []any
}

// spCreate is InsertOrGetTx's savepoint.
const spCreate = "idem_create"

// SnapshotError is InsertOrGetTx's answer when the row that conflicted is
// not visible to a REPEATABLE READ or SERIALIZABLE transaction: it was
// committed after the transaction's snapshot. It carries SQLSTATE 40001, so
// that the transaction is retried as for any serialization failure. The pgx
// front turns it into a *pgconn.PgError.
type SnapshotError struct{}

// SnapshotMessage is SnapshotError's message.
const SnapshotMessage = "idem: InsertOrGetTx: the existing row was committed after this transaction's snapshot; retry the transaction"

// Error says what happened, with the SQLSTATE.
func (*SnapshotError) Error() string {
	return SnapshotMessage + " (SQLSTATE " + serializationFailure + ")"
}

// SQLState returns 40001.
func (*SnapshotError) SQLState() string { return serializationFailure }

// serializationFailure is the SQL standard's SQLSTATE of a transaction that
// must be retried.
const serializationFailure = "40001"

// destOf is dest as a Stmt's Dest: never nil, so that the statement's row is
// scanned (and a mismatch of columns reported) even with no destination.
func destOf(dest []any) []any {
	if dest == nil {
		return []any{}
	}
	return dest
}

// InsertOrGet creates a row once per business key (idem.InsertOrGet):
// insert is an INSERT ... ON CONFLICT DO NOTHING RETURNING, lookup a SELECT
// of the same columns. Each statement runs on db on its own: on a pool or
// database, in a transaction of its own, and then the lookup, under READ
// COMMITTED, sees the row whose creator the insert waited for. created
// reports that insert returned the row. The front checks db, insert and
// lookup first.
func InsertOrGet(ctx context.Context, e Errors, db Querier, insert, lookup Query, dest []any) (created bool, err error) {
	dest = destOf(dest)
	for range MaxClaimTries {
		var found bool
		if err := db.Run(ctx, Stmt{SQL: insert.SQL, Args: insert.Args, Dest: dest, Found: &found}); err != nil {
			return false, ClosedHandle("InsertOrGet", err, e.Closed)
		}
		if found {
			return true, nil
		}
		if err := db.Run(ctx, Stmt{SQL: lookup.SQL, Args: lookup.Args, Dest: dest, Found: &found}); err != nil {
			return false, err
		}
		if found {
			return false, nil
		}
	}
	return false, errors.New("idem: InsertOrGet: the row kept vanishing between the insert and the lookup")
}

// InsertOrGetTx is InsertOrGet for a plain INSERT ... RETURNING, in the
// caller's transaction tx (idem.InsertOrGetTx): the insert runs in
// savepoint spCreate, and a unique violation (the dialect's Unique) rolls back to
// it and runs lookup instead. Any other error of insert is returned after
// the savepoint is rolled back, so tx stays usable. gone, when not nil,
// reports that tx's connection is closed: a failure then is returned
// without trying to roll back. Under REPEATABLE READ or SERIALIZABLE, a
// conflicting row committed after the snapshot is a *SnapshotError.
func InsertOrGetTx(ctx context.Context, d *Dialect, e Errors, tx Exec, gone func() bool, insert, lookup Query, dest []any) (created bool, err error) {
	dest = destOf(dest)
	for range MaxClaimTries {
		var inserted bool
		err := tx.Run(ctx,
			Stmt{SQL: "SAVEPOINT " + spCreate},
			// A row scanned into dest; none means that insert had an ON
			// CONFLICT DO NOTHING of its own.
			Stmt{SQL: insert.SQL, Args: insert.Args, Dest: dest, Found: &inserted})
		if err == nil && inserted {
			// Released only now, so that a failed scan is rolled back too.
			if err := tx.Run(ctx, Stmt{SQL: "RELEASE SAVEPOINT " + spCreate}); err != nil {
				return false, err
			}
			return true, nil
		}
		if err != nil {
			if what, _ := e.Closed(err); what != "" {
				// An ended transaction or a closed database: nothing to
				// roll back.
				return false, ClosedHandle("InsertOrGetTx", err, e.Closed)
			}
			if gone != nil && gone() {
				return false, err // the connection is gone: nothing to roll back
			}
		}
		rerr := tx.Run(ctx, d.RollbackTo(spCreate)...)
		if rerr != nil {
			return false, errors.Join(err, rerr)
		}
		if err != nil && !d.Unique(err) {
			return false, err
		}
		var found bool
		if err := tx.Run(ctx, Stmt{SQL: lookup.SQL, Args: lookup.Args, Dest: dest, Found: &found}); err != nil {
			return false, err
		}
		if found {
			return false, nil
		}
		// The row that conflicted is not visible: deleted since, or, under
		// REPEATABLE READ and SERIALIZABLE, committed after the snapshot.
		var readCommitted bool
		if err := tx.Run(ctx, Stmt{SQL: d.ReadCommittedNow, Dest: []any{&readCommitted}}); err != nil {
			return false, err
		}
		if !readCommitted {
			return false, &SnapshotError{}
		}
	}
	return false, errors.New("idem: InsertOrGetTx: the row kept vanishing between the insert and the lookup")
}

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
type SnapshotError struct {
	// Msg, when set, replaces SnapshotMessage.
	Msg string
}

// SnapshotMessage is SnapshotError's message.
const SnapshotMessage = "idem: InsertOrGetTx: the existing row was committed after this transaction's snapshot; retry the transaction"

// Error says what happened, with the SQLSTATE.
func (e *SnapshotError) Error() string {
	msg := SnapshotMessage
	if e.Msg != "" {
		msg = e.Msg
	}
	return msg + " (SQLSTATE " + serializationFailure + ")"
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
		if err := db.Run(ctx, Stmt{SQL: insert.SQL, Args: insert.Args, Dest: dest, Found: &found, Raw: true}); err != nil {
			return false, ClosedHandle("InsertOrGet", err, e.Closed)
		}
		if found {
			return true, nil
		}
		if err := db.Run(ctx, Stmt{SQL: lookup.SQL, Args: lookup.Args, Dest: dest, Found: &found, Raw: true}); err != nil {
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
			Stmt{SQL: insert.SQL, Args: insert.Args, Dest: dest, Found: &inserted, Raw: true})
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
		if err := tx.Run(ctx, Stmt{SQL: lookup.SQL, Args: lookup.Args, Dest: dest, Found: &found, Raw: true}); err != nil {
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

// PlainSnapshotMessage is InsertOrGetPlain's SnapshotError message.
const PlainSnapshotMessage = "idem: InsertOrGet: the existing row is not visible to this transaction's snapshot; read it with a locking lookup (LOCK IN SHARE MODE), or retry the transaction"

// InsertOrGetPlain creates a row once per business key on a database where
// a failed statement is rolled back alone and the transaction goes on
// (InnoDB): insert is a plain INSERT, with RETURNING of the lookup's
// columns where the server has it, and a unique violation of it (the
// dialect's Unique) means the row exists, so lookup reads it. No savepoint
// is needed, so it serves a pool, a connection and a transaction alike.
// An insert that returned no row (no RETURNING) created the row: lookup
// reads it. In the caller's transaction, a conflict whose row lookup cannot
// see twice in a row is a *SnapshotError: under REPEATABLE READ a plain
// SELECT reads the snapshot, which predates the row; a locking lookup
// reads the latest commit. On a pool each statement is a transaction of
// its own, and a row that vanished sends the call around again.
func InsertOrGetPlain(ctx context.Context, d *Dialect, e Errors, db Querier, insert, lookup Query, dest []any) (created bool, err error) {
	dest = destOf(dest)
	read := func() (bool, error) {
		var found bool
		err := db.Run(ctx, Stmt{SQL: lookup.SQL, Args: lookup.Args, Dest: dest, Found: &found, Raw: true})
		return found, err
	}
	missed := false
	for range MaxClaimTries {
		var returned bool
		err := db.Run(ctx, Stmt{SQL: insert.SQL, Args: insert.Args, Dest: dest, Found: &returned, Raw: true})
		if err == nil {
			if returned {
				return true, nil
			}
			found, err := read()
			if err == nil && !found {
				err = errors.New("idem: InsertOrGet: the row was created, and deleted before the lookup could read it")
			}
			return true, err
		}
		if !d.Unique(err) {
			return false, ClosedHandle("InsertOrGet", err, e.Closed)
		}
		found, err := read()
		if err != nil {
			return false, err
		}
		if found {
			return false, nil
		}
		if db.InTx() {
			if missed {
				return false, &SnapshotError{Msg: PlainSnapshotMessage}
			}
			missed = true
		}
	}
	return false, errors.New("idem: InsertOrGet: the row kept vanishing between the insert and the lookup")
}

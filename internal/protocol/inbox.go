package protocol

import (
	"context"
	"errors"
	"fmt"
)

// Consume once: the inbox.
//
// A delivery inserts (consumer, message ID) into the inbox table with ON
// CONFLICT DO NOTHING, in savepoint spInbox of the caller's transaction.
// The primary key is the lock: a delivery that meets another one still in
// flight waits for it, then inserts nothing (it committed) or the row (it
// rolled back). Only the transaction that inserted the row runs fn; when fn
// fails, rolling back to spInbox removes the row with fn's writes.

// spInbox is ConsumeOnce's savepoint.
const spInbox = "idem_inbox"

// ConsumeOnce runs fn for a message at most once per consumer, inside the
// caller's transaction tx, and reports whether fn ran (idem.ConsumeOnce).
// The front checks consumer, messageID, tx and fn first; c gives the inbox
// table. An error of an ended tx or a closed database is explained
// (ClosedHandle), and a missing inbox table with how to create it.
//
// When fn returns an error or panics, the row and fn's writes are rolled
// back to the savepoint, which leaves tx usable, and the error is returned
// (the panic raised again).
func ConsumeOnce[TTx any](ctx context.Context, e Errors, tx Tx[TTx], consumer, messageID string,
	fn func(ctx context.Context, tx TTx) error, c *Config) (ran bool, err error) {
	defer c.ExplainMissingTable(&err)
	var (
		inserted, row bool
		n             int64
	)
	insert := Stmt{SQL: c.Inbox.Insert, Args: []any{consumer, messageID}, Dest: []any{&row}, Found: &inserted}
	if c.Inbox.InsertAffects {
		insert = Stmt{SQL: c.Inbox.Insert, Args: insert.Args, Affected: &n}
	}
	err = tx.Run(ctx, Stmt{SQL: "SAVEPOINT " + spInbox}, insert)
	inserted = inserted || n == 1
	if err != nil && c.D.Unique(err) && !c.D.TxAborted(err) {
		// A dialect whose insert has no ON CONFLICT clause reports the
		// duplicate as an error of that statement alone.
		if rerr := tx.Run(ctx, c.D.RollbackTo(spInbox)...); rerr != nil {
			return false, rerr
		}
		return false, nil
	}
	if err != nil {
		return false, ClosedHandle("ConsumeOnce", err, e.Closed)
	}
	if !inserted {
		// Consumed already: acknowledge it.
		if err := tx.Run(ctx, Stmt{SQL: "RELEASE SAVEPOINT " + spInbox}); err != nil {
			return false, err
		}
		return false, nil
	}

	ftx, end := tx.Fn()
	_, fnErr, panicked := CallFn(ctx, ftx, func(ctx context.Context, tx TTx) (struct{}, error) {
		return struct{}{}, fn(ctx, tx)
	})
	end()
	if fnErr != nil && c.D.TxAborted(fnErr) {
		return false, fnErr // the server rolled everything back: nothing to undo
	}
	if panicked != nil || fnErr != nil {
		cctx, cancel := CleanupContext(ctx)
		rerr := tx.Run(cctx, c.D.RollbackTo(spInbox)...)
		cancel()
		if panicked != nil {
			panic(panicked)
		}
		if rerr != nil {
			rerr = fmt.Errorf("idem: undoing the consumed message (roll the transaction back): %w", rerr)
		}
		return false, errors.Join(fnErr, rerr)
	}
	if err := tx.Run(ctx, Stmt{SQL: "RELEASE SAVEPOINT " + spInbox}); err != nil {
		return false, err
	}
	return true, nil
}

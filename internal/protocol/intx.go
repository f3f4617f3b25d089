package protocol

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// inTx claims in the caller's transaction. A claimed execution runs in
// savepoint spFn. A claim that changed an existing record (a token, a
// takeover) runs in savepoint spClaim, taken before it and kept open around
// spFn until the completion: undoing the execution rolls back to spClaim,
// which puts that record back as it was, attempt number included. A claim
// that inserted its record is undone by deleting it. A no-wait claim runs
// in spClaim too, so that one that times out leaves the transaction usable.
type inTx[TTx any] struct {
	tx  Tx[TTx]
	e   Errors
	cfg *Config
	key Key
	// changed reports that spClaim holds the execution (see above).
	changed bool
	// held (WithHoldTimeout) keeps the settings the bound replaced, put
	// back by the completion.
	held *[2]string
}

func (c *inTx[TTx]) open(ctx context.Context, st *claimStep, a *claimAnswer) error {
	outer := st.changes || c.cfg.NoWait
	stmts := make([]Stmt, 0, 6)
	if outer {
		stmts = append(stmts, Stmt{SQL: "SAVEPOINT " + spClaim})
	}
	stmts = append(stmts, claimStmts(ctx, c.cfg, st, a)...)
	if outer && !st.changes {
		stmts = append(stmts, Stmt{SQL: "RELEASE SAVEPOINT " + spClaim})
	}
	stmts = append(stmts, Stmt{SQL: "SAVEPOINT " + spFn})
	if err := c.tx.Run(ctx, stmts...); err != nil {
		if c.cfg.NoWait && c.e.LockTimeout(err) {
			// Undo the claim and its lock_timeout change together.
			if rerr := c.rollbackTo(ctx, spClaim); rerr != nil {
				return fmt.Errorf("idem: undoing a no-wait claim (roll the transaction back): %w", rerr)
			}
			return ErrInProgress
		}
		// Other errors abort the transaction and are returned as they are:
		// 40001 under REPEATABLE READ, or 55P03 when the caller's own
		// lock_timeout ended the wait for the key's holder.
		return err
	}
	c.changed = st.changes
	return nil
}

// read releases the savepoints open left and reads the record, unless the
// claim read it. It goes even when ctx is done by now, so that no savepoint
// is left behind in a transaction still usable (where a call enclosing this
// one would meet it when undoing its own).
func (c *inTx[TTx]) read(ctx context.Context, a *claimAnswer) (rec Record, found bool, err error) {
	sctx, cancel := CleanupContext(ctx)
	defer cancel()
	stmts := []Stmt{{SQL: "RELEASE SAVEPOINT " + c.outerSavepoint()}, c.cfg.Q.ReadStmt(c.key, &rec, &found)}
	if a.read {
		rec, found, stmts = a.rec, a.found, stmts[:1]
	}
	c.changed = false
	if err := c.tx.Run(sctx, stmts...); err != nil {
		return rec, false, err
	}
	return rec, found, ctx.Err()
}

// outerSavepoint is the savepoint that holds a claimed execution: spClaim
// when the claim changed an existing record, spFn otherwise. Releasing it
// releases spFn too.
func (c *inTx[TTx]) outerSavepoint() string {
	if c.changed {
		return spClaim
	}
	return spFn
}

// bound applies the hold timeout after the claim, keeping the values to
// put back at completion.
func (c *inTx[TTx]) bound(ctx context.Context, d time.Duration) error {
	var prev [2]string
	err := c.tx.Run(ctx, Stmt{SQL: c.cfg.D.HoldRead, Dest: []any{&prev[0], &prev[1]}}, Stmt{SQL: c.cfg.D.HoldSet, Args: []any{HoldMillis(d)}})
	if err != nil {
		return fmt.Errorf("idem: applying the hold timeout: %w", err)
	}
	c.held = &prev
	return nil
}

func (c *inTx[TTx]) fn() (TTx, func()) { return c.tx.Fn() }

// complete records the execution's outcome and releases its savepoints (and
// puts back the settings a hold timeout replaced) in one round trip. The
// savepoints are released after the completion, so that a failed completion
// can still be undone with them, as it is then: a caller who commits anyway
// cannot commit fn's writes without their record.
func (c *inTx[TTx]) complete(ctx context.Context, status string, data []byte, attempt int32, cause error) error {
	stmts := make([]Stmt, 0, 3)
	stmts = append(stmts, c.cfg.completeStmt(c.key, status, data, attempt))
	if c.held != nil {
		stmts = append(stmts, Stmt{SQL: c.cfg.D.HoldRestore, Args: []any{c.held[0], c.held[1]}})
	}
	stmts = append(stmts, Stmt{SQL: "RELEASE SAVEPOINT " + c.outerSavepoint()})
	err := c.tx.Run(ctx, stmts...)
	if err == nil {
		return nil
	}
	if cause != nil {
		// Not recorded: this must not look like a recorded business
		// outcome, so the failure is reported by message only.
		err = fmt.Errorf("idem: recording the permanent failure %q: %w", cause.Error(), err)
	} else {
		err = fmt.Errorf("idem: recording the result: %w", err)
	}
	return errors.Join(err, c.undo(ctx, attempt))
}

// dropFn rolls back fn's writes and keeps the claim, for the completion
// that records a permanent failure. ROLLBACK TO goes alone: fn may have
// left the savepoint aborted, where nothing else can be prepared.
func (c *inTx[TTx]) dropFn(ctx context.Context, attempt int32, cause error) (again bool, err error) {
	if err := c.tx.Run(ctx, Stmt{SQL: "ROLLBACK TO SAVEPOINT " + spFn}); err != nil {
		err = fmt.Errorf("idem: recording the permanent failure %q: %w", cause.Error(), err)
		return false, errors.Join(err, c.undo(ctx, attempt))
	}
	return false, nil
}

// undo undoes a claimed execution: fn's writes and the claim. It goes even
// when ctx is done.
func (c *inTx[TTx]) undo(ctx context.Context, attempt int32) error {
	ctx, cancel := CleanupContext(ctx)
	defer cancel()
	var err error
	if c.changed {
		// Rolling back to spFn first discards any savepoint opened after
		// it: a call nested in fn whose claim failed leaves its own
		// spClaim behind (in a transaction the failure aborted), which
		// ROLLBACK TO spClaim alone would resolve to.
		err = c.tx.Run(ctx, c.cfg.D.RollbackTo(spFn, spClaim)...)
	} else if err = c.rollbackTo(ctx, spFn); err == nil {
		var n int64
		err = c.tx.Run(ctx, Stmt{SQL: c.cfg.Q.Release, Args: []any{c.key.Scope, c.key.ID, attempt}, Affected: &n})
		if err == nil && n != 1 {
			err = fmt.Errorf("the claim matched %d records, not 1", n)
		}
	}
	if err != nil {
		return fmt.Errorf("idem: removing the claim after fn failed (roll the transaction back): %w", err)
	}
	return nil
}

// rollbackTo rolls back to the named savepoint and releases it, as one
// simple-protocol message where the dialect allows: in an aborted
// transaction PostgreSQL refuses to prepare any statement but a rollback.
func (c *inTx[TTx]) rollbackTo(ctx context.Context, savepoint string) error {
	return c.tx.Run(ctx, c.cfg.D.RollbackTo(savepoint)...)
}

// HoldMillis is d in whole milliseconds, rounded up.
func HoldMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

package protocol

import (
	"context"
	"errors"
	"fmt"
)

// own claims in a transaction it begins on conn: BEGIN goes in the round
// trip of each claim or takeover, and ROLLBACK in the round trip of each
// read after a conflict. When the key is claimed, tx is the open
// transaction, and complete ends it with the completion.
type own[TTx any] struct {
	conn Conn[TTx]
	e    Errors
	cfg  *Config
	key  Key
	tx   Own[TTx]
}

func (c *own[TTx]) open(ctx context.Context, st *claimStep, a *claimAnswer) error {
	stmts := claimStmts(ctx, c.cfg, st, a)
	if c.cfg.HoldTimeout > 0 {
		// After the claiming statement, so that it never bounds a wait for
		// another holder; for a claimed key only where the driver can tell
		// (pgx sends it in the claim's batch: it then also bounds the read
		// of a replay, a round trip away).
		hold := Stmt{SQL: c.cfg.D.HoldSet, Args: []any{HoldMillis(c.cfg.HoldTimeout)}, OnlyIf: &a.claimed}
		if c.cfg.Q.Tokens {
			// Claimed is the token's verdict on what the claim read
			// (drivers of such dialects run statements one at a time).
			hold.Lazy = func(*Stmt) { a.judge(true, st.token) }
		}
		stmts = append(stmts, hold)
	}
	tx, err := c.conn.Begin(ctx, stmts...)
	if err != nil {
		if c.cfg.NoWait && c.e.LockTimeout(err) {
			return ErrInProgress // the key's holder did not finish in time
		}
		return err
	}
	c.tx = tx
	return nil
}

// read reads the record, unless the claim read it, and rolls the
// transaction back.
func (c *own[TTx]) read(ctx context.Context, a *claimAnswer) (rec Record, found bool, err error) {
	tx := c.tx
	c.tx = nil
	if a.read {
		return a.rec, a.found, tx.Rollback(ctx)
	}
	err = tx.Rollback(ctx, c.cfg.Q.ReadStmt(c.key, &rec, &found))
	return rec, found, err
}

func (c *own[TTx]) fn() (TTx, func()) { return c.tx.Fn() }

// complete records the execution's outcome and commits, in one round trip.
func (c *own[TTx]) complete(ctx context.Context, status string, data []byte, attempt int32, _ error) error {
	tx := c.tx
	c.tx = nil
	unknown, err := tx.Commit(ctx, c.cfg.completeStmt(c.key, status, data, attempt))
	if err == nil {
		return nil
	}
	tx.End(ctx)
	var notSent *NotSentError
	switch {
	case unknown:
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	case errors.As(err, &notSent):
		return notSent.Err
	}
	return fmt.Errorf("idem: commit: %w", err)
}

// dropFn rolls the whole transaction back, the claim with fn's writes: the
// permanent failure is then recorded under a new claim (again).
func (c *own[TTx]) dropFn(ctx context.Context, _ int32, cause error) (again bool, err error) {
	tx := c.tx
	c.tx = nil
	cctx, cancel := CleanupContext(ctx)
	defer cancel()
	if err := tx.Rollback(cctx); err != nil {
		// Nothing was recorded: this must not look like a recorded business
		// outcome, so the failure is reported by message only.
		return false, fmt.Errorf("idem: rolling back before recording the permanent failure %q: %w", cause.Error(), err)
	}
	return true, nil
}

// undo rolls the transaction back.
func (c *own[TTx]) undo(ctx context.Context, _ int32) error {
	c.end(ctx)
	return nil
}

// end rolls back the transaction still open, if any.
func (c *own[TTx]) end(ctx context.Context) {
	if c.tx != nil {
		c.tx.End(ctx)
		c.tx = nil
	}
}

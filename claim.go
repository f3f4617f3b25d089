package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/internal/pgerr"
)

// The claim protocol.
//
// A call claims its key with one INSERT ... ON CONFLICT DO NOTHING of a
// processing record. PostgreSQL's unique index is the lock: a second claim
// of the key waits for the transaction that holds it. When that transaction
// commits, the claim inserts nothing and the record is read (in the next
// round trip: the INSERT's snapshot predates the commit) and judged:
//
//   - a finished record is replayed; one made for another fingerprint
//     answers ErrKeyReused; a live lease answers ErrInProgress;
//   - an expired record, a processing record nobody holds, or an issued
//     token is taken over, with an UPDATE guarded by the attempt number the
//     read saw;
//   - a record that vanished in between (purged) is claimed again.
//
// Two strategies carry these steps, one per kind of transaction:
//
//   - inTx, in the caller's transaction (WithIdempotency): savepoints keep a
//     refused or failed claim away from the caller's own work;
//   - ownTx, in a transaction of idem's own on one connection (Do): every
//     claim or takeover begins the transaction in its round trip, and every
//     read after a conflict ends it in its round trip, so an execution costs
//     the round trips of a bare transaction and a replay two.

// maxClaimTries bounds the claim loop, whose every turn runs one claiming
// statement (the INSERT, or a takeover) and, when it claims nothing, the
// read: a record purged between the claim and the read, or taken over by
// another transaction first, sends the call around again. 32 turns are 16
// rounds of a claim and a takeover.
const maxClaimTries = 32

// Savepoint names. PostgreSQL resolves a repeated name to the most recent
// savepoint, so nested calls with distinct keys work.
const (
	spFn    = "idem_fn"
	spClaim = "idem_claim"
)

// claimStep is one statement that may claim the key: the INSERT, or the
// UPDATE of a token or of a record to take over. It returns the claimed
// attempt, or no attempt when it claimed nothing.
type claimStep struct {
	sql  string
	args []any
	// changes reports that the statement updates a record that existed
	// before it (an issued token, a record taken over) rather than
	// inserting one: undoing the execution must put that record back.
	changes bool
	// noWait reports a no-wait claim: it fails with SQLSTATE 55P03 when the
	// key's holder does not finish within noWaitLockTimeout.
	noWait bool
	// extra is the number of columns the statement returns after attempt
	// (the settings it put in place), which are not read.
	extra int
	// bounds reports that the statement applies the hold timeout itself.
	bounds bool
}

// scan reads the step's row into attempt, left nil when the statement
// claimed nothing.
func (st *claimStep) scan(attempt **int32) func(pgx.Row) error {
	return func(r pgx.Row) error {
		dst := []any{attempt}
		for range st.extra {
			dst = append(dst, new(any))
		}
		err := r.Scan(dst...)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	}
}

// claimStrategy runs the steps of the claim in one kind of transaction.
type claimStrategy interface {
	// first is the claim the call starts with, for its options and the
	// claim's arguments (scope, key, fingerprint, TTL).
	first(cfg *config, args []any) *claimStep
	// open runs st, opening what holds the execution: savepoints (inTx) or
	// the transaction (ownTx). When st claimed nothing, what it opened
	// stays open for read.
	open(ctx context.Context, st *claimStep) (attempt *int32, err error)
	// read reads the key's record and closes what open opened.
	read(ctx context.Context) (rec record, found bool, err error)
}

// claimKey claims key with s. It returns the claimed record, or the existing
// record to replay (succeeded, or failed with a Permanent error). Errors are
// ErrInProgress, ErrKeyReused, a *TokenError (RequireIssued), and database
// errors.
func claimKey(ctx context.Context, s claimStrategy, key Key, cfg *config) (record, error) {
	q := cfg.q
	args := []any{key.Scope, key.ID, nonNilFingerprint(key.Fingerprint), cfg.ttl.Microseconds()}
	claim := s.first(cfg, args)
	st := claim
	for try := range maxClaimTries {
		attempt, err := s.open(ctx, st)
		if err != nil {
			if try == 0 {
				err = closedHandle(cfg.op, err) // a closed pool or transaction
			}
			return record{}, err
		}
		if attempt != nil {
			if st != claim {
				cfg.emit(ctx, EventTakeover, cfg.op, key, *attempt, time.Time{}, nil)
			}
			return record{claimed: true, attempt: *attempt, status: StatusProcessing}, nil
		}
		wasTakeover := st != claim
		rec, found, err := s.read(ctx)
		if err != nil {
			return record{}, err
		}
		if cfg.requireIssued {
			if err := tokenError(found, &rec); err != nil {
				return rec, err
			}
		}
		switch {
		case !found:
			st = claim // purged after the conflict: claim again
		case !rec.fingerprintMatches(key.Fingerprint):
			return rec, ErrKeyReused
		case wasTakeover && cfg.noWait && (rec.takeable() || rec.status == StatusProcessing):
			// The no-wait takeover skipped a row another transaction holds:
			// it is taking the record over right now, or has just done so.
			return rec, ErrInProgress
		case rec.takeable():
			st = &claimStep{sql: q.takeover, args: append(args[:4:4], rec.attempt), changes: true}
			if cfg.noWait {
				st.sql = q.takeoverNoWait
			}
		case rec.status == StatusProcessing:
			return rec, ErrInProgress
		default:
			return rec, nil // finished: replay it
		}
	}
	return record{}, fmt.Errorf("idem: could not claim the key after %d tries (records vanishing under concurrent purges or takeovers)", maxClaimTries)
}

// inTx claims in the caller's transaction. A claimed execution runs in
// savepoint spFn. A claim that changed an existing record (a token, a
// takeover) runs in savepoint spClaim, taken before it and kept open around
// spFn until the completion: undoing the execution rolls back to spClaim,
// which puts that record back as it was, attempt number included. A claim
// that inserted its record is undone by deleting it.
type inTx struct {
	tx  pgx.Tx
	q   *queries
	key Key
	// changed reports that spClaim holds the execution (see above).
	changed bool
	// held (WithHoldTimeout) keeps the settings the bound replaced, put
	// back by the completion.
	held *heldSettings
}

// first is the claim in a savepoint; a no-wait claim returns the
// lock_timeout it put back.
func (c *inTx) first(cfg *config, args []any) *claimStep {
	st := &claimStep{sql: c.q.claim, args: args, changes: cfg.requireIssued, noWait: cfg.noWait}
	switch {
	case cfg.noWait && cfg.requireIssued:
		st.sql, st.extra = c.q.claimIssuedNoWait, 1
	case cfg.noWait:
		st.sql, st.extra = c.q.claimNoWait, 1
	case cfg.requireIssued:
		st.sql = c.q.claimIssued
	}
	return st
}

func (c *inTx) open(ctx context.Context, st *claimStep) (*int32, error) {
	// A no-wait claim runs in spClaim too, so that one that times out
	// leaves the transaction usable.
	outer := st.changes || st.noWait
	var attempt *int32
	b := &pgx.Batch{}
	if outer {
		b.Queue("SAVEPOINT " + spClaim)
	}
	b.Queue(st.sql, st.args...).QueryRow(st.scan(&attempt))
	if outer && !st.changes {
		b.Queue("RELEASE SAVEPOINT " + spClaim)
	}
	b.Queue("SAVEPOINT " + spFn)
	if err := c.tx.SendBatch(ctx, b).Close(); err != nil {
		if st.noWait && pgerr.Code(err) == pgerr.LockNotAvailable {
			// Undo the claim and its lock_timeout change together.
			if rerr := rollbackTo(ctx, c.tx, spClaim); rerr != nil {
				return nil, fmt.Errorf("idem: undoing a no-wait claim (roll the transaction back): %w", rerr)
			}
			return nil, ErrInProgress
		}
		// Other errors abort the transaction and are returned as they are:
		// 40001 under REPEATABLE READ, or 55P03 when the caller's own
		// lock_timeout ended the wait for the key's holder.
		return nil, err
	}
	c.changed = st.changes
	return attempt, nil
}

// read releases the savepoints open left and reads the record. It goes even
// when ctx is done by now, so that no savepoint is left behind in a
// transaction still usable (where a call enclosing this one would meet it
// when undoing its own).
func (c *inTx) read(ctx context.Context) (rec record, found bool, err error) {
	sctx, cancel := cleanupContext(ctx)
	defer cancel()
	b := &pgx.Batch{}
	b.Queue("RELEASE SAVEPOINT " + c.outerSavepoint())
	c.changed = false
	b.Queue(c.q.read, c.key.Scope, c.key.ID).QueryRow(rec.scan(&found))
	if err := c.tx.SendBatch(sctx, b).Close(); err != nil {
		return rec, false, err
	}
	return rec, found, ctx.Err()
}

// outerSavepoint is the savepoint that holds a claimed execution: spClaim
// when the claim changed an existing record, spFn otherwise. Releasing it
// releases spFn too.
func (c *inTx) outerSavepoint() string {
	if c.changed {
		return spClaim
	}
	return spFn
}

// complete records the execution's outcome and releases its savepoints (and
// puts back the settings a hold timeout replaced) in one round trip. The
// savepoints are released after the completion, so that a failed completion
// can still be undone with them.
func (c *inTx) complete(ctx context.Context, status string, data []byte, attempt int32) error {
	b := &pgx.Batch{}
	b.Queue(c.q.complete, c.key.Scope, c.key.ID, status, data, attempt)
	if c.held != nil {
		b.Queue(holdRestore, c.held.idle, c.held.statement)
	}
	b.Queue("RELEASE SAVEPOINT " + c.outerSavepoint())
	return c.tx.SendBatch(ctx, b).Close()
}

// abandon undoes a claimed execution: fn's writes and the claim. It goes
// even when ctx is done.
func (c *inTx) abandon(ctx context.Context, attempt int32) error {
	ctx, cancel := cleanupContext(ctx)
	defer cancel()
	var err error
	if c.changed {
		// Rolling back to spFn first discards any savepoint opened after
		// it: a call nested in fn whose claim failed leaves its own
		// spClaim behind (in a transaction the failure aborted), which
		// ROLLBACK TO spClaim alone would resolve to.
		_, err = c.tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+spFn+"; ROLLBACK TO SAVEPOINT "+spClaim+"; RELEASE SAVEPOINT "+spClaim)
	} else if err = rollbackTo(ctx, c.tx, spFn); err == nil {
		var tag pgconn.CommandTag
		tag, err = c.tx.Exec(ctx, c.q.release, c.key.Scope, c.key.ID, attempt)
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("the claim matched %d records, not 1", tag.RowsAffected())
		}
	}
	if err != nil {
		return fmt.Errorf("idem: removing the claim after fn failed (roll the transaction back): %w", err)
	}
	return nil
}

// rollbackTo rolls back to the named savepoint and releases it. It goes as
// one simple-protocol message: in an aborted transaction the server refuses
// to prepare any statement but a rollback, so it cannot share a batch with
// the statements that follow.
func rollbackTo(ctx context.Context, tx pgx.Tx, savepoint string) error {
	_, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+savepoint+"; RELEASE SAVEPOINT "+savepoint)
	return err
}

// ownTx claims in a transaction it begins on conn: BEGIN goes in the round
// trip of each claim or takeover, and ROLLBACK in the round trip of each
// read after a conflict. When the key is claimed, tx is the open
// transaction, and commit ends it with the completion.
type ownTx struct {
	conn *pgx.Conn
	q    *queries
	key  Key
	opts pgx.TxOptions
	// hold, when positive, bounds the rest of the transaction once the key
	// is claimed (WithHoldTimeout). It goes after the claiming statement,
	// so it never bounds a wait for another holder.
	hold time.Duration
	tx   pgx.Tx
}

// first is the claim of Do's own transaction, which puts back the
// caller's lock_timeout (no-wait) and applies the hold timeout in its own
// RETURNING, for a claimed row only: a claim that claims nothing ends the
// transaction.
func (c *ownTx) first(cfg *config, args []any) *claimStep {
	st := &claimStep{args: args, noWait: cfg.noWait, bounds: c.hold > 0}
	var issued, noWait, bounded int
	if cfg.requireIssued {
		issued = 1
	}
	if st.noWait {
		noWait, st.extra = 1, 1
	}
	if st.bounds {
		bounded = 1
		st.extra++
		st.args = append(args[:4:4], holdMillis(c.hold))
	}
	st.sql = c.q.ownClaims[issued][noWait][bounded]
	return st
}

func (c *ownTx) open(ctx context.Context, st *claimStep) (*int32, error) {
	var attempt *int32
	b := &pgx.Batch{}
	b.BeginTx(c.opts)
	b.Queue(st.sql, st.args...).QueryRow(st.scan(&attempt))
	if c.hold > 0 && !st.bounds {
		b.Queue(holdSet, holdMillis(c.hold))
	}
	br := c.conn.SendBatch(ctx, b)
	c.tx = br.Tx()
	if err := br.Close(); err != nil {
		c.end(ctx)
		if st.noWait && pgerr.Code(err) == pgerr.LockNotAvailable {
			return nil, ErrInProgress
		}
		return nil, err
	}
	return attempt, nil
}

// read reads the record and rolls the transaction back.
func (c *ownTx) read(ctx context.Context) (rec record, found bool, err error) {
	b := &pgx.Batch{}
	b.Queue(c.q.read, c.key.Scope, c.key.ID).QueryRow(rec.scan(&found))
	b.Queue("ROLLBACK")
	err = c.tx.SendBatch(ctx, b).Close()
	if err != nil {
		c.end(ctx)
	}
	return rec, found, err
}

// commit records the execution's outcome and commits, in one round trip.
func (c *ownTx) commit(ctx context.Context, status string, data []byte, attempt int32, commitSQL string) error {
	var tag pgconn.CommandTag
	b := &pgx.Batch{}
	b.Queue(c.q.complete, c.key.Scope, c.key.ID, status, data, attempt)
	b.Queue(commitSQL).Exec(func(t pgconn.CommandTag) error { tag = t; return nil })
	if err := c.tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// end rolls back the transaction, if one is still open on the connection. A
// rollback that fails closes the connection, and a pool drops it.
func (c *ownTx) end(ctx context.Context) {
	if c.tx != nil && !c.conn.IsClosed() && c.conn.PgConn().TxStatus() != 'I' {
		_ = rollback(ctx, c.tx)
	}
}

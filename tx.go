package idem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/knobs"
)

// Result is what a call with an idempotency key produced.
type Result[T any] struct {
	// Value is fn's result, or the decoded result of the execution that
	// first committed with this key.
	Value T
	// Replayed reports that Value (or the returned permanent error) comes
	// from an earlier execution's record and fn did not run.
	Replayed bool
}

// TxBeginner begins transactions: *pgxpool.Pool, *pgx.Conn and pgx.Tx (a
// savepoint) all satisfy it. Do pipelines its BEGIN and COMMIT when db is a
// *pgxpool.Pool or a *pgx.Conn.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// DBTX runs statements: *pgxpool.Pool, *pgx.Conn and pgx.Tx all satisfy it.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// maxClaimTries bounds the claim loop: a record purged between the claim and
// the read, or taken over by another transaction, sends the call around again.
const maxClaimTries = 16

// Savepoint names. PostgreSQL resolves a repeated name to the most recent
// savepoint, so nested calls with distinct keys work.
const (
	spFn    = "idem_fn"
	spClaim = "idem_claim"
)

// WithIdempotency runs fn at most once per key inside the caller's
// transaction tx, and records fn's result in the same transaction.
//
// The first call with a key inserts a processing record, runs fn inside a
// savepoint, stores the encoded result and returns it with Replayed false.
// When tx commits, record and business writes commit together; when it rolls
// back, neither exists and a retry runs fn again. A later call with the key
// does not run fn: it returns the recorded value with Replayed true. A call
// that meets a transaction still holding the key waits for it to end, then
// replays its result (or runs fn, if that transaction rolled back); with
// NoWait it returns ErrInProgress within 50ms.
//
// Errors: an invalid key returns ErrInvalidKey before any SQL; a key used
// with another Fingerprint returns ErrKeyReused; an error from fn rolls back
// fn's writes and the claim and is returned as it is; Permanent(err) rolls back
// fn's writes, records the failure and is returned again to later calls (with
// Replayed true); a panic in fn rolls back the same way and is re-raised; a
// result whose encoding exceeds WithMaxResultSize is not recorded and fails
// with ErrResultTooLarge, rolled back like an error from fn.
// After ErrInProgress, ErrKeyReused, replays and fn's own errors, tx is still
// usable, with its settings and savepoints as they were. Under REPEATABLE
// READ and SERIALIZABLE a concurrent first execution that commits first makes
// the claim fail with SQLSTATE 40001, returned unchanged (see IsRetryable); a
// lock_timeout of the caller's that ends the wait for the key's holder fails
// with SQLSTATE 55P03; such errors, and connection failures, leave tx aborted.
// When ctx is done, the error matches ctx.Err() (errors.Is), whatever the
// driver reported.
//
// fn receives tx (behind a guard that refuses Commit and Rollback) and must
// not commit or roll it back, nor call WithIdempotency with the same key.
// How long fn may hold the key is bounded only by the transaction's own
// settings unless WithHoldTimeout sets a bound.
func WithIdempotency[T any](ctx context.Context, tx pgx.Tx, key Key,
	fn func(ctx context.Context, tx pgx.Tx) (T, error), opts ...Option) (Result[T], error) {
	var zero Result[T]
	if err := key.Validate(); err != nil {
		return zero, err
	}
	if tx == nil || fn == nil {
		return zero, fmt.Errorf("%w: WithIdempotency needs a transaction and a function", ErrInvalidOption)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return zero, err
	}
	if cfg.requireIssued {
		if err := checkTokenShape(key); err != nil {
			return zero, err
		}
	}
	start := time.Now()
	res, err := withIdempotency(ctx, tx, key, fn, &cfg)
	err = holdError(&cfg, err)
	cfg.report(ctx, cmp.Or(cfg.op, "WithIdempotency"), key, start, res.Replayed, err)
	return res, withContextErr(ctx, err)
}

// withContextErr makes an error that a done ctx caused match ctx.Err(),
// whichever driver reported it: pgx returns the context's error, lib/pq the
// server's "canceling statement due to user request" (SQLSTATE 57014).
func withContextErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w: %w", cerr, err)
	}
	return err
}

// withIdempotency is WithIdempotency after the checks, without the event.
func withIdempotency[T any](ctx context.Context, tx pgx.Tx, key Key,
	fn func(ctx context.Context, tx pgx.Tx) (T, error), cfg *config) (Result[T], error) {
	var zero Result[T]
	c := claimer{tx: tx, q: cfg.q, cfg: cfg, key: key, savepoint: true}
	rec, err := c.claim(ctx, nil)
	if err != nil {
		return zero, err
	}
	if !rec.claimed {
		return replay[T](rec, cfg)
	}
	if cfg.holdTimeout > 0 {
		if c.held, err = bound(ctx, tx, cfg.holdTimeout); err != nil {
			return zero, errors.Join(err, c.abandon(ctx, rec.attempt))
		}
	}

	g := newGuard(tx)
	v, fnErr, panicked := callFn(ctx, g, fn)
	g.close()
	switch {
	case panicked != nil:
		_ = c.abandon(ctx, rec.attempt)
		panic(panicked)
	case fnErr == nil:
		data, err := encodeResult(cfg, v)
		if err != nil {
			if cerr := c.abandon(ctx, rec.attempt); cerr != nil {
				err = errors.Join(err, cerr)
			}
			return zero, err
		}
		// The savepoints are released after the completion, so that a
		// failed completion can still be undone with them.
		if _, err := c.complete(ctx, StatusSucceeded, data, rec.attempt, "RELEASE SAVEPOINT "+c.outerSavepoint()); err != nil {
			// Undo fn's writes too, so that a caller who commits anyway
			// cannot commit them without their record.
			return zero, errors.Join(fmt.Errorf("idem: recording the result: %w", err), c.abandon(ctx, rec.attempt))
		}
		return Result[T]{Value: v}, nil
	case IsPermanent(fnErr):
		// Undo fn's writes but keep the claim until the failure is
		// recorded. ROLLBACK TO goes alone: fn may have left the
		// savepoint aborted, where nothing else can be prepared.
		_, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+spFn)
		if err == nil {
			_, err = c.complete(ctx, StatusFailed, failureMessage(cfg, fnErr), rec.attempt, "RELEASE SAVEPOINT "+c.outerSavepoint())
		}
		if err != nil {
			// Not recorded: this must not look like a recorded business
			// outcome, so fnErr is reported by message only.
			err = fmt.Errorf("idem: recording the permanent failure %q: %w", fnErr.Error(), err)
			return zero, errors.Join(err, c.abandon(ctx, rec.attempt))
		}
		return zero, fnErr
	default:
		if err := c.abandon(ctx, rec.attempt); err != nil {
			return zero, errors.Join(fnErr, err)
		}
		return zero, fnErr
	}
}

// Do runs fn at most once per key in a transaction of its own: it begins a
// transaction on db, claims the key, runs fn, records the result and commits,
// all as WithIdempotency describes. On a *pgxpool.Pool or *pgx.Conn it
// pipelines BEGIN with the claim and the completion with COMMIT, so a first
// execution costs the round trips of a bare transaction that runs fn's
// statements; a replay costs two. When db is a pgx.Tx, Do works in a
// savepoint of it and leaves serialization failures to the enclosing
// transaction's owner.
//
// Serialization failures (40001) and deadlocks (40P01) are retried with
// jittered exponential backoff (WithRetry), which then usually replays the
// result the other transaction committed. WithTxOptions sets the isolation
// level. A Permanent error from fn rolls back fn's writes and commits the
// failure record in a new transaction (if another execution committed first,
// its result is returned instead).
//
// When the connection fails while COMMIT is in flight, Do cannot know whether
// the transaction committed and returns an error matching ErrOutcomeUnknown.
// Calling Do again with the same key settles it: the committed result is
// replayed, or, if nothing committed, fn runs once. When ctx is done, the
// error matches ctx.Err() (errors.Is), whatever the driver reported.
//
// By default Do sets no bound of its own on how long fn may hold the key: a
// holder that hangs with its connection open blocks the key, and every
// duplicate waiting for it, until the server's own settings (if any) end its
// transaction. WithHoldTimeout sets one that PostgreSQL enforces.
func Do[T any](ctx context.Context, db TxBeginner, key Key,
	fn func(ctx context.Context, tx pgx.Tx) (T, error), opts ...Option) (Result[T], error) {
	var zero Result[T]
	if err := key.Validate(); err != nil {
		return zero, err
	}
	if db == nil || fn == nil {
		return zero, fmt.Errorf("%w: Do needs a database and a function", ErrInvalidOption)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return zero, err
	}
	if cfg.requireIssued {
		if err := checkTokenShape(key); err != nil {
			return zero, err
		}
	}
	cfg.op = "Do"
	start := time.Now()
	var failure error // a Permanent error from an earlier attempt, to record
	_, isTx := db.(pgx.Tx)
	for attempt := 1; ; attempt++ {
		res, err := doOnce(ctx, db, key, fn, &cfg, &failure, start)
		err = holdError(&cfg, err)
		if err == nil || !IsRetryable(err) || attempt >= cfg.retry.MaxAttempts || isTx {
			// Inside an enclosing transaction (db is a pgx.Tx) a retry
			// would meet the same snapshot: that transaction must retry.
			return res, withContextErr(ctx, err)
		}
		if err := sleep(ctx, backoff(cfg.retry, attempt)); err != nil {
			return zero, err
		}
	}
}

// doOnce makes one attempt and reports its event once the attempt has
// committed (or failed).
func doOnce[T any](ctx context.Context, db TxBeginner, key Key,
	fn func(ctx context.Context, tx pgx.Tx) (T, error), cfg *config, failure *error, start time.Time) (Result[T], error) {
	switch d := db.(type) {
	case *pgxpool.Pool:
		pc, err := d.Acquire(ctx)
		if err != nil {
			return Result[T]{}, err
		}
		defer pc.Release()
		res, err := doOnConn(ctx, pc.Conn(), key, fn, cfg, failure)
		cfg.report(ctx, "Do", key, start, res.Replayed, err)
		return res, err
	case *pgx.Conn:
		res, err := doOnConn(ctx, d, key, fn, cfg, failure)
		cfg.report(ctx, "Do", key, start, res.Replayed, err)
		return res, err
	default:
		// Reported after the commit, like the branches above: an
		// execution whose COMMIT fails is no execution.
		res, err := doOnTx(ctx, db, key, fn, cfg)
		cfg.report(ctx, "Do", key, start, res.Replayed, err)
		return res, err
	}
}

// doOnTx is Do for a TxBeginner that is neither a pool nor a connection: a
// plain transaction around WithIdempotency.
func doOnTx[T any](ctx context.Context, db TxBeginner, key Key,
	fn func(ctx context.Context, tx pgx.Tx) (T, error), cfg *config) (Result[T], error) {
	var zero Result[T]
	var tx pgx.Tx
	var err error
	if b, ok := db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	}); ok {
		tx, err = b.BeginTx(ctx, cfg.txOptions)
	} else if cfg.txOptions != (pgx.TxOptions{}) {
		return zero, fmt.Errorf("%w: WithTxOptions needs a db with BeginTx, not %T", ErrInvalidOption, db)
	} else {
		tx, err = db.Begin(ctx)
	}
	if err != nil {
		return zero, err
	}
	defer rollback(ctx, tx) //nolint:errcheck // a no-op after Commit
	res, err := withIdempotency(ctx, tx, key, fn, cfg)
	if err != nil && !(IsPermanent(err) && !res.Replayed) {
		return res, err
	}
	if c := tx.Conn(); c != nil && c.IsClosed() {
		return Result[T]{}, fmt.Errorf("idem: connection closed before commit: %w", pgconn.ErrConnClosed)
	}
	if cerr := tx.Commit(ctx); cerr != nil {
		return Result[T]{}, commitError(cerr)
	}
	return res, err
}

// doOnConn is Do on one connection, with BEGIN and COMMIT pipelined.
func doOnConn[T any](ctx context.Context, conn *pgx.Conn, key Key,
	fn func(ctx context.Context, tx pgx.Tx) (T, error), cfg *config, failure *error) (res Result[T], err error) {
	c := claimer{q: cfg.q, cfg: cfg, key: key, endOnReplay: true}
	begin := &beginOn{conn: conn, opts: cfg.txOptions}
	if knobs.UnpipelinedBegin.Load() {
		if c.tx, err = conn.BeginTx(ctx, cfg.txOptions); err != nil {
			return res, err
		}
		begin = nil
	}
	rec, err := c.claim(ctx, begin)
	tx := c.tx
	defer func() {
		// Every path that does not commit ends the transaction here. A
		// rollback that fails closes the connection, and the pool drops it.
		if tx != nil && conn.PgConn().TxStatus() != 'I' && !conn.IsClosed() {
			_ = rollback(ctx, tx)
		}
	}()
	if err != nil {
		return res, err
	}
	if !rec.claimed {
		return replay[T](rec, cfg)
	}
	if cfg.holdTimeout > 0 && !c.bounded {
		if _, err := tx.Exec(ctx, holdSet, holdMillis(cfg.holdTimeout)); err != nil {
			return res, fmt.Errorf("idem: applying the hold timeout: %w", err)
		}
	}

	var status string
	var data []byte
	if *failure != nil {
		// An earlier attempt's fn failed permanently and was rolled back:
		// record that outcome without running fn again.
		status, data = StatusFailed, failureMessage(cfg, *failure)
	} else {
		g := newGuard(tx)
		v, fnErr, panicked := callFn(ctx, g, fn)
		g.close()
		switch {
		case panicked != nil:
			panic(panicked) // the deferred rollback runs as it unwinds
		case fnErr != nil:
			if IsPermanent(fnErr) {
				*failure = fnErr
				if err := rollback(ctx, tx); err != nil {
					// Nothing was recorded: this must not look like a
					// recorded business outcome, so fnErr is reported by
					// message only.
					return res, fmt.Errorf("idem: rolling back before recording the permanent failure %q: %w", fnErr.Error(), err)
				}
				// Claim again in a new transaction and record the failure
				// there; if another execution committed first, its outcome
				// is returned instead.
				return doOnConn(ctx, conn, key, fn, cfg, failure)
			}
			return res, fnErr
		}
		status = StatusSucceeded
		if data, err = encodeResult(cfg, v); err != nil {
			return res, err
		}
		res.Value = v
	}

	if conn.IsClosed() {
		return Result[T]{}, fmt.Errorf("idem: connection closed before commit: %w", pgconn.ErrConnClosed)
	}
	tag, err := c.complete(ctx, status, data, rec.attempt, cmp.Or(cfg.txOptions.CommitQuery, "COMMIT"))
	if err != nil {
		return Result[T]{}, commitError(err)
	}
	if tag.String() == "ROLLBACK" {
		return Result[T]{}, fmt.Errorf("idem: commit: %w", pgx.ErrTxCommitRollback)
	}
	if status == StatusFailed {
		return res, *failure
	}
	return res, nil
}

// commitError classifies an error from a batch or command that carried
// COMMIT on a connection that was open when it was sent: a server error, or a
// request that never left (a context done beforehand), means nothing
// committed; any other failure leaves the outcome unknown. "conn closed" is
// unknown too: it is what the rest of a batch reports once a read failure
// closed the connection mid-batch. A server error is recognised by its
// SQLSTATE from any driver (pgCode); through database/sql, driver.ErrBadConn
// and network errors are unknown like pgx's.
func commitError(err error) error {
	if pgCode(err) != "" || errors.Is(err, pgx.ErrTxCommitRollback) ||
		(pgconn.SafeToRetry(err) && !errors.Is(err, pgconn.ErrConnClosed)) {
		return fmt.Errorf("idem: commit: %w", err)
	}
	return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
}

// replay turns an existing record into the call's result.
func replay[T any](rec record, cfg *config) (Result[T], error) {
	switch rec.status {
	case StatusSucceeded:
		v, err := decodeValue[T](cfg.codec, rec.response)
		if err != nil {
			return Result[T]{}, err
		}
		return Result[T]{Value: v, Replayed: true}, nil
	case StatusFailed:
		return Result[T]{Replayed: true}, &PermanentError{Err: &RecordedError{Message: string(rec.response)}}
	case StatusProcessing:
		return Result[T]{}, ErrInProgress
	default:
		return Result[T]{}, fmt.Errorf("idem: record has unexpected status %q", rec.status)
	}
}

// beginOn asks claimer.claim to begin the transaction on conn in the same
// round trip as the claim.
type beginOn struct {
	conn *pgx.Conn
	opts pgx.TxOptions
}

// claimer runs the claim protocol for one key on one transaction.
type claimer struct {
	tx        pgx.Tx
	q         *queries
	cfg       *config
	key       Key
	savepoint bool // leave savepoint spFn open after a successful claim

	// changed (with savepoint) reports that the claim updated a record
	// that existed before it (an issued token, or a record taken over)
	// rather than inserting one, and ran in savepoint spClaim, taken before
	// it and still open around spFn: undoing the execution rolls back to
	// spClaim, which puts that record back as it was. A claim that
	// inserted its record is undone by deleting it.
	changed bool

	// held (WithIdempotency with a hold timeout) keeps the settings the
	// bound replaced, put back by the completion.
	held *heldSettings
	// bounded (Do) reports that the hold timeout went with the claim.
	bounded bool

	// endOnReplay (Do only) sends ROLLBACK with the read that follows a
	// conflict, so that a replay costs two round trips; ended reports that
	// it did.
	endOnReplay, ended bool
}

// final reports whether an existing record decides the call without a
// transaction: it is replayed, or answers ErrKeyReused or ErrInProgress.
func (c *claimer) final(rec *record) bool {
	return !rec.takeable() || !rec.fingerprintMatches(c.key.Fingerprint)
}

// claim claims c.key. It returns the claimed record, or the existing record
// (succeeded, failed, or processing under a live lease) to replay. Errors are
// ErrInProgress, ErrKeyReused, or database errors. With begin set, the first
// round trip also begins c.tx on begin.conn.
func (c *claimer) claim(ctx context.Context, begin *beginOn) (record, error) {
	restart := begin
	if restart == nil {
		c.endOnReplay = false // the transaction is not ours to end and begin again
	}
	for try := 0; try < maxClaimTries; try++ {
		rec, found, err := c.insert(ctx, begin)
		begin = nil
		if err != nil || rec.claimed {
			return rec, err
		}
		if c.cfg.requireIssued {
			if err := tokenError(found, &rec); err != nil {
				return rec, err
			}
		}
		if c.ended {
			// Do's transaction is over already. Most conflicts are replays
			// and end here; a record to take over, or one that vanished,
			// needs a new transaction that stays open after the read.
			c.ended, c.endOnReplay = false, false
			if !found || !c.final(&rec) {
				begin = restart
				continue
			}
		}
		if !found {
			continue // the record vanished (purged) after the conflict: claim again
		}
		if !rec.fingerprintMatches(c.key.Fingerprint) {
			return rec, ErrKeyReused
		}
		if !rec.takeable() {
			if rec.status == StatusProcessing {
				return rec, ErrInProgress
			}
			return rec, nil
		}
		taken, err := c.takeover(ctx, &rec)
		if taken && err == nil {
			c.cfg.emit(ctx, EventTakeover, cmp.Or(c.cfg.op, "WithIdempotency"), c.key, rec.attempt, time.Time{}, nil)
		}
		if err != nil || taken {
			return rec, err
		}
		if c.cfg.noWait {
			// Another transaction is taking the record over right now, or
			// has just done so: look once more, without waiting.
			if rec, found, err = c.read(ctx); err != nil {
				return rec, err
			}
			switch {
			case !found:
				continue
			case !rec.fingerprintMatches(c.key.Fingerprint):
				return rec, ErrKeyReused
			case rec.takeable() || rec.status == StatusProcessing:
				return rec, ErrInProgress
			default:
				return rec, nil
			}
		}
	}
	return record{}, fmt.Errorf("idem: could not claim the key after %d tries (records vanishing under concurrent purges or takeovers)", maxClaimTries)
}

func (c *claimer) claimArgs() []any {
	return []any{c.key.Scope, c.key.ID, nonNilFingerprint(c.key.Fingerprint), c.cfg.ttl.Microseconds()}
}

// insert runs the claim INSERT. When it conflicts (after waiting for an
// uncommitted holder to finish), the record is read in the next round trip.
// found is false only when the record vanished in between.
func (c *claimer) insert(ctx context.Context, begin *beginOn) (rec record, found bool, err error) {
	var w *wireBatch
	if begin != nil {
		w = newBeginBatch(begin)
	} else {
		w = newBatch(c.tx)
	}
	defer w.free()
	// In no-wait mode the claim is one statement that lowers lock_timeout
	// and restores it (queries.claimNoWait); in the caller's transaction it
	// runs in savepoint spClaim, so that a claim that times out leaves the
	// transaction usable.
	claimSQL := c.q.claim
	switch {
	case c.cfg.noWait && c.cfg.requireIssued:
		claimSQL = c.q.claimIssuedNoWait
	case c.cfg.noWait:
		claimSQL = c.q.claimNoWait
	case c.cfg.requireIssued:
		claimSQL = c.q.claimIssued
	}
	//
	// A claim of an issued token in the caller's transaction updates the
	// token's record, so it keeps spClaim open around fn's savepoint until
	// the completion (see claimer.changed).
	c.changed = c.savepoint && c.cfg.requireIssued
	outer := c.changed || (c.cfg.noWait && begin == nil)
	if outer {
		w.queue(ctx, "SAVEPOINT "+spClaim, nil, false)
	}
	claimAt := w.len()
	w.queue(ctx, claimSQL, &rec, true, argString(c.key.Scope), argString(c.key.ID),
		argBytes(nonNilFingerprint(c.key.Fingerprint)), argInt(c.cfg.ttl.Microseconds()))
	bounding := c.cfg.holdTimeout > 0 && c.endOnReplay
	if bounding {
		// Do's first try: bound the rest of its transaction in this round
		// trip (see WithHoldTimeout). Without a claim the transaction ends
		// in the next one, so the bound never reaches a wait for another
		// holder; a later try, in a transaction that stays open, is
		// bounded once it has claimed (doOnConn).
		w.queue(ctx, holdSet, nil, false, argInt(holdMillis(c.cfg.holdTimeout)))
	}
	if outer && !c.changed {
		w.queue(ctx, "RELEASE SAVEPOINT "+spClaim, nil, false)
	}
	if c.savepoint {
		w.queue(ctx, "SAVEPOINT "+spFn, nil, false)
	}
	err = w.exec(ctx)
	if begin != nil {
		c.tx = w.began
	}
	if err != nil {
		if c.cfg.noWait && pgCode(err) == sqlstateLockNotAvailable {
			if begin == nil {
				// Undo the claim attempt and the lock_timeout change together.
				if rerr := rollbackTo(ctx, c.tx, spClaim); rerr != nil {
					return rec, false, fmt.Errorf("idem: undoing a no-wait claim (roll the transaction back): %w", rerr)
				}
			}
			return rec, false, ErrInProgress
		}
		// Other errors abort the transaction and are returned as they are:
		// 40001 under REPEATABLE READ, or 55P03 when the caller's own
		// lock_timeout ended the wait for the key's holder.
		return rec, false, err
	}
	if w.found[claimAt] && !rec.claimed {
		return rec, false, fmt.Errorf("idem: internal error: the claim returned a row without claiming")
	}
	if rec.claimed {
		c.bounded = bounding
		return rec, true, nil
	}

	// Second round trip when the key was not claimed: settle the savepoint,
	// read a record committed while the claim waited, and (Do) end the
	// transaction. It goes even when ctx is done by now, so that no
	// savepoint is left behind in a transaction still usable (where a call
	// enclosing this one would meet it when undoing its own).
	sctx, cancel := cleanupContext(ctx)
	defer cancel()
	w2 := newBatch(c.tx)
	defer w2.free()
	if c.savepoint {
		w2.queue(sctx, "RELEASE SAVEPOINT "+c.outerSavepoint(), nil, false)
	}
	c.changed = false
	readAt := w2.len()
	c.queueRead(sctx, w2, &rec)
	if c.endOnReplay {
		w2.queue(sctx, "ROLLBACK", nil, false)
		c.ended = true
	}
	if err := w2.exec(sctx); err != nil {
		return rec, false, err
	}
	if err := ctx.Err(); err != nil {
		return rec, false, err
	}
	return rec, w2.found[readAt], nil
}

// queueRead queues the read of c.key's record into rec.
func (c *claimer) queueRead(ctx context.Context, w *wireBatch, rec *record) {
	w.queue(ctx, c.q.read, rec, false, argString(c.key.Scope), argString(c.key.ID))
}

func (c *claimer) read(ctx context.Context) (rec record, found bool, err error) {
	w := newBatch(c.tx)
	defer w.free()
	c.queueRead(ctx, w, &rec)
	err = w.exec(ctx)
	return rec, w.found[0], err
}

// complete records the outcome of the claimed execution, and runs then, a
// statement without parameters (RELEASE SAVEPOINT, COMMIT), in the same round
// trip. It returns then's command tag.
func (c *claimer) complete(ctx context.Context, status string, data []byte, attempt int32, then string) (pgconn.CommandTag, error) {
	w := newBatch(c.tx)
	defer w.free()
	w.queue(ctx, c.q.complete, nil, false, argString(c.key.Scope), argString(c.key.ID), argString(status), argBytes(data), argInt(int64(attempt)))
	if c.held != nil {
		w.queue(ctx, holdRestore, nil, false, argString(c.held.idle), argString(c.held.statement))
	}
	w.queue(ctx, then, nil, false)
	err := w.exec(ctx)
	return w.tag, err
}

// takeover re-claims an expired or orphaned record. It reports false when the
// record was no longer takeable (someone else took it, or it was purged), or,
// in no-wait mode, when another transaction holds its row lock.
func (c *claimer) takeover(ctx context.Context, rec *record) (bool, error) {
	query := c.q.takeover
	if c.cfg.noWait {
		query = c.q.takeoverNoWait
	}
	args := append(c.claimArgs(), rec.attempt)
	b := &pgx.Batch{}
	var attempt int32
	taken := false
	// In the caller's transaction the takeover runs in spClaim (see
	// claimer.changed): undoing the execution puts the record back as it
	// was, with its attempt number, which fences out earlier holders.
	if c.savepoint {
		b.Queue("SAVEPOINT " + spClaim)
	}
	b.Queue(query, args...).QueryRow(func(r pgx.Row) error {
		err := r.Scan(&attempt)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		taken = err == nil
		return err
	})
	if c.savepoint {
		b.Queue("SAVEPOINT " + spFn)
	}
	if err := c.tx.SendBatch(ctx, b).Close(); err != nil {
		forgetStale(c.tx.Conn(), err)
		return false, err
	}
	if !taken {
		if c.savepoint {
			// Settled even when ctx is done by now (see insert).
			sctx, cancel := cleanupContext(ctx)
			defer cancel()
			if _, err := c.tx.Exec(sctx, "RELEASE SAVEPOINT "+spClaim); err != nil {
				return false, err
			}
		}
		return false, nil
	}
	c.changed = c.savepoint
	*rec = record{claimed: true, attempt: attempt, status: StatusProcessing}
	return true, nil
}

// outerSavepoint is the savepoint that holds a claimed execution in the
// caller's transaction: spClaim when the claim changed an existing record,
// spFn otherwise. Releasing it releases spFn too.
func (c *claimer) outerSavepoint() string {
	if c.changed {
		return spClaim
	}
	return spFn
}

// abandon undoes a claimed execution inside the caller's transaction. A
// claim that changed an existing record (an issued token, a record taken
// over) is undone with fn's writes by rolling back to spClaim, which puts the
// record back as it was, attempt number included; a claim that inserted its
// record is undone by rolling back to spFn and deleting the record.
func (c *claimer) abandon(ctx context.Context, attempt int32) error {
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

// callFn runs fn, turning a panic into a value so the caller can clean up
// before re-raising it.
func callFn[T any](ctx context.Context, tx pgx.Tx, fn func(context.Context, pgx.Tx) (T, error)) (v T, err error, panicked any) {
	defer func() {
		if p := recover(); p != nil {
			panicked = p
		}
	}()
	v, err = fn(ctx, tx)
	return v, err, nil
}

// rollback rolls tx back even when ctx was cancelled.
func rollback(ctx context.Context, tx pgx.Tx) error {
	ctx, cancel := cleanupContext(ctx)
	defer cancel()
	return tx.Rollback(ctx)
}

// cleanupTimeout bounds the statements that undo work after fn failed.
const cleanupTimeout = 10 * time.Second

// cleanupContext keeps ctx's values but not its cancellation, so that work
// can still be undone after ctx was cancelled.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
}

func backoff(p RetryPolicy, retry int) time.Duration {
	d := p.BaseDelay << min(retry, 30)
	if d <= 0 || d > p.MaxDelay {
		d = p.MaxDelay
	}
	if d < math.MaxInt64 {
		d++ // rand.N's bound is exclusive
	}
	return rand.N(d)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }

// nonNilFingerprint stores "no fingerprint" as an empty bytea, so that nil and
// empty compare equal on replay.
func nonNilFingerprint(f []byte) []byte {
	if f == nil {
		return []byte{}
	}
	return f
}

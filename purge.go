package idem

import (
	"github.com/idemkit/idem/internal/protocol"

	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/pgerr"
)

// PurgeParams configures Purge. The zero value purges expired records in
// batches of 10,000 and leaves the inbox alone.
type PurgeParams struct {
	// BatchSize is the number of rows one DELETE removes; each batch is its
	// own statement, so its row locks are held for tens of milliseconds. It
	// defaults to 10,000, or to 2,000 when RowsPerSecond is set, where
	// smaller batches spread the load more evenly: the claims' p99 rose less
	// than with 10,000 (docs/performance.md, suite purge).
	BatchSize int
	// InboxRetention, when positive, also purges inbox rows consumed longer
	// ago than that, in the same batches, skipping rows another transaction
	// holds. A message redelivered after its row was purged is processed
	// again, so it must exceed the broker's longest redelivery delay. Zero
	// leaves the inbox alone.
	InboxRetention time.Duration
	// OnBatch, when set, is called after each batch of records with the
	// number of rows it deleted (a progress report); it must not block.
	OnBatch func(deleted int64)
	// OnInboxBatch, when set, is called after each batch of inbox rows
	// (InboxRetention) with the number of rows it deleted, as OnBatch is
	// for records; it must not block.
	OnInboxBatch func(deleted int64)
	// RowsPerSecond, when positive, paces Purge: after each batch it waits
	// until the rows deleted so far (records and inbox rows) amount to at
	// most this many per second since it started, so that a large purge
	// leaves CPU and WAL bandwidth to the claims running beside it. A batch
	// itself still runs at full speed. Zero purges as fast as the database
	// allows.
	RowsPerSecond int
	// Retry bounds how a batch that fails with a serialization failure or
	// a deadlock is redone. The zero value means RetryPolicy's defaults.
	Retry RetryPolicy
	// Hooks, when set, receive an EventPurged event after a Purge that
	// deleted rows.
	Hooks Hooks
}

// pacer spreads a purge's batches to at most rate rows per second on
// average since start.
type pacer struct {
	rate    int
	start   time.Time
	deleted int64
}

// wait records n more deleted rows and sleeps until they are due.
func (p *pacer) wait(ctx context.Context, n int64) error {
	p.deleted += n
	if p.rate <= 0 {
		return nil
	}
	due := p.start.Add(time.Duration(float64(p.deleted) / float64(p.rate) * float64(time.Second)))
	if d := time.Until(due); d > 0 {
		return backoff.Sleep(ctx, d)
	}
	return nil
}

// Purge deletes expired records (expires_at passed, by the database clock)
// in batches until none is left, and returns how many rows it deleted
// (records and, with InboxRetention, inbox rows). It never deletes a
// lease-mode record still processing (its lease live or run out: the next
// Claim of the key takes it over with a higher fencing token). An uncommitted
// claim is invisible to it; a row another transaction holds (a takeover in
// flight) makes a batch wait at most 20ms, after which the batch is redone
// skipping such rows (FOR UPDATE SKIP LOCKED), so Purge never waits longer
// for a claim, and a claim that races it claims the key again and never sees
// an empty result. Each batch runs at READ COMMITTED whatever the default
// isolation, so concurrent takeovers do not fail it with 40001; a batch that
// still fails with 40001 or 40P01 (a deadlock) is redone, with po.Retry's
// attempts and backoff. db is normally a pool; inside a pgx.Tx every batch
// skips held rows and keeps the transaction's isolation. WithTable and
// WithInboxTable name the tables.
//
// Purge returns an error matching ErrInvalidOption, before any SQL, for a
// nil db or a negative value in po. It returns what it deleted so far with
// ctx's error when ctx ends, and with a batch's error when one fails for
// good.
func Purge(ctx context.Context, db DBTX, po PurgeParams, opts ...TableOption) (_ int64, err error) {
	if handle.Missing(db) || po.BatchSize < 0 || po.InboxRetention < 0 || po.RowsPerSecond < 0 || !po.Retry.valid() {
		return 0, fmt.Errorf("%w: Purge needs a database and non-negative parameters", ErrInvalidOption)
	}
	if po.BatchSize == 0 {
		po.BatchSize = 10_000
		if po.RowsPerSecond > 0 {
			po.BatchSize = 2_000
		}
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return 0, err
	}
	defer cfg.ExplainMissingTable(&err)
	retry := po.Retry.withDefaults()
	_, inTx := db.(pgx.Tx)
	start := time.Now()
	pace := &pacer{rate: po.RowsPerSecond, start: start}
	var total int64
	defer func() {
		if po.Hooks != nil && total > 0 {
			po.Hooks.Event(ctx, Event{Kind: EventPurged, Op: "Purge", Rows: total, Duration: time.Since(start)})
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := purgeBatch(ctx, db, cfg.Q, po.BatchSize, inTx)
		// A batch is its own transaction: one that fails with 40001 or
		// 40P01 is simply done again.
		for try := 1; err != nil && IsRetryable(err) && !inTx && try < retry.MaxAttempts; try++ {
			if serr := backoff.Sleep(ctx, retry.backoff(try)); serr != nil {
				return total, serr
			}
			n, err = purgeBatch(ctx, db, cfg.Q, po.BatchSize, inTx)
		}
		if err != nil {
			return total, fmt.Errorf("idem: purging records: %w", err)
		}
		total += n
		if po.OnBatch != nil {
			po.OnBatch(n)
		}
		if n < int64(po.BatchSize) {
			pace.deleted += n
			break
		}
		if err := pace.wait(ctx, n); err != nil {
			return total, err
		}
	}
	if po.InboxRetention > 0 {
		n, err := purgeInbox(ctx, db, &cfg, po.InboxRetention, po.BatchSize, pace, po.OnInboxBatch)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// purgeLockTimeout bounds how long a purge batch waits for a row another
// transaction holds before it retries the batch skipping such rows.
const purgeLockTimeout = "20ms"

// purgeBatch deletes one batch. The batch is one implicit transaction at
// READ COMMITTED, whatever the session's default isolation: a row a
// concurrent takeover changed is then rechecked and skipped rather than
// failing the batch with 40001. The plain DELETE runs under a short
// lock_timeout (the setting ends with the transaction); if it meets a row
// another transaction holds, the batch is done again with FOR UPDATE SKIP
// LOCKED. Inside a caller's transaction only the skipping form is used,
// leaving its settings and isolation alone.
func purgeBatch(ctx context.Context, db DBTX, q *protocol.Queries, size int, inTx bool) (int64, error) {
	if inTx {
		tag, err := db.Exec(ctx, q.PurgeSkipLocked, size)
		return tag.RowsAffected(), err
	}
	var n int64
	count := func(ct pgconn.CommandTag) error { n = ct.RowsAffected(); return nil }
	b := &pgx.Batch{}
	b.Queue(purgeIsolation)
	b.Queue(`SELECT set_config('lock_timeout', $1, true)`, purgeLockTimeout)
	b.Queue(q.Purge, size).Exec(count)
	err := db.SendBatch(ctx, b).Close()
	if err == nil || pgerr.Code(err) != pgerr.LockNotAvailable {
		return n, err
	}
	b = &pgx.Batch{}
	b.Queue(purgeIsolation)
	b.Queue(q.PurgeSkipLocked, size).Exec(count)
	err = db.SendBatch(ctx, b).Close()
	return n, err
}

// purgeIsolation starts each purge batch's transaction.
const purgeIsolation = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"

// Purger runs Purge on an interval until its context ends. The zero value
// is not usable: DB is required.
type Purger struct {
	// DB is where to purge, normally a pool.
	DB DBTX
	// Interval between runs. It defaults to one minute; each wait is
	// jittered by ±20% so that many instances do not purge in step.
	Interval time.Duration
	// Params are passed to Purge.
	Params PurgeParams
	// Tables are passed to Purge: they name the tables (WithTable,
	// WithInboxTable).
	Tables []TableOption
	// OnPurge, if set, is called after each run with the rows deleted and
	// the run's error (nil on success). Run keeps going after errors.
	OnPurge func(deleted int64, err error)
}

// Run purges at once, then every Interval, until ctx ends; it returns
// ctx's error. A run's error does not stop it (see OnPurge).
func (p *Purger) Run(ctx context.Context) error {
	if p == nil || handle.Missing(p.DB) || p.Interval < 0 {
		return fmt.Errorf("%w: Purger needs a DB and a non-negative Interval", ErrInvalidOption)
	}
	interval := p.Interval
	if interval == 0 {
		interval = time.Minute
	}
	for {
		n, err := Purge(ctx, p.DB, p.Params, p.Tables...)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if p.OnPurge != nil {
			p.OnPurge(n, err)
		}
		wait := time.Duration(float64(interval) * (0.8 + 0.4*rand.Float64()))
		if err := backoff.Sleep(ctx, wait); err != nil {
			return err
		}
	}
}

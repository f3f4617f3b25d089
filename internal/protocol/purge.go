package protocol

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/idemkit/idem/internal/backoff"
)

// Purge: expired records, then (InboxRetention) old inbox rows, in batches
// that are each a statement of their own.

// PurgeParams is idem.PurgeParams with the protocol's types; the fronts
// pass its Hooks as a WithHooks option.
type PurgeParams struct {
	BatchSize      int
	InboxRetention time.Duration
	OnBatch        func(deleted int64)
	OnInboxBatch   func(deleted int64)
	RowsPerSecond  int
	Retry          Retry
}

// The batch sizes of a zero PurgeParams.BatchSize: unpaced, and paced
// (RowsPerSecond set), where smaller batches spread the load more evenly.
const (
	DefaultPurgeBatch      = 10_000
	DefaultPacedPurgeBatch = 2_000
)

// Pacer spreads a purge's batches to at most Rate rows per second on
// average since Start.
type Pacer struct {
	Rate    int
	Start   time.Time
	Deleted int64
}

// Wait records n more deleted rows and sleeps until they are due. A zero
// Rate never waits.
func (p *Pacer) Wait(ctx context.Context, n int64) error {
	p.Deleted += n
	if p.Rate <= 0 {
		return nil
	}
	due := p.Start.Add(time.Duration(float64(p.Deleted) / float64(p.Rate) * float64(time.Second)))
	if d := time.Until(due); d > 0 {
		return backoff.Sleep(ctx, d)
	}
	return nil
}

// Purge deletes expired records in batches until none is left, then, with
// InboxRetention, inbox rows consumed longer ago than that, and returns how
// many rows it deleted (idem.Purge). q is nil when the front was given no
// database. Its arguments are checked before any SQL: a nil q or a negative
// value in po is an ErrInvalidOption, and so is an invalid option. Hooks
// among opts receive an EventPurged after a call that deleted rows.
//
// Outside a transaction of the caller's, each batch runs in a transaction
// of its own at READ COMMITTED under a short lock_timeout, and one that met
// a held row is redone with FOR UPDATE SKIP LOCKED; a batch that fails with
// a serialization failure or a deadlock is redone with po.Retry. Inside the
// caller's transaction every batch skips held rows and leaves its settings
// and isolation alone.
func Purge[O any](ctx context.Context, d *Dialect, q Querier, errs Errors, po PurgeParams, opts []O) (total int64, err error) {
	if q == nil || po.BatchSize < 0 || po.InboxRetention < 0 || po.RowsPerSecond < 0 || !po.Retry.Valid() {
		return 0, fmt.Errorf("%w: Purge needs a database and non-negative parameters", ErrInvalidOption)
	}
	if po.BatchSize == 0 {
		po.BatchSize = DefaultPurgeBatch
		if po.RowsPerSecond > 0 {
			po.BatchSize = DefaultPacedPurgeBatch
		}
	}
	cfg, err := NewConfig(d, opts)
	if err != nil {
		return 0, err
	}
	defer cfg.ExplainMissingTable(&err)
	retry := po.Retry.WithDefaults()
	inTx := q.InTx()
	start := time.Now()
	pace := &Pacer{Rate: po.RowsPerSecond, Start: start}
	defer func() {
		if cfg.Hooks != nil && total > 0 {
			cfg.Hooks.Emit(ctx, Event{Kind: EventPurged, Op: "Purge", Rows: total, Duration: time.Since(start)})
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := purgeBatch(ctx, q, errs, &cfg, po.BatchSize, inTx)
		// A batch is its own transaction: one that fails with 40001 or
		// 40P01 is simply done again.
		for try := 1; err != nil && errs.Retryable(err) && !inTx && try < retry.MaxAttempts; try++ {
			if serr := backoff.Sleep(ctx, retry.Backoff(try)); serr != nil {
				return total, serr
			}
			n, err = purgeBatch(ctx, q, errs, &cfg, po.BatchSize, inTx)
		}
		if err != nil {
			return total, opError(ctx, errs, "Purge", "purging records", err)
		}
		total += n
		if po.OnBatch != nil {
			po.OnBatch(n)
		}
		if n < int64(po.BatchSize) {
			pace.Deleted += n
			break
		}
		if err := pace.Wait(ctx, n); err != nil {
			return total, err
		}
	}
	if po.InboxRetention > 0 {
		n, err := purgeInboxRows(ctx, q, &cfg, po.InboxRetention, po.BatchSize, pace, po.OnInboxBatch)
		total += n
		if err != nil {
			return total, opError(ctx, errs, "Purge", "purging inbox rows", err)
		}
	}
	return total, nil
}

// purgeBatch deletes one batch of records. Outside a transaction of the
// caller's the batch is one transaction of its own at READ COMMITTED,
// whatever the session's default isolation: a row a concurrent takeover
// changed is then rechecked and skipped rather than failing the batch with
// 40001. The plain DELETE runs under a short lock_timeout (the setting ends
// with the transaction); if it meets a row another transaction holds, the
// batch is done again with FOR UPDATE SKIP LOCKED. Inside the caller's
// transaction only the skipping form is used.
func purgeBatch(ctx context.Context, q Querier, errs Errors, c *Config, size int, inTx bool) (int64, error) {
	var n int64
	qs := c.Q
	if inTx {
		err := q.Run(ctx, Stmt{SQL: qs.PurgeSkipLocked, Args: []any{size}, Affected: &n})
		return n, err
	}
	stmts := purgeSettings(c.D.ReadCommitted, c.D.PurgeLockTimeout)
	err := q.Run(ctx, append(stmts, Stmt{SQL: qs.Purge, Args: []any{size}, Affected: &n})...)
	if err == nil || !errs.LockTimeout(err) {
		return n, err
	}
	n = 0
	stmts = purgeSettings(c.D.ReadCommitted)
	err = q.Run(ctx, append(stmts, Stmt{SQL: qs.PurgeSkipLocked, Args: []any{size}, Affected: &n})...)
	return n, err
}

// purgeSettings are the statements of settings that a batch of its own
// begins with, those the dialect has.
func purgeSettings(settings ...string) []Stmt {
	stmts := make([]Stmt, 0, len(settings)+1)
	for _, sql := range settings {
		if sql != "" {
			stmts = append(stmts, Stmt{SQL: sql})
		}
	}
	return stmts
}

// purgeInboxRows deletes the inbox rows of c.Inbox consumed more than
// olderThan ago, in batches of batchSize, each a statement of its own that
// skips rows another transaction holds. After every batch it calls onBatch,
// when set; after a full batch it waits with pace. It returns the rows
// deleted, also when it fails.
func purgeInboxRows(ctx context.Context, q Querier, c *Config, olderThan time.Duration, batchSize int,
	pace *Pacer, onBatch func(int64)) (int64, error) {
	var total int64
	for {
		var n int64
		if err := q.Run(ctx, Stmt{SQL: c.Inbox.Purge, Args: []any{olderThan.Microseconds(), batchSize}, Affected: &n}); err != nil {
			return total, err
		}
		total += n
		if onBatch != nil {
			onBatch(n)
		}
		if n < int64(batchSize) {
			return total, nil
		}
		if err := pace.Wait(ctx, n); err != nil {
			return total, err
		}
	}
}

// opError is the error of a statement of op (Purge, Lookup, ...) that
// failed while doing what doing says: one a done ctx caused matches ctx's
// error, one of a closed database or an ended transaction says so
// (ClosedHandle), and any other is wrapped with doing.
func opError(ctx context.Context, errs Errors, op, doing string, err error) error {
	err = WithContextErr(ctx, err)
	if what, _ := errs.Closed(err); what != "" {
		return ClosedHandle(op, err, errs.Closed)
	}
	return fmt.Errorf("idem: %s: %w", doing, err)
}

// RunPurger runs purge at once, then every interval (a minute when zero),
// each wait jittered by ±20% so that many instances do not purge in step,
// until ctx ends; it returns ctx's error (idem.Purger.Run). After each run
// it calls onPurge, when set, with what purge returned. complete is false
// when the front was given no database; it and a negative interval are an
// ErrInvalidOption.
func RunPurger(ctx context.Context, complete bool, interval time.Duration,
	purge func(ctx context.Context) (int64, error), onPurge func(deleted int64, err error)) error {
	if !complete || interval < 0 {
		return fmt.Errorf("%w: Purger needs a DB and a non-negative Interval", ErrInvalidOption)
	}
	if interval == 0 {
		interval = time.Minute
	}
	for {
		n, err := purge(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if onPurge != nil {
			onPurge(n, err)
		}
		wait := time.Duration(float64(interval) * (0.8 + 0.4*rand.Float64()))
		if err := backoff.Sleep(ctx, wait); err != nil {
			return err
		}
	}
}

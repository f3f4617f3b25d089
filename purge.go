package idem

import (
	"context"
	"time"

	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/protocol"
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
func Purge(ctx context.Context, db DBTX, po PurgeParams, opts ...TableOption) (int64, error) {
	return protocol.Purge(ctx, dialect, opsQuerier(db), pgxErrors{}, po.toProtocol(), withPurgeHooks(po.Hooks, opts))
}

// toProtocol is po to internal/protocol; its Hooks go as an option
// (withPurgeHooks).
func (po PurgeParams) toProtocol() protocol.PurgeParams {
	return protocol.PurgeParams{BatchSize: po.BatchSize, InboxRetention: po.InboxRetention, OnBatch: po.OnBatch,
		OnInboxBatch: po.OnInboxBatch, RowsPerSecond: po.RowsPerSecond, Retry: protocol.Retry(po.Retry)}
}

// withPurgeHooks is opts and, when h is set, WithHooks(h): the options of
// a Purge whose PurgeParams.Hooks is h.
func withPurgeHooks(h Hooks, opts []TableOption) []KeyOption {
	all := make([]KeyOption, 0, len(opts)+1)
	for _, o := range opts {
		all = append(all, o)
	}
	if h != nil {
		all = append(all, WithHooks(h))
	}
	return all
}

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
	if p == nil {
		return protocol.RunPurger(ctx, false, 0, nil, nil)
	}
	return protocol.RunPurger(ctx, !handle.Missing(p.DB), p.Interval, func(ctx context.Context) (int64, error) {
		return Purge(ctx, p.DB, p.Params, p.Tables...)
	}, p.OnPurge)
}

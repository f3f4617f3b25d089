package idemsql

import (
	"context"
	"database/sql"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/front"
	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/protocol"
)

// Purge deletes expired records (expires_at passed, by the database clock)
// in batches until none is left, and returns how many rows it deleted
// (records and, with InboxRetention, inbox rows), as idem.Purge does on pgx:
// the same batches, the same parameters (batch size, pacing, OnBatch and
// OnInboxBatch, retries of 40001 and 40P01 with po.Retry, an EventPurged to
// po.Hooks) and the same guarantees. It never deletes a lease-mode record
// still processing, and a row another transaction holds makes a batch wait
// at most 20ms before it is redone skipping such rows.
//
// db is normally a *sql.DB: each batch then runs in a transaction of its own
// at READ COMMITTED with a short lock_timeout, whatever the session's
// defaults. database/sql sends its statements one after the other, so a
// batch costs a few round trips (BEGIN, the settings, the DELETE, COMMIT)
// where pgx sends them in one. A *sql.Conn works the same on its one
// connection. With a *sql.Tx every batch runs in the caller's transaction,
// skips held rows and keeps the transaction's isolation and settings.
// idem.WithTable and idem.WithInboxTable name the tables.
//
// Purge returns an error matching idem.ErrInvalidOption, before any SQL,
// for a nil db, a negative value in po or a rejected option. It returns what
// it deleted so far with ctx's error when ctx ends, and with a batch's error
// when one fails for good; a closed *sql.DB, or a *sql.Tx already committed
// or rolled back, fails with an error that says so (the latter matching
// idem.ErrInvalidOption).
func Purge(ctx context.Context, db DBTX, po idem.PurgeParams, opts ...idem.TableOption) (int64, error) {
	return protocol.Purge(ctx, dialect, opsQuerier(db), sqlErrors{}, front.PurgeParams(po), front.PurgeOptions(po.Hooks, opts))
}

// opsQuerier is db to the protocol, or nil when db is missing (nil, or a
// typed nil): Purge and the inspection calls refuse it before any SQL.
func opsQuerier(db DBTX) protocol.Querier {
	if handle.Missing(db) {
		return nil
	}
	return querierOf(db)
}

// Purger runs Purge on an interval until its context ends, as idem.Purger
// does on pgx. The zero value is not usable: DB is required.
type Purger struct {
	// DB is the database to purge.
	DB *sql.DB
	// Interval between runs. It defaults to one minute; each wait is
	// jittered by ±20% so that many instances do not purge in step.
	Interval time.Duration
	// Params are passed to Purge.
	Params idem.PurgeParams
	// Tables are passed to Purge: they name the tables (idem.WithTable,
	// idem.WithInboxTable).
	Tables []idem.TableOption
	// OnPurge, if set, is called after each run with the rows deleted and
	// the run's error (nil on success). Run keeps going after errors.
	OnPurge func(deleted int64, err error)
}

// Run purges at once, then every Interval, until ctx ends; it returns
// ctx's error. A run's error does not stop it (see OnPurge). A nil Purger,
// a nil DB or a negative Interval is an idem.ErrInvalidOption, before any
// SQL.
func (p *Purger) Run(ctx context.Context) error {
	if p == nil {
		return protocol.RunPurger(ctx, false, 0, nil, nil)
	}
	return protocol.RunPurger(ctx, p.DB != nil, p.Interval, func(ctx context.Context) (int64, error) {
		return Purge(ctx, p.DB, p.Params, p.Tables...)
	}, p.OnPurge)
}

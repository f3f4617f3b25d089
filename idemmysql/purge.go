package idemmysql

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/front"
	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/protocol"
)

// Purge deletes expired records (expires_at passed, by the database clock)
// in batches until none is left, and returns how many rows it deleted
// (records and, with InboxRetention, inbox rows), as idem.Purge does: the
// same parameters (batch size, pacing, OnBatch and OnInboxBatch, po.Retry
// for deadlocks, an EventPurged to po.Hooks). It never deletes a lease-mode
// record still processing.
//
// Each batch is one DELETE ... ORDER BY ... LIMIT of its own on a *sql.DB
// or *sql.Conn (autocommitted), or part of the caller's transaction on a
// *sql.Tx. MySQL's DELETE cannot skip rows other transactions hold, so a
// batch that meets one waits for it. idem.WithTable and
// idem.WithInboxTable name the tables. A nil db, a negative value in po or
// a rejected option is an idem.ErrInvalidOption, before any SQL.
func Purge(ctx context.Context, db DBTX, po idem.PurgeParams, opts ...idem.TableOption) (int64, error) {
	q, d, err := opsQuerier(ctx, "Purge", db)
	if err != nil {
		return 0, err
	}
	n, err := protocol.Purge(ctx, d, q, mysqlErrors{}, front.PurgeParams(po), front.PurgeOptions(po.Hooks, opts))
	return n, wrap(err)
}

// CountExpired counts what Purge would delete now, as idem.CountExpired
// does: the expired records and, when inboxRetention is positive, the inbox
// rows consumed longer ago than that.
func CountExpired(ctx context.Context, db DBTX, inboxRetention time.Duration, opts ...idem.TableOption) (records, inbox int64, err error) {
	q, d, err := opsQuerier(ctx, "CountExpired", db)
	if err != nil {
		return 0, 0, err
	}
	return protocol.CountExpired(ctx, d, q, mysqlErrors{}, inboxRetention, opts)
}

// opsQuerier is db to the protocol, with its server's dialect; a missing db
// (nil, or a typed nil) is an idem.ErrInvalidOption before any SQL.
func opsQuerier(ctx context.Context, op string, db DBTX) (protocol.Querier, *protocol.Dialect, error) {
	if handle.Missing(db) {
		return nil, nil, fmt.Errorf("%w: %s needs a database", idem.ErrInvalidOption, op)
	}
	d, err := dialectOf(ctx, db)
	if err != nil {
		return nil, nil, closedHandle(op, err)
	}
	return flavor.Querier(db), d, nil
}

// Purger runs Purge on an interval until its context ends, as idem.Purger
// does. The zero value is not usable: DB is required.
type Purger struct {
	// DB is the database to purge.
	DB *sql.DB
	// Interval between runs. It defaults to one minute; each wait is
	// jittered by ±20% so that many instances do not purge in step.
	Interval time.Duration
	// Params are passed to Purge.
	Params idem.PurgeParams
	// Tables are passed to Purge (idem.WithTable, idem.WithInboxTable).
	Tables []idem.TableOption
	// OnPurge, if set, is called after each run with the rows deleted and
	// the run's error (nil on success). Run keeps going after errors.
	OnPurge func(deleted int64, err error)
}

// Run purges at once, then every Interval, until ctx ends; it returns
// ctx's error. A nil Purger, a nil DB or a negative Interval is an
// idem.ErrInvalidOption, before any SQL.
func (p *Purger) Run(ctx context.Context) error {
	if p == nil {
		return protocol.RunPurger(ctx, false, 0, nil, nil)
	}
	return protocol.RunPurger(ctx, p.DB != nil, p.Interval, func(ctx context.Context) (int64, error) {
		return Purge(ctx, p.DB, p.Params, p.Tables...)
	}, p.OnPurge)
}

package idem

import (
	"github.com/idemkit/idem/internal/protocol"

	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/handle"
)

// Stats describes a record table: what the idem CLI's stats command shows.
type Stats struct {
	// Statuses counts the records by status.
	Statuses map[string]int64
	// Expired counts the records Purge would delete now.
	Expired int64
	// StuckLeases counts lease-mode records still processing whose lease
	// ran out (see Stuck).
	StuckLeases int64
	// Oldest is the creation time of the oldest record, or nil when the
	// table is empty.
	Oldest *time.Time
	// TableBytes and IndexBytes are the on-disk sizes of the table (with
	// its TOAST data) and of its indexes.
	TableBytes, IndexBytes int64
}

const inspectColumns = `scope, key, status, attempt, fingerprint, response, locked_until,
	coalesce(recovery_point, ''), created_at, updated_at, expires_at`

func scanRecord(row pgx.Row) (*Record, error) {
	var r Record
	err := row.Scan(&r.Scope, &r.ID, &r.Status, &r.Attempt, &r.Fingerprint, &r.Response, &r.LockedUntil,
		&r.RecoveryPoint, &r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt)
	return &r, err
}

// Lookup returns the record of a key, expired or not, or ErrNotFound. An
// uncommitted claim is invisible to it. scope and id are validated like a
// Key's (ErrInvalidKey). WithTable names the table.
func Lookup(ctx context.Context, db DBTX, scope, id string, opts ...TableOption) (_ *Record, err error) {
	if handle.Missing(db) {
		return nil, fmt.Errorf("%w: Lookup needs a database", ErrInvalidOption)
	}
	if err := (Key{Scope: scope, ID: id}).Validate(); err != nil {
		return nil, err
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	defer cfg.ExplainMissingTable(&err)
	r, err := scanRecord(db.QueryRow(ctx, `SELECT `+inspectColumns+` FROM `+cfg.Q.Table+` WHERE scope = $1 AND key = $2`, scope, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("idem: looking up a record: %w", err)
	}
	return r, nil
}

// Stuck lists lease-mode records still processing whose lease ran out, the
// longest-expired first, at most limit of them (limit must be positive).
// Such a key is taken over by the next Claim of the same request; until
// then its work is neither finished nor abandoned. A lease given up with
// Release is listed too, until the key is claimed again. No index covers
// locked_until, so it reads the whole table: on a large table, run it from
// a replica or off-peak. WithTable names the table.
func Stuck(ctx context.Context, db DBTX, limit int, opts ...TableOption) (_ []Record, err error) {
	if handle.Missing(db) || limit <= 0 {
		return nil, fmt.Errorf("%w: Stuck needs a database and a positive limit", ErrInvalidOption)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	defer cfg.ExplainMissingTable(&err)
	rows, err := db.Query(ctx, `SELECT `+inspectColumns+` FROM `+cfg.Q.Table+`
	WHERE `+protocol.StuckLease+`
	ORDER BY locked_until LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("idem: listing stuck leases: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
		r, err := scanRecord(row)
		return *r, err
	})
	if err != nil {
		return nil, fmt.Errorf("idem: listing stuck leases: %w", err)
	}
	return out, nil
}

// CountExpired counts what Purge would delete now: the expired records
// (never a lease record still processing, as Purge) and, when
// inboxRetention is positive, the inbox rows consumed longer ago than that.
// It reads through the expires_at and consumed_at indexes rather than the
// whole tables. WithTable and WithInboxTable name the tables.
func CountExpired(ctx context.Context, db DBTX, inboxRetention time.Duration, opts ...TableOption) (records, inbox int64, err error) {
	if handle.Missing(db) || inboxRetention < 0 {
		return 0, 0, fmt.Errorf("%w: CountExpired needs a database and a non-negative retention", ErrInvalidOption)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return 0, 0, err
	}
	defer cfg.ExplainMissingTable(&err)
	err = db.QueryRow(ctx, `SELECT count(*) FROM `+cfg.Q.Table+`
	WHERE `+protocol.Purgeable).Scan(&records)
	if err != nil {
		return 0, 0, fmt.Errorf("idem: counting expired records: %w", err)
	}
	if inboxRetention > 0 {
		err = db.QueryRow(ctx, `SELECT count(*) FROM `+cfg.Inbox.Table+`
	WHERE consumed_at < statement_timestamp() - $1::bigint * interval '1 microsecond'`, inboxRetention.Microseconds()).Scan(&inbox)
		if err != nil {
			return records, 0, fmt.Errorf("idem: counting expired inbox rows: %w", err)
		}
	}
	return records, inbox, nil
}

// TableStats counts a record table's rows by status and reports its oldest
// record and its size, in one statement (one snapshot). It reads the whole
// table (a sequential scan): on a large table, run it from a replica or
// off-peak. WithTable names the table.
func TableStats(ctx context.Context, db DBTX, opts ...TableOption) (_ *Stats, err error) {
	if handle.Missing(db) {
		return nil, fmt.Errorf("%w: TableStats needs a database", ErrInvalidOption)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	defer cfg.ExplainMissingTable(&err)
	t := cfg.Q.Table
	// One statement, one scan, one snapshot: a row per status (none for an
	// empty table, hence the outer join), each with the sizes.
	rows, err := db.Query(ctx, `WITH s AS (SELECT status, count(*) AS n,
		count(*) FILTER (WHERE `+protocol.Purgeable+`) AS expired,
		count(*) FILTER (WHERE `+protocol.StuckLease+`) AS stuck,
		min(created_at) AS oldest
	FROM `+t+` GROUP BY status)
	SELECT s.status, coalesce(s.n, 0), coalesce(s.expired, 0), coalesce(s.stuck, 0), s.oldest,
		pg_table_size($1::regclass), pg_indexes_size($1::regclass)
	FROM (SELECT 1) AS one LEFT JOIN s ON true`, t)
	if err != nil {
		return nil, fmt.Errorf("idem: reading table statistics: %w", err)
	}
	st := &Stats{Statuses: map[string]int64{}}
	var (
		status            *string
		n, expired, stuck int64
		oldest            *time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&status, &n, &expired, &stuck, &oldest, &st.TableBytes, &st.IndexBytes}, func() error {
		if status != nil {
			st.Statuses[*status] = n
		}
		st.Expired += expired
		st.StuckLeases += stuck
		if oldest != nil && (st.Oldest == nil || oldest.Before(*st.Oldest)) {
			o := *oldest
			st.Oldest = &o
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("idem: reading table statistics: %w", err)
	}
	return st, nil
}

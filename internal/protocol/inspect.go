package protocol

import (
	"context"
	"fmt"
	"time"
)

// Inspection: the reads of operators and of the idem CLI.

// StoredRecord is idem.Record, field for field, so that each converts to
// the other: a record row as operators see it.
type StoredRecord struct {
	Scope, ID     string
	Status        string
	Attempt       int32
	Fingerprint   []byte
	Response      []byte
	LockedUntil   *time.Time
	RecoveryPoint string

	CreatedAt, UpdatedAt, ExpiresAt time.Time
}

// dest is where a row of Queries.Lookup or Queries.Stuck is scanned: scope,
// key, status, attempt, fingerprint, response, locked_until, recovery_point
// (empty for none), created_at, updated_at, expires_at. A NULL locked_until,
// fingerprint or response leaves the field nil, with every driver: each
// scans NULL into a pointer or a []byte as nil.
func (r *StoredRecord) dest(q *Queries) []any {
	if q.TimeText {
		return []any{&r.Scope, &r.ID, &r.Status, &r.Attempt, &r.Fingerprint, &r.Response, textTime{p: &r.LockedUntil},
			&r.RecoveryPoint, textTime{t: &r.CreatedAt}, textTime{t: &r.UpdatedAt}, textTime{t: &r.ExpiresAt}}
	}
	return []any{&r.Scope, &r.ID, &r.Status, &r.Attempt, &r.Fingerprint, &r.Response, &r.LockedUntil,
		&r.RecoveryPoint, &r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt}
}

// textTime scans a UTC time that a driver may give as a time.Time or, as
// go-sql-driver/mysql does without parseTime, as text ("2006-01-02
// 15:04:05.999999"), into t, or into p (nil for NULL).
type textTime struct {
	t *time.Time
	p **time.Time
}

func (s textTime) Scan(src any) error {
	var v time.Time
	switch x := src.(type) {
	case nil:
		if s.p == nil {
			return fmt.Errorf("idem: a NULL time")
		}
		*s.p = nil
		return nil
	case time.Time:
		v = x.UTC()
	case []byte:
		return s.Scan(string(x))
	case string:
		var err error
		if v, err = time.ParseInLocation("2006-01-02 15:04:05.999999", x, time.UTC); err != nil {
			return fmt.Errorf("idem: a time: %w", err)
		}
	default:
		return fmt.Errorf("idem: a time of type %T", src)
	}
	if s.p != nil {
		*s.p = &v
	} else {
		*s.t = v
	}
	return nil
}

// Stats is idem.Stats, field for field.
type Stats struct {
	Statuses               map[string]int64
	Expired                int64
	StuckLeases            int64
	Oldest                 *time.Time
	TableBytes, IndexBytes int64
}

// Lookup returns the record of a key, expired or not, or ErrNotFound
// (idem.Lookup). q is nil when the front was given no database; keyErr is
// the key's validation error. Both are checked before any SQL.
func Lookup[O any](ctx context.Context, d *Dialect, q Querier, errs Errors, scope, id string, keyErr error, opts []O) (_ *StoredRecord, err error) {
	if q == nil {
		return nil, fmt.Errorf("%w: Lookup needs a database", ErrInvalidOption)
	}
	if keyErr != nil {
		return nil, keyErr
	}
	cfg, err := NewConfig(d, opts)
	if err != nil {
		return nil, err
	}
	defer cfg.ExplainMissingTable(&err)
	var r StoredRecord
	found := false
	err = q.Run(ctx, Stmt{SQL: cfg.Q.Lookup,
		Args: []any{scope, id}, Dest: r.dest(cfg.Q), Found: &found})
	if err != nil {
		return nil, opError(ctx, errs, "Lookup", "looking up a record", err)
	}
	if !found {
		return nil, ErrNotFound
	}
	return &r, nil
}

// Stuck lists lease-mode records still processing whose lease ran out, the
// longest-expired first, at most limit of them (idem.Stuck). A nil q or a
// limit that is not positive is an ErrInvalidOption, before any SQL.
func Stuck[O any](ctx context.Context, d *Dialect, q Querier, errs Errors, limit int, opts []O) (_ []StoredRecord, err error) {
	if q == nil || limit <= 0 {
		return nil, fmt.Errorf("%w: Stuck needs a database and a positive limit", ErrInvalidOption)
	}
	cfg, err := NewConfig(d, opts)
	if err != nil {
		return nil, err
	}
	defer cfg.ExplainMissingTable(&err)
	out := []StoredRecord{}
	err = q.Run(ctx, Stmt{SQL: cfg.Q.Stuck, Args: []any{limit}, Each: func(scan func(dest ...any) error) error {
		var r StoredRecord
		if err := scan(r.dest(cfg.Q)...); err != nil {
			return err
		}
		out = append(out, r)
		return nil
	}})
	if err != nil {
		return nil, opError(ctx, errs, "Stuck", "listing stuck leases", err)
	}
	return out, nil
}

// CountExpired counts what Purge would delete now: the expired records and,
// when inboxRetention is positive, the inbox rows consumed longer ago than
// that (idem.CountExpired). A nil q or a negative retention is an
// ErrInvalidOption, before any SQL.
func CountExpired[O any](ctx context.Context, d *Dialect, q Querier, errs Errors, inboxRetention time.Duration, opts []O) (records, inbox int64, err error) {
	if q == nil || inboxRetention < 0 {
		return 0, 0, fmt.Errorf("%w: CountExpired needs a database and a non-negative retention", ErrInvalidOption)
	}
	cfg, err := NewConfig(d, opts)
	if err != nil {
		return 0, 0, err
	}
	defer cfg.ExplainMissingTable(&err)
	err = q.Run(ctx, Stmt{SQL: cfg.Q.CountExpired, Dest: []any{&records}})
	if err != nil {
		return 0, 0, opError(ctx, errs, "CountExpired", "counting expired records", err)
	}
	if inboxRetention > 0 {
		err = q.Run(ctx, Stmt{SQL: cfg.Inbox.CountExpired,
			Args: []any{inboxRetention.Microseconds()}, Dest: []any{&inbox}})
		if err != nil {
			return records, 0, opError(ctx, errs, "CountExpired", "counting expired inbox rows", err)
		}
	}
	return records, inbox, nil
}

// TableStats counts a record table's rows by status and reports its oldest
// record and its size, in one statement (one snapshot) (idem.TableStats). A
// nil q is an ErrInvalidOption, before any SQL.
func TableStats[O any](ctx context.Context, d *Dialect, q Querier, errs Errors, opts []O) (_ *Stats, err error) {
	if q == nil {
		return nil, fmt.Errorf("%w: TableStats needs a database", ErrInvalidOption)
	}
	cfg, err := NewConfig(d, opts)
	if err != nil {
		return nil, err
	}
	defer cfg.ExplainMissingTable(&err)
	st := &Stats{Statuses: map[string]int64{}}
	err = q.Run(ctx, Stmt{SQL: cfg.Q.Stats, Each: func(scan func(dest ...any) error) error {
		var (
			status            *string
			n, expired, stuck int64
			oldest            *time.Time
		)
		var oldestDest any = &oldest
		if cfg.Q.TimeText {
			oldestDest = textTime{p: &oldest}
		}
		if err := scan(&status, &n, &expired, &stuck, oldestDest, &st.TableBytes, &st.IndexBytes); err != nil {
			return err
		}
		if status != nil {
			st.Statuses[*status] = n
		}
		st.Expired += expired
		st.StuckLeases += stuck
		if oldest != nil && (st.Oldest == nil || oldest.Before(*st.Oldest)) {
			st.Oldest = oldest
		}
		return nil
	}})
	if err != nil {
		return nil, opError(ctx, errs, "TableStats", "reading table statistics", err)
	}
	return st, nil
}

package integration_test

import (
	"context"
	"database/sql"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "github.com/lib/pq"              // database/sql driver "postgres"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsql"
	"github.com/idemkit/idem/integration/internal/pgtest"
)

// Purge, the Purger and the inspection calls through idemsql's own
// database/sql API, for pgx's stdlib driver and lib/pq: the same rows, the
// same answers as the pgx calls.

// purgeSQLEnv is one test's view of one database/sql driver: a pgx pool
// for setup and checks, a schema of its own, and the *sql.DB.
type purgeSQLEnv struct {
	driver string // the database/sql driver's name
	pool   *pgxpool.Pool
	s      *pgtest.Schema
	db     *sql.DB
}

// inbox is the schema's sanitized inbox table.
func (e *purgeSQLEnv) inbox() string {
	return pgx.Identifier{e.s.Name, idem.DefaultInboxTable}.Sanitize()
}

// exec runs setup SQL through pgx.
func (e *purgeSQLEnv) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	_, err := e.pool.Exec(context.Background(), q, args...)
	require.NoError(t, err)
}

// count counts a table's rows through pgx.
func (e *purgeSQLEnv) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n))
	return n
}

func forEachPurgeSQLDriver(t *testing.T, f func(t *testing.T, e *purgeSQLEnv)) {
	for _, d := range sqlDBDrivers {
		t.Run(d.name, func(t *testing.T) {
			pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 4 })
			f(t, &purgeSQLEnv{driver: d.driver, pool: pool, s: pgtest.NewSchema(t, pool), db: openSQLDB(t, d.driver, pgtest.ClientURL(), 4)})
		})
	}
}

// purgeEvents records the EventPurged events Purge reports.
type purgeEvents struct {
	mu   sync.Mutex
	rows []int64
}

func (h *purgeEvents) Event(_ context.Context, e idem.Event) {
	if e.Kind != idem.EventPurged || e.Op != "Purge" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rows = append(h.rows, e.Rows)
}

// Records that idemsql.Do made, expired by moving expires_at in SQL, go;
// live ones, a lease still processing and a row another transaction holds
// stay; the held one goes once released; old inbox rows go with
// InboxRetention. Inside a *sql.Tx the purge is the caller's to commit.
func TestSQLPurgeExpiredRecordsAndInbox(t *testing.T) {
	forEachPurgeSQLDriver(t, func(t *testing.T, e *purgeSQLEnv) {
		ctx := context.Background()
		// Records made by the library, then expired in SQL.
		for _, id := range []string{"done-1", "done-2", "done-3", "live"} {
			_, err := idemsql.Do(ctx, e.db, idem.Key{Scope: "s", ID: id}, func(ctx context.Context, tx *sql.Tx) (string, error) {
				_, err := tx.ExecContext(ctx, `INSERT INTO `+e.s.Effects+` (scope, key, value) VALUES ('s', $1, 'v')`, id)
				return id, err
			}, e.s.Opt)
			require.NoError(t, err)
		}
		e.exec(t, `UPDATE `+e.s.Records+` SET expires_at = clock_timestamp() - interval '1 minute' WHERE key LIKE 'done-%'`)
		// 2,500 more expired records, a lease-mode record still processing
		// and expired, and an expired record another transaction holds.
		e.exec(t, `INSERT INTO `+e.s.Records+` (scope, key, fingerprint, status, response, expires_at)
			SELECT 's', 'old-' || g, '', 'succeeded', '1', clock_timestamp() - interval '1 minute' FROM generate_series(1, 2500) g`)
		e.exec(t, `INSERT INTO `+e.s.Records+` (scope, key, fingerprint, status, locked_until, expires_at)
			VALUES ('s', 'leased', '', 'processing', clock_timestamp() + interval '1 hour', clock_timestamp() - interval '1 minute'),
			       ('s', 'held', '', 'succeeded', NULL, clock_timestamp() - interval '1 minute')`)
		holder, err := e.pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = holder.Rollback(context.Background()) })
		_, err = holder.Exec(ctx, `SELECT FROM `+e.s.Records+` WHERE key = 'held' FOR UPDATE`)
		require.NoError(t, err)

		records, inbox, err := idemsql.CountExpired(ctx, e.db, 0, e.s.Opt)
		require.NoError(t, err)
		require.EqualValues(t, 2500+3+1, records, "the held row counts; the live lease does not")
		require.Zero(t, inbox)

		hooks := &purgeEvents{}
		var batches []int64
		started := time.Now()
		n, err := idemsql.Purge(ctx, e.db, idem.PurgeParams{BatchSize: 1000, Hooks: hooks,
			OnBatch: func(n int64) { batches = append(batches, n) }}, e.s.Opt)
		require.NoError(t, err)
		require.Less(t, time.Since(started), 5*time.Second, "the purge did not wait for the held row")
		require.EqualValues(t, 2503, n)
		require.Equal(t, []int64{1000, 1000, 503}, batches)
		require.Equal(t, []int64{2503}, hooks.rows)
		rows, err := e.pool.Query(ctx, `SELECT key FROM `+e.s.Records+` ORDER BY key`)
		require.NoError(t, err)
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Equal(t, []string{"held", "leased", "live"}, keys)
		require.Equal(t, 4, e.count(t, e.s.Effects), "the purge touches records only")

		require.NoError(t, holder.Rollback(ctx))
		n, err = idemsql.Purge(ctx, e.db, idem.PurgeParams{Hooks: hooks}, e.s.Opt)
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "the held row goes once released")
		n, err = idemsql.Purge(ctx, e.db, idem.PurgeParams{Hooks: hooks}, e.s.Opt)
		require.NoError(t, err)
		require.Zero(t, n)
		require.Equal(t, []int64{2503, 1}, hooks.rows, "a purge that deleted nothing reports nothing")

		// Inbox rows: 30 consumed two days ago, 5 just now.
		e.exec(t, `INSERT INTO `+e.inbox()+` (consumer, message_id) SELECT 'c', 'm' || g FROM generate_series(1, 35) g`)
		e.exec(t, `UPDATE `+e.inbox()+` SET consumed_at = now() - interval '2 days' WHERE message_id <> ALL ('{m31,m32,m33,m34,m35}')`)
		_, inbox, err = idemsql.CountExpired(ctx, e.db, 24*time.Hour, e.s.Opt, e.s.InboxOpt)
		require.NoError(t, err)
		require.EqualValues(t, 30, inbox)
		var inboxBatches []int64
		n, err = idemsql.Purge(ctx, e.db, idem.PurgeParams{BatchSize: 20, InboxRetention: 24 * time.Hour,
			OnInboxBatch: func(n int64) { inboxBatches = append(inboxBatches, n) }}, e.s.Opt, e.s.InboxOpt)
		require.NoError(t, err)
		require.EqualValues(t, 30, n)
		require.Equal(t, []int64{20, 10}, inboxBatches)
		require.Equal(t, 5, e.count(t, e.inbox()), "the recent inbox rows stay")

		// In the caller's transaction: rolled back, nothing is gone;
		// committed, the rows are.
		e.exec(t, `UPDATE `+e.s.Records+` SET expires_at = clock_timestamp() - interval '1 minute' WHERE key = 'live'`)
		for _, commit := range []bool{false, true} {
			tx, err := e.db.BeginTx(ctx, nil)
			require.NoError(t, err)
			n, err = idemsql.Purge(ctx, tx, idem.PurgeParams{InboxRetention: time.Nanosecond}, e.s.Opt, e.s.InboxOpt)
			require.NoError(t, err)
			require.EqualValues(t, 1+5, n)
			if commit {
				require.NoError(t, tx.Commit())
			} else {
				require.NoError(t, tx.Rollback())
			}
		}
		require.Equal(t, 0, e.count(t, e.inbox()))
		require.Equal(t, 1, e.count(t, e.s.Records), "the live lease is left")

		// On a *sql.Conn, each batch is its own transaction on it.
		e.exec(t, `UPDATE `+e.s.Records+` SET status = 'succeeded', locked_until = NULL`)
		conn, err := e.db.Conn(ctx)
		require.NoError(t, err)
		defer conn.Close()
		n, err = idemsql.Purge(ctx, conn, idem.PurgeParams{}, e.s.Opt)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		require.Equal(t, 0, e.count(t, e.s.Records), "the batch committed")
	})
}

// RowsPerSecond spreads the batches of records and inbox rows, reported to
// OnBatch and OnInboxBatch; the purge takes at least as long as the rate
// allows (a lower bound, which a slow machine cannot break). A cancelled
// context stops it between batches with what it deleted so far.
func TestSQLPurgePaced(t *testing.T) {
	forEachPurgeSQLDriver(t, func(t *testing.T, e *purgeSQLEnv) {
		ctx := context.Background()
		fill := func() {
			e.exec(t, `INSERT INTO `+e.s.Records+` (scope, key, fingerprint, status, response, expires_at)
				SELECT 's', 'old-' || g, '', 'succeeded', '1', clock_timestamp() + interval '1 hour' FROM generate_series(1, 2000) g`)
			e.exec(t, `INSERT INTO `+e.inbox()+` (consumer, message_id) SELECT 'c', 'm' || g FROM generate_series(1, 1000) g`)
			// Expire them in SQL.
			e.exec(t, `UPDATE `+e.s.Records+` SET expires_at = clock_timestamp() - interval '1 minute'`)
			e.exec(t, `UPDATE `+e.inbox()+` SET consumed_at = now() - interval '2 days'`)
		}
		fill()
		var batches, inboxBatches []int64
		po := idem.PurgeParams{BatchSize: 500, RowsPerSecond: 10_000, InboxRetention: 24 * time.Hour,
			OnBatch:      func(n int64) { batches = append(batches, n) },
			OnInboxBatch: func(n int64) { inboxBatches = append(inboxBatches, n) }}
		started := time.Now()
		n, err := idemsql.Purge(ctx, e.db, po, e.s.Opt, e.s.InboxOpt)
		require.NoError(t, err)
		took := time.Since(started)
		require.EqualValues(t, 3000, n)
		require.Equal(t, []int64{500, 500, 500, 500, 0}, batches)
		require.Equal(t, []int64{500, 500, 0}, inboxBatches)
		// 3,000 rows in full batches of 500 wait until 500 rows per 50ms
		// are due: the last full batch is due at 300ms.
		require.GreaterOrEqual(t, took, 300*time.Millisecond, "the purge was not paced")
		require.Zero(t, e.count(t, e.s.Records)+e.count(t, e.inbox()))

		fill()
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		po = idem.PurgeParams{BatchSize: 500, RowsPerSecond: 1, OnBatch: func(int64) { cancel() }}
		n, err = idemsql.Purge(cctx, e.db, po, e.s.Opt)
		require.ErrorIs(t, err, context.Canceled)
		require.EqualValues(t, 500, n, "one batch, then the pause is cut short")

		// Paced, the batches default to 2,000 rows.
		_, err = idemsql.Purge(ctx, e.db, idem.PurgeParams{InboxRetention: 24 * time.Hour}, e.s.Opt, e.s.InboxOpt)
		require.NoError(t, err)
		fill()
		batches = nil
		n, err = idemsql.Purge(ctx, e.db, idem.PurgeParams{RowsPerSecond: 1_000_000,
			OnBatch: func(n int64) { batches = append(batches, n) }}, e.s.Opt)
		require.NoError(t, err)
		require.EqualValues(t, 2000, n)
		require.Equal(t, []int64{2000, 0}, batches)
	})
}

// The Purger purges at once and keeps going until its context ends.
func TestSQLPurger(t *testing.T) {
	forEachPurgeSQLDriver(t, func(t *testing.T, e *purgeSQLEnv) {
		e.exec(t, `INSERT INTO `+e.s.Records+` (scope, key, fingerprint, status, response, expires_at)
			SELECT 's', 'old-' || g, '', 'succeeded', '1', clock_timestamp() - interval '1 minute' FROM generate_series(1, 10) g`)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		runs := make(chan int64, 100)
		p := &idemsql.Purger{DB: e.db, Interval: 10 * time.Millisecond, Tables: []idem.TableOption{e.s.Opt},
			OnPurge: func(n int64, err error) {
				if err != nil {
					t.Errorf("purge: %v", err)
				}
				runs <- n
			}}
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		require.EqualValues(t, 10, <-runs, "the first run purges at once")
		e.exec(t, `INSERT INTO `+e.s.Records+` (scope, key, fingerprint, status, response, expires_at)
			VALUES ('s', 'later', '', 'succeeded', '1', clock_timestamp() - interval '1 minute')`)
		var later int64
		for later == 0 {
			later = <-runs
		}
		require.EqualValues(t, 1, later)
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)

		require.ErrorIs(t, (&idemsql.Purger{}).Run(ctx), idem.ErrInvalidOption)
		require.ErrorIs(t, (*idemsql.Purger)(nil).Run(ctx), idem.ErrInvalidOption)
		require.ErrorIs(t, (&idemsql.Purger{DB: e.db, Interval: -1}).Run(ctx), idem.ErrInvalidOption)
	})
}

// utcRecord is r with its times in UTC, so that records read by different
// drivers (pgx gives local time, lib/pq the session's offset) compare.
func utcRecord(r idem.Record) idem.Record {
	if r.LockedUntil != nil {
		l := r.LockedUntil.UTC()
		r.LockedUntil = &l
	}
	r.CreatedAt, r.UpdatedAt, r.ExpiresAt = r.CreatedAt.UTC(), r.UpdatedAt.UTC(), r.ExpiresAt.UTC()
	return r
}

// Lookup, Stuck, CountExpired and TableStats read the same rows as the pgx
// calls and give the same answers, NULL columns and timestamps included.
func TestSQLInspectAgreesWithPgx(t *testing.T) {
	forEachPurgeSQLDriver(t, func(t *testing.T, e *purgeSQLEnv) {
		ctx := context.Background()
		// A finished record, a recorded failure, a token (no fingerprint,
		// no response), two stuck leases (one checkpointed), a live lease,
		// and an expired record.
		e.exec(t, `INSERT INTO `+e.s.Records+` (scope, key, fingerprint, status, attempt, response, locked_until, recovery_point, created_at, updated_at, expires_at) VALUES
			('s', 'done', '\x0102', 'succeeded', 1, '"ok"', NULL, NULL, now() - interval '1 hour', now(), clock_timestamp() + interval '1 day'),
			('s', 'failed', '\x03', 'failed', 1, 'declined', NULL, NULL, now(), now(), clock_timestamp() + interval '1 day'),
			('s', 'token', NULL, 'issued', 0, NULL, NULL, NULL, now(), now(), clock_timestamp() + interval '1 day'),
			('s', 'stuck-1', '', 'processing', 3, NULL, clock_timestamp() - interval '2 minutes', NULL, now(), now(), clock_timestamp() + interval '1 day'),
			('s', 'stuck-2', '', 'processing', 2, '{"n":1}', clock_timestamp() - interval '1 minute', 'charged', now(), now(), clock_timestamp() + interval '1 day'),
			('s', 'leased', '', 'processing', 1, NULL, clock_timestamp() + interval '1 hour', NULL, now(), now(), clock_timestamp() + interval '1 day'),
			('s', 'old', '', 'succeeded', 1, '1', NULL, NULL, now() - interval '2 days', now(), clock_timestamp() + interval '1 day')`)
		e.exec(t, `UPDATE `+e.s.Records+` SET expires_at = clock_timestamp() - interval '1 second' WHERE key = 'old'`)
		e.exec(t, `INSERT INTO `+e.inbox()+` (consumer, message_id) VALUES ('c', 'm1'), ('c', 'm2'), ('c', 'm3')`)
		e.exec(t, `UPDATE `+e.inbox()+` SET consumed_at = now() - interval '2 days' WHERE message_id <> 'm3'`)

		for _, id := range []string{"done", "failed", "token", "stuck-1", "stuck-2", "leased", "old"} {
			want, err := idem.Lookup(ctx, e.pool, "s", id, e.s.Opt)
			require.NoError(t, err)
			got, err := idemsql.Lookup(ctx, e.db, "s", id, e.s.Opt)
			require.NoError(t, err, id)
			require.Equal(t, utcRecord(*want), utcRecord(*got), id)
		}
		token, err := idemsql.Lookup(ctx, e.db, "s", "token", e.s.Opt)
		require.NoError(t, err)
		require.Nil(t, token.Fingerprint)
		require.Nil(t, token.Response)
		require.Nil(t, token.LockedUntil)
		stuck2, err := idemsql.Lookup(ctx, e.db, "s", "stuck-2", e.s.Opt)
		require.NoError(t, err)
		require.Equal(t, "charged", stuck2.RecoveryPoint)
		require.NotNil(t, stuck2.LockedUntil)
		require.WithinDuration(t, time.Now().Add(-time.Minute), *stuck2.LockedUntil, time.Minute)

		_, err = idemsql.Lookup(ctx, e.db, "s", "absent", e.s.Opt)
		require.ErrorIs(t, err, idem.ErrNotFound)
		_, err = idemsql.Lookup(ctx, e.db, "s", "", e.s.Opt)
		require.ErrorIs(t, err, idem.ErrInvalidKey)

		wantStuck, err := idem.Stuck(ctx, e.pool, 10, e.s.Opt)
		require.NoError(t, err)
		gotStuck, err := idemsql.Stuck(ctx, e.db, 10, e.s.Opt)
		require.NoError(t, err)
		require.Len(t, gotStuck, 2)
		require.Equal(t, "stuck-1", gotStuck[0].ID, "the longest-expired first")
		for i := range wantStuck {
			require.Equal(t, utcRecord(wantStuck[i]), utcRecord(gotStuck[i]))
		}
		one, err := idemsql.Stuck(ctx, e.db, 1, e.s.Opt)
		require.NoError(t, err)
		require.Len(t, one, 1)

		wantRecords, wantInbox, err := idem.CountExpired(ctx, e.pool, 24*time.Hour, e.s.Opt, e.s.InboxOpt)
		require.NoError(t, err)
		gotRecords, gotInbox, err := idemsql.CountExpired(ctx, e.db, 24*time.Hour, e.s.Opt, e.s.InboxOpt)
		require.NoError(t, err)
		require.EqualValues(t, 1, gotRecords)
		require.EqualValues(t, 2, gotInbox)
		require.Equal(t, wantRecords, gotRecords)
		require.Equal(t, wantInbox, gotInbox)

		want, err := idem.TableStats(ctx, e.pool, e.s.Opt)
		require.NoError(t, err)
		got, err := idemsql.TableStats(ctx, e.db, e.s.Opt)
		require.NoError(t, err)
		require.Equal(t, map[string]int64{"succeeded": 2, "failed": 1, "issued": 1, "processing": 3}, got.Statuses)
		require.EqualValues(t, 1, got.Expired)
		require.EqualValues(t, 2, got.StuckLeases)
		require.NotNil(t, got.Oldest)
		require.True(t, want.Oldest.Equal(*got.Oldest), "oldest: pgx %v, database/sql %v", want.Oldest, got.Oldest)
		require.Positive(t, got.TableBytes)
		require.Positive(t, got.IndexBytes)
		wantCopy, gotCopy := *want, *got
		wantCopy.Oldest, gotCopy.Oldest = nil, nil
		require.Equal(t, wantCopy, gotCopy)

		// In the caller's transaction, its own uncommitted writes are seen.
		tx, err := e.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback() })
		_, err = tx.ExecContext(ctx, `DELETE FROM `+e.s.Records+` WHERE status = 'processing'`)
		require.NoError(t, err)
		inTx, err := idemsql.TableStats(ctx, tx, e.s.Opt)
		require.NoError(t, err)
		require.Zero(t, inTx.StuckLeases)
		stuckInTx, err := idemsql.Stuck(ctx, tx, 10, e.s.Opt)
		require.NoError(t, err)
		require.Empty(t, stuckInTx)
		require.NoError(t, tx.Rollback())

		// An empty table.
		e.exec(t, `TRUNCATE `+e.s.Records)
		empty, err := idemsql.TableStats(ctx, e.db, e.s.Opt)
		require.NoError(t, err)
		require.Empty(t, empty.Statuses)
		require.Nil(t, empty.Oldest)
		require.Zero(t, empty.Expired)
		gotStuck, err = idemsql.Stuck(ctx, e.db, 10, e.s.Opt)
		require.NoError(t, err)
		require.Empty(t, gotStuck)
	})
}

// Nil handles, bad arguments, a closed *sql.DB, an ended *sql.Tx and a
// missing table, for Purge and every inspection call.
func TestSQLPurgeInspectArgumentsAndHandles(t *testing.T) {
	forEachPurgeSQLDriver(t, func(t *testing.T, e *purgeSQLEnv) {
		ctx := context.Background()
		calls := map[string]func(db idemsql.DBTX, opts ...idem.TableOption) error{
			"Purge": func(db idemsql.DBTX, opts ...idem.TableOption) error {
				_, err := idemsql.Purge(ctx, db, idem.PurgeParams{}, opts...)
				return err
			},
			"Purge, inbox": func(db idemsql.DBTX, opts ...idem.TableOption) error {
				_, err := idemsql.Purge(ctx, db, idem.PurgeParams{InboxRetention: time.Hour}, opts...)
				return err
			},
			"Lookup": func(db idemsql.DBTX, opts ...idem.TableOption) error {
				_, err := idemsql.Lookup(ctx, db, "s", "k", opts...)
				if err == idem.ErrNotFound {
					return nil
				}
				return err
			},
			"Stuck": func(db idemsql.DBTX, opts ...idem.TableOption) error {
				_, err := idemsql.Stuck(ctx, db, 10, opts...)
				return err
			},
			"CountExpired": func(db idemsql.DBTX, opts ...idem.TableOption) error {
				_, _, err := idemsql.CountExpired(ctx, db, time.Hour, opts...)
				return err
			},
			"TableStats": func(db idemsql.DBTX, opts ...idem.TableOption) error {
				_, err := idemsql.TableStats(ctx, db, opts...)
				return err
			},
		}
		names := make([]string, 0, len(calls))
		for name := range calls {
			names = append(names, name)
		}
		sort.Strings(names)
		closed := openSQLDB(t, e.driver, pgtest.ClientURL(), 1)
		require.NoError(t, closed.Close())
		ended, err := e.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, ended.Rollback())
		missing := idem.WithTable(e.s.Name, "never_migrated")
		noInbox := idem.WithInboxTable(e.s.Name, "no_inbox")
		for _, name := range names {
			call := calls[name]
			require.NoError(t, call(e.db, e.s.Opt, e.s.InboxOpt), name)
			for _, h := range []idemsql.DBTX{nil, (*sql.DB)(nil), (*sql.Tx)(nil), (*sql.Conn)(nil)} {
				var err error
				require.NotPanics(t, func() { err = call(h, e.s.Opt) }, "%s(%T)", name, h)
				require.ErrorIs(t, err, idem.ErrInvalidOption, "%s(%T)", name, h)
			}
			err := call(closed, e.s.Opt, e.s.InboxOpt)
			op, _, _ := strings.Cut(name, ",")
			require.ErrorContains(t, err, "idem: "+op+": the pool was closed", name)
			err = call(ended, e.s.Opt, e.s.InboxOpt)
			require.ErrorIs(t, err, idem.ErrInvalidOption, "%s on an ended *sql.Tx", name)
			require.ErrorIs(t, err, sql.ErrTxDone, name)
			require.ErrorContains(t, err, "already committed or rolled back", name)

			opts := []idem.TableOption{missing, e.s.InboxOpt}
			table := e.s.Name + ".never_migrated"
			if name == "Purge, inbox" {
				opts, table = []idem.TableOption{e.s.Opt, noInbox}, e.s.Name+".no_inbox"
			}
			err = call(e.db, opts...)
			require.ErrorContains(t, err, "table "+table+" does not exist", name)
			require.ErrorContains(t, err, "migrations.Up", name)
		}
		for name, err := range map[string]error{
			"negative batch":     func() error { _, err := idemsql.Purge(ctx, e.db, idem.PurgeParams{BatchSize: -1}); return err }(),
			"negative rate":      func() error { _, err := idemsql.Purge(ctx, e.db, idem.PurgeParams{RowsPerSecond: -1}); return err }(),
			"negative retention": func() error { _, err := idemsql.Purge(ctx, e.db, idem.PurgeParams{InboxRetention: -1}); return err }(),
			"negative retry": func() error {
				_, err := idemsql.Purge(ctx, e.db, idem.PurgeParams{Retry: idem.RetryPolicy{MaxAttempts: -1}})
				return err
			}(),
			"bad table": func() error {
				_, err := idemsql.Purge(ctx, e.db, idem.PurgeParams{}, idem.WithTable("", "1t"))
				return err
			}(),
			"zero limit":   func() error { _, err := idemsql.Stuck(ctx, e.db, 0); return err }(),
			"negative age": func() error { _, _, err := idemsql.CountExpired(ctx, e.db, -1); return err }(),
			"bad inbox": func() error {
				_, _, err := idemsql.CountExpired(ctx, e.db, 0, idem.WithInboxTable("", "1i"))
				return err
			}(),
			"lookup option": func() error { _, err := idemsql.Lookup(ctx, e.db, "s", "k", idem.WithTable("", "1t")); return err }(),
		} {
			require.ErrorIs(t, err, idem.ErrInvalidOption, name)
		}
	})
}

package integration_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	"github.com/idemkit/idem/internal/cutproxy"
)

// The same scenarios run for three drivers: pgx itself (*pgxpool.Pool,
// pgx.Tx), and database/sql through idemsql with pgx's stdlib driver and
// with lib/pq.

// sqlDriver opens one driver's database.
type sqlDriver struct {
	name string
	// open connects to databaseURL with at most maxConns connections,
	// closed when the test ends: a *pgxpool.Pool or a *sql.DB.
	open func(t *testing.T, databaseURL string, maxConns int) any
}

var sqlDrivers = []sqlDriver{
	{name: "pgx", open: openPgx},
	{name: "stdlib", open: func(t *testing.T, u string, n int) any { return openSQLDB(t, "pgx", u, n) }},
	{name: "libpq", open: func(t *testing.T, u string, n int) any { return openSQLDB(t, "postgres", u, n) }},
}

func openPgx(t *testing.T, databaseURL string, maxConns int) any {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	require.NoError(t, err)
	cfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// stx is a transaction in its driver's own type, as fn receives it and as
// the caller holds it, with the few calls the scenarios make.
type stx struct {
	pgx pgx.Tx
	sql *sql.Tx
}

// Exec runs a statement in the transaction.
func (x stx) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	if x.sql != nil {
		res, err := x.sql.ExecContext(ctx, q, args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
	tag, err := x.pgx.Exec(ctx, q, args...)
	return tag.RowsAffected(), err
}

// QueryRow runs a query in the transaction; Scan reads its row.
func (x stx) QueryRow(ctx context.Context, q string, args ...any) interface{ Scan(...any) error } {
	if x.sql != nil {
		return x.sql.QueryRowContext(ctx, q, args...)
	}
	return x.pgx.QueryRow(ctx, q, args...)
}

// Commit and Rollback end a transaction the scenario began.
func (x stx) Commit(ctx context.Context) error {
	if x.sql != nil {
		return x.sql.Commit()
	}
	return x.pgx.Commit(ctx)
}

func (x stx) Rollback(ctx context.Context) error {
	if x.sql != nil {
		return x.sql.Rollback()
	}
	return x.pgx.Rollback(ctx)
}

// envDo is Do of db's driver: idem.Do on a pool, idemsql.Do on a *sql.DB.
func envDo[T any](ctx context.Context, db any, key idem.Key, fn func(context.Context, stx) (T, error), opts ...idem.DoOption) (idem.Result[T], error) {
	if d, ok := db.(*sql.DB); ok {
		return idemsql.Do(ctx, d, key, func(ctx context.Context, tx *sql.Tx) (T, error) { return fn(ctx, stx{sql: tx}) }, opts...)
	}
	return idem.Do(ctx, db.(*pgxpool.Pool), key, func(ctx context.Context, tx pgx.Tx) (T, error) { return fn(ctx, stx{pgx: tx}) }, opts...)
}

// envWith is WithIdempotency of tx's driver.
func envWith[T any](ctx context.Context, tx stx, key idem.Key, fn func(context.Context, stx) (T, error), opts ...idem.Option) (idem.Result[T], error) {
	if tx.sql != nil {
		return idemsql.WithIdempotency(ctx, tx.sql, key, func(ctx context.Context, t *sql.Tx) (T, error) { return fn(ctx, stx{sql: t}) }, opts...)
	}
	return idem.WithIdempotency(ctx, tx.pgx, key, func(ctx context.Context, t pgx.Tx) (T, error) { return fn(ctx, stx{pgx: t}) }, opts...)
}

// sqlEnv is one scenario's view of one driver.
type sqlEnv struct {
	driver sqlDriver
	pool   *pgxpool.Pool // pgx, for setup and for counting
	s      *pgtest.Schema
	db     any // the driver's database: *pgxpool.Pool or *sql.DB
}

// begin begins a caller-owned transaction at iso in the driver's type.
func (e *sqlEnv) begin(ctx context.Context, iso pgx.TxIsoLevel) (stx, error) {
	if d, ok := e.db.(*sql.DB); ok {
		level := map[pgx.TxIsoLevel]sql.IsolationLevel{
			"": sql.LevelDefault, pgx.ReadCommitted: sql.LevelReadCommitted,
			pgx.RepeatableRead: sql.LevelRepeatableRead, pgx.Serializable: sql.LevelSerializable,
		}[iso]
		tx, err := d.BeginTx(ctx, &sql.TxOptions{Isolation: level})
		return stx{sql: tx}, err
	}
	tx, err := e.db.(*pgxpool.Pool).BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
	return stx{pgx: tx}, err
}

// inTx runs f in a caller-owned transaction and commits.
func (e *sqlEnv) inTx(t *testing.T, f func(tx stx) error) error {
	t.Helper()
	ctx := context.Background()
	tx, err := e.begin(ctx, "")
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// effect writes one effect row in tx, with its driver's own calls.
func (e *sqlEnv) effect(ctx context.Context, tx stx, key idem.Key, value string) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+e.s.Effects+` (scope, key, value) VALUES ($1, $2, $3)`, key.Scope, key.ID, value)
	return err
}

func sqlKey(t *testing.T) idem.Key {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return idem.Key{Scope: "sqldriver", ID: hex.EncodeToString(b)}
}

type sqlScenario struct {
	name     string
	maxConns int // 0: 4
	run      func(t *testing.T, e *sqlEnv)
}

func TestSQLDriver(t *testing.T) {
	for _, d := range sqlDrivers {
		t.Run(d.name, func(t *testing.T) {
			for _, sc := range sqlScenarios {
				t.Run(sc.name, func(t *testing.T) {
					conns := sc.maxConns
					if conns == 0 {
						conns = 4
					}
					pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 4 })
					db := d.open(t, pgtest.ClientURL(), conns)
					sc.run(t, &sqlEnv{driver: d, pool: pool, s: pgtest.NewSchema(t, pool), db: db})
				})
			}
		})
	}
}

var errBoom = errors.New("boom")

var sqlScenarios = []sqlScenario{
	{name: "FirstCallThenReplay", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		key := sqlKey(t)
		var runs atomic.Int64
		fn := func(ctx context.Context, tx stx) (string, error) {
			v := fmt.Sprintf("run-%d", runs.Add(1))
			return v, e.effect(ctx, tx, key, v)
		}
		var first, second idem.Result[string]
		require.NoError(t, e.inTx(t, func(tx stx) (err error) {
			first, err = envWith(ctx, tx, key, fn, e.s.Opt)
			return err
		}))
		require.NoError(t, e.inTx(t, func(tx stx) (err error) {
			second, err = envWith(ctx, tx, key, fn, e.s.Opt)
			return err
		}))
		viaDo, err := envDo(ctx, e.db, key, fn, e.s.Opt)
		require.NoError(t, err)
		require.False(t, first.Replayed)
		require.True(t, second.Replayed)
		require.True(t, viaDo.Replayed)
		require.Equal(t, "run-1", first.Value)
		require.Equal(t, first.Value, second.Value)
		require.Equal(t, first.Value, viaDo.Value)
		require.EqualValues(t, 1, runs.Load())
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
		require.Equal(t, idem.StatusSucceeded, e.s.ReadRecord(t, e.pool, key).Status)
	}},

	{name: "FnErrorLeavesNothingAndRetryRuns", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		key := sqlKey(t)
		fail := true
		fn := func(ctx context.Context, tx stx) (string, error) {
			if err := e.effect(ctx, tx, key, "x"); err != nil {
				return "", err
			}
			if fail {
				return "", errBoom
			}
			return "ok", nil
		}
		require.NoError(t, e.inTx(t, func(tx stx) error {
			_, err := envWith(ctx, tx, key, fn, e.s.Opt)
			require.ErrorIs(t, err, errBoom)
			// The caller's transaction is still usable.
			var one int
			return tx.QueryRow(ctx, `SELECT 1`).Scan(&one)
		}))
		require.Zero(t, e.s.CountEffects(t, e.pool, key))
		require.Nil(t, e.s.ReadRecord(t, e.pool, key))
		fail = false
		res, err := envDo(ctx, e.db, key, fn, e.s.Opt)
		require.NoError(t, err)
		require.False(t, res.Replayed)
		require.Equal(t, "ok", res.Value)
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
	}},

	{name: "PermanentRecordedAndReplayed", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		key := sqlKey(t)
		var runs atomic.Int64
		fn := func(ctx context.Context, tx stx) (int64, error) {
			runs.Add(1)
			if err := e.effect(ctx, tx, key, "charged"); err != nil {
				return 0, err
			}
			return 0, idem.Permanent(errors.New("card declined"))
		}
		_, err := envDo(ctx, e.db, key, fn, e.s.Opt)
		require.True(t, idem.IsPermanent(err), "%v", err)
		require.EqualError(t, err, "card declined")
		res, err := envDo(ctx, e.db, key, fn, e.s.Opt)
		require.True(t, idem.IsPermanent(err), "%v", err)
		require.EqualError(t, err, "card declined")
		require.True(t, res.Replayed)
		require.EqualValues(t, 1, runs.Load())
		require.Zero(t, e.s.CountEffects(t, e.pool, key))
		require.Equal(t, idem.StatusFailed, e.s.ReadRecord(t, e.pool, key).Status)
	}},

	{name: "NoWaitInProgressKeepsCallerTx", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		key := sqlKey(t)
		holder, err := e.begin(ctx, "")
		require.NoError(t, err)
		defer holder.Rollback(ctx) //nolint:errcheck
		_, err = envWith(ctx, holder, key, func(ctx context.Context, tx stx) (string, error) {
			return "held", e.effect(ctx, tx, key, "held")
		}, e.s.Opt)
		require.NoError(t, err)

		require.NoError(t, e.inTx(t, func(tx stx) error {
			_, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '7s'`)
			require.NoError(t, err)
			start := time.Now()
			_, err = envWith(ctx, tx, key, func(context.Context, stx) (string, error) {
				t.Error("fn ran while another transaction held the key")
				return "", nil
			}, e.s.Opt, idem.NoWait())
			require.ErrorIs(t, err, idem.ErrInProgress)
			require.Less(t, time.Since(start), 3*time.Second)
			var timeout string
			require.NoError(t, tx.QueryRow(ctx, `SHOW lock_timeout`).Scan(&timeout))
			require.Equal(t, "7s", timeout)
			var n int
			require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_class WHERE relname = 'pg_class'`).Scan(&n))
			require.Equal(t, 1, n)
			return nil
		}))
		require.NoError(t, holder.Commit(ctx))
		res, err := envDo(ctx, e.db, key, func(context.Context, stx) (string, error) { return "again", nil }, e.s.Opt, idem.NoWait())
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, "held", res.Value)
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
	}},

	{name: "KeyReused", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		key := sqlKey(t)
		key.Fingerprint = []byte("request A")
		fn := func(ctx context.Context, tx stx) (string, error) { return "a", e.effect(ctx, tx, key, "a") }
		_, err := envDo(ctx, e.db, key, fn, e.s.Opt)
		require.NoError(t, err)
		other := key
		other.Fingerprint = []byte("request B")
		_, err = envDo(ctx, e.db, other, fn, e.s.Opt)
		require.ErrorIs(t, err, idem.ErrKeyReused)
		require.NoError(t, e.inTx(t, func(tx stx) error {
			_, err := envWith(ctx, tx, other, fn, e.s.Opt)
			require.ErrorIs(t, err, idem.ErrKeyReused)
			return nil
		}))
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
	}},

	{name: "FiftyGoroutinesOneKey", maxConns: 20, run: func(t *testing.T, e *sqlEnv) {
		key := sqlKey(t)
		var runs atomic.Int64
		values := make([]string, 50)
		errs := make([]error, 50)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Go(func() {
				<-start
				res, err := envDo(context.Background(), e.db, key, func(ctx context.Context, tx stx) (string, error) {
					v := fmt.Sprintf("run-%d-%d", runs.Add(1), time.Now().UnixNano())
					return v, e.effect(ctx, tx, key, v)
				}, e.s.Opt)
				values[i], errs[i] = res.Value, err
			})
		}
		close(start)
		wg.Wait()
		requireOneOutcome(t, e, key, values, errs)
	}},

	{name: "RepeatableReadConflictsAreRetried", maxConns: 20, run: func(t *testing.T, e *sqlEnv) {
		contendedDo(t, e, pgx.RepeatableRead)
	}},

	{name: "SerializationFailureIsRetryable", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		_, err := e.pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{e.s.Name, "counter"}.Sanitize()+` (id int PRIMARY KEY, n int NOT NULL);
			INSERT INTO `+pgx.Identifier{e.s.Name, "counter"}.Sanitize()+` VALUES (1, 0)`)
		require.NoError(t, err)
		table := pgx.Identifier{e.s.Name, "counter"}.Sanitize()
		tx, err := e.begin(ctx, pgx.RepeatableRead)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck
		var n int
		require.NoError(t, tx.QueryRow(ctx, `SELECT n FROM `+table+` WHERE id = $1`, 1).Scan(&n)) // the snapshot
		tag, err := e.pool.Exec(ctx, `UPDATE `+table+` SET n = n + 1 WHERE id = $1`, 1)
		require.NoError(t, err)
		require.EqualValues(t, 1, tag.RowsAffected())
		_, err = tx.Exec(ctx, `UPDATE `+table+` SET n = n + 1 WHERE id = $1`, 1)
		require.Error(t, err)
		require.True(t, idem.IsRetryable(err), "%T %v", err, err)
	}},

	{name: "SavepointsOnCallerTx", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		key, failing := sqlKey(t), sqlKey(t)
		fn := func(ctx context.Context, tx stx) (string, error) { return "v", e.effect(ctx, tx, key, "v") }
		require.NoError(t, e.inTx(t, func(tx stx) error {
			_, err := tx.Exec(ctx, `SAVEPOINT caller`)
			require.NoError(t, err)
			res, err := envWith(ctx, tx, key, fn, e.s.Opt)
			require.NoError(t, err)
			require.False(t, res.Replayed)
			_, err = envWith(ctx, tx, failing, func(ctx context.Context, tx stx) (string, error) {
				if err := e.effect(ctx, tx, failing, "x"); err != nil {
					return "", err
				}
				_, err := tx.Exec(ctx, `SELECT 1/0`) // aborts fn's savepoint
				return "", err
			}, e.s.Opt)
			require.Error(t, err)
			// idem's savepoints are gone and the caller's is where it was:
			// rolling back to it undoes the first call, record and effect.
			_, err = tx.Exec(ctx, `ROLLBACK TO SAVEPOINT caller`)
			require.NoError(t, err)
			var n int
			require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM `+e.s.Records+` WHERE key = $1`, key.ID).Scan(&n))
			require.Zero(t, n)
			_, err = tx.Exec(ctx, `RELEASE SAVEPOINT caller`)
			require.NoError(t, err)
			res, err = envWith(ctx, tx, key, fn, e.s.Opt)
			require.NoError(t, err)
			require.False(t, res.Replayed)
			return nil
		}))
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
		require.Zero(t, e.s.CountEffects(t, e.pool, failing))
		require.Nil(t, e.s.ReadRecord(t, e.pool, failing))
	}},

	{name: "CutCommitIsOutcomeUnknown", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		key := sqlKey(t)
		p, err := cutproxy.New(pgtest.URL())
		require.NoError(t, err)
		t.Cleanup(p.Close)
		viaProxy := e.driver.open(t, p.URL(), 2)
		var runs atomic.Int64
		fn := func(ctx context.Context, tx stx) (string, error) {
			v := fmt.Sprintf("run-%d", runs.Add(1))
			return v, e.effect(ctx, tx, key, v)
		}
		p.SetCutRate(1)
		_, err = envDo(ctx, viaProxy, key, fn, e.s.Opt)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "%T %v", err, err)
		t.Logf("cut COMMIT: %v", err)
		require.EqualValues(t, 1, p.Cuts())
		// The same key, retried, settles it: a replay or a single run.
		res, err := envDo(ctx, e.db, key, fn, e.s.Opt)
		require.NoError(t, err)
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
		if res.Replayed {
			require.Equal(t, "run-1", res.Value)
		} else {
			require.Equal(t, "run-2", res.Value)
		}
	}},
	// The rest of the WithIdempotency/Do case table (README, "Guarantees of
	// WithIdempotency and Do"), mirroring the pgx-only tests of
	// core_test.go, lease_test.go, token_purge_test.go, security_test.go
	// and hooks_test.go.

	{name: "PanicReraisedLeavesNothing", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		key := sqlKey(t)
		panicky := func(ctx context.Context, tx stx) (string, error) {
			if err := e.effect(ctx, tx, key, "x"); err != nil {
				return "", err
			}
			panic("kaboom")
		}
		require.PanicsWithValue(t, "kaboom", func() { _, _ = envDo(ctx, e.db, key, panicky, e.s.Opt) })
		require.Nil(t, e.s.ReadRecord(t, e.pool, key))
		require.Zero(t, e.s.CountEffects(t, e.pool, key))

		tx, err := e.begin(ctx, "")
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck
		require.PanicsWithValue(t, "kaboom", func() { _, _ = envWith(ctx, tx, key, panicky, e.s.Opt) })
		// The caller's transaction survived the panic and can commit.
		own := idem.Key{Scope: "caller", ID: key.ID}
		require.NoError(t, e.effect(ctx, tx, own, "kept"))
		require.NoError(t, tx.Commit(ctx))
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, own))
		requireNothingThenOneRun(t, e, key)
	}},

	{name: "ContextCancelledMidFn", run: func(t *testing.T, e *sqlEnv) {
		key := sqlKey(t)
		for _, viaDo := range []bool{true, false} {
			ctx, cancel := context.WithCancel(context.Background())
			slow := func(ctx context.Context, tx stx) (string, error) {
				if err := e.effect(ctx, tx, key, "x"); err != nil {
					return "", err
				}
				marker := "pg_sleep(5) -- " + e.s.Name
				cancelWhenRunning(t, ctx, marker, cancel)
				_, err := tx.Exec(ctx, "SELECT "+marker)
				return "late", err
			}
			start := time.Now()
			if viaDo {
				_, err := envDo(ctx, e.db, key, slow, e.s.Opt)
				// Whatever the driver reports (lib/pq: the server's
				// SQLSTATE 57014), idem's error matches the context's.
				require.ErrorIs(t, err, context.Canceled, "%T %v", err, err)
				t.Logf("Do, cancelled: %v", err)
			} else {
				tx, err := e.begin(context.Background(), "")
				require.NoError(t, err)
				defer tx.Rollback(context.Background()) //nolint:errcheck
				_, err = envWith(ctx, tx, key, slow, e.s.Opt)
				require.Error(t, err)
				t.Logf("WithIdempotency, cancelled: %v", err)
				_ = tx.Commit(context.Background()) // a careless caller: still nothing may commit
			}
			cancel()
			require.Less(t, time.Since(start), 4*time.Second, "the cancellation interrupted pg_sleep")
			require.Nil(t, e.s.ReadRecord(t, e.pool, key), "viaDo=%v", viaDo)
			require.Zero(t, e.s.CountEffects(t, e.pool, key), "viaDo=%v", viaDo)
		}
		var runs atomic.Int64
		res, err := envDo(context.Background(), e.db, key, func(ctx context.Context, tx stx) (string, error) {
			runs.Add(1)
			return "ok", e.effect(ctx, tx, key, "ok")
		}, e.s.Opt)
		require.NoError(t, err)
		require.False(t, res.Replayed)
		require.EqualValues(t, 1, runs.Load(), "the retry runs fn once")
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
	}},

	{name: "TerminatedBackendMidFn", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		key := sqlKey(t)
		var victimRuns atomic.Int64
		victim := func(ctx context.Context, tx stx) (string, error) {
			victimRuns.Add(1)
			if err := e.effect(ctx, tx, key, "doomed"); err != nil {
				return "", err
			}
			var pid int
			if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				return "", err
			}
			var killed bool
			if err := e.pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&killed); err != nil {
				return "", err
			}
			if !killed {
				return "", fmt.Errorf("backend %d was not terminated", pid)
			}
			_, err := tx.Exec(ctx, "SELECT 1")
			return "unreachable", err
		}
		// Do's retries of an unavailable database off: the victim would
		// have itself terminated on every attempt.
		_, err := envDo(ctx, e.db, key, victim, e.s.Opt, idem.WithRetry(idem.RetryPolicy{Outage: -1}))
		require.Error(t, err)
		require.NotContains(t, err.Error(), "was not terminated")
		t.Logf("terminated backend: %v", err)
		require.EqualValues(t, 1, victimRuns.Load())
		requireNothingThenOneRun(t, e, key)
	}},

	{name: "TTLExpiryTakeover", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		key := sqlKey(t)
		ttl := idem.WithTTL(time.Hour)
		var runs atomic.Int64
		fn := func(ctx context.Context, tx stx) (string, error) {
			v := fmt.Sprintf("run-%d", runs.Add(1))
			return v, e.effect(ctx, tx, key, v)
		}
		r1, err := envDo(ctx, e.db, key, fn, e.s.Opt, ttl)
		require.NoError(t, err)
		require.False(t, r1.Replayed)
		r2, err := envDo(ctx, e.db, key, fn, e.s.Opt, ttl)
		require.NoError(t, err)
		require.True(t, r2.Replayed, "replayed while the record lives")
		require.Equal(t, r1.Value, r2.Value)

		expireRecord(t, e.pool, e.s, key)
		r3, err := envDo(ctx, e.db, key, fn, e.s.Opt, ttl)
		require.NoError(t, err)
		require.False(t, r3.Replayed, "an expired record is taken over")
		require.Equal(t, "run-2", r3.Value)
		require.Equal(t, 2, e.s.CountEffects(t, e.pool, key))
		require.Equal(t, 2, e.s.ReadRecord(t, e.pool, key).Attempt)

		// Inside a caller's transaction, too; the default TTL then keeps it:
		// the record expires a DefaultTTL from its claim, not the call's hour.
		expireRecord(t, e.pool, e.s, key)
		var r4 idem.Result[string]
		var claimedAt time.Time
		require.NoError(t, e.inTx(t, func(tx stx) (err error) {
			if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&claimedAt); err != nil {
				return err
			}
			r4, err = envWith(ctx, tx, key, fn, e.s.Opt)
			return err
		}))
		require.False(t, r4.Replayed)
		require.Equal(t, "run-3", r4.Value)
		var expiresAt time.Time
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT expires_at FROM `+e.s.Records+` WHERE scope = $1 AND key = $2`,
			key.Scope, key.ID).Scan(&expiresAt))
		require.GreaterOrEqual(t, expiresAt.Sub(claimedAt), idem.DefaultTTL)
		r5, err := envDo(ctx, e.db, key, fn, e.s.Opt)
		require.NoError(t, err)
		require.True(t, r5.Replayed)
		require.Equal(t, r4.Value, r5.Value)
		require.EqualValues(t, 3, runs.Load())
		require.Equal(t, 3, e.s.CountEffects(t, e.pool, key))
	}},

	{name: "MaxResultSize", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		key := sqlKey(t)
		small := idem.WithMaxResultSize(100)
		var runs atomic.Int64
		sized := func(n int) func(context.Context, stx) (string, error) {
			return func(ctx context.Context, tx stx) (string, error) {
				runs.Add(1)
				// n characters are n+2 bytes of JSON.
				return strings.Repeat("y", n), e.effect(ctx, tx, key, fmt.Sprint(n))
			}
		}
		_, err := envDo(ctx, e.db, key, sized(99), e.s.Opt, small)
		require.ErrorIs(t, err, idem.ErrResultTooLarge)
		require.Contains(t, err.Error(), "101 bytes")
		require.Nil(t, e.s.ReadRecord(t, e.pool, key), "nothing recorded")
		require.Zero(t, e.s.CountEffects(t, e.pool, key), "fn's writes rolled back")

		// In the caller's transaction: rolled back like an error from fn,
		// the transaction usable.
		require.NoError(t, e.inTx(t, func(tx stx) error {
			_, err := envWith(ctx, tx, key, sized(99), e.s.Opt, small)
			require.ErrorIs(t, err, idem.ErrResultTooLarge)
			require.NoError(t, e.effect(ctx, tx, idem.Key{Scope: "caller", ID: key.ID}, "kept"))
			res, err := envWith(ctx, tx, key, sized(98), e.s.Opt, small)
			require.NoError(t, err)
			require.False(t, res.Replayed)
			return nil
		}))
		require.EqualValues(t, 3, runs.Load())
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, key), "only the run that fit")
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, idem.Key{Scope: "caller", ID: key.ID}))
		require.Len(t, e.s.ReadRecord(t, e.pool, key).Response, 100)
		res, err := envDo(ctx, e.db, key, sized(99), e.s.Opt, small)
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, strings.Repeat("y", 98), res.Value)
	}},

	{name: "SerializableTwentyCallers", maxConns: 20, run: func(t *testing.T, e *sqlEnv) {
		contendedDo(t, e, pgx.Serializable)
	}},

	{name: "HooksReportOnlyCommittedExecutions", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		log := &eventLog{}
		hooks := idem.WithHooks(log)
		key := sqlKey(t)
		var runs atomic.Int64
		fn := func(ctx context.Context, tx stx) (string, error) {
			v := fmt.Sprintf("run-%d", runs.Add(1))
			return v, e.effect(ctx, tx, key, v)
		}
		_, err := envDo(ctx, e.db, key, fn, e.s.Opt, hooks)
		require.NoError(t, err)
		require.Equal(t, []string{"executed/Do"}, log.take())
		_, err = envDo(ctx, e.db, key, fn, e.s.Opt, hooks)
		require.NoError(t, err)
		require.Equal(t, []string{"replayed/Do"}, log.take())

		// fn's write breaks a deferred unique constraint: the COMMIT fails
		// with 23505, so nothing executed and nothing may be reported so.
		tickets := pgx.Identifier{e.s.Name, "tickets"}.Sanitize()
		_, err = e.pool.Exec(ctx, `CREATE TABLE `+tickets+` (seat text NOT NULL,
			CONSTRAINT tickets_seat_key UNIQUE (seat) DEFERRABLE INITIALLY DEFERRED);
			INSERT INTO `+tickets+` VALUES ('1A')`)
		require.NoError(t, err)
		dkey := sqlKey(t)
		var druns atomic.Int64
		seat := "1A"
		book := func(ctx context.Context, tx stx) (string, error) {
			druns.Add(1)
			_, err := tx.Exec(ctx, `INSERT INTO `+tickets+` (seat) VALUES ($1)`, seat)
			if err != nil {
				return "", err // the constraint is deferred: not here
			}
			return "booked " + seat, e.effect(ctx, tx, dkey, seat)
		}
		_, err = envDo(ctx, e.db, dkey, book, e.s.Opt, hooks)
		require.Error(t, err)
		constraint, ok := idem.UniqueViolation(err)
		require.True(t, ok, "want 23505 from COMMIT, got %T %v", err, err)
		if e.driver.name == "pgx" {
			require.Equal(t, "tickets_seat_key", constraint)
		}
		require.NotErrorIs(t, err, idem.ErrOutcomeUnknown, "a COMMIT refused by the server did not commit")
		require.EqualValues(t, 1, druns.Load())
		events := log.take()
		require.NotContains(t, events, "executed/Do", "a COMMIT that failed is no execution")
		require.Empty(t, events)
		require.Nil(t, e.s.ReadRecord(t, e.pool, dkey))
		require.Zero(t, e.s.CountEffects(t, e.pool, dkey))

		// A retry that fits runs fn and reports one execution.
		seat = "1B"
		res, err := envDo(ctx, e.db, dkey, book, e.s.Opt, hooks)
		require.NoError(t, err)
		require.False(t, res.Replayed)
		require.Equal(t, "booked 1B", res.Value)
		require.Equal(t, []string{"executed/Do"}, log.take())
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, dkey))
	}},
}

// retrySerialization retries attempt while it fails with 40001 or 40P01, as
// a client of a database whose default isolation is above READ COMMITTED
// must.
func retrySerialization(attempt func() error) error {
	for range 100 {
		err := attempt()
		if err == nil || !idem.IsRetryable(err) {
			return err
		}
		time.Sleep(time.Millisecond)
	}
	return errors.New("still conflicting after 100 attempts")
}

// requireOneOutcome checks what concurrent callers of one key got: no
// error, one value for all, and one effect row.
func requireOneOutcome(t *testing.T, e *sqlEnv, key idem.Key, values []string, errs []error) {
	t.Helper()
	for _, err := range errs {
		require.NoError(t, err)
	}
	for _, v := range values {
		require.Equal(t, values[0], v)
	}
	require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
}

// contendedDo sends 20 concurrent callers of one key through Do at iso. fn's
// first run holds the claim until another caller waits on the key, so that
// at least one meets a row committed after its snapshot: 40001. Without
// retries some caller gets it, which proves that the storm conflicts; with
// them, no caller sees an error, all get one value, one effect is committed.
func contendedDo(t *testing.T, e *sqlEnv, iso pgx.TxIsoLevel) {
	direct := pgtest.Direct(t)
	storm := func(key idem.Key, attempts int) ([]string, []error) {
		var runs atomic.Int64
		const callers = 20
		values := make([]string, callers)
		errs := make([]error, callers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				<-start
				res, err := envDo(context.Background(), e.db, key, func(ctx context.Context, tx stx) (string, error) {
					n := runs.Add(1)
					if n == 1 {
						// Hold the claim until another caller waits on it.
						if err := awaitBackend(ctx, direct, "wait_event_type = 'Lock'", e.s.Name); err != nil {
							return "", err
						}
					}
					v := fmt.Sprintf("run-%d-%d", n, time.Now().UnixNano())
					return v, e.effect(ctx, tx, key, v)
				}, e.s.Opt, idem.WithTxOptions(pgx.TxOptions{IsoLevel: iso}),
					idem.WithRetry(idem.RetryPolicy{MaxAttempts: attempts, BaseDelay: time.Millisecond, MaxDelay: 20 * time.Millisecond}))
				values[i], errs[i] = res.Value, err
			})
		}
		close(start)
		wg.Wait()
		t.Logf("fn ran %d times for %d callers, %d attempts each at most (rolled-back runs included)", runs.Load(), callers, attempts)
		return values, errs
	}
	_, errs := storm(sqlKey(t), 1)
	require.True(t, slices.ContainsFunc(errs, idem.IsRetryable), "without retries, some caller met a serialization failure: %v", errs)
	key := sqlKey(t)
	values, errs := storm(key, 50)
	requireOneOutcome(t, e, key, values, errs)
}

// requireNothingThenOneRun checks that a failed attempt left no record and
// no effect for key, and that a retry through Do runs fn once and commits
// one effect.
func requireNothingThenOneRun(t *testing.T, e *sqlEnv, key idem.Key) {
	t.Helper()
	ctx := context.Background()
	require.Nil(t, e.s.ReadRecord(t, e.pool, key))
	require.Zero(t, e.s.CountEffects(t, e.pool, key))
	var runs atomic.Int64
	res, err := envDo(ctx, e.db, key, func(ctx context.Context, tx stx) (string, error) {
		runs.Add(1)
		return "ok", e.effect(ctx, tx, key, "ok")
	}, e.s.Opt)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, "ok", res.Value)
	require.EqualValues(t, 1, runs.Load(), "the retry runs fn once")
	require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
}

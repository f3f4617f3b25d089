package integration_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
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

// sqlDB is what the scenarios need of a database: a pool or idemsql.DB.
type sqlDB interface {
	idem.TxBeginner
	idem.DBTX
}

// sqlDriver opens one driver's database.
type sqlDriver struct {
	name string
	// open connects to databaseURL with at most maxConns connections,
	// closed when the test ends. It returns the database and a way to
	// begin a caller-owned transaction as a pgx.Tx.
	open func(t *testing.T, databaseURL string, maxConns int) (sqlDB, func(context.Context, pgx.TxIsoLevel) (pgx.Tx, error))
	// viaSQL: fn's effects are written through idemsql.SQLTx.
	viaSQL bool
}

var sqlDrivers = []sqlDriver{
	{name: "pgx", open: openPgx},
	{name: "stdlib", open: openSQL("pgx"), viaSQL: true},
	{name: "libpq", open: openSQL("postgres"), viaSQL: true},
}

func openPgx(t *testing.T, databaseURL string, maxConns int) (sqlDB, func(context.Context, pgx.TxIsoLevel) (pgx.Tx, error)) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	require.NoError(t, err)
	cfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, func(ctx context.Context, iso pgx.TxIsoLevel) (pgx.Tx, error) {
		return pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
	}
}

func openSQL(driverName string) func(*testing.T, string, int) (sqlDB, func(context.Context, pgx.TxIsoLevel) (pgx.Tx, error)) {
	return func(t *testing.T, databaseURL string, maxConns int) (sqlDB, func(context.Context, pgx.TxIsoLevel) (pgx.Tx, error)) {
		if driverName == "postgres" {
			// lib/pq would send pgx's own parameter to the server.
			u, err := url.Parse(databaseURL)
			require.NoError(t, err)
			q := u.Query()
			q.Del("default_query_exec_mode")
			if pgtest.ViaPgBouncer() && databaseURL == pgtest.ClientURL() {
				// Outside a transaction lib/pq prepares and executes a
				// statement with arguments in two round trips, which
				// transaction pooling may send to two servers; with
				// binary_parameters it sends them in one.
				q.Set("binary_parameters", "yes")
			}
			u.RawQuery = q.Encode()
			databaseURL = u.String()
		}
		db, err := sql.Open(driverName, databaseURL)
		require.NoError(t, err)
		db.SetMaxOpenConns(maxConns)
		t.Cleanup(func() { _ = db.Close() })
		begin := func(ctx context.Context, iso pgx.TxIsoLevel) (pgx.Tx, error) {
			level := map[pgx.TxIsoLevel]sql.IsolationLevel{
				"": sql.LevelDefault, pgx.ReadCommitted: sql.LevelReadCommitted,
				pgx.RepeatableRead: sql.LevelRepeatableRead, pgx.Serializable: sql.LevelSerializable,
			}[iso]
			stx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
			if err != nil {
				return nil, err
			}
			return idemsql.WrapTx(stx), nil
		}
		return idemsql.Wrap(db), begin
	}
}

// sqlEnv is one scenario's view of one driver.
type sqlEnv struct {
	driver sqlDriver
	pool   *pgxpool.Pool // pgx, for setup and for counting
	s      *pgtest.Schema
	db     sqlDB
	begin  func(context.Context, pgx.TxIsoLevel) (pgx.Tx, error)
}

// inTx runs f in a caller-owned transaction and commits.
func (e *sqlEnv) inTx(t *testing.T, f func(tx pgx.Tx) error) error {
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

// effect writes one effect row in tx: through the *sql.Tx behind tx for the
// database/sql drivers (so that fn's own database/sql code is exercised),
// with pgx otherwise.
func (e *sqlEnv) effect(ctx context.Context, tx pgx.Tx, key idem.Key, value string) error {
	if !e.driver.viaSQL {
		return e.s.AddEffect(ctx, tx, key, value)
	}
	stx, ok := idemsql.SQLTx(tx)
	if !ok {
		return fmt.Errorf("idemsql.SQLTx found no *sql.Tx behind %T", tx)
	}
	_, err := stx.ExecContext(ctx, `INSERT INTO `+e.s.Effects+` (scope, key, value) VALUES ($1, $2, $3)`, key.Scope, key.ID, value)
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
					db, begin := d.open(t, pgtest.ClientURL(), conns)
					sc.run(t, &sqlEnv{driver: d, pool: pool, s: pgtest.NewSchema(t, pool), db: db, begin: begin})
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
		fn := func(ctx context.Context, tx pgx.Tx) (string, error) {
			v := fmt.Sprintf("run-%d", runs.Add(1))
			return v, e.effect(ctx, tx, key, v)
		}
		var first, second idem.Result[string]
		require.NoError(t, e.inTx(t, func(tx pgx.Tx) (err error) {
			first, err = idem.WithIdempotency(ctx, tx, key, fn, e.s.Opt)
			return err
		}))
		require.NoError(t, e.inTx(t, func(tx pgx.Tx) (err error) {
			second, err = idem.WithIdempotency(ctx, tx, key, fn, e.s.Opt)
			return err
		}))
		viaDo, err := idem.Do(ctx, e.db, key, fn, e.s.Opt)
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
		fn := func(ctx context.Context, tx pgx.Tx) (string, error) {
			if err := e.effect(ctx, tx, key, "x"); err != nil {
				return "", err
			}
			if fail {
				return "", errBoom
			}
			return "ok", nil
		}
		require.NoError(t, e.inTx(t, func(tx pgx.Tx) error {
			_, err := idem.WithIdempotency(ctx, tx, key, fn, e.s.Opt)
			require.ErrorIs(t, err, errBoom)
			// The caller's transaction is still usable.
			var one int
			return tx.QueryRow(ctx, `SELECT 1`).Scan(&one)
		}))
		require.Zero(t, e.s.CountEffects(t, e.pool, key))
		require.Nil(t, e.s.ReadRecord(t, e.pool, key))
		fail = false
		res, err := idem.Do(ctx, e.db, key, fn, e.s.Opt)
		require.NoError(t, err)
		require.False(t, res.Replayed)
		require.Equal(t, "ok", res.Value)
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
	}},

	{name: "PermanentRecordedAndReplayed", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		key := sqlKey(t)
		var runs atomic.Int64
		fn := func(ctx context.Context, tx pgx.Tx) (int64, error) {
			runs.Add(1)
			if err := e.effect(ctx, tx, key, "charged"); err != nil {
				return 0, err
			}
			return 0, idem.Permanent(errors.New("card declined"))
		}
		_, err := idem.Do(ctx, e.db, key, fn, e.s.Opt)
		require.True(t, idem.IsPermanent(err), "%v", err)
		require.EqualError(t, err, "card declined")
		res, err := idem.Do(ctx, e.db, key, fn, e.s.Opt)
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
		_, err = idem.WithIdempotency(ctx, holder, key, func(ctx context.Context, tx pgx.Tx) (string, error) {
			return "held", e.effect(ctx, tx, key, "held")
		}, e.s.Opt)
		require.NoError(t, err)

		require.NoError(t, e.inTx(t, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '7s'`)
			require.NoError(t, err)
			start := time.Now()
			_, err = idem.WithIdempotency(ctx, tx, key, func(context.Context, pgx.Tx) (string, error) {
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
		res, err := idem.Do(ctx, e.db, key, func(context.Context, pgx.Tx) (string, error) { return "again", nil }, e.s.Opt, idem.NoWait())
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, "held", res.Value)
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
	}},

	{name: "KeyReused", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		key := sqlKey(t)
		key.Fingerprint = []byte("request A")
		fn := func(ctx context.Context, tx pgx.Tx) (string, error) { return "a", e.effect(ctx, tx, key, "a") }
		_, err := idem.Do(ctx, e.db, key, fn, e.s.Opt)
		require.NoError(t, err)
		other := key
		other.Fingerprint = []byte("request B")
		_, err = idem.Do(ctx, e.db, other, fn, e.s.Opt)
		require.ErrorIs(t, err, idem.ErrKeyReused)
		require.NoError(t, e.inTx(t, func(tx pgx.Tx) error {
			_, err := idem.WithIdempotency(ctx, tx, other, fn, e.s.Opt)
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
				res, err := idem.Do(context.Background(), e.db, key, func(ctx context.Context, tx pgx.Tx) (string, error) {
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
		tag, err := e.db.Exec(ctx, `UPDATE `+table+` SET n = n + 1 WHERE id = $1`, 1)
		require.NoError(t, err)
		require.EqualValues(t, 1, tag.RowsAffected())
		_, err = tx.Exec(ctx, `UPDATE `+table+` SET n = n + 1 WHERE id = $1`, 1)
		require.Error(t, err)
		require.True(t, idem.IsRetryable(err), "%T %v", err, err)
	}},

	{name: "ClaimCompleteReplayAndLeaseLost", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		key := sqlKey(t)
		first, _, err := idem.Claim[string](ctx, e.db, key, time.Minute, e.s.Opt)
		require.NoError(t, err)
		require.NotNil(t, first)
		require.EqualValues(t, 1, first.Attempt())
		_, _, err = idem.Claim[string](ctx, e.db, key, time.Minute, e.s.Opt)
		require.ErrorIs(t, err, idem.ErrInProgress)
		require.NoError(t, first.Checkpoint(ctx, e.db, "charged", map[string]string{"charge": "ch_1"}))
		endLease(t, e.pool, e.s, key) // the lease runs out

		second, _, err := idem.Claim[string](ctx, e.db, key, time.Minute, e.s.Opt)
		require.NoError(t, err)
		require.NotNil(t, second)
		require.EqualValues(t, 2, second.Attempt())
		require.Equal(t, "charged", second.RecoveryPoint())
		var data map[string]string
		require.NoError(t, second.RecoveryData(&data))
		require.Equal(t, "ch_1", data["charge"])
		require.NoError(t, second.Extend(ctx, e.db))

		err = e.inTx(t, func(tx pgx.Tx) error { return first.Complete(ctx, tx, "stale") })
		require.ErrorIs(t, err, idem.ErrLeaseLost)
		require.NoError(t, e.inTx(t, func(tx pgx.Tx) error {
			if err := e.effect(ctx, tx, key, "done"); err != nil {
				return err
			}
			return second.Complete(ctx, tx, "done")
		}))

		again, res, err := idem.Claim[string](ctx, e.db, key, time.Minute, e.s.Opt)
		require.NoError(t, err)
		require.Nil(t, again)
		require.True(t, res.Replayed)
		require.Equal(t, "done", res.Value)
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
	}},

	{name: "TransitionTwentyPayersAndRefunders", maxConns: 20, run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		m, err := idem.NewStateMachine(idem.StateMachineConfig{
			Schema: e.s.Name, Table: "orders", IDColumn: "id", StateColumn: "status",
			States: []string{"PENDING", "PAID", "SHIPPED", "CANCELLED", "REFUNDED"},
			Transitions: map[string][]string{
				"PENDING": {"PAID", "CANCELLED"},
				"PAID":    {"SHIPPED", "REFUNDED"},
				"SHIPPED": {"REFUNDED"},
			},
			VersionColumn: "version", HistoryTable: "order_history",
		})
		require.NoError(t, err)
		orders := pgx.Identifier{e.s.Name, "orders"}.Sanitize()
		_, err = e.pool.Exec(ctx, `CREATE TABLE `+orders+` (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			status text NOT NULL DEFAULT 'PENDING',
			version bigint NOT NULL DEFAULT 0,
			paid_at timestamptz,
			payment_ref text)`)
		require.NoError(t, err)
		_, err = e.pool.Exec(ctx, m.HistoryTableDDL("bigint"))
		require.NoError(t, err)
		var id int64
		require.NoError(t, e.pool.QueryRow(ctx, `INSERT INTO `+orders+` DEFAULT VALUES RETURNING id`).Scan(&id))

		// Twenty concurrent callers per move. PAID has one source state
		// (a plain guarded UPDATE); REFUNDED has two, so its statement
		// binds the source states as a text[] parameter.
		for _, move := range []struct{ to, from string }{{"PAID", "PENDING"}, {"REFUNDED", "PAID"}} {
			var applied, repeats atomic.Int64
			errs := make([]error, 20)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range 20 {
				wg.Go(func() {
					<-start
					var res idem.TransitionResult
					err := retrySerialization(func() (err error) {
						res, err = m.Transition(ctx, e.db, id, move.to,
							idem.Set("paid_at", time.Now()), idem.Set("payment_ref", fmt.Sprintf("pay-%d", i)))
						return err
					})
					switch {
					case err != nil:
						errs[i] = err
					case res.Applied && res.From != move.from:
						errs[i] = fmt.Errorf("applied from %q", res.From)
					case res.Applied:
						applied.Add(1)
					case res.From != move.to:
						errs[i] = fmt.Errorf("repeat saw %q", res.From)
					default:
						repeats.Add(1)
					}
				})
			}
			close(start)
			wg.Wait()
			for _, err := range errs {
				require.NoError(t, err)
			}
			require.EqualValues(t, 1, applied.Load(), move.to)
			require.EqualValues(t, 19, repeats.Load(), move.to)
		}
		_, err = m.Transition(ctx, e.db, id, "PAID")
		var te *idem.TransitionError
		require.ErrorAs(t, err, &te)
		require.Equal(t, "REFUNDED", te.Current)
		_, err = m.Transition(ctx, e.db, id+1000, "PAID")
		require.ErrorIs(t, err, idem.ErrNotFound)
		var history int
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{e.s.Name, "order_history"}.Sanitize()+
			` WHERE entity_id = $1`, id).Scan(&history))
		require.Equal(t, 2, history)
		var version int64
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT version FROM `+orders+` WHERE id = $1`, id).Scan(&version))
		require.EqualValues(t, 2, version)
	}},

	{name: "ConsumeOnceTwentyDeliveries", maxConns: 20, run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		key := idem.Key{Scope: "payments", ID: sqlKey(t).ID}
		// A failed delivery leaves nothing, and the caller's tx usable.
		require.NoError(t, e.inTx(t, func(tx pgx.Tx) error {
			ran, err := idem.ConsumeOnce(ctx, tx, "payments", key.ID, func(ctx context.Context, tx pgx.Tx) error {
				if err := e.effect(ctx, tx, key, "crashed"); err != nil {
					return err
				}
				return errBoom
			}, e.s.InboxOpt)
			require.ErrorIs(t, err, errBoom)
			require.False(t, ran)
			_, err = tx.Exec(ctx, `SELECT 1`)
			return err
		}))
		var ran atomic.Int64
		errs := make([]error, 20)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				<-start
				errs[i] = retrySerialization(func() error {
					tx, err := e.begin(ctx, "")
					if err != nil {
						return err
					}
					defer tx.Rollback(ctx) //nolint:errcheck
					ok, err := idem.ConsumeOnce(ctx, tx, "payments", key.ID, func(ctx context.Context, tx pgx.Tx) error {
						return e.effect(ctx, tx, key, "paid")
					}, e.s.InboxOpt)
					if err != nil {
						return err
					}
					if err := tx.Commit(ctx); err != nil {
						return err
					}
					if ok {
						ran.Add(1)
					}
					return nil
				})
			})
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		require.EqualValues(t, 1, ran.Load())
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
	}},

	{name: "SavepointsOnCallerTx", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		key := sqlKey(t)
		require.NoError(t, e.inTx(t, func(tx pgx.Tx) error {
			sp, err := tx.Begin(ctx)
			require.NoError(t, err)
			_, err = sp.Exec(ctx, `INSERT INTO `+e.s.Effects+` (scope, key, value) VALUES ($1, $2, $3)`, key.Scope, key.ID, "undone")
			require.NoError(t, err)
			_, err = sp.Exec(ctx, `SELECT 1/0`) // aborts the savepoint
			require.Error(t, err)
			require.NoError(t, sp.Rollback(ctx))
			require.ErrorIs(t, sp.Rollback(ctx), pgx.ErrTxClosed)
			sp, err = tx.Begin(ctx)
			require.NoError(t, err)
			inner, err := sp.Begin(ctx)
			require.NoError(t, err)
			tag, err := inner.Exec(ctx, `INSERT INTO `+e.s.Effects+` (scope, key, value) VALUES ($1, $2, $3)`, key.Scope, key.ID, "kept")
			require.NoError(t, err)
			require.EqualValues(t, 1, tag.RowsAffected())
			require.NoError(t, inner.Commit(ctx))
			require.NoError(t, sp.Commit(ctx))
			// Savepoints are all released: a savepoint name of idem's
			// must not resolve.
			_, err = tx.Exec(ctx, `SAVEPOINT probe; RELEASE SAVEPOINT probe`)
			return err
		}))
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
	}},

	{name: "InsertOrGetTxUniqueViolation", run: func(t *testing.T, e *sqlEnv) {
		// A plain INSERT that hits a unique constraint (23505, recognised
		// from every driver) rolls back to InsertOrGetTx's savepoint and
		// reads the existing row, leaving the caller's tx usable.
		ctx := context.Background()
		users := pgx.Identifier{e.s.Name, "users"}.Sanitize()
		_, err := e.pool.Exec(ctx, `CREATE TABLE `+users+` (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, email text NOT NULL UNIQUE)`)
		require.NoError(t, err)
		insert := idem.Query{SQL: `INSERT INTO ` + users + ` (email) VALUES ($1) RETURNING id`, Args: []any{"a@example.com"}}
		lookup := idem.Query{SQL: `SELECT id FROM ` + users + ` WHERE email = $1`, Args: []any{"a@example.com"}}
		var first, second int64
		for _, c := range []struct {
			dest    *int64
			created bool
		}{{&first, true}, {&second, false}} {
			require.NoError(t, e.inTx(t, func(tx pgx.Tx) error {
				created, err := idem.InsertOrGetTx(ctx, tx, insert, lookup, c.dest)
				require.NoError(t, err)
				require.Equal(t, c.created, created)
				_, err = tx.Exec(ctx, `SELECT 1`)
				return err
			}))
		}
		require.Equal(t, first, second)
	}},

	{name: "CutCommitIsOutcomeUnknown", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		key := sqlKey(t)
		p, err := cutproxy.New(pgtest.URL())
		require.NoError(t, err)
		t.Cleanup(p.Close)
		viaProxy, _ := e.driver.open(t, p.URL(), 2)
		var runs atomic.Int64
		fn := func(ctx context.Context, tx pgx.Tx) (string, error) {
			v := fmt.Sprintf("run-%d", runs.Add(1))
			return v, e.effect(ctx, tx, key, v)
		}
		p.SetCutRate(1)
		_, err = idem.Do(ctx, viaProxy, key, fn, e.s.Opt)
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "%T %v", err, err)
		t.Logf("cut COMMIT: %v", err)
		require.EqualValues(t, 1, p.Cuts())
		// The same key, retried, settles it: a replay or a single run.
		res, err := idem.Do(ctx, e.db, key, fn, e.s.Opt)
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
		panicky := func(ctx context.Context, tx pgx.Tx) (string, error) {
			if err := e.effect(ctx, tx, key, "x"); err != nil {
				return "", err
			}
			panic("kaboom")
		}
		require.PanicsWithValue(t, "kaboom", func() { _, _ = idem.Do(ctx, e.db, key, panicky, e.s.Opt) })
		require.Nil(t, e.s.ReadRecord(t, e.pool, key))
		require.Zero(t, e.s.CountEffects(t, e.pool, key))

		tx, err := e.begin(ctx, "")
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck
		require.PanicsWithValue(t, "kaboom", func() { _, _ = idem.WithIdempotency(ctx, tx, key, panicky, e.s.Opt) })
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
			slow := func(ctx context.Context, tx pgx.Tx) (string, error) {
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
				_, err := idem.Do(ctx, e.db, key, slow, e.s.Opt)
				// Whatever the driver reports (lib/pq: the server's
				// SQLSTATE 57014), idem's error matches the context's.
				require.ErrorIs(t, err, context.Canceled, "%T %v", err, err)
				t.Logf("Do, cancelled: %v", err)
			} else {
				tx, err := e.begin(context.Background(), "")
				require.NoError(t, err)
				defer tx.Rollback(context.Background()) //nolint:errcheck
				_, err = idem.WithIdempotency(ctx, tx, key, slow, e.s.Opt)
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
		res, err := idem.Do(context.Background(), e.db, key, func(ctx context.Context, tx pgx.Tx) (string, error) {
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
		victim := func(ctx context.Context, tx pgx.Tx) (string, error) {
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
		_, err := idem.Do(ctx, e.db, key, victim, e.s.Opt)
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
		fn := func(ctx context.Context, tx pgx.Tx) (string, error) {
			v := fmt.Sprintf("run-%d", runs.Add(1))
			return v, e.effect(ctx, tx, key, v)
		}
		r1, err := idem.Do(ctx, e.db, key, fn, e.s.Opt, ttl)
		require.NoError(t, err)
		require.False(t, r1.Replayed)
		r2, err := idem.Do(ctx, e.db, key, fn, e.s.Opt, ttl)
		require.NoError(t, err)
		require.True(t, r2.Replayed, "replayed while the record lives")
		require.Equal(t, r1.Value, r2.Value)

		expireRecord(t, e.pool, e.s, key)
		r3, err := idem.Do(ctx, e.db, key, fn, e.s.Opt, ttl)
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
		require.NoError(t, e.inTx(t, func(tx pgx.Tx) (err error) {
			if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&claimedAt); err != nil {
				return err
			}
			r4, err = idem.WithIdempotency(ctx, tx, key, fn, e.s.Opt)
			return err
		}))
		require.False(t, r4.Replayed)
		require.Equal(t, "run-3", r4.Value)
		var expiresAt time.Time
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT expires_at FROM `+e.s.Records+` WHERE scope = $1 AND key = $2`,
			key.Scope, key.ID).Scan(&expiresAt))
		require.GreaterOrEqual(t, expiresAt.Sub(claimedAt), idem.DefaultTTL)
		r5, err := idem.Do(ctx, e.db, key, fn, e.s.Opt)
		require.NoError(t, err)
		require.True(t, r5.Replayed)
		require.Equal(t, r4.Value, r5.Value)
		require.EqualValues(t, 3, runs.Load())
		require.Equal(t, 3, e.s.CountEffects(t, e.pool, key))
	}},

	{name: "IssuedTokens", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		req := idem.RequireIssued()
		scope := "user:" + sqlKey(t).ID
		token, err := idem.IssueToken(ctx, e.db, scope, time.Hour, e.s.Opt)
		require.NoError(t, err)
		require.Len(t, token, 56)
		key := idem.Key{Scope: scope, ID: token}
		var runs atomic.Int64
		fn := func(ctx context.Context, tx pgx.Tx) (string, error) {
			v := fmt.Sprintf("run-%d", runs.Add(1))
			return v, e.effect(ctx, tx, key, v)
		}
		first, err := idem.Do(ctx, e.db, key, fn, e.s.Opt, req)
		require.NoError(t, err)
		require.False(t, first.Replayed)
		again, err := idem.Do(ctx, e.db, key, fn, e.s.Opt, req)
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, first.Value, again.Value)
		require.NoError(t, e.inTx(t, func(tx pgx.Tx) error {
			res, err := idem.WithIdempotency(ctx, tx, key, fn, e.s.Opt, req)
			require.NoError(t, err)
			require.True(t, res.Replayed)
			return nil
		}))
		require.EqualValues(t, 1, runs.Load())
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))

		// Forged: the right shape for the scope, never issued.
		forged := idem.Key{Scope: scope, ID: strings.Repeat("A", 43) + token[43:]}
		_, err = idem.Do(ctx, e.db, forged, fn, e.s.Opt, req)
		require.ErrorIs(t, err, idem.ErrTokenRejected)
		require.ErrorIs(t, err, idem.ErrTokenUnknown)
		var te *idem.TokenError
		require.ErrorAs(t, err, &te)
		require.NoError(t, e.inTx(t, func(tx pgx.Tx) error {
			_, err := idem.WithIdempotency(ctx, tx, forged, fn, e.s.Opt, req)
			require.ErrorIs(t, err, idem.ErrTokenRejected)
			return nil
		}))
		_, err = idem.Do(ctx, e.db, idem.Key{Scope: scope, ID: "made-up"}, fn, e.s.Opt, req)
		require.ErrorIs(t, err, idem.ErrTokenRejected)
		require.EqualValues(t, 1, runs.Load(), "fn never ran for a rejected token")
		require.Nil(t, e.s.ReadRecord(t, e.pool, forged))
	}},

	{name: "MaxResultSize", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		key := sqlKey(t)
		small := idem.WithMaxResultSize(100)
		var runs atomic.Int64
		sized := func(n int) func(context.Context, pgx.Tx) (string, error) {
			return func(ctx context.Context, tx pgx.Tx) (string, error) {
				runs.Add(1)
				// n characters are n+2 bytes of JSON.
				return strings.Repeat("y", n), e.effect(ctx, tx, key, fmt.Sprint(n))
			}
		}
		_, err := idem.Do(ctx, e.db, key, sized(99), e.s.Opt, small)
		require.ErrorIs(t, err, idem.ErrResultTooLarge)
		require.Contains(t, err.Error(), "101 bytes")
		require.Nil(t, e.s.ReadRecord(t, e.pool, key), "nothing recorded")
		require.Zero(t, e.s.CountEffects(t, e.pool, key), "fn's writes rolled back")

		// In the caller's transaction: rolled back like an error from fn,
		// the transaction usable.
		require.NoError(t, e.inTx(t, func(tx pgx.Tx) error {
			_, err := idem.WithIdempotency(ctx, tx, key, sized(99), e.s.Opt, small)
			require.ErrorIs(t, err, idem.ErrResultTooLarge)
			require.NoError(t, e.effect(ctx, tx, idem.Key{Scope: "caller", ID: key.ID}, "kept"))
			res, err := idem.WithIdempotency(ctx, tx, key, sized(98), e.s.Opt, small)
			require.NoError(t, err)
			require.False(t, res.Replayed)
			return nil
		}))
		require.EqualValues(t, 3, runs.Load())
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, key), "only the run that fit")
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, idem.Key{Scope: "caller", ID: key.ID}))
		require.Len(t, e.s.ReadRecord(t, e.pool, key).Response, 100)
		res, err := idem.Do(ctx, e.db, key, sized(99), e.s.Opt, small)
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
		fn := func(ctx context.Context, tx pgx.Tx) (string, error) {
			v := fmt.Sprintf("run-%d", runs.Add(1))
			return v, e.effect(ctx, tx, key, v)
		}
		_, err := idem.Do(ctx, e.db, key, fn, e.s.Opt, hooks)
		require.NoError(t, err)
		require.Equal(t, []string{"executed/Do"}, log.take())
		_, err = idem.Do(ctx, e.db, key, fn, e.s.Opt, hooks)
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
		book := func(ctx context.Context, tx pgx.Tx) (string, error) {
			druns.Add(1)
			_, err := tx.Exec(ctx, `INSERT INTO `+tickets+` (seat) VALUES ($1)`, seat)
			if err != nil {
				return "", err // the constraint is deferred: not here
			}
			return "booked " + seat, e.effect(ctx, tx, dkey, seat)
		}
		_, err = idem.Do(ctx, e.db, dkey, book, e.s.Opt, hooks)
		require.Error(t, err)
		constraint, ok := idem.UniqueViolation(err)
		require.True(t, ok, "want 23505 from COMMIT, got %T %v", err, err)
		if !e.driver.viaSQL {
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
		res, err := idem.Do(ctx, e.db, dkey, book, e.s.Opt, hooks)
		require.NoError(t, err)
		require.False(t, res.Replayed)
		require.Equal(t, "booked 1B", res.Value)
		require.Equal(t, []string{"executed/Do"}, log.take())
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, dkey))
	}},

	{name: "KeepAliveRenewsLease", run: func(t *testing.T, e *sqlEnv) {
		ctx := context.Background()
		key := sqlKey(t)
		const lease = keepAliveLease
		l, _, err := idem.Claim[string](ctx, e.db, key, lease, e.s.Opt)
		require.NoError(t, err)
		require.NotNil(t, l)
		claimedEnd := lockedUntil(t, e.pool, e.s, key)
		workCtx, stop := l.KeepAlive(ctx, e.db)
		sleepPast(t, e.pool, claimedEnd) // the lease as claimed has run out
		_, _, err = idem.Claim[string](ctx, e.db, key, lease, e.s.Opt)
		require.ErrorIs(t, err, idem.ErrInProgress, "the watchdog kept the lease alive")
		require.True(t, lockedUntil(t, e.pool, e.s, key).After(claimedEnd), "the watchdog renewed the lease")
		require.NoError(t, workCtx.Err())
		require.NoError(t, stop())
		require.ErrorIs(t, workCtx.Err(), context.Canceled)
		require.NoError(t, e.inTx(t, func(tx pgx.Tx) error {
			if err := e.effect(ctx, tx, key, "done"); err != nil {
				return err
			}
			return l.Complete(ctx, tx, "done")
		}))
		_, res, err := idem.Claim[string](ctx, e.db, key, lease, e.s.Opt)
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, "done", res.Value)

		// A second watchdog notices a takeover and cancels the work.
		other := sqlKey(t)
		l1, _, err := idem.Claim[string](ctx, e.db, other, lease, e.s.Opt)
		require.NoError(t, err)
		workCtx, stop = l1.KeepAlive(ctx, e.db)
		l2 := takeOver(t, func() error {
			_, err := e.pool.Exec(ctx, `UPDATE `+e.s.Records+` SET locked_until = clock_timestamp() - interval '1 second' WHERE scope = $1 AND key = $2`,
				other.Scope, other.ID)
			return err
		}, func() (*idem.Lease[string], error) {
			l, _, err := idem.Claim[string](ctx, e.db, other, time.Minute, e.s.Opt)
			return l, err
		})
		require.NotNil(t, l2)
		require.EqualValues(t, 2, l2.Attempt())
		select {
		case <-workCtx.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the watchdog did not notice the takeover")
		}
		require.ErrorIs(t, context.Cause(workCtx), idem.ErrLeaseLost)
		require.ErrorIs(t, stop(), idem.ErrLeaseLost)
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
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

// countingBeginner counts the transactions begun on an idemsql.DB.
type countingBeginner struct {
	*idemsql.DB
	n atomic.Int64
}

func (c *countingBeginner) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	c.n.Add(1)
	return c.DB.BeginTx(ctx, opts)
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
// at least one meets a row committed after its snapshot: 40001, which Do
// must retry into a replay. No caller sees an error, all get one value, one
// effect is committed; on database/sql, more transactions than callers
// prove the retries happened.
func contendedDo(t *testing.T, e *sqlEnv, iso pgx.TxIsoLevel) {
	key := sqlKey(t)
	direct := pgtest.Direct(t)
	db := e.db
	var begins *atomic.Int64
	if c, ok := db.(*idemsql.DB); ok {
		cb := &countingBeginner{DB: c}
		begins, db = &cb.n, cb
	}
	var runs atomic.Int64
	const callers = 20
	values := make([]string, callers)
	errs := make([]error, callers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			<-start
			res, err := idem.Do(context.Background(), db, key, func(ctx context.Context, tx pgx.Tx) (string, error) {
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
				idem.WithRetry(idem.RetryPolicy{MaxAttempts: 50, BaseDelay: time.Millisecond, MaxDelay: 20 * time.Millisecond}))
			values[i], errs[i] = res.Value, err
		})
	}
	close(start)
	wg.Wait()
	requireOneOutcome(t, e, key, values, errs)
	t.Logf("fn ran %d times for %d callers (rolled-back runs included)", runs.Load(), callers)
	if begins != nil {
		t.Logf("%d transactions for %d callers", begins.Load(), callers)
		require.Greater(t, begins.Load(), int64(callers), "no serialization failure was retried")
	}
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
	res, err := idem.Do(ctx, e.db, key, func(ctx context.Context, tx pgx.Tx) (string, error) {
		runs.Add(1)
		return "ok", e.effect(ctx, tx, key, "ok")
	}, e.s.Opt)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, "ok", res.Value)
	require.EqualValues(t, 1, runs.Load(), "the retry runs fn once")
	require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
}

package integration_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
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
)

// ConsumeOnce, InsertOrGet and InsertOrGetTx through idemsql's native API,
// for pgx's stdlib driver and lib/pq: fn receives the *sql.Tx itself.

// inboxEnv is one test's view of one database/sql driver.
type inboxEnv struct {
	driver string        // database/sql's name of the driver
	pool   *pgxpool.Pool // pgx, for setup and for counting
	s      *pgtest.Schema
	db     *sql.DB
}

// forEachInboxDriver runs f once per database/sql driver, each with a
// schema of its own.
func forEachInboxDriver(t *testing.T, maxConns int, f func(t *testing.T, e *inboxEnv)) {
	for _, d := range sqlDBDrivers {
		t.Run(d.name, func(t *testing.T) {
			pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 4 })
			f(t, &inboxEnv{driver: d.driver, pool: pool, s: pgtest.NewSchema(t, pool), db: openSQLDB(t, d.driver, pgtest.ClientURL(), maxConns)})
		})
	}
}

// inTx runs f in a transaction of the caller's and commits it.
func (e *inboxEnv) inTx(t *testing.T, iso sql.IsolationLevel, f func(tx *sql.Tx) error) error {
	t.Helper()
	ctx := context.Background()
	tx, err := e.db.BeginTx(ctx, &sql.TxOptions{Isolation: iso})
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// effect writes one effect row in tx, as a handler's database/sql code does.
func (e *inboxEnv) effect(ctx context.Context, tx *sql.Tx, key idem.Key, value string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO `+e.s.Effects+` (scope, key, value) VALUES ($1, $2, $3)`, key.Scope, key.ID, value)
	return err
}

// usersTable creates a table whose email is unique and returns its name.
func (e *inboxEnv) usersTable(t *testing.T) string {
	t.Helper()
	users := pgx.Identifier{e.s.Name, "users"}.Sanitize()
	_, err := e.pool.Exec(context.Background(), `CREATE TABLE `+users+` (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, email text NOT NULL UNIQUE)`)
	require.NoError(t, err)
	return users
}

func inboxMessageID(t *testing.T) string {
	t.Helper()
	b := make([]byte, 8)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// retryInboxSerialization runs attempt again while it fails with a
// serialization failure or a deadlock.
func retryInboxSerialization(attempt func() error) error {
	for range 100 {
		err := attempt()
		if err == nil || !idem.IsRetryable(err) {
			return err
		}
		time.Sleep(time.Millisecond)
	}
	return errors.New("still conflicting after 100 attempts")
}

// inboxSavepointExists reports whether tx has a savepoint of that name,
// leaving tx as it was.
func inboxSavepointExists(t *testing.T, tx *sql.Tx, name string) bool {
	t.Helper()
	ctx := context.Background()
	_, err := tx.ExecContext(ctx, "SAVEPOINT probe")
	require.NoError(t, err)
	if _, err := tx.ExecContext(ctx, "RELEASE SAVEPOINT "+name); err == nil {
		return true
	}
	_, err = tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT probe; RELEASE SAVEPOINT probe")
	require.NoError(t, err)
	return false
}

var errInboxBoom = errors.New("boom")

// The scenario ConsumeOnceTwentyDeliveries of TestSQLDriver, natively: a
// failed delivery leaves nothing and the caller's tx usable; then twenty
// concurrent deliveries of one message run fn once.
func TestSQLInboxConsumeOnceTwentyDeliveries(t *testing.T) {
	forEachInboxDriver(t, 20, func(t *testing.T, e *inboxEnv) {
		ctx := context.Background()
		key := idem.Key{Scope: "payments", ID: inboxMessageID(t)}
		require.NoError(t, e.inTx(t, sql.LevelDefault, func(tx *sql.Tx) error {
			ran, err := idemsql.ConsumeOnce(ctx, tx, "payments", key.ID, func(ctx context.Context, tx *sql.Tx) error {
				if err := e.effect(ctx, tx, key, "crashed"); err != nil {
					return err
				}
				return errInboxBoom
			}, e.s.InboxOpt)
			require.ErrorIs(t, err, errInboxBoom)
			require.False(t, ran)
			_, err = tx.ExecContext(ctx, `SELECT 1`)
			return err
		}))
		var ran atomic.Int64
		errs := make([]error, 20)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				<-start
				errs[i] = retryInboxSerialization(func() error {
					tx, err := e.db.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback() //nolint:errcheck
					ok, err := idemsql.ConsumeOnce(ctx, tx, "payments", key.ID, func(ctx context.Context, tx *sql.Tx) error {
						return e.effect(ctx, tx, key, "paid")
					}, e.s.InboxOpt)
					if err != nil {
						return err
					}
					if err := tx.Commit(); err != nil {
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
	})
}

// The scenario InsertOrGetTxUniqueViolation of TestSQLDriver, natively: a
// plain INSERT that hits a unique constraint (23505, recognised from both
// drivers) rolls back to InsertOrGetTx's savepoint and reads the existing
// row, leaving the caller's tx usable.
func TestSQLInboxInsertOrGetTxUniqueViolation(t *testing.T) {
	forEachInboxDriver(t, 4, func(t *testing.T, e *inboxEnv) {
		ctx := context.Background()
		users := e.usersTable(t)
		insert := idem.Query{SQL: `INSERT INTO ` + users + ` (email) VALUES ($1) RETURNING id`, Args: []any{"a@example.com"}}
		lookup := idem.Query{SQL: `SELECT id FROM ` + users + ` WHERE email = $1`, Args: []any{"a@example.com"}}
		var first, second int64
		for _, c := range []struct {
			dest    *int64
			created bool
		}{{&first, true}, {&second, false}} {
			require.NoError(t, e.inTx(t, sql.LevelDefault, func(tx *sql.Tx) error {
				created, err := idemsql.InsertOrGetTx(ctx, tx, insert, lookup, c.dest)
				require.NoError(t, err)
				require.Equal(t, c.created, created)
				_, err = tx.ExecContext(ctx, `SELECT 1`)
				return err
			}))
		}
		require.Equal(t, first, second)
		var rows int
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM `+users).Scan(&rows))
		require.Equal(t, 1, rows)
	})
}

// Thirty concurrent creators of one row, on the *sql.DB (InsertOrGet) and
// each in a transaction of its own (InsertOrGetTx, with a plain INSERT):
// one row, one id for everybody, no error for anybody.
func TestSQLInboxInsertOrGetConcurrentCreators(t *testing.T) {
	for _, variant := range []string{"InsertOrGet", "InsertOrGetTx"} {
		t.Run(variant, func(t *testing.T) {
			forEachInboxDriver(t, 20, func(t *testing.T, e *inboxEnv) {
				ctx := context.Background()
				users := e.usersTable(t)
				lookup := idem.Query{SQL: `SELECT id FROM ` + users + ` WHERE email = $1`, Args: []any{"b@example.com"}}
				var created atomic.Int64
				ids := make([]int64, 30)
				errs := make([]error, 30)
				start := make(chan struct{})
				var wg sync.WaitGroup
				for i := range 30 {
					wg.Go(func() {
						<-start
						var ok bool
						var err error
						if variant == "InsertOrGet" {
							ok, err = idemsql.InsertOrGet(ctx, e.db, idem.Query{
								SQL:  `INSERT INTO ` + users + ` (email) VALUES ($1) ON CONFLICT DO NOTHING RETURNING id`,
								Args: []any{"b@example.com"}}, lookup, &ids[i])
						} else {
							err = e.inTx(t, sql.LevelDefault, func(tx *sql.Tx) error {
								var err error
								ok, err = idemsql.InsertOrGetTx(ctx, tx, idem.Query{
									SQL:  `INSERT INTO ` + users + ` (email) VALUES ($1) RETURNING id`,
									Args: []any{"b@example.com"}}, lookup, &ids[i])
								if err == nil {
									_, err = tx.ExecContext(ctx, `SELECT 1`) // still usable
								}
								return err
							})
						}
						errs[i] = err
						if ok {
							created.Add(1)
						}
					})
				}
				close(start)
				wg.Wait()
				for _, err := range errs {
					require.NoError(t, err)
				}
				require.EqualValues(t, 1, created.Load())
				for _, id := range ids {
					require.Equal(t, ids[0], id)
				}
				var rows int
				require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM `+users).Scan(&rows))
				require.Equal(t, 1, rows)
			})
		})
	}
}

// An insert that fails for another reason than a duplicate is returned with
// the savepoint rolled back: the transaction stays usable. Under REPEATABLE
// READ a row committed after the snapshot is a retryable error.
func TestSQLInboxInsertOrGetTxOtherErrorsAndRepeatableRead(t *testing.T) {
	forEachInboxDriver(t, 4, func(t *testing.T, e *inboxEnv) {
		ctx := context.Background()
		users := e.usersTable(t)
		var id int64
		require.NoError(t, e.inTx(t, sql.LevelDefault, func(tx *sql.Tx) error {
			_, err := idemsql.InsertOrGetTx(ctx, tx, idem.Query{SQL: `INSERT INTO ` + users + ` (email) VALUES (NULL) RETURNING id`},
				idem.Query{SQL: `SELECT id FROM ` + users}, &id)
			require.Error(t, err)
			_, isUnique := idem.UniqueViolation(err)
			require.False(t, isUnique)
			require.False(t, inboxSavepointExists(t, tx, "idem_create"))
			return nil
		}))
		require.NoError(t, e.inTx(t, sql.LevelDefault, func(tx *sql.Tx) error {
			_, err := idemsql.InsertOrGetTx(ctx, tx, idem.Query{SQL: `INSERT INTO ` + users + ` (email) VALUES (NULL) RETURNING id`},
				idem.Query{SQL: `SELECT id FROM ` + users}, &id)
			require.Error(t, err)
			_, err = tx.ExecContext(ctx, `INSERT INTO `+users+` (email) VALUES ('c@example.com')`)
			return err
		}), "the transaction is usable after the failed insert")

		tx, err := e.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
		require.NoError(t, err)
		defer tx.Rollback()                      //nolint:errcheck
		_, err = tx.ExecContext(ctx, `SELECT 1`) // the snapshot
		require.NoError(t, err)
		_, err = e.pool.Exec(ctx, `INSERT INTO `+users+` (email) VALUES ('d@example.com')`)
		require.NoError(t, err)
		_, err = idemsql.InsertOrGetTx(ctx, tx, idem.Query{SQL: `INSERT INTO ` + users + ` (email) VALUES ('d@example.com') RETURNING id`},
			idem.Query{SQL: `SELECT id FROM ` + users + ` WHERE email = 'd@example.com'`}, &id)
		require.True(t, idem.IsRetryable(err), "want a retryable error, got %v", err)
	})
}

// A handler that panics leaves neither its writes nor the inbox row, and
// the panic goes on; a redelivery in the same transaction processes the
// message, and one after the commit does not.
func TestSQLInboxConsumeOncePanicAndRedelivery(t *testing.T) {
	forEachInboxDriver(t, 4, func(t *testing.T, e *inboxEnv) {
		ctx := context.Background()
		key := idem.Key{Scope: "c", ID: inboxMessageID(t)}
		require.NoError(t, e.inTx(t, sql.LevelDefault, func(tx *sql.Tx) error {
			require.PanicsWithValue(t, "handler bug", func() {
				_, _ = idemsql.ConsumeOnce(ctx, tx, "c", key.ID, func(ctx context.Context, tx *sql.Tx) error {
					if err := e.effect(ctx, tx, key, "x"); err != nil {
						return err
					}
					_, _ = tx.ExecContext(ctx, `SELECT 1/0`) // aborts the savepoint
					panic("handler bug")
				}, e.s.InboxOpt)
			})
			require.False(t, inboxSavepointExists(t, tx, "idem_inbox"), "rolled back and released")
			ran, err := idemsql.ConsumeOnce(ctx, tx, "c", key.ID, func(ctx context.Context, tx *sql.Tx) error {
				return e.effect(ctx, tx, key, "y")
			}, e.s.InboxOpt)
			require.NoError(t, err)
			require.True(t, ran)
			return nil
		}))
		require.NoError(t, e.inTx(t, sql.LevelDefault, func(tx *sql.Tx) error {
			ran, err := idemsql.ConsumeOnce(ctx, tx, "c", key.ID, func(context.Context, *sql.Tx) error {
				t.Error("fn ran for a consumed message")
				return nil
			}, e.s.InboxOpt)
			require.NoError(t, err)
			require.False(t, ran)
			require.False(t, inboxSavepointExists(t, tx, "idem_inbox"), "the savepoint is released")
			return nil
		}))
		require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
	})
}

// Arguments are checked before any SQL, and a transaction already ended or
// a missing inbox table is explained.
func TestSQLInboxArgumentsAndHandles(t *testing.T) {
	forEachInboxDriver(t, 2, func(t *testing.T, e *inboxEnv) {
		ctx := context.Background()
		fn := func(context.Context, *sql.Tx) error {
			t.Error("fn ran")
			return nil
		}
		var n int
		q := idem.Query{SQL: "SELECT 1"}
		tx, err := e.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer tx.Rollback() //nolint:errcheck

		_, err = idemsql.ConsumeOnce(ctx, tx, "", "m", fn)
		var invalid *idem.InvalidKeyError
		require.ErrorAs(t, err, &invalid)
		require.Equal(t, "consumer", invalid.Field)
		_, err = idemsql.ConsumeOnce(ctx, tx, "c", strings.Repeat("m", 256), fn)
		require.ErrorAs(t, err, &invalid)
		require.Equal(t, "message ID", invalid.Field)
		require.ErrorIs(t, err, idem.ErrInvalidKey)
		_, err = idemsql.ConsumeOnce(ctx, nil, "c", "m", fn)
		require.ErrorIs(t, err, idem.ErrInvalidOption)
		_, err = idemsql.ConsumeOnce(ctx, tx, "c", "m", nil)
		require.ErrorIs(t, err, idem.ErrInvalidOption)
		_, err = idemsql.ConsumeOnce(ctx, tx, "c", "m", fn, idem.WithInboxTable("", "1inbox"))
		require.ErrorIs(t, err, idem.ErrInvalidOption)
		_, err = idemsql.InsertOrGet(ctx, nil, q, q, &n)
		require.ErrorIs(t, err, idem.ErrInvalidOption)
		_, err = idemsql.InsertOrGet(ctx, e.db, q, idem.Query{}, &n)
		require.ErrorIs(t, err, idem.ErrInvalidOption)
		_, err = idemsql.InsertOrGetTx(ctx, nil, q, q, &n)
		require.ErrorIs(t, err, idem.ErrInvalidOption)
		_, err = idemsql.InsertOrGetTx(ctx, tx, idem.Query{}, q, &n)
		require.ErrorIs(t, err, idem.ErrInvalidOption)

		// A missing inbox table says how to create it; tx is aborted.
		_, err = idemsql.ConsumeOnce(ctx, tx, "c", "m", fn, idem.WithInboxTable(e.s.Name, "no_inbox"))
		require.ErrorContains(t, err, "migrations.Up")

		for _, end := range []string{"Commit", "Rollback"} {
			tx, err := e.db.BeginTx(ctx, nil)
			require.NoError(t, err)
			if end == "Commit" {
				require.NoError(t, tx.Commit())
			} else {
				require.NoError(t, tx.Rollback())
			}
			_, err = idemsql.ConsumeOnce(ctx, tx, "c", "m", fn, e.s.InboxOpt)
			require.ErrorIs(t, err, idem.ErrInvalidOption, end)
			require.ErrorContains(t, err, "idem: ConsumeOnce: the transaction was already committed or rolled back", end)
			_, err = idemsql.InsertOrGetTx(ctx, tx, q, q, &n)
			require.ErrorIs(t, err, idem.ErrInvalidOption, end)
			require.ErrorContains(t, err, "idem: InsertOrGetTx: the transaction was already committed or rolled back", end)
		}

		closed := openSQLDB(t, e.driver, pgtest.ClientURL(), 1)
		require.NoError(t, closed.Close())
		_, err = idemsql.InsertOrGet(ctx, closed, q, q, &n)
		require.ErrorContains(t, err, "idem: InsertOrGet: the pool was closed")
	})
}

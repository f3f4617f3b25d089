package integration_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/integration/internal/pgtest"
	"github.com/idemkit/idem/migrations"
)

func tableExists(t *testing.T, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, schema, table string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, db.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT FROM pg_tables WHERE schemaname = $1 AND tablename = $2)`, schema, table).Scan(&ok))
	return ok
}

func TestMigrationsUpDownUp(t *testing.T) {
	pgtest.SkipViaPgBouncer(t, "golang-migrate holds a session advisory lock (pg_advisory_lock/unlock); migrations need a direct connection")
	pool := pgtest.Pool(t)
	ctx := context.Background()
	schema := "idem_mig_updownup"
	_, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})
	opt := migrations.WithTable(schema, "keys")

	require.NoError(t, migrations.Up(ctx, pool, opt))
	require.True(t, tableExists(t, pool, schema, "keys"))
	require.True(t, tableExists(t, pool, schema, "keys_schema_migrations"), "its own version table")
	require.True(t, tableExists(t, pool, schema, "idem_inbox"))
	require.False(t, tableExists(t, pool, schema, "schema_migrations"), "never the application's")
	v, dirty, err := migrations.Version(ctx, pool, opt)
	require.NoError(t, err)
	require.False(t, dirty)
	require.EqualValues(t, 2, v)

	// The table has the promised shape.
	var reloptions []string
	require.NoError(t, pool.QueryRow(ctx, `SELECT reloptions FROM pg_class WHERE oid = $1::regclass`,
		pgx.Identifier{schema, "keys"}.Sanitize()).Scan(&reloptions))
	require.Contains(t, reloptions, "fillfactor=70")
	var indexes []string
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(indexdef ORDER BY indexname) FROM pg_indexes WHERE schemaname = $1 AND tablename = 'keys'`,
		schema).Scan(&indexes))
	require.Len(t, indexes, 2)
	require.Contains(t, indexes[0], "(expires_at)")
	require.Contains(t, indexes[1], "keys_pkey")
	require.Contains(t, indexes[1], "UNIQUE")
	require.Contains(t, indexes[1], "(scope, key)")

	// Up again is no change, not an error.
	require.NoError(t, migrations.Up(ctx, pool, opt))

	// The table works with idem under the same names.
	res, err := idem.Do(ctx, pool, idem.Key{Scope: "s", ID: "k"}, func(context.Context, pgx.Tx) (int, error) { return 42, nil },
		idem.WithTable(schema, "keys"))
	require.NoError(t, err)
	require.Equal(t, 42, res.Value)

	require.NoError(t, migrations.Down(ctx, pool, opt))
	require.False(t, tableExists(t, pool, schema, "keys"))
	require.False(t, tableExists(t, pool, schema, "idem_inbox"))
	require.NoError(t, migrations.Down(ctx, pool, opt), "down again is no change")
	v, _, err = migrations.Version(ctx, pool, opt)
	require.NoError(t, err)
	require.EqualValues(t, 0, v)

	require.NoError(t, migrations.Up(ctx, pool, opt))
	require.True(t, tableExists(t, pool, schema, "keys"))

	// The pool is still open and usable.
	require.NoError(t, pool.Ping(ctx))
}

func TestMigrationsOnAConnLeaveItOpen(t *testing.T) {
	pgtest.SkipViaPgBouncer(t, "golang-migrate holds a session advisory lock (pg_advisory_lock/unlock); migrations need a direct connection")
	pool := pgtest.Pool(t)
	conn := pgtest.Conn(t)
	ctx := context.Background()
	schema := "idem_mig_conn"
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
	})
	opt := migrations.WithTable(schema, idem.DefaultTable)
	require.NoError(t, migrations.Up(ctx, conn, opt))
	require.False(t, conn.IsClosed())
	require.NoError(t, conn.Ping(ctx))
	require.True(t, tableExists(t, conn, schema, idem.DefaultTable))
	require.True(t, tableExists(t, conn, schema, idem.DefaultTable+"_schema_migrations"))
}

func TestMigrationsRejectBadInput(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	require.ErrorIs(t, migrations.Up(ctx, pool, migrations.WithTable("", `bad"name`)), idem.ErrInvalidOption)
	require.ErrorIs(t, migrations.Up(ctx, pool, migrations.WithTable("1schema", "t")), idem.ErrInvalidOption)
	require.ErrorIs(t, migrations.Up(ctx, pool, migrations.WithTable("s", idem.DefaultInboxTable)), idem.ErrInvalidOption,
		"a record table may not take the inbox's name")
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, migrations.Up(cancelled, pool), context.Canceled)
}

// Two record tables in one schema share its inbox: the second one's
// migrations find it in place.
func TestMigrationsTwoRecordTablesInOneSchema(t *testing.T) {
	pgtest.SkipViaPgBouncer(t, "golang-migrate holds a session advisory lock (pg_advisory_lock/unlock); migrations need a direct connection")
	pool := pgtest.Pool(t)
	ctx := context.Background()
	schema := "idem_mig_two"
	dropSchema := func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
	}
	dropSchema()
	t.Cleanup(dropSchema)
	for _, table := range []string{"order_keys", "payment_keys"} {
		require.NoError(t, migrations.Up(ctx, pool, migrations.WithTable(schema, table)), table)
		v, dirty, err := migrations.Version(ctx, pool, migrations.WithTable(schema, table))
		require.NoError(t, err)
		require.False(t, dirty)
		require.EqualValues(t, 2, v, table)
		require.True(t, tableExists(t, pool, schema, table))
	}
	require.True(t, tableExists(t, pool, schema, idem.DefaultInboxTable))
}

// Concurrent runs into a schema that does not exist yet all succeed: the
// one that loses the race to create the schema goes on.
func TestMigrationsConcurrentUpIntoANewSchema(t *testing.T) {
	pgtest.SkipViaPgBouncer(t, "golang-migrate holds a session advisory lock (pg_advisory_lock/unlock); migrations need a direct connection")
	pool := pgtest.Pool(t)
	ctx := context.Background()
	for round := range 3 {
		schema := "idem_mig_race_" + strconv.Itoa(round)
		_, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) })
		errs := make(chan error, 6)
		for range 6 {
			go func() { errs <- migrations.Up(ctx, pool, migrations.WithTable(schema, idem.DefaultTable)) }()
		}
		for range 6 {
			require.NoError(t, <-errs)
		}
	}
}

// A run that fails while golang-migrate sets up (here a read-only session,
// where it cannot create its version table) leaves no connection behind: it
// neither holds one of the caller's pool nor leaks one of its own.
func TestMigrationsFailedRunLeavesNoConnection(t *testing.T) {
	pgtest.SkipViaPgBouncer(t, "golang-migrate holds a session advisory lock (pg_advisory_lock/unlock); migrations need a direct connection")
	admin := pgtest.Pool(t)
	ctx := context.Background()
	app := "idem_mig_readonly_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	ro := pgtest.Pool(t, func(c *pgxpool.Config) {
		c.MaxConns = 1
		c.ConnConfig.RuntimeParams["application_name"] = app
		c.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	})
	schema := "idem_mig_readonly"
	_, err := admin.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`) })
	for range 2 {
		require.Error(t, migrations.Up(ctx, ro, migrations.WithTable(schema, "keys")))
	}
	// A closed connection's backend leaves pg_stat_activity a moment later.
	require.Eventually(t, func() bool {
		var backends int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&backends))
		return backends == 0
	}, 10*time.Second, 20*time.Millisecond, "a connection of the failed runs is still open")
	acquireCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := ro.Acquire(acquireCtx)
	require.NoError(t, err, "the caller's pool has a free connection")
	c.Release()
}

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

// dropSchemaNow drops schema now and when the test ends.
func dropSchemaNow(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	drop := func() {
		_, err := pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		require.NoError(t, err)
	}
	drop()
	t.Cleanup(drop)
}

func schemaExists(t *testing.T, pool *pgxpool.Pool, schema string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&ok))
	return ok
}

// Version and Down on what was never migrated write nothing: they work on
// a read-only session, and leave no schema and no version table behind.
func TestMigrationsVersionAndDownOnNothingWriteNothing(t *testing.T) {
	pgtest.SkipViaPgBouncer(t, "migrations take a session advisory lock and need a direct connection")
	admin := pgtest.Pool(t)
	ctx := context.Background()
	ro := pgtest.Pool(t, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	})
	missing, empty := "idem_mig_never_made", "idem_mig_empty"
	dropSchemaNow(t, admin, missing)
	dropSchemaNow(t, admin, empty)
	_, err := admin.Exec(ctx, `CREATE SCHEMA `+empty)
	require.NoError(t, err)

	for _, schema := range []string{missing, empty} {
		opt := migrations.WithTable(schema, idem.DefaultTable)
		for _, db := range []*pgxpool.Pool{ro, admin} {
			v, dirty, err := migrations.Version(ctx, db, opt)
			require.NoError(t, err, schema)
			require.Zero(t, v)
			require.False(t, dirty)
			require.NoError(t, migrations.Down(ctx, db, opt), "down on nothing is no change")
		}
		require.False(t, tableExists(t, admin, schema, idem.DefaultTable+"_schema_migrations"), "no version table was created")
	}
	require.False(t, schemaExists(t, admin, missing), "no schema was created")

	// A search_path naming no existing schema: current_schema() is null.
	conn := pgtest.Conn(t, func(c *pgx.ConnConfig) { c.RuntimeParams["search_path"] = missing })
	v, dirty, err := migrations.Version(ctx, conn)
	require.NoError(t, err)
	require.Zero(t, v)
	require.False(t, dirty)
	require.False(t, schemaExists(t, admin, missing))
}

// Down leaves nothing of idem's behind: the tables and the version table go,
// the schema stays.
func TestMigrationsDownDropsTheVersionTable(t *testing.T) {
	pgtest.SkipViaPgBouncer(t, "migrations take a session advisory lock and need a direct connection")
	pool := pgtest.Pool(t)
	ctx := context.Background()
	schema := "idem_mig_down_clean"
	dropSchemaNow(t, pool, schema)
	opt := migrations.WithTable(schema, "keys")

	require.NoError(t, migrations.Up(ctx, pool, opt))
	require.True(t, tableExists(t, pool, schema, "keys_schema_migrations"))
	require.NoError(t, migrations.Down(ctx, pool, opt))
	var tables int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = $1`, schema).Scan(&tables))
	require.Zero(t, tables, "the record, inbox and version tables are gone")
	require.True(t, schemaExists(t, pool, schema), "the schema stays")

	// An empty version table (Force(-1)) is dropped too.
	require.NoError(t, migrations.Force(ctx, pool, 1, opt))
	require.NoError(t, migrations.Force(ctx, pool, -1, opt))
	require.True(t, tableExists(t, pool, schema, "keys_schema_migrations"))
	v, dirty, err := migrations.Version(ctx, pool, opt)
	require.NoError(t, err)
	require.Zero(t, v)
	require.False(t, dirty)
	require.NoError(t, migrations.Down(ctx, pool, opt))
	require.False(t, tableExists(t, pool, schema, "keys_schema_migrations"))
}

// A dirty version stops Up and Down; Force clears it without running a
// migration.
func TestMigrationsForceClearsADirtyVersion(t *testing.T) {
	pgtest.SkipViaPgBouncer(t, "migrations take a session advisory lock and need a direct connection")
	pool := pgtest.Pool(t)
	ctx := context.Background()
	schema := "idem_mig_force"
	dropSchemaNow(t, pool, schema)
	opt := migrations.WithTable(schema, idem.DefaultTable)

	for _, bad := range []int{-2, 0, 3} {
		require.ErrorIs(t, migrations.Force(ctx, pool, bad, opt), idem.ErrInvalidOption, "version %d", bad)
	}
	require.NoError(t, migrations.Force(ctx, pool, -1, opt), "no version on nothing")
	require.False(t, schemaExists(t, pool, schema), "Force(-1) on nothing writes nothing")

	require.NoError(t, migrations.Up(ctx, pool, opt))
	_, err := pool.Exec(ctx, `UPDATE `+pgx.Identifier{schema, idem.DefaultTable + "_schema_migrations"}.Sanitize()+` SET dirty = true`)
	require.NoError(t, err)
	v, dirty, err := migrations.Version(ctx, pool, opt)
	require.NoError(t, err)
	require.EqualValues(t, 2, v)
	require.True(t, dirty)

	err = migrations.Up(ctx, pool, opt)
	require.ErrorContains(t, err, "dirty")
	require.ErrorContains(t, migrations.Down(ctx, pool, opt), "dirty")
	require.True(t, tableExists(t, pool, schema, idem.DefaultTable), "a dirty Down changes nothing")

	require.NoError(t, migrations.Force(ctx, pool, 2, opt))
	v, dirty, err = migrations.Version(ctx, pool, opt)
	require.NoError(t, err)
	require.EqualValues(t, 2, v)
	require.False(t, dirty)
	require.NoError(t, migrations.Up(ctx, pool, opt))

	// Force runs no migration: forced back to 1, Up applies 2 again, which
	// finds the inbox in place.
	require.NoError(t, migrations.Force(ctx, pool, 1, opt))
	v, _, err = migrations.Version(ctx, pool, opt)
	require.NoError(t, err)
	require.EqualValues(t, 1, v)
	require.True(t, tableExists(t, pool, schema, idem.DefaultInboxTable), "Force ran no down migration")
	require.NoError(t, migrations.Up(ctx, pool, opt))
	v, _, err = migrations.Version(ctx, pool, opt)
	require.NoError(t, err)
	require.EqualValues(t, 2, v)
}

// While another session holds the migration lock, Up, Down and Force wait
// only as long as ctx allows, and leave no connection behind; once the lock
// is free, they run.
func TestMigrationsLockWaitEndsWithCtx(t *testing.T) {
	pgtest.SkipViaPgBouncer(t, "migrations take a session advisory lock and need a direct connection")
	admin := pgtest.Pool(t)
	ctx := context.Background()
	schema := "idem_mig_lockwait"
	dropSchemaNow(t, admin, schema)
	app := "idem_mig_lockwait_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = app })
	opt := migrations.WithTable(schema, idem.DefaultTable)
	require.NoError(t, migrations.Up(ctx, pool, opt))

	holder := pgtest.Conn(t)
	const lockKey = `hashtextextended('idem migrations ' || $1 || '.' || $2, 0)`
	_, err := holder.Exec(ctx, `SELECT pg_advisory_lock(`+lockKey+`)`, schema, idem.DefaultTable+"_schema_migrations")
	require.NoError(t, err)

	for name, op := range map[string]func(context.Context) error{
		"Up":    func(ctx context.Context) error { return migrations.Up(ctx, pool, opt) },
		"Down":  func(ctx context.Context) error { return migrations.Down(ctx, pool, opt) },
		"Force": func(ctx context.Context) error { return migrations.Force(ctx, pool, 2, opt) },
	} {
		opCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		started := time.Now()
		err := op(opCtx)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, name)
		require.ErrorContains(t, err, "migration lock", name)
		require.Less(t, time.Since(started), 10*time.Second, "%s waited for golang-migrate's lock timeout", name)
		require.Eventually(t, func() bool {
			var backends int
			require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&backends))
			return backends == 0
		}, 10*time.Second, 20*time.Millisecond, "%s left a connection behind", name)
	}
	require.True(t, tableExists(t, admin, schema, idem.DefaultTable), "no run got through")

	var unlocked bool
	require.NoError(t, holder.QueryRow(ctx, `SELECT pg_advisory_unlock(`+lockKey+`)`, schema, idem.DefaultTable+"_schema_migrations").Scan(&unlocked))
	require.True(t, unlocked)
	require.NoError(t, migrations.Down(ctx, pool, opt))
	require.NoError(t, migrations.Up(ctx, pool, opt))
	v, dirty, err := migrations.Version(ctx, pool, opt)
	require.NoError(t, err)
	require.EqualValues(t, 2, v)
	require.False(t, dirty)
}

// Package pgtest gives integration tests a real PostgreSQL.
//
// The database comes from TEST_DATABASE_URL when it is set. Otherwise a
// PostgreSQL container is started with testcontainers-go (Docker needed) and
// removed when the tests end. When neither works, the tests fail with a
// message saying how to provide a database; they never skip.
//
// With IDEM_TEST_PGBOUNCER set (see BouncerEnv), Main also starts PgBouncer
// in transaction pooling mode on a free loopback port, and Pool and Conn
// connect through it with the pgx execution mode that works there
// (BouncerExecMode). Migrations, which take a session advisory lock, run on
// a direct connection; a test that cannot work through a transaction pooler
// says why with SkipViaPgBouncer. If PgBouncer cannot start, the tests fail.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/migrations"
)

var (
	// databaseURL is the database itself; clientURL is what Pool and Conn
	// connect to: databaseURL, or PgBouncer in front of it.
	databaseURL, clientURL string
	bouncerRun             *bouncer

	directOnce sync.Once
	direct     *pgxpool.Pool
	directErr  error
)

// Main resolves the database, starts PgBouncer when BouncerEnv asks for it,
// runs the tests and cleans up. Call it from TestMain.
func Main(m *testing.M) {
	url, cleanup, err := resolve()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		os.Exit(1)
	}
	databaseURL, clientURL = url, url
	bin, err := bouncerBinary()
	if err == nil && bin != "" {
		bouncerRun, err = startBouncer(bin, url)
		if err == nil {
			clientURL = bouncerRun.url(bouncerRun.database)
			fmt.Fprintf(os.Stderr, "pgtest: through %s (transaction pooling, pgx exec mode %q) on 127.0.0.1:%d\n",
				bouncerVersion(bin), BouncerExecMode, bouncerRun.port)
		}
	}
	if err != nil {
		cleanup()
		fmt.Fprintln(os.Stderr, "pgtest: PgBouncer:", err)
		os.Exit(1)
	}
	code := m.Run()
	if direct != nil {
		direct.Close()
	}
	if bouncerRun != nil {
		if code != 0 {
			fmt.Fprintf(os.Stderr, "pgtest: PgBouncer's log:\n%s\n", bouncerRun.log.String())
		}
		bouncerRun.stop()
	}
	cleanup()
	os.Exit(code)
}

func resolve() (string, func(), error) {
	if url := os.Getenv("TEST_DATABASE_URL"); url != "" {
		return url, func() {}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := postgres.Run(ctx, "postgres:15-alpine",
		postgres.WithDatabase("idem"),
		postgres.WithUsername("idem"),
		postgres.WithPassword("idem"),
		postgres.BasicWaitStrategies(),
	)
	if err != nil {
		return "", nil, fmt.Errorf(`no database for the tests.
Set TEST_DATABASE_URL to a PostgreSQL 13+ database the tests may create schemas in, e.g.
    TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable
or make Docker available so that testcontainers-go can start one.
(starting a container failed: %v)`, err)
	}
	url, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = c.Terminate(context.Background())
		return "", nil, err
	}
	return url, func() { _ = c.Terminate(context.Background()) }, nil
}

// URL is the test database's own connection string, never PgBouncer's: a
// test that builds its own connections from it (a fault-injecting proxy,
// say) talks to PostgreSQL directly.
func URL() string { return databaseURL }

// ClientURL is the connection string Pool and Conn use: PgBouncer's, with
// pgx's default_query_exec_mode set to BouncerExecMode, when the tests run
// through it, otherwise URL.
func ClientURL() string { return clientURL }

// ViaPgBouncer reports whether Pool and Conn go through PgBouncer in
// transaction pooling mode.
func ViaPgBouncer() bool { return bouncerRun != nil }

// SkipViaPgBouncer skips the test when it runs through PgBouncer, giving
// the reason, which must be one inherent to transaction pooling (a test of
// session state, of a backend's identity, of session advisory locks).
func SkipViaPgBouncer(t testing.TB, reason string) {
	t.Helper()
	if ViaPgBouncer() {
		t.Skipf("skipped through PgBouncer in transaction pooling mode: %s", reason)
	}
}

// SingleServerURL is the connection string of the test database behind
// PgBouncer through a pool of one server connection (SingleServerDatabase).
// It is empty when the tests do not run through PgBouncer.
func SingleServerURL() string {
	if bouncerRun == nil {
		return ""
	}
	return bouncerRun.url(SingleServerDatabase)
}

// Direct is a pool of direct connections to the database, bypassing
// PgBouncer, shared by the tests and closed by Main: for what needs a
// session of its own, such as migrations (golang-migrate holds a session
// advisory lock while it migrates).
func Direct(t testing.TB) *pgxpool.Pool {
	t.Helper()
	directOnce.Do(func() {
		cfg, err := pgxpool.ParseConfig(databaseURL)
		if err != nil {
			directErr = fmt.Errorf("parsing TEST_DATABASE_URL: %w", err)
			return
		}
		cfg.MaxConns = 4
		direct, directErr = pgxpool.NewWithConfig(context.Background(), cfg)
	})
	if directErr != nil {
		t.Fatalf("connecting directly: %v", directErr)
	}
	return direct
}

// Pool opens a pool closed at the end of the test, through PgBouncer when
// the tests run through it. configure may adjust the configuration.
func Pool(t testing.TB, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(clientURL)
	if err != nil {
		t.Fatalf("parsing TEST_DATABASE_URL: %v", err)
	}
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Conn opens a single connection closed at the end of the test, through
// PgBouncer when the tests run through it.
func Conn(t testing.TB, configure ...func(*pgx.ConnConfig)) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(clientURL)
	if err != nil {
		t.Fatalf("parsing TEST_DATABASE_URL: %v", err)
	}
	for _, f := range configure {
		f(cfg)
	}
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// Schema is a test's own schema holding a migrated record table and an
// effects table.
type Schema struct {
	Name string
	// Effects is the sanitized name of a table (id bigserial, scope text, key
	// text, value text) with no unique constraint, so that every execution of
	// a test's fn leaves a row and duplicates show.
	Effects string
	// Records is the sanitized name of the record table.
	Records string
	// Opt points idem at the schema's record table, InboxOpt at its inbox.
	Opt, InboxOpt idem.TableOption
}

// NewSchema creates a schema for the test, migrates idem's table into it, and
// drops it when the test ends. The migration runs on a direct connection
// when pool goes through PgBouncer; the rest through pool.
func NewSchema(t testing.TB, pool *pgxpool.Pool) *Schema {
	t.Helper()
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "idem_test_" + hex.EncodeToString(b)
	migrateOn := pool
	if ViaPgBouncer() {
		migrateOn = Direct(t)
	}
	if err := migrations.Up(ctx, migrateOn, migrations.WithTable(name, idem.DefaultTable)); err != nil {
		t.Fatalf("migrating: %v", err)
	}
	s := &Schema{
		Name:     name,
		Effects:  pgx.Identifier{name, "effects"}.Sanitize(),
		Records:  pgx.Identifier{name, idem.DefaultTable}.Sanitize(),
		Opt:      idem.WithTable(name, idem.DefaultTable),
		InboxOpt: idem.WithInboxTable(name, idem.DefaultInboxTable),
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+s.Effects+` (id bigserial PRIMARY KEY, scope text NOT NULL, key text NOT NULL, value text NOT NULL)`); err != nil {
		t.Fatalf("creating the effects table: %v", err)
	}
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{name}.Sanitize()+` CASCADE`)
		if err != nil {
			t.Errorf("dropping schema %s: %v", name, err)
		}
	})
	return s
}

// AddEffect writes one effect row in tx: what a test's fn does.
func (s *Schema) AddEffect(ctx context.Context, tx pgx.Tx, key idem.Key, value string) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+s.Effects+` (scope, key, value) VALUES ($1, $2, $3)`, key.Scope, key.ID, value)
	return err
}

// CountEffects counts the committed effects of a key.
func (s *Schema) CountEffects(t testing.TB, pool *pgxpool.Pool, key idem.Key) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+s.Effects+` WHERE scope = $1 AND key = $2`, key.Scope, key.ID).Scan(&n)
	if err != nil {
		t.Fatalf("counting effects: %v", err)
	}
	return n
}

// Record is a record row as a test sees it.
type Record struct {
	Status   string
	Attempt  int
	Response []byte
}

// ReadRecord returns a key's committed record, or nil.
func (s *Schema) ReadRecord(t testing.TB, pool *pgxpool.Pool, key idem.Key) *Record {
	t.Helper()
	var r Record
	err := pool.QueryRow(context.Background(), `SELECT status, attempt, response FROM `+s.Records+` WHERE scope = $1 AND key = $2`,
		key.Scope, key.ID).Scan(&r.Status, &r.Attempt, &r.Response)
	if err == pgx.ErrNoRows {
		return nil
	}
	if err != nil {
		t.Fatalf("reading the record: %v", err)
	}
	return &r
}

// Package pgtest gives integration tests a real PostgreSQL.
//
// The database comes from TEST_DATABASE_URL when it is set. Otherwise a
// PostgreSQL container is started with testcontainers-go (Docker needed) and
// removed when the tests end. When neither works, the tests fail with a
// message saying how to provide a database; they never skip.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/migrations"
)

var databaseURL string

// Main resolves the database, runs the tests and cleans up. Call it from
// TestMain.
func Main(m *testing.M) {
	url, cleanup, err := resolve()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		os.Exit(1)
	}
	databaseURL = url
	code := m.Run()
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

// URL is the test database's connection string.
func URL() string { return databaseURL }

// Pool opens a pool closed at the end of the test. configure may adjust the
// configuration.
func Pool(t testing.TB, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(databaseURL)
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

// Conn opens a single connection closed at the end of the test.
func Conn(t testing.TB, configure ...func(*pgx.ConnConfig)) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(databaseURL)
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
	Opt, InboxOpt idem.Option
}

// NewSchema creates a schema for the test, migrates idem's table into it, and
// drops it when the test ends.
func NewSchema(t testing.TB, pool *pgxpool.Pool) *Schema {
	t.Helper()
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "idem_test_" + hex.EncodeToString(b)
	if err := migrations.Up(ctx, pool, migrations.WithTable(name, idem.DefaultTable)); err != nil {
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

package idem_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/migrations"
)

// The runnable examples need a database: TEST_DATABASE_URL. (The
// integration module's tests can also start one with testcontainers-go.)
func TestMain(m *testing.M) {
	if os.Getenv("TEST_DATABASE_URL") == "" {
		fmt.Fprintln(os.Stderr, `TEST_DATABASE_URL is not set. The examples of this package run against PostgreSQL:
    TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable go test ./...
(see README.md; .ci/run creates a throwaway database and sets it).`)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// examplePool connects to TEST_DATABASE_URL with search_path set to a fresh
// schema holding a migrated record table and an example signups table.
func examplePool(name string) *pgxpool.Pool {
	ctx := context.Background()
	schema := pgx.Identifier{"idem_example_" + name}.Sanitize()
	setup, err := pgx.Connect(ctx, os.Getenv("TEST_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer setup.Close(ctx)
	if _, err := setup.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE; CREATE SCHEMA "+schema); err != nil {
		panic(err)
	}
	cfg, err := pgxpool.ParseConfig(os.Getenv("TEST_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = "idem_example_" + name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	if err := migrations.Up(ctx, pool); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE signups (id bigint GENERATED ALWAYS AS IDENTITY, user_id bigint, activity_id bigint)`); err != nil {
		panic(err)
	}
	return pool
}

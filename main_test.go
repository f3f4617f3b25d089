package idem_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/migrations"
)

// databaseExamples are the examples that run against PostgreSQL (they call
// examplePool). The package's tests need no database.
var databaseExamples = []string{
	"ExampleWithIdempotency", "ExampleDo", "ExamplePermanent", "ExampleStateMachine_Transition",
	"ExampleClaim", "ExampleConsumeOnce", "ExampleInsertOrGet",
	"ExampleIssueToken", "Example_service", "ExamplePurge", "ExampleWithHooks", "ExampleLookup", "ExampleStuck", "ExamplePurger",
}

// The runnable examples need a database: TEST_DATABASE_URL. (The
// integration module's tests can also start one with testcontainers-go.)
// Without it the run fails at once, unless -short is set: then the examples
// that need the database are skipped, saying so, and everything else runs.
// The schemas the examples made are dropped after the run.
func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv("TEST_DATABASE_URL") == "" {
		if !testing.Short() {
			fmt.Fprintln(os.Stderr, `TEST_DATABASE_URL is not set. The examples of this package run against PostgreSQL:
    TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable go test ./...
(see README.md; .ci/run creates a throwaway database and sets it).
go test -short runs only what needs no database.`)
			os.Exit(1)
		}
		skip(databaseExamples)
		fmt.Fprintf(os.Stderr, "-short without TEST_DATABASE_URL: skipping the examples that run against PostgreSQL (%s)\n",
			strings.Join(databaseExamples, ", "))
	}
	code := m.Run()
	if err := dropExampleSchemas(); err != nil {
		fmt.Fprintln(os.Stderr, "dropping the examples' schemas:", err)
		code = max(code, 1)
	}
	os.Exit(code)
}

// skip adds names to -test.skip, keeping the skip pattern the run was given.
func skip(names []string) {
	pattern := "^(" + strings.Join(names, "|") + ")$"
	if own := flag.Lookup("test.skip").Value.String(); own != "" {
		pattern = own + "|" + pattern
	}
	if err := flag.Set("test.skip", pattern); err != nil {
		panic(err)
	}
}

var (
	exampleSchemasMu sync.Mutex
	exampleSchemas   []string // made by examplePool, dropped by TestMain
)

// examplePool connects to TEST_DATABASE_URL with search_path set to a fresh
// schema holding a migrated record table and an example signups table.
// TestMain drops the schema after the run.
func examplePool(name string) *pgxpool.Pool {
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		panic("examplePool: TEST_DATABASE_URL is not set; an example that needs the database must be listed in databaseExamples (main_test.go) to be skipped without one")
	}
	ctx := context.Background()
	schema := "idem_example_" + name
	setup, err := pgx.Connect(ctx, url)
	if err != nil {
		panic(err)
	}
	defer setup.Close(ctx)
	ident := pgx.Identifier{schema}.Sanitize()
	if _, err := setup.Exec(ctx, "DROP SCHEMA IF EXISTS "+ident+" CASCADE; CREATE SCHEMA "+ident); err != nil {
		panic(err)
	}
	exampleSchemasMu.Lock()
	exampleSchemas = append(exampleSchemas, schema)
	exampleSchemasMu.Unlock()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
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

// dropExampleSchemas drops the schemas examplePool made.
func dropExampleSchemas() error {
	exampleSchemasMu.Lock()
	defer exampleSchemasMu.Unlock()
	if len(exampleSchemas) == 0 {
		return nil
	}
	idents := make([]string, len(exampleSchemas))
	for i, s := range exampleSchemas {
		idents[i] = pgx.Identifier{s}.Sanitize()
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("TEST_DATABASE_URL"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+strings.Join(idents, ", ")+" CASCADE")
	return err
}

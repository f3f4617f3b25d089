// Package exampledb connects the example programs to PostgreSQL. Each
// example keeps its tables, and idem's, in a schema of its own, named after
// it (quickstart_example, orders_example, ...), and says so when it starts.
package exampledb

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// SampleURL is the DATABASE_URL the README runs the examples with.
const SampleURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// ErrNoURL is returned by Connect when DATABASE_URL is empty: the examples
// do not fall back to libpq's PG* variables and defaults, so that they never
// write to a database nobody named.
var ErrNoURL = errors.New("DATABASE_URL is not set")

// Connect opens a pool on url (DATABASE_URL), creates schema if it is
// missing, sets search_path to it on every connection, so that the
// example's tables and idem's land there, and checks that the database
// answers within 5 seconds, saying what to set when it does not. Each
// configure function may change the pool's configuration first (its
// MaxConns, say). An empty url is ErrNoURL, with the URL to set.
func Connect(ctx context.Context, url, schema string, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	if url == "" {
		return nil, fmt.Errorf("%w: name the PostgreSQL 13+ database this example may keep its tables in (in the schema %s, created if missing), e.g.\n    DATABASE_URL='%s'",
			ErrNoURL, schema, SampleURL)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	for _, c := range configure {
		c(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot reach PostgreSQL through DATABASE_URL (e.g. DATABASE_URL='%s'): %w", SampleURL, err)
	}
	if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{schema}.Sanitize()); err != nil {
		pool.Close()
		return nil, fmt.Errorf("creating the schema %s: %w", schema, err)
	}
	return pool, nil
}

// Where is the line an example prints when it starts: the database it
// writes to, the schema its tables and idem's are in, and how to remove
// them.
func Where(pool *pgxpool.Pool, schema string) string {
	cfg := pool.Config().ConnConfig
	return fmt.Sprintf("database %s@%s:%d/%s, schema %s: this example's tables and idem's (DROP SCHEMA %s CASCADE removes them)",
		cfg.User, cfg.Host, cfg.Port, cmp.Or(cfg.Database, cfg.User), schema, schema)
}

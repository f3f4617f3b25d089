// Package exampledb connects the example programs to PostgreSQL.
package exampledb

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Connect opens a pool on url (DATABASE_URL; empty means libpq's PG*
// variables and defaults) with search_path set to schema, and checks that
// the database answers, saying what to set when it does not.
func Connect(ctx context.Context, url, schema string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot reach PostgreSQL (set DATABASE_URL, e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable): %w", err)
	}
	return pool, nil
}

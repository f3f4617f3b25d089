package main

import (
	"context"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/migrations"
)

// pgStore is the lead form on PostgreSQL, through pgx: the pool's
// search_path is schema, and the handler's transaction is idemhttp.Tx.
type pgStore struct {
	pool   *pgxpool.Pool
	schema string
}

func (s pgStore) setUp(ctx context.Context) error {
	if err := migrations.Up(ctx, s.pool, migrations.WithTable(s.schema, idem.DefaultTable)); err != nil {
		return err
	}
	// No unique constraint: the key alone keeps a lead from being stored
	// twice, and a duplicate would show. The key is stored with the lead
	// only so that the page can count a submission's rows; idem does not
	// need it.
	_, err := s.pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS leads (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			name text NOT NULL, email text NOT NULL, message text NOT NULL,
			idempotency_key text,
			created_at timestamptz NOT NULL DEFAULT now());
		-- An earlier version of this example made leads without it.
		ALTER TABLE leads ADD COLUMN IF NOT EXISTS idempotency_key text`)
	return err
}

func (s pgStore) middleware(cfg idemhttp.Config) (func(http.Handler) http.Handler, error) {
	return idemhttp.Middleware(s.pool, cfg)
}

func (pgStore) insertLead(ctx context.Context, name, email, message, key string) (int64, error) {
	var id int64
	err := idemhttp.Tx(ctx).QueryRow(ctx,
		`INSERT INTO leads (name, email, message, idempotency_key) VALUES ($1, $2, $3, $4) RETURNING id`,
		name, email, message, key).Scan(&id)
	return id, err
}

func (s pgStore) countLeads(ctx context.Context, key string) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM leads WHERE idempotency_key = $1`, key).Scan(&n)
	return n, err
}

package main

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/migrations"
)

// pgStore is the quickstart on PostgreSQL, through pgx.
type pgStore struct{ pool *pgxpool.Pool }

func (s pgStore) setUp(ctx context.Context) (int64, error) {
	// Unqualified, idem's tables go where the quickstart's do: into the first
	// schema of the search_path.
	if err := migrations.Up(ctx, s.pool); err != nil { // creates idem's tables, or does nothing if they are up to date
		return 0, err
	}
	// The sign-up table deliberately has no unique constraint: a duplicate
	// sign-up would show as a second row.
	if _, err := s.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS quickstart_signups (
		id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		activity_id bigint NOT NULL,
		user_id     bigint NOT NULL,
		created_at  timestamptz NOT NULL DEFAULT now())`); err != nil {
		return 0, err
	}
	var next int64
	err := s.pool.QueryRow(ctx, `SELECT coalesce(max(activity_id), 0) + 1 FROM quickstart_signups`).Scan(&next)
	return next, err
}

func (s pgStore) signUp(ctx context.Context, key idem.Key, activityID, userID int64) (idem.Result[receipt], error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return idem.Result[receipt]{}, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
	res, err := idem.WithIdempotency(ctx, tx, key, func(ctx context.Context, tx pgx.Tx) (receipt, error) {
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO quickstart_signups (activity_id, user_id) VALUES ($1, $2) RETURNING id`,
			activityID, userID).Scan(&id)
		return signedUp(id), err
	}, idem.NoWait())
	if err != nil {
		return res, err
	}
	return res, tx.Commit(ctx)
}

func (s pgStore) count(ctx context.Context, activityID int64) (rows, users int, err error) {
	err = s.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT user_id) FROM quickstart_signups WHERE activity_id = $1`,
		activityID).Scan(&rows, &users)
	return rows, users, err
}

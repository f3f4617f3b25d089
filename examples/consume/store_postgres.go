package main

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/migrations"
)

// pgStore is the consumer on PostgreSQL, through pgx; the pool's
// search_path is the example's schema.
type pgStore struct{ pool *pgxpool.Pool }

func (s pgStore) setUp(ctx context.Context) (int64, error) {
	if err := migrations.Up(ctx, s.pool); err != nil { // idem's tables, the inbox among them
		return 0, err
	}
	// No unique key on order_id: a second credit would show.
	if _, err := s.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS loyalty_points (
		id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		batch      bigint NOT NULL,
		order_id   bigint NOT NULL,
		user_id    bigint NOT NULL,
		points     int NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return 0, err
	}
	var next int64
	err := s.pool.QueryRow(ctx, `SELECT coalesce(max(batch), 0) + 1 FROM loyalty_points`).Scan(&next)
	return next, err
}

func (s pgStore) consumeOnce(ctx context.Context, m message, credit func(context.Context, creditFunc) error) (bool, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
	ran, err := idem.ConsumeOnce(ctx, tx, consumer, m.ID, func(ctx context.Context, tx pgx.Tx) error {
		return credit(ctx, func(ctx context.Context, m message) error {
			_, err := tx.Exec(ctx, `INSERT INTO loyalty_points (batch, order_id, user_id, points) VALUES ($1, $2, $3, $4)`,
				m.Batch, m.OrderID, m.UserID, m.Points)
			return err
		})
	})
	if err != nil {
		return false, err
	}
	return ran, tx.Commit(ctx)
}

func (s pgStore) count(ctx context.Context, batch int64) (rows, orders int, err error) {
	err = s.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT order_id) FROM loyalty_points WHERE batch = $1`, batch).Scan(&rows, &orders)
	return rows, orders, err
}

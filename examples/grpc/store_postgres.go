package main

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/migrations"
)

// pgStore is the example on PostgreSQL, through pgx; the pool's
// search_path is the example's schema.
type pgStore struct{ pool *pgxpool.Pool }

func (s pgStore) setUp(ctx context.Context) error {
	if err := migrations.Up(ctx, s.pool); err != nil { // idem's tables, in the example's schema
		return err
	}
	_, err := s.pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS grpc_orders (
			id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			item         text NOT NULL,
			amount_cents bigint NOT NULL,
			created_at   timestamptz NOT NULL DEFAULT now());
		CREATE TABLE IF NOT EXISTS grpc_payments (
			id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			order_id     bigint NOT NULL,
			amount_cents bigint NOT NULL)`)
	return err
}

func (s pgStore) interceptor(cfg idemgrpc.Config) (grpc.UnaryServerInterceptor, error) {
	return idemgrpc.UnaryServerInterceptor(idemgrpc.Pgx(s.pool), cfg)
}

func (pgStore) place(ctx context.Context, item string, amountCents int64) (orderID, paymentID int64, err error) {
	tx := idemgrpc.Tx(ctx) // the call's transaction
	if err := tx.QueryRow(ctx, `INSERT INTO grpc_orders (item, amount_cents) VALUES ($1, $2) RETURNING id`,
		item, amountCents).Scan(&orderID); err != nil {
		return 0, 0, err
	}
	err = tx.QueryRow(ctx, `INSERT INTO grpc_payments (order_id, amount_cents) VALUES ($1, $2) RETURNING id`,
		orderID, amountCents).Scan(&paymentID)
	return orderID, paymentID, err
}

func (s pgStore) count(ctx context.Context, item string) (orders, payments int, err error) {
	err = s.pool.QueryRow(ctx, `SELECT count(DISTINCT o.id), count(p.id) FROM grpc_orders o
		LEFT JOIN grpc_payments p ON p.order_id = o.id WHERE o.item = $1`, item).Scan(&orders, &payments)
	return orders, payments, err
}

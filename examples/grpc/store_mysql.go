package main

import (
	"context"
	"database/sql"

	"google.golang.org/grpc"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemmysql"
)

// mysqlStore is the example on MySQL or MariaDB, through database/sql; db's
// connections use the example's database.
type mysqlStore struct{ db *sql.DB }

func (s mysqlStore) setUp(ctx context.Context) error {
	if err := idemmysql.Migrate(ctx, s.db); err != nil { // idem's tables, in the example's database
		return err
	}
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS grpc_orders (
			id           BIGINT AUTO_INCREMENT PRIMARY KEY,
			item         VARCHAR(255) NOT NULL,
			amount_cents BIGINT NOT NULL,
			created_at   DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE = InnoDB`,
		`CREATE TABLE IF NOT EXISTS grpc_payments (
			id           BIGINT AUTO_INCREMENT PRIMARY KEY,
			order_id     BIGINT NOT NULL,
			amount_cents BIGINT NOT NULL) ENGINE = InnoDB`,
	} {
		if _, err := s.db.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

// interceptor answers a duplicate in flight at once (Aborted) on MariaDB;
// on MySQL 8, whose claims cannot skip a held key, set Config.Wait.
func (s mysqlStore) interceptor(cfg idemgrpc.Config) (grpc.UnaryServerInterceptor, error) {
	return idemgrpc.UnaryServerInterceptor(idemgrpc.MySQL(s.db), cfg)
}

func (mysqlStore) place(ctx context.Context, item string, amountCents int64) (orderID, paymentID int64, err error) {
	tx := idemgrpc.SQLTx(ctx) // the call's transaction
	r, err := tx.ExecContext(ctx, `INSERT INTO grpc_orders (item, amount_cents) VALUES (?, ?)`, item, amountCents)
	if err != nil {
		return 0, 0, err
	}
	if orderID, err = r.LastInsertId(); err != nil {
		return 0, 0, err
	}
	r, err = tx.ExecContext(ctx, `INSERT INTO grpc_payments (order_id, amount_cents) VALUES (?, ?)`, orderID, amountCents)
	if err != nil {
		return 0, 0, err
	}
	paymentID, err = r.LastInsertId()
	return orderID, paymentID, err
}

func (s mysqlStore) count(ctx context.Context, item string) (orders, payments int, err error) {
	err = s.db.QueryRowContext(ctx, `SELECT COUNT(DISTINCT o.id), COUNT(p.id) FROM grpc_orders o
		LEFT JOIN grpc_payments p ON p.order_id = o.id WHERE o.item = ?`, item).Scan(&orders, &payments)
	return orders, payments, err
}

package main

import (
	"context"
	"database/sql"

	"github.com/idemkit/idem/idemmysql"
)

// mysqlStore is the consumer on MySQL or MariaDB, through database/sql;
// db's connections use the example's database.
type mysqlStore struct{ db *sql.DB }

func (s mysqlStore) setUp(ctx context.Context) (int64, error) {
	if err := idemmysql.Migrate(ctx, s.db); err != nil { // idem's tables, the inbox among them
		return 0, err
	}
	// No unique key on order_id: a second credit would show.
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS loyalty_points (
		id         BIGINT AUTO_INCREMENT PRIMARY KEY,
		batch      BIGINT NOT NULL,
		order_id   BIGINT NOT NULL,
		user_id    BIGINT NOT NULL,
		points     INT NOT NULL,
		created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
		KEY loyalty_points_batch (batch))`); err != nil {
		return 0, err
	}
	var next int64
	err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(batch), 0) + 1 FROM loyalty_points`).Scan(&next)
	return next, err
}

// consumeOnce: a delivery that meets another of the same message in
// flight waits for its row lock; when that one rolls back, InnoDB may end
// the waiter with a deadlock, a *idemmysql.TxAbortedError that
// idem.IsRetryable reports, and the queue redelivers it.
func (s mysqlStore) consumeOnce(ctx context.Context, m message, credit func(context.Context, creditFunc) error) (bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	ran, err := idemmysql.ConsumeOnce(ctx, tx, consumer, m.ID, func(ctx context.Context, tx *sql.Tx) error {
		return credit(ctx, func(ctx context.Context, m message) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO loyalty_points (batch, order_id, user_id, points) VALUES (?, ?, ?, ?)`,
				m.Batch, m.OrderID, m.UserID, m.Points)
			return err
		})
	})
	if err != nil {
		return false, err
	}
	return ran, tx.Commit()
}

func (s mysqlStore) count(ctx context.Context, batch int64) (rows, orders int, err error) {
	err = s.db.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT order_id) FROM loyalty_points WHERE batch = ?`, batch).Scan(&rows, &orders)
	return rows, orders, err
}

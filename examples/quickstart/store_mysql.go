package main

import (
	"context"
	"database/sql"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
)

// mysqlStore is the quickstart on MySQL or MariaDB, through database/sql;
// db's connections use the quickstart's database.
type mysqlStore struct{ db *sql.DB }

func (s mysqlStore) setUp(ctx context.Context) (int64, error) {
	if err := idemmysql.Migrate(ctx, s.db); err != nil { // idem's tables, in the quickstart's database
		return 0, err
	}
	// No unique constraint here either: a duplicate would show.
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS quickstart_signups (
		id          BIGINT AUTO_INCREMENT PRIMARY KEY,
		activity_id BIGINT NOT NULL,
		user_id     BIGINT NOT NULL,
		created_at  DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))`); err != nil {
		return 0, err
	}
	var next int64
	err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(activity_id), 0) + 1 FROM quickstart_signups`).Scan(&next)
	return next, err
}

func (s mysqlStore) signUp(ctx context.Context, key idem.Key, activityID, userID int64) (idem.Result[receipt], error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return idem.Result[receipt]{}, err
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	res, err := idemmysql.WithIdempotency(ctx, tx, key, func(ctx context.Context, tx *sql.Tx) (receipt, error) {
		r, err := tx.ExecContext(ctx, `INSERT INTO quickstart_signups (activity_id, user_id) VALUES (?, ?)`, activityID, userID)
		if err != nil {
			return receipt{}, err
		}
		id, err := r.LastInsertId()
		return signedUp(id), err
	}, idem.NoWait())
	if err != nil {
		return res, err
	}
	return res, tx.Commit()
}

func (s mysqlStore) count(ctx context.Context, activityID int64) (rows, users int, err error) {
	err = s.db.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT user_id) FROM quickstart_signups WHERE activity_id = ?`,
		activityID).Scan(&rows, &users)
	return rows, users, err
}

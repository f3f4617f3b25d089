package main

import (
	"context"
	"database/sql"
	"net/http"

	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemmysql"
)

// mysqlStore is the lead form on MySQL or MariaDB, through database/sql:
// db's connections use the example's database, and the handler's
// transaction is idemhttp.SQLTx.
type mysqlStore struct{ db *sql.DB }

func (s mysqlStore) setUp(ctx context.Context) error {
	if err := idemmysql.Migrate(ctx, s.db); err != nil {
		return err
	}
	// As on PostgreSQL, no unique key on idempotency_key: the key alone
	// keeps a lead from being stored twice, and a duplicate would show as
	// a second row. The index serves the page's count.
	_, err := s.db.ExecContext(ctx, `
		CREATE TABLE IF NOT EXISTS leads (
			id BIGINT AUTO_INCREMENT PRIMARY KEY,
			name VARCHAR(200) NOT NULL, email VARCHAR(320) NOT NULL, message TEXT NOT NULL,
			idempotency_key VARCHAR(255),
			created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
			KEY leads_idempotency_key (idempotency_key))`)
	return err
}

// middleware answers a duplicate in flight 409 at once on MariaDB; on
// MySQL 8 it would need Config.Wait (idemhttp.MySQL).
func (s mysqlStore) middleware(cfg idemhttp.Config) (func(http.Handler) http.Handler, error) {
	return idemhttp.New(idemhttp.MySQL(s.db), cfg)
}

func (mysqlStore) insertLead(ctx context.Context, name, email, message, key string) (int64, error) {
	r, err := idemhttp.SQLTx(ctx).ExecContext(ctx,
		`INSERT INTO leads (name, email, message, idempotency_key) VALUES (?, ?, ?, ?)`,
		name, email, message, key)
	if err != nil {
		return 0, err
	}
	return r.LastInsertId()
}

func (s mysqlStore) countLeads(ctx context.Context, key string) (int, error) {
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM leads WHERE idempotency_key = ?`, key).Scan(&n)
	return n, err
}

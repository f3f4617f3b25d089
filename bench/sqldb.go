package main

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsql"
)

// The sql suite measures idemsql.Do against a bare database/sql transaction
// that runs the same INSERT, both through pgx's stdlib driver on the
// connection settings of the run's pool (through its delay proxy, with
// -rtt), and idem.Do on the pool beside them.

// sqlDB is the database/sql pool of the sql suite.
var sqlDB *sql.DB

func setupSQL(_ context.Context, pool *pgxpool.Pool) error {
	if sqlDB != nil {
		_ = sqlDB.Close()
	}
	cfg := pool.Config()
	sqlDB = stdlib.OpenDB(*cfg.ConnConfig)
	sqlDB.SetMaxOpenConns(int(cfg.MaxConns))
	sqlDB.SetMaxIdleConns(int(cfg.MaxConns))
	return nil
}

func insertRowSQL(ctx context.Context, tx *sql.Tx) (int64, error) {
	var id int64
	err := tx.QueryRowContext(ctx, `INSERT INTO idem_bench.orders (user_id, amount) VALUES ($1, $2) RETURNING id`, 42, 999).Scan(&id)
	return id, err
}

var sqlVariants = []variant{
	{"bare database/sql", func(ctx context.Context, _ *pgxpool.Pool, _ idem.Key) error {
		tx, err := sqlDB.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := insertRowSQL(ctx, tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}},
	{"idemsql.Do", func(ctx context.Context, _ *pgxpool.Pool, key idem.Key) error {
		_, err := idemsql.Do(ctx, sqlDB, key, insertRowSQL, tableOpt)
		return err
	}},
	coreVariants[2], // idem.Do on the pgx pool
}

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
// that runs the same INSERT, both through pgx's stdlib driver over the
// run's pool (through its delay proxy, with -rtt). database/sql keeps the
// pool's connections it used, so no variant on the pool itself runs beside
// them; the model and core suites measure idem.Do.

// sqlDB is the database/sql pool of the sql suite.
var sqlDB *sql.DB

func setupSQL(_ context.Context, pool *pgxpool.Pool) error {
	// Over the run's pool: its connections, and no more of them.
	sqlDB = stdlib.OpenDBFromPool(pool)
	sqlDB.SetMaxOpenConns(int(pool.Config().MaxConns))
	sqlDB.SetMaxIdleConns(int(pool.Config().MaxConns))
	return nil
}

// teardownSQL gives the pool's connections back, so that it can close.
func teardownSQL() {
	_ = sqlDB.Close()
	sqlDB = nil
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
}

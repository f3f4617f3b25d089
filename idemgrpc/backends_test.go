package idemgrpc_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/migrations"
)

// backend is one database the interceptor runs on in the tests, with the
// business table orders (no unique key, so a duplicate shows).
type backend struct {
	name string
	// intercept builds the server interceptor on the backend's Driver.
	intercept func(cfg idemgrpc.Config) (grpc.UnaryServerInterceptor, error)
	// insert writes an order row through the call's transaction.
	insert func(ctx context.Context, item string) (int64, error)
	// fail runs a statement that fails in the call's transaction.
	fail func(ctx context.Context)
	// rows counts the committed orders of item.
	rows func(t *testing.T, item string) int
	// abortsOnError: a failed statement aborts the transaction (PostgreSQL).
	abortsOnError bool
}

// onEach runs test as a subtest per backend: pgx, database/sql on
// PostgreSQL, and MySQL, each on tables of the test's own.
func onEach(t *testing.T, test func(t *testing.T, b backend)) {
	t.Run("pgx", func(t *testing.T) { test(t, pgxBackend(t)) })
	t.Run("database-sql", func(t *testing.T) { test(t, sqlBackend(t)) })
	t.Run("mysql", func(t *testing.T) { test(t, mysqlBackend(t)) })
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// pgSchema creates a schema of the test's own with idem's tables and the
// orders table, dropped when the test ends, and returns a pool whose
// search_path is the schema.
func pgSchema(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		t.Fatal("TEST_DATABASE_URL is not set: point it at a PostgreSQL database, e.g. TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	}
	ctx := context.Background()
	schema := randomName("idemgrpc_t_")
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		pool.Close()
		require.NoError(t, err)
	})
	require.NoError(t, migrations.Up(ctx, pool, migrations.WithTable(schema, "idempotent_record")))
	_, err = pool.Exec(ctx, `CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY, item text NOT NULL)`)
	require.NoError(t, err)
	return pool, schema
}

func withTable(schema string, cfg idemgrpc.Config) idemgrpc.Config {
	cfg.Options = append([]idem.DoOption{idem.WithTable(schema, "idempotent_record")}, cfg.Options...)
	return cfg
}

func pgxBackend(t *testing.T) backend {
	pool, schema := pgSchema(t)
	return backend{
		name: "pgx",
		intercept: func(cfg idemgrpc.Config) (grpc.UnaryServerInterceptor, error) {
			return idemgrpc.UnaryServerInterceptor(idemgrpc.Pgx(pool), withTable(schema, cfg))
		},
		insert: func(ctx context.Context, item string) (int64, error) {
			var id int64
			err := idemgrpc.Tx(ctx).QueryRow(ctx, `INSERT INTO orders (item) VALUES ($1) RETURNING id`, item).Scan(&id)
			return id, err
		},
		fail: func(ctx context.Context) { _, _ = idemgrpc.Tx(ctx).Exec(ctx, `SELECT 1/0`) },
		rows: func(t *testing.T, item string) int {
			var n int
			require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM orders WHERE item = $1`, item).Scan(&n))
			return n
		},
		abortsOnError: true,
	}
}

func sqlBackend(t *testing.T) backend {
	pool, schema := pgSchema(t)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	return backend{
		name: "database-sql",
		intercept: func(cfg idemgrpc.Config) (grpc.UnaryServerInterceptor, error) {
			return idemgrpc.UnaryServerInterceptor(idemgrpc.SQL(db), withTable(schema, cfg))
		},
		insert: func(ctx context.Context, item string) (int64, error) {
			var id int64
			err := idemgrpc.SQLTx(ctx).QueryRowContext(ctx, `INSERT INTO orders (item) VALUES ($1) RETURNING id`, item).Scan(&id)
			return id, err
		},
		fail: func(ctx context.Context) { _, _ = idemgrpc.SQLTx(ctx).ExecContext(ctx, `SELECT 1/0`) },
		rows: func(t *testing.T, item string) int {
			var n int
			require.NoError(t, db.QueryRow(`SELECT count(*) FROM orders WHERE item = $1`, item).Scan(&n))
			return n
		},
		abortsOnError: true,
	}
}

// mysqlBackend creates a database of the test's own on TEST_MYSQL_DSN's
// server, dropped when the test ends. Without TEST_MYSQL_DSN the test is
// skipped, unless CI is set, when it fails.
func mysqlBackend(t *testing.T) backend {
	t.Helper()
	dsn := os.Getenv("TEST_MYSQL_DSN")
	if dsn == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("TEST_MYSQL_DSN is not set (.ci/run sets it)")
		}
		t.Skip("TEST_MYSQL_DSN is not set: point it at a MySQL or MariaDB server, e.g. TEST_MYSQL_DSN='root@tcp(127.0.0.1:3306)/test'")
	}
	cfg, err := mysql.ParseDSN(dsn)
	require.NoError(t, err)
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close() })
	name := randomName("idemgrpc_t_")
	ctx := context.Background()
	_, err = admin.ExecContext(ctx, "CREATE DATABASE "+name)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := admin.ExecContext(context.Background(), "DROP DATABASE "+name)
		require.NoError(t, err)
	})
	cfg.DBName = name
	db, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	db.SetMaxOpenConns(40)
	t.Cleanup(func() { db.Close() })
	require.NoError(t, idemmysql.Migrate(ctx, db))
	_, err = db.ExecContext(ctx, `CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, item VARCHAR(255) NOT NULL) ENGINE = InnoDB`)
	require.NoError(t, err)
	return backend{
		name: "mysql",
		intercept: func(cfg idemgrpc.Config) (grpc.UnaryServerInterceptor, error) {
			return idemgrpc.UnaryServerInterceptor(idemgrpc.MySQL(db), cfg)
		},
		insert: func(ctx context.Context, item string) (int64, error) {
			r, err := idemgrpc.SQLTx(ctx).ExecContext(ctx, `INSERT INTO orders (item) VALUES (?)`, item)
			if err != nil {
				return 0, err
			}
			return r.LastInsertId()
		},
		fail: func(ctx context.Context) { _, _ = idemgrpc.SQLTx(ctx).ExecContext(ctx, `SELECT * FROM no_such_table`) },
		rows: func(t *testing.T, item string) int {
			var n int
			require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM orders WHERE item = ?`, item).Scan(&n))
			return n
		},
	}
}

package idemmysql_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/internal/mysqltest"
)

// openDB returns a pool on a fresh database with idem's tables, whose DSN
// carries params as well (e.g. "clientFoundRows=true").
func openDB(t *testing.T, params ...string) *sql.DB {
	t.Helper()
	cfg := mysqltest.Database(t, "idem_t_")
	ctx := context.Background()
	// The DSN's own session variables stay (the isolation matrix sets
	// tx_isolation there); params add to them.
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	for _, p := range params {
		k, v, _ := strings.Cut(p, "=")
		cfg.Params[k] = v
	}
	// The driver's own parameters are Config fields; the rest of Params
	// are session variables.
	if cfg.Params["clientFoundRows"] == "true" {
		cfg.ClientFoundRows = true
		delete(cfg.Params, "clientFoundRows")
	}
	if cfg.Params["parseTime"] == "true" {
		cfg.ParseTime = true
		delete(cfg.Params, "parseTime")
	}
	db, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	db.SetMaxOpenConns(60)
	t.Cleanup(func() { db.Close() })
	require.NoError(t, idemmysql.Migrate(ctx, db))
	// The business table: no unique key, so a duplicate effect would show.
	_, err = db.ExecContext(ctx, `CREATE TABLE effects (k VARBINARY(255) NOT NULL, v INT NOT NULL, at DATETIME(6) NOT NULL DEFAULT UTC_TIMESTAMP(6)) ENGINE = InnoDB`)
	require.NoError(t, err)
	return db
}

// effects counts the committed business rows of key k.
func effects(t *testing.T, db *sql.DB, k string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM effects WHERE k = ?`, k).Scan(&n))
	return n
}

// insertEffect is fn's business write.
func insertEffect(ctx context.Context, tx *sql.Tx, k string, v int) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO effects (k, v) VALUES (?, ?)`, k, v)
	return err
}

// claimsRunning counts the sessions running a statement on the record
// table of db's database: claims waiting for the key's holder.
func claimsRunning(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM information_schema.PROCESSLIST
		WHERE db = DATABASE() AND id <> CONNECTION_ID() AND command IN ('Query', 'Execute') AND info LIKE '%idempotent_record%'`).Scan(&n))
	return n
}

// waitFor polls cond every 5ms until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// deadlocks is the server's count of deadlocks so far.
func deadlocks(t *testing.T, db *sql.DB) int {
	t.Helper()
	var name string
	var n int
	require.NoError(t, db.QueryRow(`SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'`).Scan(&name, &n))
	return n
}

// dsnOf is TEST_MYSQL_DSN with database name (openDB's test has one).
func dsnOf(t *testing.T, name string) string {
	t.Helper()
	cfg := mysqltest.Server(t)
	cfg.DBName = name
	return cfg.FormatDSN()
}

package idemotel_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
)

// openMySQL returns a pool on a fresh database of TEST_MYSQL_DSN's server
// with idem's tables, dropped when the test ends. Without TEST_MYSQL_DSN
// the test skips, unless CI is set.
func openMySQL(t *testing.T) *sql.DB {
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
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "idem_otel_" + hex.EncodeToString(b)
	_, err = admin.Exec("CREATE DATABASE " + name)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := admin.Exec("DROP DATABASE " + name)
		require.NoError(t, err)
	})
	cfg.DBName = name
	db, err := sql.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	require.NoError(t, idemmysql.Migrate(context.Background(), db))
	return db
}

// The same hooks on MySQL: idemmysql's calls emit the events idem's do, and
// the metrics and spans follow.
func TestThroughIdemMySQL(t *testing.T) {
	ctx := context.Background()
	db := openMySQL(t)
	tel := newTelemetry(t)
	opts := []idem.DoOption{idem.WithHooks(tel.hooks)}
	key := idem.Key{Scope: "s", ID: "order-1", Fingerprint: []byte("a")}
	fn := func(context.Context, *sql.Tx) (int, error) { return 7, nil }
	for range 3 {
		res, err := idemmysql.Do(ctx, db, key, fn, opts...)
		require.NoError(t, err)
		require.Equal(t, 7, res.Value)
	}
	key.Fingerprint = []byte("b")
	_, err := idemmysql.Do(ctx, db, key, fn, opts...)
	require.ErrorIs(t, err, idem.ErrKeyReused)

	// Two records expired in SQL, and a purge that reports them.
	for _, id := range []string{"old-1", "old-2"} {
		_, err := idemmysql.Do(ctx, db, idem.Key{Scope: "s", ID: id}, fn)
		require.NoError(t, err)
	}
	_, err = db.Exec(`UPDATE idempotent_record SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 HOUR WHERE idem_key LIKE 'old-%'`)
	require.NoError(t, err)
	n, err := idemmysql.Purge(ctx, db, idem.PurgeParams{Hooks: tel.hooks})
	require.NoError(t, err)
	require.Equal(t, int64(2), n)

	require.Equal(t, map[string]int64{"executed/Do": 1, "replayed/Do": 2, "key_reused/Do": 1, "purged/Purge": 1, "purged rows": 2}, tel.counts(t))
	var names []string
	for _, s := range tel.spans.Ended() {
		names = append(names, s.Name())
	}
	require.Equal(t, []string{"idem.Do", "idem.Do", "idem.Do", "idem.Do", "idem.Purge"}, names)
}

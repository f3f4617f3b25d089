package idemotel_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/internal/mysqltest"
)

// openMySQL returns a pool on a fresh database of TEST_MYSQL_DSN's server
// with idem's tables, dropped when the test ends. Without TEST_MYSQL_DSN
// the test skips, unless CI is set.
func openMySQL(t *testing.T) *sql.DB {
	t.Helper()
	cfg := mysqltest.Database(t, "idem_otel_")
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

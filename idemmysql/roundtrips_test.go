package idemmysql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
)

// roundTrips counts the commands the server answered on the pool's one
// connection (statements, prepared-statement executions and preparations)
// while run runs; the count itself is one SHOW, subtracted.
func roundTrips(t *testing.T, db *sql.DB, run func()) int {
	t.Helper()
	read := func() int {
		rows, err := db.Query(`SHOW SESSION STATUS WHERE Variable_name IN ('Questions', 'Com_stmt_prepare')`)
		require.NoError(t, err)
		defer rows.Close()
		total := 0
		for rows.Next() {
			var name string
			var n int
			require.NoError(t, rows.Scan(&name, &n))
			total += n
		}
		require.NoError(t, rows.Err())
		return total
	}
	before := read()
	run()
	return read() - before - 1
}

// Do costs a bare transaction's round trips plus the claim and the
// completion (MariaDB: the claim reads its answer with RETURNING), each one
// round trip once prepared on the connection; a replay costs BEGIN, the
// claim and ROLLBACK.
func TestRoundTrips(t *testing.T) {
	db := openDB(t)
	db.SetMaxOpenConns(1)
	ctx := context.Background()
	fn := func(ctx context.Context, tx *sql.Tx) (int, error) { return 1, insertEffect(ctx, tx, "rt", 1) }
	bare := func() {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = fn(ctx, tx)
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
	}
	do := func(id string) func() {
		return func() {
			_, err := idemmysql.Do(ctx, db, idem.Key{Scope: "rt", ID: id}, fn)
			require.NoError(t, err)
		}
	}
	do("warm-up")() // prepares idem's statements on the connection
	bare()          // and fn's
	b := roundTrips(t, db, bare)
	first := roundTrips(t, db, do("k"))
	replay := roundTrips(t, db, do("k"))
	t.Logf("bare transaction %d, Do %d, replay %d", b, first, replay)
	require.Equal(t, b+2, first)
	require.Equal(t, 3, replay)

	// With a hold timeout (MariaDB): the bound after the claim, and the
	// session's settings put back once the transaction ended, on a
	// connection of its own; a replay sets no bound but puts back all the
	// same.
	held := func(id string) func() {
		return func() {
			_, err := idemmysql.Do(ctx, db, idem.Key{Scope: "rt", ID: id}, fn, idem.WithHoldTimeout(time.Minute))
			require.NoError(t, err)
		}
	}
	held("warm-up-hold")()
	heldFirst := roundTrips(t, db, held("kh"))
	heldReplay := roundTrips(t, db, held("kh"))
	t.Logf("with a hold timeout: Do %d, replay %d", heldFirst, heldReplay)
	require.Equal(t, b+4, heldFirst)
	require.Equal(t, 4, heldReplay)

	// MySQL 8's way: the claim's answer is a statement of its own.
	restore := idemmysql.UseClaimRead()
	defer restore()
	do("warm-up-2")()
	first = roundTrips(t, db, do("k2"))
	replay = roundTrips(t, db, do("k2"))
	require.Equal(t, b+3, first)
	require.Equal(t, 4, replay)
	restore()

	// In the caller's transaction: SAVEPOINTs around the claim and fn,
	// and statements go-sql-driver prepares and closes each time (idem
	// cannot reach the pool to keep them prepared).
	inTx := roundTrips(t, db, func() {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = idemmysql.WithIdempotency(ctx, tx, idem.Key{Scope: "rt", ID: "k3"}, fn)
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
	})
	t.Logf("WithIdempotency in a transaction: %d (a bare transaction %d)", inTx, b)
	require.Equal(t, b+6, inTx)
}

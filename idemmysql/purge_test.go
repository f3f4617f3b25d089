package idemmysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
)

// Purge deletes the expired records in batches, never a live one nor a
// lease record still processing, and the inbox rows past their retention.
func TestPurge(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	fn := func(context.Context, *sql.Tx) (int, error) { return 1, nil }
	for i := range 25 {
		_, err := idemmysql.Do(ctx, db, idem.Key{Scope: "p", ID: fmt.Sprint(i)}, fn)
		require.NoError(t, err)
	}
	// 20 expire; one of them is a lease record still processing.
	_, err := db.Exec(`UPDATE idempotent_record SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE CAST(idem_key AS UNSIGNED) < 20`)
	require.NoError(t, err)
	_, err = db.Exec(`UPDATE idempotent_record SET status = 'processing', locked_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE idem_key = '0'`)
	require.NoError(t, err)
	tx, err := db.Begin()
	require.NoError(t, err)
	for _, id := range []string{"old-1", "old-2", "new"} {
		_, err := idemmysql.ConsumeOnce(ctx, tx, "c", id, func(context.Context, *sql.Tx) error { return nil })
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit())
	_, err = db.Exec(`UPDATE idem_inbox SET consumed_at = UTC_TIMESTAMP(6) - INTERVAL 2 HOUR WHERE message_id LIKE 'old-%'`)
	require.NoError(t, err)

	records, inbox, err := idemmysql.CountExpired(ctx, db, time.Hour)
	require.NoError(t, err)
	require.EqualValues(t, 19, records)
	require.EqualValues(t, 2, inbox)

	var batches []int64
	n, err := idemmysql.Purge(ctx, db, idem.PurgeParams{BatchSize: 7, InboxRetention: time.Hour,
		OnBatch: func(n int64) { batches = append(batches, n) }})
	require.NoError(t, err)
	require.EqualValues(t, 21, n)
	require.Equal(t, []int64{7, 7, 5}, batches)
	var left int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM idempotent_record`).Scan(&left))
	require.Equal(t, 6, left, "the 5 live records and the lease record still processing")
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM idem_inbox`).Scan(&left))
	require.Equal(t, 1, left)

	// In the caller's transaction, with what it rolls back.
	_, err = db.Exec(`UPDATE idempotent_record SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE idem_key = '24'`)
	require.NoError(t, err)
	tx, err = db.Begin()
	require.NoError(t, err)
	n, err = idemmysql.Purge(ctx, tx, idem.PurgeParams{})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.NoError(t, tx.Rollback())
	records, _, err = idemmysql.CountExpired(ctx, db, 0)
	require.NoError(t, err)
	require.EqualValues(t, 1, records)

	_, err = idemmysql.Purge(ctx, nil, idem.PurgeParams{})
	require.ErrorIs(t, err, idem.ErrInvalidOption)
	_, err = idemmysql.Purge(ctx, db, idem.PurgeParams{BatchSize: -1})
	require.ErrorIs(t, err, idem.ErrInvalidOption)
}

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

// The inspection calls read the records, their times in UTC with or
// without parseTime in the DSN.
func TestInspect(t *testing.T) {
	for _, params := range [][]string{nil, {"parseTime=true"}} {
		db := openDB(t, params...)
		ctx := context.Background()
		var now any
		require.NoError(t, db.QueryRow(`SELECT UTC_TIMESTAMP(6)`).Scan(&now))
		_, isTime := now.(time.Time)
		require.Equal(t, params != nil, isTime, "parseTime %v gives %T", params, now)
		before := time.Now().UTC().Add(-time.Minute)
		_, err := idemmysql.Do(ctx, db, idem.Key{Scope: "s", ID: "done", Fingerprint: []byte{1, 2}},
			func(context.Context, *sql.Tx) (string, error) { return "ok", nil }, idem.WithTTL(time.Hour))
		require.NoError(t, err)
		r, err := idemmysql.Lookup(ctx, db, "s", "done")
		require.NoError(t, err)
		require.Equal(t, "succeeded", r.Status)
		require.Equal(t, []byte{1, 2}, r.Fingerprint)
		require.JSONEq(t, `"ok"`, string(r.Response))
		require.Nil(t, r.LockedUntil)
		require.True(t, r.CreatedAt.After(before), "%v", r.CreatedAt)
		require.InDelta(t, time.Hour.Seconds(), r.ExpiresAt.Sub(r.CreatedAt).Seconds(), 1)
		_, err = idemmysql.Lookup(ctx, db, "s", "absent")
		require.ErrorIs(t, err, idem.ErrNotFound)
		_, err = idemmysql.Lookup(ctx, db, "s", "")
		require.ErrorIs(t, err, idem.ErrInvalidKey)

		// A lease record whose lease ran out is stuck.
		_, err = db.Exec(`INSERT INTO idempotent_record (scope, idem_key, fingerprint, status, attempt, claim_token, locked_until, created_at, updated_at, expires_at)
			VALUES ('s', 'stuck', '', 'processing', 3, REPEAT('x', 16), UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)`)
		require.NoError(t, err)
		stuck, err := idemmysql.Stuck(ctx, db, 10)
		require.NoError(t, err)
		require.Len(t, stuck, 1)
		require.Equal(t, "stuck", stuck[0].ID)
		require.EqualValues(t, 3, stuck[0].Attempt)
		require.NotNil(t, stuck[0].LockedUntil)
		require.True(t, stuck[0].LockedUntil.Before(time.Now()))

		st, err := idemmysql.TableStats(ctx, db)
		require.NoError(t, err)
		require.Equal(t, map[string]int64{"succeeded": 1, "processing": 1}, st.Statuses)
		require.EqualValues(t, 1, st.StuckLeases)
		require.NotNil(t, st.Oldest)
		require.Positive(t, st.TableBytes)

		_, err = db.Exec(`DELETE FROM idempotent_record`)
		require.NoError(t, err)
		st, err = idemmysql.TableStats(ctx, db)
		require.NoError(t, err)
		require.Empty(t, st.Statuses)
		require.Nil(t, st.Oldest)
	}
}

package idemmysql_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
)

// expireLease moves a key's lease into the past, by the database clock.
func expireLease(t *testing.T, db *sql.DB, id string) {
	t.Helper()
	_, err := db.Exec(`UPDATE idempotent_record SET locked_until = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE idem_key = ?`, id)
	require.NoError(t, err)
}

// Lease mode on MySQL: a live lease is in progress for others; once it
// runs out the next claim takes the key over with the next attempt and the
// checkpoint, and the fenced-out holder can no longer complete; the
// completion commits with the business rows and is replayed after.
func TestLease(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	key := idem.Key{Scope: "pay", ID: "charge-1", Fingerprint: []byte("req")}
	first, res, err := idemmysql.Claim[string](ctx, db, key, time.Minute)
	require.NoError(t, err)
	require.NotNil(t, first, "%+v", res)
	require.EqualValues(t, 1, first.Attempt())
	require.Empty(t, first.RecoveryPoint())

	_, _, err = idemmysql.Claim[string](ctx, db, key, time.Minute)
	require.ErrorIs(t, err, idem.ErrInProgress)
	_, _, err = idemmysql.Claim[string](ctx, db, idem.Key{Scope: "pay", ID: "charge-1", Fingerprint: []byte("other")}, time.Minute)
	require.ErrorIs(t, err, idem.ErrKeyReused)

	require.NoError(t, first.Extend(ctx, db))
	require.NoError(t, first.Checkpoint(ctx, db, "authorized", map[string]string{"auth": "A-1"}))

	expireLease(t, db, key.ID)
	second, _, err := idemmysql.Claim[string](ctx, db, key, time.Minute)
	require.NoError(t, err)
	require.NotNil(t, second)
	require.EqualValues(t, 2, second.Attempt())
	require.Equal(t, "authorized", second.RecoveryPoint())
	var data map[string]string
	require.NoError(t, second.RecoveryData(&data))
	require.Equal(t, "A-1", data["auth"])

	// The fenced-out holder: every call is ErrLeaseLost, nothing commits.
	require.ErrorIs(t, first.Extend(ctx, db), idem.ErrLeaseLost)
	tx, err := db.Begin()
	require.NoError(t, err)
	require.NoError(t, insertEffect(ctx, tx, key.ID, 1))
	require.ErrorIs(t, first.Complete(ctx, tx, "first"), idem.ErrLeaseLost)
	require.NoError(t, tx.Rollback())

	tx, err = db.Begin()
	require.NoError(t, err)
	require.NoError(t, insertEffect(ctx, tx, key.ID, 2))
	require.NoError(t, second.Complete(ctx, tx, "captured"))
	require.NoError(t, tx.Commit())
	require.Equal(t, 1, effects(t, db, key.ID))

	l, res, err := idemmysql.Claim[string](ctx, db, key, time.Minute)
	require.NoError(t, err)
	require.Nil(t, l)
	require.True(t, res.Replayed)
	require.Equal(t, "captured", res.Value)

	// Release frees the key at once; Fail records a permanent failure.
	k2 := idem.Key{Scope: "pay", ID: "charge-2"}
	l, _, err = idemmysql.Claim[string](ctx, db, k2, time.Minute)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx, db))
	l, _, err = idemmysql.Claim[string](ctx, db, k2, time.Minute)
	require.NoError(t, err)
	require.EqualValues(t, 2, l.Attempt())
	require.NoError(t, l.Fail(ctx, db, errors.New("card declined")))
	_, _, err = idemmysql.Claim[string](ctx, db, k2, time.Minute)
	require.True(t, idem.IsPermanent(err), "%v", err)
}

// Workers racing for one expired lease: exactly one takes it over, with
// the next attempt; the others are told it is in progress.
func TestLeaseTakeoverRace(t *testing.T) {
	claimReads(t, func(t *testing.T) {
		db := openDB(t)
		ctx := context.Background()
		key := idem.Key{Scope: "pay", ID: "race"}
		l, _, err := idemmysql.Claim[int](ctx, db, key, time.Minute)
		require.NoError(t, err)
		require.NotNil(t, l)
		expireLease(t, db, key.ID)
		var won, busy atomic.Int32
		var wg sync.WaitGroup
		for range 30 {
			wg.Go(func() {
				l, _, err := idemmysql.Claim[int](ctx, db, key, time.Minute)
				switch {
				case err == nil && l != nil:
					won.Add(1)
					require.EqualValues(t, 2, l.Attempt())
				case errors.Is(err, idem.ErrInProgress):
					busy.Add(1)
				default:
					t.Errorf("unexpected: %v", err)
				}
			})
		}
		wg.Wait()
		require.EqualValues(t, 1, won.Load())
		require.EqualValues(t, 29, busy.Load())
	})
}

// A lease on an issued token: RequireIssued with Claim.
func TestLeaseOnIssuedToken(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	token, err := idemmysql.IssueToken(ctx, db, "pay", time.Hour)
	require.NoError(t, err)
	l, _, err := idemmysql.Claim[int](ctx, db, idem.Key{Scope: "pay", ID: token}, time.Minute, idem.RequireIssued())
	require.NoError(t, err)
	require.NotNil(t, l)
	require.EqualValues(t, 1, l.Attempt())
	_, _, err = idemmysql.Claim[int](ctx, db, idem.Key{Scope: "pay", ID: token}, time.Minute, idem.RequireIssued())
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.NoError(t, l.Complete(ctx, db, 7))
	_, res, err := idemmysql.Claim[int](ctx, db, idem.Key{Scope: "pay", ID: token}, time.Minute, idem.RequireIssued())
	require.NoError(t, err)
	require.Equal(t, 7, res.Value)
}

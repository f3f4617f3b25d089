package integration_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsql"
	"github.com/idemkit/idem/integration/internal/pgtest"
)

// Lease mode and issued tokens through idemsql's own API (idemsql.Claim,
// idemsql.Lease, idemsql.IssueToken), on pgx's stdlib driver and on lib/pq:
// the lease scenarios of sqldriver_test.go, with *sql.DB and *sql.Tx in
// place of the pgx emulation.

// sqlLeaseEnv is one scenario's view of one driver.
type sqlLeaseEnv struct {
	pool *pgxpool.Pool // pgx, for setup and for counting
	s    *pgtest.Schema
	db   *sql.DB
}

// inTx runs f in a *sql.Tx of the caller's and commits when f succeeds.
func (e *sqlLeaseEnv) inTx(t *testing.T, f func(tx *sql.Tx) error) error {
	t.Helper()
	tx, err := e.db.BeginTx(context.Background(), nil)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// effect writes one effect row in tx.
func (e *sqlLeaseEnv) effect(ctx context.Context, tx *sql.Tx, key idem.Key, value string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO `+e.s.Effects+` (scope, key, value) VALUES ($1, $2, $3)`, key.Scope, key.ID, value)
	return err
}

// sqlLeaseKey is a key of its own for each use.
func sqlLeaseKey() idem.Key {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return idem.Key{Scope: "sqllease", ID: hex.EncodeToString(b)}
}

// sqlLeaseTakeOver is takeOver for idemsql's leases: it expires a lease
// that a watchdog is renewing and claims it, again for up to 5s when a
// renewal lands between the two.
func sqlLeaseTakeOver[T any](t *testing.T, expire func() error, claim func() (*idemsql.Lease[T], error)) *idemsql.Lease[T] {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		require.NoError(t, expire())
		l, err := claim()
		if errors.Is(err, idem.ErrInProgress) && time.Now().Before(deadline) {
			continue
		}
		require.NoError(t, err)
		return l
	}
}

func TestSQLNativeLease(t *testing.T) {
	scenarios := []struct {
		name string
		run  func(t *testing.T, e *sqlLeaseEnv)
	}{
		{"ClaimCompleteReplayAndLeaseLost", sqlLeaseClaimCompleteReplayAndLeaseLost},
		{"KeepAliveRenewsLease", sqlLeaseKeepAliveRenewsLease},
		{"IssuedTokens", sqlLeaseIssuedTokens},
		{"FailAndRelease", sqlLeaseFailAndRelease},
		{"ClaimNeverBlocks", sqlLeaseClaimNeverBlocks},
		{"ClaimInCallerTx", sqlLeaseClaimInCallerTx},
		{"Handles", sqlLeaseHandles},
	}
	for _, d := range sqlDBDrivers {
		t.Run(d.name, func(t *testing.T) {
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 4 })
					sc.run(t, &sqlLeaseEnv{pool: pool, s: pgtest.NewSchema(t, pool), db: openSQLDB(t, d.driver, pgtest.ClientURL(), 4)})
				})
			}
		})
	}
}

func sqlLeaseClaimCompleteReplayAndLeaseLost(t *testing.T, e *sqlLeaseEnv) {
	ctx := context.Background()
	key := sqlLeaseKey()
	first, _, err := idemsql.Claim[string](ctx, e.db, key, time.Minute, e.s.Opt)
	require.NoError(t, err)
	require.NotNil(t, first)
	require.EqualValues(t, 1, first.Attempt())
	require.Equal(t, key, first.Key())
	_, _, err = idemsql.Claim[string](ctx, e.db, key, time.Minute, e.s.Opt)
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.NoError(t, first.Checkpoint(ctx, e.db, "charged", map[string]string{"charge": "ch_1"}))
	endLease(t, e.pool, e.s, key) // the lease runs out

	second, _, err := idemsql.Claim[string](ctx, e.db, key, time.Minute, e.s.Opt)
	require.NoError(t, err)
	require.NotNil(t, second)
	require.EqualValues(t, 2, second.Attempt())
	require.Equal(t, "charged", second.RecoveryPoint())
	var data map[string]string
	require.NoError(t, second.RecoveryData(&data))
	require.Equal(t, "ch_1", data["charge"])
	require.NoError(t, second.Extend(ctx, e.db))

	err = e.inTx(t, func(tx *sql.Tx) error { return first.Complete(ctx, tx, "stale") })
	require.ErrorIs(t, err, idem.ErrLeaseLost)
	require.ErrorIs(t, first.Extend(ctx, e.db), idem.ErrLeaseLost)
	require.NoError(t, e.inTx(t, func(tx *sql.Tx) error {
		if err := e.effect(ctx, tx, key, "done"); err != nil {
			return err
		}
		return second.Complete(ctx, tx, "done")
	}))

	again, res, err := idemsql.Claim[string](ctx, e.db, key, time.Minute, e.s.Opt)
	require.NoError(t, err)
	require.Nil(t, again)
	require.True(t, res.Replayed)
	require.Equal(t, "done", res.Value)
	require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
}

func sqlLeaseKeepAliveRenewsLease(t *testing.T, e *sqlLeaseEnv) {
	ctx := context.Background()
	key := sqlLeaseKey()
	const lease = keepAliveLease
	l, _, err := idemsql.Claim[string](ctx, e.db, key, lease, e.s.Opt)
	require.NoError(t, err)
	require.NotNil(t, l)
	claimedEnd := lockedUntil(t, e.pool, e.s, key)
	workCtx, stop := l.KeepAlive(ctx, e.db)
	sleepPast(t, e.pool, claimedEnd) // the lease as claimed has run out
	_, _, err = idemsql.Claim[string](ctx, e.db, key, lease, e.s.Opt)
	require.ErrorIs(t, err, idem.ErrInProgress, "the watchdog kept the lease alive")
	require.True(t, lockedUntil(t, e.pool, e.s, key).After(claimedEnd), "the watchdog renewed the lease")
	require.NoError(t, workCtx.Err())
	require.NoError(t, stop())
	require.ErrorIs(t, workCtx.Err(), context.Canceled)
	require.NoError(t, e.inTx(t, func(tx *sql.Tx) error {
		if err := e.effect(ctx, tx, key, "done"); err != nil {
			return err
		}
		return l.Complete(ctx, tx, "done")
	}))
	_, res, err := idemsql.Claim[string](ctx, e.db, key, lease, e.s.Opt)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, "done", res.Value)

	// A second watchdog notices a takeover and cancels the work.
	other := sqlLeaseKey()
	l1, _, err := idemsql.Claim[string](ctx, e.db, other, lease, e.s.Opt)
	require.NoError(t, err)
	workCtx, stop = l1.KeepAlive(ctx, e.db)
	l2 := sqlLeaseTakeOver(t, func() error {
		_, err := e.pool.Exec(ctx, `UPDATE `+e.s.Records+` SET locked_until = clock_timestamp() - interval '1 second' WHERE scope = $1 AND key = $2`,
			other.Scope, other.ID)
		return err
	}, func() (*idemsql.Lease[string], error) {
		l, _, err := idemsql.Claim[string](ctx, e.db, other, time.Minute, e.s.Opt)
		return l, err
	})
	require.NotNil(t, l2)
	require.EqualValues(t, 2, l2.Attempt())
	select {
	case <-workCtx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the watchdog did not notice the takeover")
	}
	require.ErrorIs(t, context.Cause(workCtx), idem.ErrLeaseLost)
	require.ErrorIs(t, stop(), idem.ErrLeaseLost)
	require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
}

func sqlLeaseIssuedTokens(t *testing.T, e *sqlLeaseEnv) {
	ctx := context.Background()
	req := idem.RequireIssued()
	scope := "user:" + sqlLeaseKey().ID
	token, err := idemsql.IssueToken(ctx, e.db, scope, time.Hour, e.s.Opt)
	require.NoError(t, err)
	require.Len(t, token, 56)
	require.Equal(t, "issued", e.s.ReadRecord(t, e.pool, idem.Key{Scope: scope, ID: token}).Status)
	key := idem.Key{Scope: scope, ID: token}
	var runs atomic.Int64
	fn := func(ctx context.Context, tx *sql.Tx) (string, error) {
		v := fmt.Sprintf("run-%d", runs.Add(1))
		return v, e.effect(ctx, tx, key, v)
	}
	first, err := idemsql.Do(ctx, e.db, key, fn, e.s.Opt, req)
	require.NoError(t, err)
	require.False(t, first.Replayed)
	again, err := idemsql.Do(ctx, e.db, key, fn, e.s.Opt, req)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, first.Value, again.Value)
	require.NoError(t, e.inTx(t, func(tx *sql.Tx) error {
		res, err := idemsql.WithIdempotency(ctx, tx, key, fn, e.s.Opt, req)
		require.NoError(t, err)
		require.True(t, res.Replayed)
		return nil
	}))
	require.EqualValues(t, 1, runs.Load())
	require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))

	// Forged: the right shape for the scope, never issued.
	forged := idem.Key{Scope: scope, ID: strings.Repeat("A", 43) + token[43:]}
	_, err = idemsql.Do(ctx, e.db, forged, fn, e.s.Opt, req)
	require.ErrorIs(t, err, idem.ErrTokenRejected)
	require.ErrorIs(t, err, idem.ErrTokenUnknown)
	var te *idem.TokenError
	require.ErrorAs(t, err, &te)
	require.NoError(t, e.inTx(t, func(tx *sql.Tx) error {
		_, err := idemsql.WithIdempotency(ctx, tx, forged, fn, e.s.Opt, req)
		require.ErrorIs(t, err, idem.ErrTokenRejected)
		return nil
	}))
	_, err = idemsql.Do(ctx, e.db, idem.Key{Scope: scope, ID: "made-up"}, fn, e.s.Opt, req)
	require.ErrorIs(t, err, idem.ErrTokenRejected)
	require.EqualValues(t, 1, runs.Load(), "fn never ran for a rejected token")
	require.Nil(t, e.s.ReadRecord(t, e.pool, forged))

	// A token claimed in lease mode, issued in the caller's transaction.
	var leased string
	require.NoError(t, e.inTx(t, func(tx *sql.Tx) (err error) {
		leased, err = idemsql.IssueToken(ctx, tx, scope, time.Hour, e.s.Opt)
		return err
	}))
	lkey := idem.Key{Scope: scope, ID: leased}
	l, _, err := idemsql.Claim[string](ctx, e.db, lkey, time.Minute, e.s.Opt, req)
	require.NoError(t, err)
	require.EqualValues(t, 1, l.Attempt())
	require.NoError(t, l.Complete(ctx, e.db, "leased"))
	_, res, err := idemsql.Claim[string](ctx, e.db, lkey, time.Minute, e.s.Opt, req)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, "leased", res.Value)
	_, _, err = idemsql.Claim[string](ctx, e.db, forged, time.Minute, e.s.Opt, req)
	require.ErrorIs(t, err, idem.ErrTokenUnknown)
}

func sqlLeaseFailAndRelease(t *testing.T, e *sqlLeaseEnv) {
	ctx := context.Background()
	failing := sqlLeaseKey()
	l, _, err := idemsql.Claim[string](ctx, e.db, failing, time.Minute, e.s.Opt)
	require.NoError(t, err)
	require.ErrorIs(t, l.Fail(ctx, e.db, nil), idem.ErrInvalidOption)
	require.NoError(t, e.inTx(t, func(tx *sql.Tx) error { return l.Fail(ctx, tx, errors.New("card declined")) }))
	none, res, err := idemsql.Claim[string](ctx, e.db, failing, time.Minute, e.s.Opt)
	require.Nil(t, none)
	require.True(t, res.Replayed)
	require.True(t, idem.IsPermanent(err))
	require.EqualError(t, err, "card declined")

	released := sqlLeaseKey()
	l, _, err = idemsql.Claim[string](ctx, e.db, released, time.Minute, e.s.Opt)
	require.NoError(t, err)
	require.ErrorIs(t, l.Checkpoint(ctx, e.db, "", nil), idem.ErrInvalidOption)
	require.NoError(t, l.Checkpoint(ctx, e.db, "step-1", []byte("raw")))
	require.NoError(t, l.Release(ctx, e.db))
	l2, _, err := idemsql.Claim[string](ctx, e.db, released, time.Minute, e.s.Opt)
	require.NoError(t, err, "a released key is taken over at once")
	require.EqualValues(t, 2, l2.Attempt())
	require.Equal(t, "step-1", l2.RecoveryPoint())
	var raw []byte
	require.NoError(t, l2.RecoveryData(&raw))
	require.Equal(t, []byte("raw"), raw)
	require.ErrorIs(t, l.Release(ctx, e.db), idem.ErrLeaseLost)

	// A WithIdempotency call on a key under a live lease is in progress.
	require.NoError(t, e.inTx(t, func(tx *sql.Tx) error {
		_, err := idemsql.WithIdempotency(ctx, tx, released, func(context.Context, *sql.Tx) (int, error) { return 1, nil }, e.s.Opt)
		require.ErrorIs(t, err, idem.ErrInProgress)
		return nil
	}))
}

// Claim on a *sql.DB runs in a transaction of its own with a local
// lock_timeout: it answers ErrInProgress instead of waiting for a row
// another transaction holds, and leaves the connection's settings as they
// were.
func sqlLeaseClaimNeverBlocks(t *testing.T, e *sqlLeaseEnv) {
	ctx := context.Background()
	key := sqlLeaseKey()
	l, _, err := idemsql.Claim[string](ctx, e.db, key, time.Minute, e.s.Opt)
	require.NoError(t, err)
	endLease(t, e.pool, e.s, key) // ran out: takeable
	// The holder is completing in a transaction that has not committed.
	tx, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	require.NoError(t, l.Complete(ctx, tx, "c"))
	started := time.Now()
	_, _, err = idemsql.Claim[string](ctx, e.db, key, time.Minute, e.s.Opt)
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.Less(t, time.Since(started), 2*time.Second)
	require.NoError(t, tx.Commit())
	_, res, err := idemsql.Claim[string](ctx, e.db, key, time.Minute, e.s.Opt)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, "c", res.Value)

	// The lock_timeout of the claim's transaction ended with it.
	conn, err := e.db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	fresh := sqlLeaseKey()
	_, _, err = idemsql.Claim[string](ctx, conn, fresh, time.Minute, e.s.Opt)
	require.NoError(t, err)
	var timeout string
	require.NoError(t, conn.QueryRowContext(ctx, "SHOW lock_timeout").Scan(&timeout))
	require.Equal(t, "0", timeout)
}

// Claim in a *sql.Tx of the caller's commits with it, and rolls back with it.
func sqlLeaseClaimInCallerTx(t *testing.T, e *sqlLeaseEnv) {
	ctx := context.Background()
	key := sqlLeaseKey()
	tx, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	l, _, err := idemsql.Claim[string](ctx, tx, key, time.Minute, e.s.Opt)
	require.NoError(t, err)
	require.EqualValues(t, 1, l.Attempt())
	require.NoError(t, tx.Rollback())
	require.Nil(t, e.s.ReadRecord(t, e.pool, key), "the claim rolled back with the caller's transaction")

	require.NoError(t, e.inTx(t, func(tx *sql.Tx) error {
		l, _, err = idemsql.Claim[string](ctx, tx, key, time.Minute, e.s.Opt)
		if err != nil {
			return err
		}
		if err := e.effect(ctx, tx, key, "done"); err != nil {
			return err
		}
		return l.Complete(ctx, tx, "done")
	}))
	_, res, err := idemsql.Claim[string](ctx, e.db, key, time.Minute, e.s.Opt)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, "done", res.Value)
	require.Equal(t, 1, e.s.CountEffects(t, e.pool, key))
}

// Nil handles, a zero lease and a zero Lease are refused before any SQL; a
// *sql.Tx already ended is an ErrInvalidOption that says so; a closed
// *sql.DB is explained.
func sqlLeaseHandles(t *testing.T, e *sqlLeaseEnv) {
	ctx := context.Background()
	key := sqlLeaseKey()
	nils := []idemsql.DBTX{nil, (*sql.DB)(nil), (*sql.Tx)(nil), (*sql.Conn)(nil)}
	zero := new(idemsql.Lease[string])
	var none *idemsql.Lease[string]
	for _, db := range nils {
		_, _, err := idemsql.Claim[string](ctx, db, key, time.Minute, e.s.Opt)
		require.ErrorIs(t, err, idem.ErrInvalidOption, "Claim(%T)", db)
		_, err = idemsql.IssueToken(ctx, db, "s", time.Minute, e.s.Opt)
		require.ErrorIs(t, err, idem.ErrInvalidOption, "IssueToken(%T)", db)
		for _, l := range []*idemsql.Lease[string]{zero, none} {
			require.ErrorIs(t, l.Extend(ctx, db), idem.ErrInvalidOption)
			require.ErrorIs(t, l.Checkpoint(ctx, db, "p", nil), idem.ErrInvalidOption)
			require.ErrorIs(t, l.Complete(ctx, db, "v"), idem.ErrInvalidOption)
			require.ErrorIs(t, l.Fail(ctx, db, errors.New("x")), idem.ErrInvalidOption)
			require.ErrorIs(t, l.Release(ctx, db), idem.ErrInvalidOption)
			workCtx, stop := l.KeepAlive(ctx, db)
			require.ErrorIs(t, context.Cause(workCtx), idem.ErrInvalidOption)
			require.ErrorIs(t, stop(), idem.ErrInvalidOption)
		}
	}
	for _, l := range []*idemsql.Lease[string]{zero, none} {
		require.ErrorIs(t, l.Extend(ctx, e.db), idem.ErrInvalidOption)
		require.Zero(t, l.Attempt())
		require.Zero(t, l.Key())
		require.Empty(t, l.RecoveryPoint())
		require.ErrorIs(t, l.RecoveryData(new(any)), idem.ErrNotFound)
	}
	_, _, err := idemsql.Claim[string](ctx, e.db, key, 0, e.s.Opt)
	require.ErrorIs(t, err, idem.ErrInvalidOption)
	_, _, err = idemsql.Claim[string](ctx, e.db, idem.Key{Scope: "s"}, time.Minute, e.s.Opt)
	require.ErrorIs(t, err, idem.ErrInvalidKey)
	_, err = idemsql.IssueToken(ctx, e.db, "", time.Minute, e.s.Opt)
	require.ErrorIs(t, err, idem.ErrInvalidKey)
	_, err = idemsql.IssueToken(ctx, e.db, "s", 0, e.s.Opt)
	require.ErrorIs(t, err, idem.ErrInvalidOption)

	l, _, err := idemsql.Claim[string](ctx, e.db, key, time.Minute, e.s.Opt)
	require.NoError(t, err)
	tx, err := e.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())
	err = l.Complete(ctx, tx, "v")
	require.ErrorIs(t, err, idem.ErrInvalidOption)
	require.ErrorContains(t, err, "idem: Complete: the transaction was already committed or rolled back")
	_, err = idemsql.IssueToken(ctx, tx, "s", time.Minute, e.s.Opt)
	require.ErrorIs(t, err, idem.ErrInvalidOption)
	_, _, err = idemsql.Claim[string](ctx, tx, sqlLeaseKey(), time.Minute, e.s.Opt)
	require.ErrorIs(t, err, idem.ErrInvalidOption)

	require.NoError(t, e.db.Close())
	err = l.Extend(ctx, e.db)
	require.ErrorContains(t, err, "idem: Extend: the pool was closed")
	_, _, err = idemsql.Claim[string](ctx, e.db, sqlLeaseKey(), time.Minute, e.s.Opt)
	require.ErrorContains(t, err, "idem: Claim: the pool was closed")
	_, err = idemsql.IssueToken(ctx, e.db, "s", time.Minute, e.s.Opt)
	require.ErrorContains(t, err, "idem: IssueToken: the pool was closed")
}

package integration_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/integration/internal/pgtest"
)

type charge struct {
	ChargeID string `json:"charge_id"`
	Amount   int    `json:"amount"`
}

func TestLeaseLifecycle(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	key := idem.Key{Scope: "shop", ID: "pay-1", Fingerprint: []byte("order 1, 999")}
	const lease = time.Minute // live through the steps below, however loaded the machine

	w1, res, err := idem.Claim[charge](ctx, pool, key, lease, s.Opt)
	require.NoError(t, err)
	require.NotNil(t, w1)
	require.False(t, res.Replayed)
	require.EqualValues(t, 1, w1.Attempt())
	require.Empty(t, w1.RecoveryPoint())
	require.ErrorIs(t, w1.RecoveryData(new(map[string]any)), idem.ErrNotFound)

	// While the lease is live, others are told at once.
	started := time.Now()
	_, _, err = idem.Claim[charge](ctx, pool, key, lease, s.Opt)
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.Less(t, time.Since(started), time.Second)
	other := key
	other.Fingerprint = []byte("another body")
	_, _, err = idem.Claim[charge](ctx, pool, other, lease, s.Opt)
	require.ErrorIs(t, err, idem.ErrKeyReused)

	require.NoError(t, w1.Extend(ctx, pool))
	require.NoError(t, w1.Checkpoint(ctx, pool, "charge-requested", charge{ChargeID: "ch_1", Amount: 999}))

	// w1 stops; its lease runs out; w2 takes over and resumes.
	endLease(t, pool, s, key)
	w2, _, err := idem.Claim[charge](ctx, pool, key, lease, s.Opt)
	require.NoError(t, err)
	require.NotNil(t, w2)
	require.EqualValues(t, 2, w2.Attempt(), "the takeover increments the fencing token")
	require.Equal(t, "charge-requested", w2.RecoveryPoint())
	var resumed charge
	require.NoError(t, w2.RecoveryData(&resumed))
	require.Equal(t, charge{ChargeID: "ch_1", Amount: 999}, resumed)

	// The stale worker is fenced out everywhere.
	require.ErrorIs(t, w1.Extend(ctx, pool), idem.ErrLeaseLost)
	require.ErrorIs(t, w1.Checkpoint(ctx, pool, "x", nil), idem.ErrLeaseLost)
	require.ErrorIs(t, w1.Fail(ctx, pool, errors.New("x")), idem.ErrLeaseLost)
	require.ErrorIs(t, w1.Release(ctx, pool), idem.ErrLeaseLost)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, s.AddEffect(ctx, tx, key, "stale"))
	require.ErrorIs(t, w1.Complete(ctx, tx, charge{ChargeID: "stale"}), idem.ErrLeaseLost)
	require.NoError(t, tx.Rollback(ctx), "the fenced-out worker's business transaction rolls back")

	// w2 completes inside its business transaction.
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, s.AddEffect(ctx, tx, key, "charged"))
	require.NoError(t, w2.Complete(ctx, tx, resumed))
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 1, s.CountEffects(t, pool, key))

	// Later claims replay.
	none, res, err := idem.Claim[charge](ctx, pool, key, lease, s.Opt)
	require.NoError(t, err)
	require.Nil(t, none)
	require.True(t, res.Replayed)
	require.Equal(t, resumed, res.Value)
	rec := s.ReadRecord(t, pool, key)
	require.Equal(t, idem.StatusSucceeded, rec.Status)
	require.Equal(t, 2, rec.Attempt)
}

func TestLeaseFailAndRelease(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()

	failing := idem.Key{Scope: "shop", ID: "declined"}
	l, _, err := idem.Claim[charge](ctx, pool, failing, time.Minute, s.Opt)
	require.NoError(t, err)
	require.NoError(t, l.Fail(ctx, pool, errors.New("card declined")))
	none, res, err := idem.Claim[charge](ctx, pool, failing, time.Minute, s.Opt)
	require.Nil(t, none)
	require.True(t, res.Replayed)
	require.True(t, idem.IsPermanent(err))
	require.EqualError(t, err, "card declined")

	released := idem.Key{Scope: "shop", ID: "released"}
	l, _, err = idem.Claim[charge](ctx, pool, released, time.Minute, s.Opt)
	require.NoError(t, err)
	require.NoError(t, l.Checkpoint(ctx, pool, "step-1", []byte("raw")))
	require.NoError(t, l.Release(ctx, pool))
	l2, _, err := idem.Claim[charge](ctx, pool, released, time.Minute, s.Opt)
	require.NoError(t, err, "a released key is taken over at once")
	require.EqualValues(t, 2, l2.Attempt())
	require.Equal(t, "step-1", l2.RecoveryPoint())
	var raw []byte
	require.NoError(t, l2.RecoveryData(&raw))
	require.Equal(t, []byte("raw"), raw)

	// A WithIdempotency call on a key under a live lease is in progress.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = idem.WithIdempotency(ctx, tx, released, func(context.Context, pgx.Tx) (int, error) { return 1, nil }, s.Opt)
	require.ErrorIs(t, err, idem.ErrInProgress)
}

// 50 goroutines race to take over one expired lease: exactly one wins and
// the attempt rises by exactly one.
func TestLeaseTakeoverRace(t *testing.T) {
	pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 25 })
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	key := idem.Key{Scope: "shop", ID: "race"}
	_, _, err := idem.Claim[charge](ctx, pool, key, time.Minute, s.Opt)
	require.NoError(t, err)
	endLease(t, pool, s, key)

	var winners, busy atomic.Int64
	var attempts sync.Map
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 50 {
		wg.Go(func() {
			<-start
			l, _, err := idem.Claim[charge](ctx, pool, key, time.Minute, s.Opt)
			switch {
			case err == nil && l != nil:
				winners.Add(1)
				attempts.Store(l.Attempt(), true)
			case errors.Is(err, idem.ErrInProgress):
				busy.Add(1)
			default:
				t.Errorf("claim: lease %v, err %v", l, err)
			}
		})
	}
	close(start)
	wg.Wait()
	require.EqualValues(t, 1, winners.Load())
	require.EqualValues(t, 49, busy.Load())
	_, ok := attempts.Load(int32(2))
	require.True(t, ok)
	require.Equal(t, 2, s.ReadRecord(t, pool, key).Attempt)
}

// Claim answers ErrInProgress instead of waiting for a row another
// transaction holds.
func TestClaimNeverBlocks(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	key := idem.Key{Scope: "shop", ID: "held"}
	l, _, err := idem.Claim[charge](ctx, pool, key, time.Minute, s.Opt)
	require.NoError(t, err)
	endLease(t, pool, s, key) // ran out: takeable
	// The holder is completing in a transaction that has not committed.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	require.NoError(t, l.Complete(ctx, tx, charge{ChargeID: "c"}))
	started := time.Now()
	_, _, err = idem.Claim[charge](ctx, pool, key, time.Minute, s.Opt)
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.Less(t, time.Since(started), 2*time.Second)
	require.NoError(t, tx.Commit(ctx))
	_, res, err := idem.Claim[charge](ctx, pool, key, time.Minute, s.Opt)
	require.NoError(t, err)
	require.True(t, res.Replayed)
}

func TestKeepAlive(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	key := idem.Key{Scope: "shop", ID: "watchdog"}
	l, _, err := idem.Claim[charge](ctx, pool, key, keepAliveLease, s.Opt)
	require.NoError(t, err)
	claimedEnd := lockedUntil(t, pool, s, key)
	workCtx, stop := l.KeepAlive(ctx, pool)
	sleepPast(t, pool, claimedEnd) // the lease as claimed has run out
	_, _, err = idem.Claim[charge](ctx, pool, key, keepAliveLease, s.Opt)
	require.ErrorIs(t, err, idem.ErrInProgress, "the watchdog kept the lease alive")
	require.True(t, lockedUntil(t, pool, s, key).After(claimedEnd), "the watchdog renewed the lease")
	require.NoError(t, workCtx.Err())
	require.NoError(t, stop())
	require.ErrorIs(t, workCtx.Err(), context.Canceled)

	// A second watchdog on l, which has outlived the lease as claimed,
	// counts from the first one's latest renewal, not from the claim: it
	// renews, and reports nothing lost.
	renewedEnd := lockedUntil(t, pool, s, key)
	workCtx, stop = l.KeepAlive(ctx, pool)
	require.Eventually(t, func() bool { return lockedUntil(t, pool, s, key).After(renewedEnd) }, 10*time.Second, 20*time.Millisecond,
		"the second watchdog did not renew the lease")
	require.NoError(t, workCtx.Err(), "the second watchdog took the lease for lost")
	require.NoError(t, stop())

	// A watchdog notices a takeover and cancels the work.
	other := idem.Key{Scope: "shop", ID: "watchdog-2"}
	l1, _, err := idem.Claim[charge](ctx, pool, other, keepAliveLease, s.Opt)
	require.NoError(t, err)
	workCtx, stop = l1.KeepAlive(ctx, pool)
	l2 := takeOver(t, func() error {
		_, err := pool.Exec(ctx, `UPDATE `+s.Records+` SET locked_until = clock_timestamp() - interval '1 second' WHERE key = $1`, other.ID)
		return err
	}, func() (*idem.Lease[charge], error) {
		l, _, err := idem.Claim[charge](ctx, pool, other, time.Minute, s.Opt)
		return l, err
	})
	require.NotNil(t, l2)
	select {
	case <-workCtx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the watchdog did not notice the takeover")
	}
	require.ErrorIs(t, context.Cause(workCtx), idem.ErrLeaseLost)
	require.ErrorIs(t, stop(), idem.ErrLeaseLost)
}

// keepAliveLease is the lease of the watchdog tests. KeepAlive renews a lease
// every third of it, and reports it lost when no renewal succeeded within
// it: a few seconds leave room for a loaded machine's pauses.
const keepAliveLease = 3 * time.Second

// lockedUntil reads the end of a key's lease, by the database clock.
func lockedUntil(t *testing.T, pool *pgxpool.Pool, s *pgtest.Schema, key idem.Key) time.Time {
	t.Helper()
	var end time.Time
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT locked_until FROM `+s.Records+` WHERE scope = $1 AND key = $2`,
		key.Scope, key.ID).Scan(&end))
	return end
}

// sleepPast waits until the database clock has passed at.
func sleepPast(t *testing.T, pool *pgxpool.Pool, at time.Time) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `SELECT pg_sleep_until($1::timestamptz + interval '1 millisecond')`, at)
	require.NoError(t, err)
}

// takeOver expires a lease that a watchdog is renewing and claims it. The
// watchdog renews every third of the lease, so a renewal can land between the
// expiry and the claim; like a real taker, it tries again, for up to 5s.
func takeOver[T any](t *testing.T, expire func() error, claim func() (*idem.Lease[T], error)) *idem.Lease[T] {
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

// clockSpy is a DBTX that fails the test if the application's clock is ever
// sent to the database: every lease, TTL and expiry decision must use the
// database clock.
type clockSpy struct {
	t  *testing.T
	db *pgxpool.Pool
}

func (c clockSpy) check(args []any) {
	for _, a := range args {
		if _, ok := a.(time.Time); ok {
			c.t.Errorf("the application clock was sent to the database: %v", a)
		}
	}
}

func (c clockSpy) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.check(args)
	return c.db.Exec(ctx, sql, args...)
}
func (c clockSpy) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.check(args)
	return c.db.Query(ctx, sql, args...)
}
func (c clockSpy) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.check(args)
	return c.db.QueryRow(ctx, sql, args...)
}
func (c clockSpy) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, q := range b.QueuedQueries {
		c.check(q.Arguments)
	}
	return c.db.SendBatch(ctx, b)
}

// A wildly wrong application clock changes nothing, because the library
// never sends it: the database clock decides every lease and expiry. The spy
// sees every statement of the lease flow, tokens and purging.
func TestOnlyTheDatabaseClockDecides(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	db := clockSpy{t: t, db: pool}
	key := idem.Key{Scope: "shop", ID: "clock"}
	l, _, err := idem.Claim[charge](ctx, db, key, time.Minute, s.Opt, idem.WithTTL(time.Hour))
	require.NoError(t, err)
	require.NoError(t, l.Extend(ctx, db))
	require.NoError(t, l.Checkpoint(ctx, db, "p", 1))
	var leaseLeft, ttlLeft float64
	require.NoError(t, pool.QueryRow(ctx, `SELECT extract(epoch FROM locked_until - clock_timestamp()),
		extract(epoch FROM expires_at - clock_timestamp()) FROM `+s.Records+` WHERE key = $1`, key.ID).Scan(&leaseLeft, &ttlLeft))
	require.InDelta(t, 60, leaseLeft, 5, "the lease is measured on the database clock")
	require.InDelta(t, 3600, ttlLeft, 5)
	require.NoError(t, l.Complete(ctx, db, charge{}))
	token, err := idem.IssueToken(ctx, db, "shop", time.Minute, s.Opt)
	require.NoError(t, err)
	_, _, err = idem.Claim[charge](ctx, db, idem.Key{Scope: "shop", ID: token}, time.Minute, s.Opt, idem.RequireIssued())
	require.NoError(t, err)
	_, err = idem.Purge(ctx, db, idem.PurgeParams{InboxRetention: time.Hour}, s.Opt, s.InboxOpt)
	require.NoError(t, err)
}

// A lease longer than the record's TTL stays live: the record outlives it,
// and a finished record lives a full TTL from completion.
func TestLeaseOutlivesTTL(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	key := idem.Key{Scope: "shop", ID: "long"}
	ttl := idem.WithTTL(time.Minute)
	l, _, err := idem.Claim[charge](ctx, pool, key, time.Hour, s.Opt, ttl)
	require.NoError(t, err)
	expireRecord(t, pool, s, key) // the TTL runs out, the lease does not
	_, _, err = idem.Claim[charge](ctx, pool, key, time.Minute, s.Opt, ttl)
	require.ErrorIs(t, err, idem.ErrInProgress, "a live lease is never taken over")
	require.NoError(t, inTx(t, pool, pgx.ReadCommitted, func(tx pgx.Tx) error {
		_, err := idem.WithIdempotency(ctx, tx, key, func(context.Context, pgx.Tx) (int, error) { return 0, nil }, s.Opt, ttl)
		require.ErrorIs(t, err, idem.ErrInProgress)
		return nil
	}))
	n, err := idem.Purge(ctx, pool, idem.PurgeParams{}, s.Opt)
	require.NoError(t, err)
	require.Zero(t, n, "a lease record is not purged")
	require.NoError(t, l.Extend(ctx, pool))
	require.NoError(t, l.Complete(ctx, pool, charge{ChargeID: "c"}))
	_, res, err := idem.Claim[charge](ctx, pool, key, time.Minute, s.Opt, ttl)
	require.NoError(t, err)
	require.True(t, res.Replayed, "the finished record lives a TTL from completion")
}

// The watchdog stops quietly once the holder completes, even when a renewal
// meets the row the completing transaction holds and then finds the record
// completed.
func TestKeepAliveAfterComplete(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	key := idem.Key{Scope: "shop", ID: "done"}
	log := &eventLog{}
	l, _, err := idem.Claim[charge](ctx, pool, key, keepAliveLease, s.Opt, idem.WithHooks(log))
	require.NoError(t, err)
	workCtx, stop := l.KeepAlive(ctx, pool)
	tx, err := pool.Begin(workCtx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	// The business transaction holds the record's row: the next renewal
	// waits for it.
	_, err = tx.Exec(workCtx, `SELECT 1 FROM `+s.Records+` WHERE scope = $1 AND key = $2 FOR UPDATE`, key.Scope, key.ID)
	require.NoError(t, err)
	waitForLockWaitOn(t, s.Name)
	require.NoError(t, l.Complete(workCtx, tx, charge{ChargeID: "c"}))
	require.NoError(t, tx.Commit(workCtx))
	// The waiting renewal finds the record completed (its hooks hear of it)...
	require.Eventually(t, func() bool { return log.has(idem.EventLeaseLost, "Extend") }, 10*time.Second, 5*time.Millisecond,
		"the renewal that met the completing transaction did not end")
	// ...and the watchdog does not take it for a lost lease.
	require.NoError(t, workCtx.Err(), "the completed lease is not reported lost")
	require.NoError(t, stop())
}

// Purge leaves lease records whose lease ran out: the next Claim takes them
// over with a higher fencing token, instead of starting again at 1.
func TestPurgeKeepsAbandonedLeases(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	key := idem.Key{Scope: "shop", ID: "abandoned"}
	ttl := idem.WithTTL(time.Minute)
	l, _, err := idem.Claim[charge](ctx, pool, key, time.Minute, s.Opt, ttl)
	require.NoError(t, err)
	// The holder stopped: its lease ran out, and the record's TTL.
	endLease(t, pool, s, key)
	expireRecord(t, pool, s, key)
	n, err := idem.Purge(ctx, pool, idem.PurgeParams{}, s.Opt)
	require.NoError(t, err)
	require.Zero(t, n)
	l2, _, err := idem.Claim[charge](ctx, pool, key, time.Minute, s.Opt, ttl)
	require.NoError(t, err)
	require.Greater(t, l2.Attempt(), l.Attempt())
	require.ErrorIs(t, l.Extend(ctx, pool), idem.ErrLeaseLost)
}

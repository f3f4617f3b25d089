package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsql"
	"github.com/idemkit/idem/integration/internal/pgtest"
	"github.com/idemkit/idem/internal/cutproxy"
)

// What a failover looks like to Do, one failure at a time on a single
// server: each provably committed nothing, so Do retries it on a fresh
// connection (RetryPolicy.Outage) and the caller sees one result; a COMMIT
// whose answer was lost is the one failure it surfaces.

// terminateOnFirstRun is an fn that, on its first run, has its own backend
// terminated (as a switchover or a shutdown does: FATAL 57P01) before it
// writes key's effect.
func terminateOnFirstRun(t *testing.T, s *pgtest.Schema, key idem.Key, runs *atomic.Int64) func(context.Context, pgx.Tx) (string, error) {
	return func(ctx context.Context, tx pgx.Tx) (string, error) {
		if runs.Add(1) == 1 {
			var pid int
			require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
			_, err := pgtest.Direct(t).Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
			require.NoError(t, err)
		}
		return "done", s.AddEffect(ctx, tx, key, "v")
	}
}

func TestDoRetriesASessionEndedBeforeCommit(t *testing.T) {
	pgtest.SkipViaPgBouncer(t, "terminating the server's backend does not end the client's session with PgBouncer")
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	key := newKey(t)
	var runs atomic.Int64
	res, err := idem.Do(context.Background(), pool, key, terminateOnFirstRun(t, s, key, &runs), s.Opt)
	require.NoError(t, err, "the attempt whose session ended committed nothing: Do retried it")
	require.False(t, res.Replayed)
	require.EqualValues(t, 2, runs.Load(), "fn ran again on a fresh connection")
	require.Equal(t, 1, s.CountEffects(t, pool, key))

	// With the outage retries off, the same failure reaches the caller, and
	// nothing was committed: a retry with the key runs fn.
	key2 := idem.Key{Scope: "user-1", ID: t.Name() + "/off"}
	runs.Store(0)
	fn := terminateOnFirstRun(t, s, key2, &runs)
	_, err = idem.Do(context.Background(), pool, key2, fn, s.Opt, idem.WithRetry(idem.RetryPolicy{Outage: -1}))
	var pe *pgconn.PgError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "57P01", pe.Code)
	require.NotErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.Equal(t, 0, s.CountEffects(t, pool, key2))
	_, err = idem.Do(context.Background(), pool, key2, fn, s.Opt)
	require.NoError(t, err)
	require.Equal(t, 1, s.CountEffects(t, pool, key2))
}

func TestDoDropsAReadOnlyConnection(t *testing.T) {
	pgtest.SkipViaPgBouncer(t, "a session setting does not stay with one server connection through PgBouncer")
	pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	// The pool's one connection turns read-only, as a primary's sessions
	// would see a demotion: every write fails with 25006.
	var readOnlyPID int
	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = c.Exec(ctx, `SET default_transaction_read_only = on`)
	if err == nil {
		err = c.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&readOnlyPID)
	}
	c.Release()
	require.NoError(t, err)

	key := newKey(t)
	cnt := &counter{s: s}
	_, err = idem.Do(ctx, pool, key, cnt.fn(key), s.Opt)
	require.NoError(t, err, "Do retried the read-only failure on a fresh connection")
	require.EqualValues(t, 1, cnt.runs.Load(), "the claim failed before fn ran")
	require.Equal(t, 1, s.CountEffects(t, pool, key))
	var pid int
	require.NoError(t, pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	require.NotEqual(t, readOnlyPID, pid, "the read-only connection was closed, not handed out again")
}

// refusingPool is a pool whose first refusals dials are refused, as a
// server being failed over refuses them, and which counts its dials.
func refusingPool(t *testing.T, refusals int64) (*pgxpool.Pool, *atomic.Int64) {
	var dials atomic.Int64
	pool := pgtest.Pool(t, func(c *pgxpool.Config) {
		var d net.Dialer
		c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if dials.Add(1) <= refusals {
				return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
			}
			return d.DialContext(ctx, network, addr)
		}
	})
	return pool, &dials
}

func TestDoRetriesRefusedConnections(t *testing.T) {
	pool, dials := refusingPool(t, 3)
	s := pgtest.NewSchema(t, pgtest.Pool(t))
	key := newKey(t)
	cnt := &counter{s: s}
	_, err := idem.Do(context.Background(), pool, key, cnt.fn(key), s.Opt)
	require.NoError(t, err)
	require.EqualValues(t, 4, dials.Load(), "three refused dials, then one that connected")
	require.EqualValues(t, 1, cnt.runs.Load())
	require.Equal(t, 1, s.CountEffects(t, pool, key))

	// Off, or out of time: the connect error itself, fn never run.
	for _, p := range []idem.RetryPolicy{{Outage: -1}, {Outage: 20 * time.Millisecond}} {
		refusing, dials := refusingPool(t, 1<<40)
		_, err := idem.Do(context.Background(), refusing, idem.Key{Scope: "user-1", ID: t.Name() + "/down"}, cnt.fn(key), s.Opt, idem.WithRetry(p))
		var ce *pgconn.ConnectError
		require.ErrorAs(t, err, &ce, "%+v", p)
		require.ErrorIs(t, err, syscall.ECONNREFUSED)
		if p.Outage < 0 {
			require.EqualValues(t, 1, dials.Load(), "no retry with Outage < 0")
		} else {
			require.Greater(t, dials.Load(), int64(1), "retried until Outage ran out")
		}
	}
	require.EqualValues(t, 1, cnt.runs.Load())
}

func TestDoDoesNotRetryWhatMayHaveCommitted(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	proxy, err := cutproxy.New(pgtest.URL())
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	cut := pgtest.Pool(t, func(c *pgxpool.Config) {
		cc, err := pgx.ParseConfig(proxy.URL())
		require.NoError(t, err)
		c.ConnConfig = cc
		c.MaxConns = 1
	})
	cnt := &counter{s: s}
	warm := idem.Key{Scope: "user-1", ID: t.Name() + "/warm"}
	_, err = idem.Do(ctx, cut, warm, cnt.fn(warm), s.Opt)
	require.NoError(t, err)

	// A COMMIT cut in flight, through a pool: ErrOutcomeUnknown, one run.
	key := newKey(t)
	proxy.SetCutRate(1)
	_, err = idem.Do(ctx, cut, key, cnt.fn(key), s.Opt)
	proxy.SetCutRate(0)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.EqualValues(t, 2, cnt.runs.Load(), "not retried: it may have committed")
	res, err := idem.Do(ctx, pool, key, cnt.fn(key), s.Opt)
	require.NoError(t, err)
	require.True(t, res.Replayed, "it had committed")
	require.Equal(t, 1, s.CountEffects(t, pool, key))

	// fn's own network failure, its connection alive: returned, not retried.
	dialFailed := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	var runs atomic.Int64
	_, err = idem.Do(ctx, pool, idem.Key{Scope: "user-1", ID: t.Name() + "/fn"}, func(context.Context, pgx.Tx) (string, error) {
		runs.Add(1)
		return "", dialFailed
	}, s.Opt)
	require.ErrorIs(t, err, dialFailed)
	require.EqualValues(t, 1, runs.Load())
}

func TestSQLDoRetriesASessionEndedBeforeCommit(t *testing.T) {
	pgtest.SkipViaPgBouncer(t, "terminating the server's backend does not end the client's session with PgBouncer")
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	cfg, err := pgx.ParseConfig(pgtest.ClientURL())
	require.NoError(t, err)
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	key := newKey(t)
	var runs atomic.Int64
	res, err := idemsql.Do(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) (string, error) {
		if runs.Add(1) == 1 {
			var pid int
			require.NoError(t, tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
			_, err := pgtest.Direct(t).Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
			require.NoError(t, err)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO `+s.Effects+` (scope, key, value) VALUES ($1, $2, 'v')`, key.Scope, key.ID)
		return "done", err
	}, s.Opt)
	require.NoError(t, err, "idemsql.Do retried the attempt whose session ended")
	require.False(t, res.Replayed)
	require.EqualValues(t, 2, runs.Load())
	require.Equal(t, 1, s.CountEffects(t, pool, key))
	require.False(t, errors.Is(err, idem.ErrOutcomeUnknown))
}

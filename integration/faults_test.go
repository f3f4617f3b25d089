package integration_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/integration/internal/pgtest"
	"github.com/idemkit/idem/internal/cutproxy"
)

// tracer counts round trips (queries and batches) and can run a hook before
// a batch is sent.
type tracer struct {
	trips       atomic.Int64
	beforeBatch func(b *pgx.Batch)
}

func (tr *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	tr.trips.Add(1)
	return ctx
}
func (tr *tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (tr *tracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	tr.trips.Add(1)
	if tr.beforeBatch != nil {
		tr.beforeBatch(d.Batch)
	}
	return ctx
}
func (tr *tracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (tr *tracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// oneInsert returns an fn that inserts one effect row, and a bare
// transaction on conn that runs it: BEGIN, the INSERT and COMMIT, one round
// trip each.
func oneInsert(t *testing.T, conn *pgx.Conn, s *pgtest.Schema) (func(context.Context, pgx.Tx) (int, error), func()) {
	insert := func(ctx context.Context, tx pgx.Tx) (int, error) {
		_, err := tx.Exec(ctx, `INSERT INTO `+s.Effects+` (scope, key, value) VALUES ('s', 'k', 'v')`)
		return 1, err
	}
	bare := func() {
		ctx := context.Background()
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		_, err = insert(ctx, tx)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
	}
	return insert, bare
}

// TestDoCostsTheRoundTripsOfABareTransaction checks the pipelining: a first
// execution through Do takes as many round trips as BEGIN, one INSERT and
// COMMIT sent one by one, with NoWait too.
func TestDoCostsTheRoundTripsOfABareTransaction(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	tr := &tracer{}
	conn := pgtest.Conn(t, func(c *pgx.ConnConfig) { c.Tracer = tr })
	ctx := context.Background()
	insert, bare := oneInsert(t, conn, s)
	// Warm the statement caches first.
	bare()
	_, err := idem.Do(ctx, conn, idem.Key{Scope: "s", ID: "warm"}, insert, s.Opt)
	require.NoError(t, err)
	_, err = idem.Do(ctx, conn, idem.Key{Scope: "s", ID: "warm"}, insert, s.Opt)
	require.NoError(t, err)

	tr.trips.Store(0)
	bare()
	bareTrips := tr.trips.Load()

	tr.trips.Store(0)
	res, err := idem.Do(ctx, conn, idem.Key{Scope: "s", ID: "k1"}, insert, s.Opt)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, bareTrips, tr.trips.Load(), "a first execution costs what a bare transaction costs")

	tr.trips.Store(0)
	res, err = idem.Do(ctx, conn, idem.Key{Scope: "s", ID: "k1"}, insert, s.Opt)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.EqualValues(t, 2, tr.trips.Load(), "a replay costs two round trips")

	// NoWait costs nothing more: the claim lowers lock_timeout and puts it
	// back in its one statement.
	_, err = idem.Do(ctx, conn, idem.Key{Scope: "s", ID: "warm-nowait"}, insert, s.Opt, idem.NoWait())
	require.NoError(t, err)
	tr.trips.Store(0)
	res, err = idem.Do(ctx, conn, idem.Key{Scope: "s", ID: "k2"}, insert, s.Opt, idem.NoWait())
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, bareTrips, tr.trips.Load(), "a first execution with NoWait costs what a bare transaction costs")
	tr.trips.Store(0)
	res, err = idem.Do(ctx, conn, idem.Key{Scope: "s", ID: "k2"}, insert, s.Opt, idem.NoWait())
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.EqualValues(t, 2, tr.trips.Load(), "a replay with NoWait costs two round trips")
}

// TestCompletionIsAHOTUpdate checks that the fillfactor and the choice of
// columns let the completion UPDATE stay on its page.
func TestCompletionIsAHOTUpdate(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	for i := range 20 {
		key := idem.Key{Scope: "s", ID: fmt.Sprint(i)}
		_, err := idem.WithIdempotency(ctx, tx, key, func(context.Context, pgx.Tx) (string, error) {
			return strings.Repeat("x", 200), nil
		}, s.Opt)
		require.NoError(t, err)
	}
	var updates, hot int
	require.NoError(t, tx.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relid = $1::regclass`,
		s.Records).Scan(&updates, &hot))
	require.Equal(t, 20, updates)
	require.Equal(t, 20, hot, "every completion is a HOT update")
}

// TestRecordVanishingAfterTheConflictIsClaimedAgain deletes the record (as a
// purge would) between the claim's conflict and the read of the record.
func TestRecordVanishingAfterTheConflictIsClaimedAgain(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	key := newKey(t)
	var deleted atomic.Bool
	tr := &tracer{beforeBatch: func(b *pgx.Batch) {
		for _, q := range b.QueuedQueries {
			if strings.HasPrefix(q.SQL, "SELECT attempt, status") && deleted.CompareAndSwap(false, true) {
				_, err := pool.Exec(ctx, `DELETE FROM `+s.Records+` WHERE scope = $1 AND key = $2`, key.Scope, key.ID)
				require.NoError(t, err)
			}
		}
	}}
	conn := pgtest.Conn(t, func(c *pgx.ConnConfig) { c.Tracer = tr })

	// A holds the key uncommitted; B's claim waits on it.
	txA, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer txA.Rollback(ctx) //nolint:errcheck
	_, err = txA.Exec(ctx, `INSERT INTO `+s.Records+` (scope, key, fingerprint, status, response, expires_at)
		VALUES ($1, $2, '', 'succeeded', '"from A"', now() + interval '1 hour')`, key.Scope, key.ID)
	require.NoError(t, err)

	type out struct {
		res idem.Result[string]
		err error
	}
	done := make(chan out, 1)
	var runs atomic.Int64
	go func() {
		tx, err := conn.Begin(ctx)
		if err != nil {
			done <- out{err: err}
			return
		}
		res, err := idem.WithIdempotency(ctx, tx, key, func(ctx context.Context, tx pgx.Tx) (string, error) {
			runs.Add(1)
			return "from B", s.AddEffect(ctx, tx, key, "B")
		}, s.Opt)
		if err == nil {
			err = tx.Commit(ctx)
		}
		done <- out{res, err}
	}()
	waitForLockWaitOn(t, s.Name)
	require.NoError(t, txA.Commit(ctx))
	o := <-done
	require.NoError(t, o.err)
	require.True(t, deleted.Load(), "the record was deleted between the conflict and the read")
	require.False(t, o.res.Replayed)
	require.Equal(t, "from B", o.res.Value, "never an empty result")
	require.EqualValues(t, 1, runs.Load())
	require.Equal(t, idem.StatusSucceeded, s.ReadRecord(t, pool, key).Status)
}

// TestConnectionLostDuringCommit cuts the connection while COMMIT is in
// flight: Do must say the outcome is unknown, and a retry with the same key
// must settle it with exactly one effect. It runs in pgx's default mode,
// where the completion and COMMIT go below pgx.Batch as prepared statements,
// and in QueryExecModeExec, where they go through pgx.Batch; with the COMMIT
// forwarded first (it commits) and dropped (it rolls back).
func TestConnectionLostDuringCommit(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	proxy, err := cutproxy.New(pgtest.URL())
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	ctx := context.Background()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec} {
		for _, dropped := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/dropped=%v", mode, dropped), func(t *testing.T) {
				cfg, err := pgx.ParseConfig(proxy.URL())
				require.NoError(t, err)
				cfg.DefaultQueryExecMode = mode
				conn, err := pgx.ConnectConfig(ctx, cfg)
				require.NoError(t, err)
				defer conn.Close(ctx)

				c := &counter{s: s}
				// Prepare the statements on this connection first: preparing a
				// COMMIT is not committing, and is never cut.
				warm := idem.Key{Scope: "user-1", ID: t.Name() + "/warm"}
				_, err = idem.Do(ctx, conn, warm, c.fn(warm), s.Opt)
				require.NoError(t, err)

				key := newKey(t)
				before := proxy.Cuts()
				proxy.SetDropRate(map[bool]float64{false: 0, true: 1}[dropped])
				proxy.SetCutRate(1)
				_, err = idem.Do(ctx, conn, key, c.fn(key), s.Opt)
				proxy.SetCutRate(0)
				require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
				require.EqualValues(t, 1, proxy.Cuts()-before)

				runs := c.runs.Load()
				res, err := idem.Do(ctx, pool, key, c.fn(key), s.Opt)
				require.NoError(t, err)
				require.Equal(t, 1, s.CountEffects(t, pool, key), "the retry settles on exactly one effect")
				if dropped {
					require.False(t, res.Replayed, "the dropped COMMIT rolled back: the retry runs fn")
					require.EqualValues(t, runs+1, c.runs.Load())
				} else {
					require.True(t, res.Replayed, "the forwarded COMMIT committed: the retry replays")
					require.EqualValues(t, runs, c.runs.Load())
				}
			})
		}
	}
}

// TestErrorsMatchSentinels keeps the wrapped errors usable with errors.Is.
func TestErrorsMatchSentinels(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	_, err := idem.Do(context.Background(), pool, idem.Key{Scope: "s", ID: "k"},
		func(context.Context, pgx.Tx) (int, error) { return 0, nil }, s.Opt, idem.WithTTL(-1))
	require.ErrorIs(t, err, idem.ErrInvalidOption)
	_, err = idem.Do(context.Background(), pool, idem.Key{Scope: "s", ID: "k"},
		func(context.Context, pgx.Tx) (int, error) { return 0, nil }, idem.WithTable("", `x"; DROP TABLE y; --`))
	require.ErrorIs(t, err, idem.ErrInvalidOption)
	require.False(t, errors.Is(err, idem.ErrInvalidKey))
}

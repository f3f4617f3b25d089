package integration_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/integration/internal/pgtest"
)

// An fn error in WithIdempotency undoes the claim by rolling back to the
// savepoint taken before it, so a record the claim changed rather than
// created is put back as it was: an issued token stays issued (a retry runs
// fn), and a lease record taken over keeps its attempt number, which fences
// out its earlier holder.

func TestFnErrorKeepsTheIssuedToken(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	c := &counter{s: s}
	ctx := context.Background()
	token, err := idem.IssueToken(ctx, pool, "user:1", time.Hour, s.Opt)
	require.NoError(t, err)
	key := idem.Key{Scope: "user:1", ID: token}
	boom := errors.New("transient")

	for _, noWait := range []bool{false, true} {
		opts := []idem.Option{s.Opt, idem.RequireIssued()}
		if noWait {
			opts = append(opts, idem.NoWait())
		}
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = idem.WithIdempotency(ctx, tx, key, func(context.Context, pgx.Tx) (string, error) {
			return "", boom
		}, opts...)
		require.ErrorIs(t, err, boom)
		require.NoError(t, tx.Commit(ctx), "the caller's transaction is usable after fn's error")
		rec := s.ReadRecord(t, pool, key)
		require.NotNil(t, rec, "noWait=%v: the token survives", noWait)
		require.Equal(t, idem.StatusIssued, rec.Status)
	}

	res, err := idem.Do(ctx, pool, key, c.fn(key), s.Opt, idem.RequireIssued())
	require.NoError(t, err, "a retry runs fn")
	require.False(t, res.Replayed)
	require.EqualValues(t, 1, c.runs.Load())
}

func TestFnErrorAfterATakeoverKeepsTheFencingToken(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	key := newKey(t)
	a, _, err := idem.Claim[string](ctx, pool, key, time.Minute, s.Opt)
	require.NoError(t, err)
	require.EqualValues(t, 1, a.Attempt())
	endLease(t, pool, s, key) // A pauses; its lease runs out

	ran := false
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = idem.WithIdempotency(ctx, tx, key, func(context.Context, pgx.Tx) (string, error) {
		ran = true // the takeover happened
		return "", errors.New("transient")
	}, s.Opt)
	require.Error(t, err)
	require.True(t, ran)
	require.NoError(t, tx.Commit(ctx))
	rec := s.ReadRecord(t, pool, key)
	require.NotNil(t, rec, "the record taken over is put back, not deleted")
	require.EqualValues(t, 1, rec.Attempt)

	b, _, err := idem.Claim[string](ctx, pool, key, time.Hour, s.Opt)
	require.NoError(t, err)
	require.EqualValues(t, 2, b.Attempt(), "the next holder's token is past A's")
	require.ErrorIs(t, a.Complete(ctx, pool, "from A"), idem.ErrLeaseLost, "A is fenced out")
	require.NoError(t, b.Complete(ctx, pool, "from B"))
}

// A call nested in fn whose claim fails (here: the caller's lock_timeout ends
// its wait for a token another transaction holds, which aborts the
// transaction) leaves its savepoint behind; undoing the enclosing call must
// still undo the enclosing call's own claim and fn's writes, not just the
// nested savepoint.
func TestNestedFailedClaimDoesNotConfuseTheUndo(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	tokenA, err := idem.IssueToken(ctx, pool, "u", time.Hour, s.Opt)
	require.NoError(t, err)
	tokenB, err := idem.IssueToken(ctx, pool, "u", time.Hour, s.Opt)
	require.NoError(t, err)
	keyA, keyB := idem.Key{Scope: "u", ID: tokenA}, idem.Key{Scope: "u", ID: tokenB}

	// Another transaction holds token B, claimed and not committed.
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	gate, finished := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		defer close(finished)
		_, err := idem.WithIdempotency(ctx, holder, keyB, func(context.Context, pgx.Tx) (string, error) {
			held <- nil
			<-gate
			return "b", nil
		}, s.Opt, idem.RequireIssued())
		if err != nil {
			held <- err
		}
	}()
	defer func() {
		close(gate)
		<-finished
		_ = holder.Rollback(ctx)
	}()
	require.NoError(t, <-held)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, "SET LOCAL lock_timeout = '100ms'")
	require.NoError(t, err)
	_, err = idem.WithIdempotency(ctx, tx, keyA, func(ctx context.Context, ftx pgx.Tx) (string, error) {
		if err := s.AddEffect(ctx, ftx, keyA, "a"); err != nil {
			return "", err
		}
		res, err := idem.WithIdempotency(ctx, ftx, keyB, func(context.Context, pgx.Tx) (string, error) {
			return "never", nil
		}, s.Opt, idem.RequireIssued())
		return res.Value, err
	}, s.Opt, idem.RequireIssued())
	require.Error(t, err)
	require.Equal(t, "55P03", pgCodeOf(err), "the nested claim's lock_timeout: %v", err)
	require.NoError(t, tx.Commit(ctx), "the undo restored the caller's transaction")

	rec := s.ReadRecord(t, pool, keyA)
	require.NotNil(t, rec)
	require.Equal(t, idem.StatusIssued, rec.Status, "token A was put back")
	require.Equal(t, 0, s.CountEffects(t, pool, keyA), "fn's write was undone")
}

func pgCodeOf(err error) string {
	var e interface{ SQLState() string }
	if errors.As(err, &e) {
		return e.SQLState()
	}
	return ""
}

// cancelAfterBatch cancels a context when the next batch after arm ends.
type cancelAfterBatch struct {
	mu     sync.Mutex
	cancel context.CancelFunc
}

func (c *cancelAfterBatch) arm(cancel context.CancelFunc) {
	c.mu.Lock()
	c.cancel = cancel
	c.mu.Unlock()
}

func (c *cancelAfterBatch) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (c *cancelAfterBatch) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *cancelAfterBatch) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (c *cancelAfterBatch) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *cancelAfterBatch) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancel != nil {
		c.cancel()
		c.cancel = nil
	}
}

// A nested call whose context ends between its claim and the read that
// follows a conflict still releases its savepoints, so that the enclosing
// call's undo (ROLLBACK TO its own savepoint) undoes fn's writes.
func TestNestedCallCancelledAfterItsClaimLeavesNoSavepoint(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	keyA, keyB := idem.Key{Scope: "u", ID: "a"}, idem.Key{Scope: "u", ID: "b"}
	_, err := idem.Do(ctx, pool, keyB, func(context.Context, pgx.Tx) (string, error) { return "b", nil }, s.Opt)
	require.NoError(t, err) // B is committed: a claim of B conflicts and reads it

	tracer := &cancelAfterBatch{}
	var writes atomic.Int64
	conn := directConn(t, &writes, func(c *pgx.ConnConfig) { c.Tracer = tracer })
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = idem.WithIdempotency(ctx, tx, keyA, func(ctx context.Context, ftx pgx.Tx) (string, error) {
		if err := s.AddEffect(ctx, ftx, keyA, "a"); err != nil {
			return "", err
		}
		inner, cancel := context.WithCancel(ctx)
		defer cancel()
		tracer.arm(cancel) // ends inner right after B's claim round trip
		res, err := idem.WithIdempotency(inner, ftx, keyB, func(context.Context, pgx.Tx) (string, error) {
			return "never", nil
		}, s.Opt)
		return res.Value, err
	}, s.Opt)
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, tx.Commit(ctx))
	require.Nil(t, s.ReadRecord(t, pool, keyA), "A's claim was undone")
	require.Equal(t, 0, s.CountEffects(t, pool, keyA), "fn's write was undone")
}

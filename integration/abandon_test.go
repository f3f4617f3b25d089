package integration_test

import (
	"context"
	"errors"
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
	a, _, err := idem.Claim[string](ctx, pool, key, 50*time.Millisecond, s.Opt)
	require.NoError(t, err)
	require.EqualValues(t, 1, a.Attempt())
	require.Eventually(t, func() bool { // A pauses; its lease runs out
		var live bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT locked_until > clock_timestamp() FROM `+s.Records+` WHERE scope = $1 AND key = $2`, key.Scope, key.ID).Scan(&live))
		return !live
	}, 5*time.Second, 10*time.Millisecond)

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

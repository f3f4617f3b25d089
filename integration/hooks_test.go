package integration_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/integration/internal/pgtest"
)

// eventLog records every event, safe for concurrent use.
type eventLog struct {
	mu     sync.Mutex
	events []idem.Event
}

func (l *eventLog) Event(_ context.Context, e idem.Event) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

// take returns "kind/op" of the events since the last take.
func (l *eventLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.events))
	for _, e := range l.events {
		out = append(out, fmt.Sprintf("%s/%s", e.Kind, e.Op))
	}
	l.events = nil
	return out
}

// has reports whether an event of kind from op arrived since the last take.
func (l *eventLog) has(kind idem.EventKind, op string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.events {
		if e.Kind == kind && e.Op == op {
			return true
		}
	}
	return false
}

func (l *eventLog) last() idem.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.events[len(l.events)-1]
}

// TestHooksReportEveryEvent drives each entry point to each of its events
// and checks that exactly the expected events arrive, once each.
func TestHooksReportEveryEvent(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	log := &eventLog{}
	opts := []idem.KeyOption{s.Opt, idem.WithHooks(log)}
	do := doOpts(opts)
	c := &counter{s: s}

	// Do on a pool: executed, replayed, key reused.
	key := idem.Key{Scope: "u", ID: "do", Fingerprint: []byte("a")}
	_, err := idem.Do(ctx, pool, key, c.fn(key), do...)
	require.NoError(t, err)
	_, err = idem.Do(ctx, pool, key, c.fn(key), do...)
	require.NoError(t, err)
	other := key
	other.Fingerprint = []byte("b")
	_, err = idem.Do(ctx, pool, other, c.fn(other), do...)
	require.ErrorIs(t, err, idem.ErrKeyReused)
	ev := log.last()
	require.Equal(t, "do", ev.Key.ID)
	require.Positive(t, ev.Duration)
	require.ErrorIs(t, ev.Err, idem.ErrKeyReused)
	require.Equal(t, []string{"executed/Do", "replayed/Do", "key_reused/Do"}, log.take())

	// A Permanent error is an execution, then a replay.
	pkey := idem.Key{Scope: "u", ID: "permanent"}
	fail := func(context.Context, pgx.Tx) (string, error) { return "", idem.Permanent(fmt.Errorf("card declined")) }
	_, err = idem.Do(ctx, pool, pkey, fail, do...)
	require.True(t, idem.IsPermanent(err))
	_, err = idem.Do(ctx, pool, pkey, fail, do...)
	require.True(t, idem.IsPermanent(err))
	require.Equal(t, []string{"executed/Do", "replayed/Do"}, log.take())

	// Do inside a caller's transaction runs as one Do event, not two.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	tkey := idem.Key{Scope: "u", ID: "do-in-tx"}
	_, err = idem.Do(ctx, tx, tkey, c.fn(tkey), do...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, []string{"executed/Do"}, log.take())

	// WithIdempotency: in progress while another transaction holds the key.
	wkey := idem.Key{Scope: "u", ID: "held"}
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx) //nolint:errcheck
	_, err = idem.WithIdempotency(ctx, holder, wkey, c.fn(wkey), txOpts(opts)...)
	require.NoError(t, err)
	require.NoError(t, inTx(t, pool, pgx.ReadCommitted, func(tx pgx.Tx) error {
		_, err := idem.WithIdempotency(ctx, tx, wkey, c.fn(wkey), txOpts(opts, idem.NoWait())...)
		require.ErrorIs(t, err, idem.ErrInProgress)
		return nil
	}))
	require.NoError(t, holder.Commit(ctx))
	require.Equal(t, []string{"executed/WithIdempotency", "in_progress/WithIdempotency"}, log.take())

	// An expired record is taken over, then executed.
	ekey := idem.Key{Scope: "u", ID: "expiring"}
	_, err = idem.Do(ctx, pool, ekey, c.fn(ekey), do...)
	require.NoError(t, err)
	expireRecord(t, pool, s, ekey)
	_, err = idem.Do(ctx, pool, ekey, c.fn(ekey), do...)
	require.NoError(t, err)
	require.Equal(t, []string{"executed/Do", "takeover/Do", "executed/Do"}, log.take())

	// Lease mode: claimed, in progress, taken over after the lease ran
	// out, the stale holder's lease lost, completed then replayed.
	lkey := idem.Key{Scope: "u", ID: "lease"}
	first, _, err := idem.Claim[string](ctx, pool, lkey, time.Minute, opts...)
	require.NoError(t, err)
	_, _, err = idem.Claim[string](ctx, pool, lkey, time.Minute, opts...)
	require.ErrorIs(t, err, idem.ErrInProgress)
	endLease(t, pool, s, lkey)
	second, _, err := idem.Claim[string](ctx, pool, lkey, time.Minute, opts...)
	require.NoError(t, err)
	require.EqualValues(t, 2, second.Attempt())
	require.ErrorIs(t, first.Complete(ctx, pool, "stale"), idem.ErrLeaseLost)
	require.NoError(t, second.Complete(ctx, pool, "done"))
	_, res, err := idem.Claim[string](ctx, pool, lkey, time.Minute, opts...)
	require.NoError(t, err)
	require.Equal(t, "done", res.Value)
	require.Equal(t, []string{"executed/Claim", "in_progress/Claim", "takeover/Claim", "lease_lost/Complete", "replayed/Claim"}, log.take())

	// Purge reports the rows it deleted.
	_, err = pool.Exec(ctx, `UPDATE `+s.Records+` SET expires_at = now() - interval '1 second' WHERE status <> 'processing'`)
	require.NoError(t, err)
	n, err := idem.Purge(ctx, pool, idem.PurgeParams{Hooks: log}, s.Opt)
	require.NoError(t, err)
	require.Positive(t, n)
	require.Equal(t, []string{"purged/Purge"}, log.take())
	_, err = idem.Purge(ctx, pool, idem.PurgeParams{Hooks: log}, s.Opt)
	require.NoError(t, err)
	require.Empty(t, log.take(), "a purge that deleted nothing reports nothing")
}

package integration_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
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

// The core and state-machine suites run against databases whose
// default_transaction_isolation is READ COMMITTED, REPEATABLE READ or
// SERIALIZABLE (.ci/run creates one of each). Where a test drives
// WithIdempotency or Transition concurrently in a transaction of the
// database's default level, it behaves like a real client: above READ
// COMMITTED a 40001 or 40P01 (idem.IsRetryable) is answered by running the
// whole transaction again, and any other error, or either of those at READ
// COMMITTED, fails the test. Do retries them itself and never returns one.

// isolationOf returns the isolation level of a transaction begun on pool
// without options: the database's default_transaction_isolation.
func isolationOf(t testing.TB, pool *pgxpool.Pool) pgx.TxIsoLevel {
	t.Helper()
	var iso string
	require.NoError(t, pool.QueryRow(context.Background(), "SHOW default_transaction_isolation").Scan(&iso))
	switch l := pgx.TxIsoLevel(iso); l {
	case pgx.ReadUncommitted, pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable:
		return l
	}
	t.Fatalf("unknown default_transaction_isolation %q", iso)
	return ""
}

// effectiveIsolation is iso, or the pool's default when iso is empty (a
// transaction begun without an isolation level).
func effectiveIsolation(t testing.TB, pool *pgxpool.Pool, iso pgx.TxIsoLevel) pgx.TxIsoLevel {
	t.Helper()
	if iso != "" {
		return iso
	}
	return isolationOf(t, pool)
}

// aboveReadCommitted reports whether transactions at iso may fail with a
// serialization failure when a concurrent transaction commits first.
// (PostgreSQL runs READ UNCOMMITTED as READ COMMITTED.)
func aboveReadCommitted(iso pgx.TxIsoLevel) bool {
	return iso == pgx.RepeatableRead || iso == pgx.Serializable
}

// maxClientRetries bounds asClient, so that a livelock fails the test
// instead of hanging it.
const maxClientRetries = 100

// asClient runs attempt, a whole transaction at isolation iso, the way a
// client must: when iso is above READ COMMITTED, a 40001 or 40P01 is retried
// after a short jittered pause. Any other error, those two at READ COMMITTED,
// or a conflict still failing after maxClientRetries retries is returned. It
// also returns how many times it retried. It does not use t, so goroutines
// may call it.
func asClient(iso pgx.TxIsoLevel, attempt func() error) (retries int, err error) {
	for {
		err = attempt()
		if err == nil || !idem.IsRetryable(err) || !aboveReadCommitted(iso) || retries >= maxClientRetries {
			return retries, err
		}
		retries++
		time.Sleep(rand.N(time.Duration(min(retries, 10)) * time.Millisecond))
	}
}

// conflictCounter is a pgx tracer that counts the statements and batches
// that failed with 40001 or 40P01 on a pool's connections.
type conflictCounter struct{ n atomic.Int64 }

func (c *conflictCounter) count(err error) {
	if idem.IsRetryable(err) {
		c.n.Add(1)
	}
}

func (c *conflictCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (c *conflictCounter) TraceQueryEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	c.count(d.Err)
}

func (c *conflictCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *conflictCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *conflictCounter) TraceBatchEnd(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchEndData) {
	c.count(d.Err)
}

// TestIsolationLevelsDoRetriesConflicts runs a concurrent workload through
// Do at each isolation level, whatever the database's default: 50 callers
// each ask for the same few keys in their own order, and fn reads before it
// writes (a check-then-insert, which gives SERIALIZABLE read/write
// dependencies to detect) while it holds the key for a few milliseconds, so
// that the key's other callers wait for it. Do retries the 40001s and 40P01s the database
// raises, so no caller sees an error; every key has exactly one committed
// effect and every caller of a key gets the same value.
func TestIsolationLevelsDoRetriesConflicts(t *testing.T) {
	const (
		callers = 50
		keys    = 4
	)
	for _, iso := range isolationLevels {
		t.Run(string(iso), func(t *testing.T) {
			conflicts := &conflictCounter{}
			pool := pgtest.Pool(t, func(c *pgxpool.Config) {
				c.MaxConns = 20
				c.ConnConfig.Tracer = conflicts
			})
			s := pgtest.NewSchema(t, pool)
			ctx := context.Background()
			opts := []idem.DoOption{s.Opt, idem.WithTxOptions(pgx.TxOptions{IsoLevel: iso})}

			var runs atomic.Int64
			// The first execution of each key holds it until another caller
			// is seen waiting for a key's holder: at least one caller then
			// waits on a transaction that commits after its snapshot was
			// taken, which above READ COMMITTED is a serialization failure
			// for Do to retry, however the scheduler orders the callers.
			direct := pgtest.Direct(t)
			var held sync.Map
			fn := func(key idem.Key) func(context.Context, pgx.Tx) (string, error) {
				return func(ctx context.Context, tx pgx.Tx) (string, error) {
					n := runs.Add(1)
					if _, again := held.LoadOrStore(key.ID, true); !again {
						if err := awaitBackend(ctx, direct, "wait_event_type = 'Lock'", "ON CONFLICT (scope, key) DO NOTHING"); err != nil {
							return "", err
						}
					}
					// Hold the key for a few milliseconds, so that the
					// other callers of the key queue up behind it.
					var seen int
					if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+s.Effects+` WHERE scope = $1 AND pg_sleep(0.005) IS NOT NULL`,
						key.Scope).Scan(&seen); err != nil {
						return "", err
					}
					v := fmt.Sprintf("%s-run-%d-saw-%d", key.ID, n, seen)
					return v, s.AddEffect(ctx, tx, key, v)
				}
			}

			var (
				wg     sync.WaitGroup
				mu     sync.Mutex
				values = map[string]map[string]int{} // key ID -> value -> callers
				errs   []error
			)
			start := make(chan struct{})
			for c := range callers {
				wg.Go(func() {
					<-start
					r := rand.New(rand.NewPCG(uint64(c), 42))
					for _, k := range r.Perm(keys) {
						key := idem.Key{Scope: "matrix", ID: fmt.Sprintf("k%d", k)}
						res, err := idem.Do(ctx, pool, key, fn(key), opts...)
						mu.Lock()
						if err != nil {
							errs = append(errs, fmt.Errorf("caller %d, key %s: %w", c, key.ID, err))
						} else {
							if values[key.ID] == nil {
								values[key.ID] = map[string]int{}
							}
							values[key.ID][res.Value]++
						}
						mu.Unlock()
					}
				})
			}
			close(start)
			wg.Wait()

			require.Empty(t, errs, "Do must retry serialization failures and deadlocks, not return them")
			require.Len(t, values, keys)
			for k := range keys {
				key := idem.Key{Scope: "matrix", ID: fmt.Sprintf("k%d", k)}
				require.Len(t, values[key.ID], 1, "every caller of %s gets the identical value: %v", key.ID, values[key.ID])
				for v, n := range values[key.ID] {
					require.Equal(t, callers, n)
					rec := s.ReadRecord(t, pool, key)
					require.NotNil(t, rec)
					require.Equal(t, idem.StatusSucceeded, rec.Status)
					require.JSONEq(t, fmt.Sprintf("%q", v), string(rec.Response))
				}
				require.Equal(t, 1, s.CountEffects(t, pool, key), "exactly one committed effect for %s", key.ID)
			}
			if !aboveReadCommitted(iso) {
				require.Zero(t, conflicts.n.Load(), "READ COMMITTED raised serialization failures")
			}
			if iso == pgx.Serializable {
				// The workload is built to conflict (see held): without a
				// retried 40001 the test would not have exercised Do's
				// retries.
				require.Positive(t, conflicts.n.Load(), "no serialization failure to retry at SERIALIZABLE")
			}
			t.Logf("%s: %d callers x %d keys: fn ran %d times for %d keys, %d statements or batches failed with 40001/40P01 and were retried by Do",
				iso, callers, keys, runs.Load(), keys, conflicts.n.Load())
		})
	}
}

// asClient retries only what a client may retry, and only above READ
// COMMITTED.
func TestAsClientRetriesOnlyConflictsAboveReadCommitted(t *testing.T) {
	serialization := &pgconn.PgError{Code: "40001"}
	deadlock := fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "40P01"})
	other := &pgconn.PgError{Code: "23505"}
	for _, tc := range []struct {
		iso     pgx.TxIsoLevel
		err     error
		retries int
	}{
		{pgx.ReadCommitted, serialization, 0},
		{pgx.ReadCommitted, deadlock, 0},
		{pgx.RepeatableRead, serialization, 2},
		{pgx.Serializable, deadlock, 2},
		{pgx.Serializable, other, 0},
	} {
		calls := 0
		retries, err := asClient(tc.iso, func() error {
			calls++
			if calls <= 2 {
				return tc.err
			}
			return nil
		})
		require.Equal(t, tc.retries, retries, "%s %v", tc.iso, tc.err)
		if tc.retries == 0 {
			require.ErrorIs(t, err, tc.err)
		} else {
			require.NoError(t, err)
		}
	}
}

// TestDatabaseDefaultIsolation checks that the database the suites run on
// has the default isolation a matrix run expects (IDEM_EXPECT_ISOLATION, as
// .ci/run sets it), so that a matrix run cannot pass at the wrong level.
func TestDatabaseDefaultIsolation(t *testing.T) {
	want := os.Getenv("IDEM_EXPECT_ISOLATION")
	if want == "" {
		t.Skip("IDEM_EXPECT_ISOLATION is not set: no matrix run expects a level")
	}
	require.Equal(t, pgx.TxIsoLevel(want), isolationOf(t, pgtest.Pool(t)))
}

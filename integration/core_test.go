package integration_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

func TestMain(m *testing.M) { pgtest.Main(m) }

var isolationLevels = []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}

// counter is an fn that writes one effect and returns a value unique to the
// execution, so that replays are told apart from runs.
type counter struct {
	s    *pgtest.Schema
	runs atomic.Int64
}

func (c *counter) fn(key idem.Key) func(context.Context, pgx.Tx) (string, error) {
	return func(ctx context.Context, tx pgx.Tx) (string, error) {
		n := c.runs.Add(1)
		v := fmt.Sprintf("run-%d-%d", n, time.Now().UnixNano())
		return v, c.s.AddEffect(ctx, tx, key, v)
	}
}

func newKey(t *testing.T) idem.Key {
	return idem.Key{Scope: "user-1", ID: t.Name()}
}

// doOpts returns opts, of any option kind, followed by more, as the
// DoOptions Do takes: a test builds its options once for WithIdempotency
// (or Claim) and Do.
func doOpts[O idem.DoOption](opts []O, more ...idem.DoOption) []idem.DoOption {
	out := make([]idem.DoOption, 0, len(opts)+len(more))
	for _, o := range opts {
		out = append(out, o)
	}
	return append(out, more...)
}

// txOpts is doOpts for WithIdempotency.
func txOpts[O idem.Option](opts []O, more ...idem.Option) []idem.Option {
	out := make([]idem.Option, 0, len(opts)+len(more))
	for _, o := range opts {
		out = append(out, o)
	}
	return append(out, more...)
}

// inTx runs f in a transaction of the given isolation level and commits.
func inTx(t *testing.T, pool *pgxpool.Pool, iso pgx.TxIsoLevel, f func(tx pgx.Tx) error) error {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

func TestFirstCallThenReplay(t *testing.T) {
	pool := pgtest.Pool(t)
	for _, iso := range isolationLevels {
		t.Run(string(iso), func(t *testing.T) {
			s := pgtest.NewSchema(t, pool)
			c := &counter{s: s}
			key := newKey(t)
			var first, second idem.Result[string]
			require.NoError(t, inTx(t, pool, iso, func(tx pgx.Tx) (err error) {
				first, err = idem.WithIdempotency(context.Background(), tx, key, c.fn(key), s.Opt)
				return err
			}))
			require.False(t, first.Replayed)
			rec := s.ReadRecord(t, pool, key)
			require.NotNil(t, rec)
			require.Equal(t, idem.StatusSucceeded, rec.Status)

			require.NoError(t, inTx(t, pool, iso, func(tx pgx.Tx) (err error) {
				second, err = idem.WithIdempotency(context.Background(), tx, key, c.fn(key), s.Opt)
				return err
			}))
			require.True(t, second.Replayed)
			require.Equal(t, first.Value, second.Value)
			require.EqualValues(t, 1, c.runs.Load())
			require.Equal(t, 1, s.CountEffects(t, pool, key))

			// Do replays what WithIdempotency recorded, and the reverse.
			third, err := idem.Do(context.Background(), pool, key, c.fn(key), s.Opt, idem.WithTxOptions(pgx.TxOptions{IsoLevel: iso}))
			require.NoError(t, err)
			require.True(t, third.Replayed)
			require.Equal(t, first.Value, third.Value)

			other := idem.Key{Scope: key.Scope, ID: key.ID + "-do"}
			r1, err := idem.Do(context.Background(), pool, other, c.fn(other), s.Opt, idem.WithTxOptions(pgx.TxOptions{IsoLevel: iso}))
			require.NoError(t, err)
			require.False(t, r1.Replayed)
			var r2 idem.Result[string]
			require.NoError(t, inTx(t, pool, iso, func(tx pgx.Tx) (err error) {
				r2, err = idem.WithIdempotency(context.Background(), tx, other, c.fn(other), s.Opt)
				return err
			}))
			require.True(t, r2.Replayed)
			require.Equal(t, r1.Value, r2.Value)
			require.Equal(t, 1, s.CountEffects(t, pool, other))
		})
	}
}

func TestScopesNeverMatch(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	c := &counter{s: s}
	a := idem.Key{Scope: "alice", ID: "k1"}
	b := idem.Key{Scope: "bob", ID: "k1"}
	ra, err := idem.Do(context.Background(), pool, a, c.fn(a), s.Opt)
	require.NoError(t, err)
	rb, err := idem.Do(context.Background(), pool, b, c.fn(b), s.Opt)
	require.NoError(t, err)
	require.False(t, rb.Replayed)
	require.NotEqual(t, ra.Value, rb.Value)
}

func TestRollbackLeavesNothing(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	c := &counter{s: s}
	key := newKey(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = idem.WithIdempotency(ctx, tx, key, c.fn(key), s.Opt)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Nil(t, s.ReadRecord(t, pool, key))

	res, err := idem.Do(ctx, pool, key, c.fn(key), s.Opt)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, 1, s.CountEffects(t, pool, key))
}

// TestConcurrentSameKey sends 200 goroutines at one key and counts effects in
// a table without a unique constraint.
func TestConcurrentSameKey(t *testing.T) {
	const callers = 200
	pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 40 })
	for _, tc := range []struct {
		name   string
		noWait bool
		inTx   bool
		iso    pgx.TxIsoLevel
	}{
		{name: "Do/wait"},
		{name: "Do/nowait", noWait: true},
		{name: "Do/wait/serializable", iso: pgx.Serializable},
		{name: "WithIdempotency/wait", inTx: true},
		{name: "WithIdempotency/nowait", inTx: true, noWait: true},
		{name: "WithIdempotency/wait/repeatable-read", inTx: true, iso: pgx.RepeatableRead},
		{name: "WithIdempotency/wait/serializable", inTx: true, iso: pgx.Serializable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := pgtest.NewSchema(t, pool)
			c := &counter{s: s}
			key := newKey(t)
			opts := []idem.Option{s.Opt}
			if tc.noWait {
				opts = append(opts, idem.NoWait())
			}
			// The Do callers run at tc.iso through WithTxOptions; the
			// WithIdempotency callers' transactions are begun at it.
			doOptions := doOpts(opts, idem.WithTxOptions(pgx.TxOptions{IsoLevel: tc.iso}))
			// The level the callers' transactions run at: tc.iso, or the
			// database's default (the isolation matrix of .ci/run).
			iso := effectiveIsolation(t, pool, tc.iso)
			var (
				wg         sync.WaitGroup
				mu         sync.Mutex
				values     = map[string]int{}
				inProgress atomic.Int64
				replays    atomic.Int64
				retries    atomic.Int64
				errs       []error
			)
			start := make(chan struct{})
			for range callers {
				wg.Go(func() {
					<-start
					ctx := context.Background()
					var res idem.Result[string]
					var err error
					if tc.inTx {
						// Under REPEATABLE READ and SERIALIZABLE the losers get
						// 40001 and retry the whole transaction, as a caller
						// must; the retry replays. At READ COMMITTED a 40001
						// is an error like any other.
						var n int
						n, err = asClient(iso, func() error {
							return inTx(t, pool, tc.iso, func(tx pgx.Tx) (err error) {
								res, err = idem.WithIdempotency(ctx, tx, key, c.fn(key), opts...)
								return err
							})
						})
						retries.Add(int64(n))
					} else {
						res, err = idem.Do(ctx, pool, key, c.fn(key), doOptions...)
					}
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						values[res.Value]++
						if res.Replayed {
							replays.Add(1)
						}
					case tc.noWait && errors.Is(err, idem.ErrInProgress):
						inProgress.Add(1)
					default:
						errs = append(errs, err)
					}
				})
			}
			close(start)
			wg.Wait()
			require.Empty(t, errs)
			require.Len(t, values, 1, "every caller must get the identical value: %v", values)
			require.Equal(t, 1, s.CountEffects(t, pool, key), "exactly one committed effect")
			require.EqualValues(t, 1, c.runs.Load(), "fn ran once")
			t.Logf("%s: %d callers: %d replays, %d in progress, %d transactions retried after 40001/40P01, fn ran %d times",
				iso, callers, replays.Load(), inProgress.Load(), retries.Load(), c.runs.Load())
			if !tc.noWait {
				require.EqualValues(t, callers-1, replays.Load())
			}
		})
	}
}

func TestDuplicateWaitsForInFlight(t *testing.T) {
	for _, outcome := range []string{"commit", "rollback"} {
		t.Run(outcome, func(t *testing.T) {
			pool := pgtest.Pool(t)
			s := pgtest.NewSchema(t, pool)
			c := &counter{s: s}
			key := newKey(t)
			ctx := context.Background()

			txA, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer txA.Rollback(ctx) //nolint:errcheck
			first, err := idem.WithIdempotency(ctx, txA, key, c.fn(key), s.Opt)
			require.NoError(t, err)

			done := make(chan struct{})
			var second idem.Result[string]
			var secondErr error
			go func() {
				defer close(done)
				second, secondErr = idem.Do(ctx, pool, key, c.fn(key), s.Opt)
			}()
			waitForLockWaitOn(t, s.Name)
			select {
			case <-done:
				t.Fatal("the duplicate did not wait for the in-flight transaction")
			default:
			}
			if outcome == "commit" {
				require.NoError(t, txA.Commit(ctx))
			} else {
				require.NoError(t, txA.Rollback(ctx))
			}
			<-done
			require.NoError(t, secondErr)
			if outcome == "commit" {
				require.True(t, second.Replayed)
				require.Equal(t, first.Value, second.Value)
			} else {
				require.False(t, second.Replayed)
				require.NotEqual(t, first.Value, second.Value)
			}
			require.Equal(t, 1, s.CountEffects(t, pool, key))
		})
	}
}

// waitForLockWaitOn waits until a backend of the test database waits on a
// lock in a statement that names marker (a schema's name, say), so that
// other packages' tests on the same database cannot answer for it.
func waitForLockWaitOn(t *testing.T, marker string) {
	t.Helper()
	require.NoError(t, awaitBackend(context.Background(), pgtest.Direct(t), "wait_event_type = 'Lock'", marker))
}

// awaitBackend polls pg_stat_activity until a backend of the test database
// other than its own matches cond (SQL) running a statement that contains
// marker ("" for any), for up to 10s or until ctx ends. It does not use t,
// so goroutines may call it. Give it pgtest.Direct: through PgBouncer, a
// pool the watched backends share may have no server connection left to
// look with while they wait.
func awaitBackend(ctx context.Context, pool *pgxpool.Pool, cond, marker string) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND `+cond+`
			AND strpos(query, $1) > 0`, marker).Scan(&n)
		if err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("no backend of the test database came to %s in a statement containing %q within 10s", cond, marker)
}

// cancelWhenRunning cancels ctx (with its cancel) once a backend of the
// test database runs a statement containing marker, so that the
// cancellation lands while that statement runs rather than when the
// scheduler happens to fire a timer (a cancel request that reaches an idle
// backend is ignored). After 10s without one it cancels anyway and fails
// the test; it gives up quietly if ctx ends first.
func cancelWhenRunning(t *testing.T, ctx context.Context, marker string, cancel context.CancelFunc) {
	pool := pgtest.Direct(t)
	go func() {
		defer cancel()
		if err := awaitBackend(ctx, pool, "state = 'active'", marker); err != nil && ctx.Err() == nil {
			t.Errorf("cancelling: %v", err)
		}
	}()
}

// expireRecord moves a key's record past its expiry by the database clock,
// as its TTL running out would. Tests expire records this way rather than
// by sleeping past a short TTL, which a loaded machine can overrun before
// the record is even committed.
func expireRecord(t *testing.T, pool *pgxpool.Pool, s *pgtest.Schema, key idem.Key) {
	t.Helper()
	tag, err := pool.Exec(context.Background(), `UPDATE `+s.Records+` SET expires_at = now() - interval '1 second'
		WHERE scope = $1 AND key = $2`, key.Scope, key.ID)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected(), "no record of %v to expire", key)
}

// endLease moves the end of a key's lease (locked_until) into the past by
// the database clock, as it runs out when its holder stops renewing it.
// Tests end leases this way rather than by sleeping past a short lease, and
// keep the leases they need live long enough for a loaded machine.
func endLease(t *testing.T, pool *pgxpool.Pool, s *pgtest.Schema, key idem.Key) {
	t.Helper()
	tag, err := pool.Exec(context.Background(), `UPDATE `+s.Records+` SET locked_until = now() - interval '1 second'
		WHERE scope = $1 AND key = $2 AND locked_until IS NOT NULL`, key.Scope, key.ID)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected(), "no lease of %v to end", key)
}

// savepointExists reports whether tx has a savepoint with that name, leaving
// tx as it was when it has none.
func savepointExists(t *testing.T, tx pgx.Tx, name string) bool {
	t.Helper()
	ctx := context.Background()
	_, err := tx.Exec(ctx, "SAVEPOINT probe")
	require.NoError(t, err)
	if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT "+name); err == nil {
		return true
	}
	_, err = tx.Exec(ctx, "ROLLBACK TO SAVEPOINT probe")
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "RELEASE SAVEPOINT probe")
	require.NoError(t, err)
	return false
}

func show(t *testing.T, tx pgx.Tx, setting string) string {
	t.Helper()
	var v string
	require.NoError(t, tx.QueryRow(context.Background(), "SELECT current_setting($1)", setting).Scan(&v))
	return v
}

func TestNoWaitKeepsCallerTxIntact(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	c := &counter{s: s}
	key := newKey(t)
	ctx := context.Background()

	txA, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer txA.Rollback(ctx) //nolint:errcheck
	first, err := idem.WithIdempotency(ctx, txA, key, c.fn(key), s.Opt)
	require.NoError(t, err)

	txB, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer txB.Rollback(ctx) //nolint:errcheck
	_, err = txB.Exec(ctx, "SET LOCAL lock_timeout = '7s'; SET LOCAL statement_timeout = '9s'")
	require.NoError(t, err)
	_, err = txB.Exec(ctx, "SAVEPOINT mine")
	require.NoError(t, err)

	started := time.Now()
	_, err = idem.WithIdempotency(ctx, txB, key, c.fn(key), s.Opt, idem.NoWait())
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.Less(t, time.Since(started), 5*time.Second, "no-wait must not wait for the in-flight claim")

	require.Equal(t, "7s", show(t, txB, "lock_timeout"))
	require.Equal(t, "9s", show(t, txB, "statement_timeout"))
	require.False(t, savepointExists(t, txB, "idem_claim"))
	require.False(t, savepointExists(t, txB, "idem_fn"))
	require.True(t, savepointExists(t, txB, "mine"), "the caller's savepoint is still there")

	// The transaction is usable: it can do more work, and a no-wait call for
	// another key runs, keeping the settings.
	other := idem.Key{Scope: key.Scope, ID: "other"}
	res, err := idem.WithIdempotency(ctx, txB, other, c.fn(other), s.Opt, idem.NoWait())
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, "7s", show(t, txB, "lock_timeout"))
	require.False(t, savepointExists(t, txB, "idem_fn"))
	require.NoError(t, txB.Commit(ctx))
	require.Equal(t, 1, s.CountEffects(t, pool, other))

	// Once A commits, a no-wait call replays. Under SERIALIZABLE, B's commit
	// can make A's fail with 40001 (B read and wrote index entries next to
	// A's): nothing of A committed, so A runs again as a client would, and
	// runs fn.
	retries, err := asClient(isolationOf(t, pool), func() error {
		if txA != nil {
			tx := txA
			txA = nil
			return tx.Commit(ctx)
		}
		return inTx(t, pool, "", func(tx pgx.Tx) (err error) {
			first, err = idem.WithIdempotency(ctx, tx, key, c.fn(key), s.Opt)
			if err == nil && first.Replayed {
				err = errors.New("A's retry replayed, but A never committed")
			}
			return err
		})
	})
	require.NoError(t, err)
	if retries > 0 {
		t.Logf("A's commit failed with 40001/40P01; A ran again (%d retries)", retries)
	}
	res, err = idem.Do(ctx, pool, key, c.fn(key), s.Opt, idem.NoWait())
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, first.Value, res.Value)
	require.Equal(t, 1, s.CountEffects(t, pool, key))
}

func TestCallerTxHygieneOnEveryPath(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	c := &counter{s: s}
	ctx := context.Background()
	done := idem.Key{Scope: "u", ID: "done"}
	_, err := idem.Do(ctx, pool, done, c.fn(done), s.Opt)
	require.NoError(t, err)

	boom := errors.New("boom")
	for name, call := range map[string]func(tx pgx.Tx, opts ...idem.Option) error{
		"first run": func(tx pgx.Tx, opts ...idem.Option) error {
			k := idem.Key{Scope: "u", ID: "fresh"}
			_, err := idem.WithIdempotency(ctx, tx, k, c.fn(k), opts...)
			return err
		},
		"replay": func(tx pgx.Tx, opts ...idem.Option) error {
			_, err := idem.WithIdempotency(ctx, tx, done, c.fn(done), opts...)
			return err
		},
		"key reused": func(tx pgx.Tx, opts ...idem.Option) error {
			k := done
			k.Fingerprint = []byte("other")
			_, err := idem.WithIdempotency(ctx, tx, k, c.fn(k), opts...)
			require.ErrorIs(t, err, idem.ErrKeyReused)
			return nil
		},
		"fn error": func(tx pgx.Tx, opts ...idem.Option) error {
			k := idem.Key{Scope: "u", ID: "fails"}
			_, err := idem.WithIdempotency(ctx, tx, k, func(ctx context.Context, tx pgx.Tx) (int, error) {
				_, _ = tx.Exec(ctx, "SELECT 1/0") // aborts the savepoint
				return 0, boom
			}, opts...)
			require.ErrorIs(t, err, boom)
			return nil
		},
		"permanent": func(tx pgx.Tx, opts ...idem.Option) error {
			k := idem.Key{Scope: "u", ID: "permanent"}
			_, err := idem.WithIdempotency(ctx, tx, k, func(ctx context.Context, tx pgx.Tx) (int, error) {
				return 0, idem.Permanent(boom)
			}, opts...)
			require.ErrorIs(t, err, boom)
			return nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			for _, noWait := range []bool{false, true} {
				tx, err := pool.Begin(ctx)
				require.NoError(t, err)
				defer tx.Rollback(ctx) //nolint:errcheck
				_, err = tx.Exec(ctx, "SET LOCAL lock_timeout = '4s'; SAVEPOINT mine")
				require.NoError(t, err)
				opts := []idem.Option{s.Opt}
				if noWait {
					opts = append(opts, idem.NoWait())
					// Other plans for the planner to consider: the no-wait
					// claim must restore lock_timeout whatever it picks
					// (geqo_threshold = 2 once made it skip the restore for
					// a key that was not claimed, when the restore hung on
					// a join).
					_, err = tx.Exec(ctx, `SET LOCAL geqo_threshold = 2; SET LOCAL enable_nestloop = off;
						SET LOCAL enable_hashagg = off; SET LOCAL enable_material = off; SET LOCAL jit = off`)
					require.NoError(t, err)
				}
				require.NoError(t, call(tx, opts...))
				require.Equal(t, "4s", show(t, tx, "lock_timeout"))
				require.False(t, savepointExists(t, tx, "idem_fn"))
				require.False(t, savepointExists(t, tx, "idem_claim"))
				require.True(t, savepointExists(t, tx, "mine"))
				require.NoError(t, tx.Rollback(ctx))
			}
		})
	}
}

func TestTTLExpiryTakeover(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	c := &counter{s: s}
	key := newKey(t)
	ctx := context.Background()
	ttl := idem.WithTTL(time.Hour)

	r1, err := idem.Do(ctx, pool, key, c.fn(key), s.Opt, ttl)
	require.NoError(t, err)
	r2, err := idem.Do(ctx, pool, key, c.fn(key), s.Opt, ttl)
	require.NoError(t, err)
	require.True(t, r2.Replayed, "replayed while the record lives")
	require.Equal(t, r1.Value, r2.Value)

	expireRecord(t, pool, s, key)
	// 20 concurrent callers find the record expired: exactly one takes it
	// over, the others replay the new result.
	var wg sync.WaitGroup
	var mu sync.Mutex
	values := map[string]int{}
	for range 20 {
		wg.Go(func() {
			r, err := idem.Do(ctx, pool, key, c.fn(key), s.Opt, ttl)
			require.NoError(t, err)
			mu.Lock()
			values[r.Value]++
			mu.Unlock()
		})
	}
	wg.Wait()
	require.Len(t, values, 1)
	require.NotContains(t, values, r1.Value)
	require.Equal(t, 2, s.CountEffects(t, pool, key))
	rec := s.ReadRecord(t, pool, key)
	require.Equal(t, 2, rec.Attempt)

	// Inside a caller's transaction, too, and the default TTL keeps it: the
	// new record expires a DefaultTTL from its claim, not the call's hour.
	expireRecord(t, pool, s, key)
	var r3 idem.Result[string]
	var claimedAt time.Time
	require.NoError(t, inTx(t, pool, pgx.ReadCommitted, func(tx pgx.Tx) (err error) {
		if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&claimedAt); err != nil {
			return err
		}
		r3, err = idem.WithIdempotency(ctx, tx, key, c.fn(key), s.Opt)
		return err
	}))
	require.False(t, r3.Replayed)
	var expiresAt time.Time
	require.NoError(t, pool.QueryRow(ctx, `SELECT expires_at FROM `+s.Records+` WHERE scope = $1 AND key = $2`,
		key.Scope, key.ID).Scan(&expiresAt))
	require.GreaterOrEqual(t, expiresAt.Sub(claimedAt), idem.DefaultTTL)
	r4, err := idem.Do(ctx, pool, key, c.fn(key), s.Opt)
	require.NoError(t, err)
	require.True(t, r4.Replayed)
	require.Equal(t, r3.Value, r4.Value)
	require.Equal(t, 3, s.CountEffects(t, pool, key))
}

func TestFingerprintMismatch(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	c := &counter{s: s}
	ctx := context.Background()
	key := idem.Key{Scope: "u", ID: "k", Fingerprint: []byte{1, 2, 3}}
	_, err := idem.Do(ctx, pool, key, c.fn(key), s.Opt)
	require.NoError(t, err)

	other := key
	other.Fingerprint = []byte{9}
	_, err = idem.Do(ctx, pool, other, c.fn(other), s.Opt)
	require.ErrorIs(t, err, idem.ErrKeyReused)
	require.NoError(t, inTx(t, pool, pgx.ReadCommitted, func(tx pgx.Tx) error {
		_, err := idem.WithIdempotency(ctx, tx, other, c.fn(other), s.Opt)
		require.ErrorIs(t, err, idem.ErrKeyReused)
		return nil
	}))
	none := key
	none.Fingerprint = nil
	_, err = idem.Do(ctx, pool, none, c.fn(none), s.Opt)
	require.ErrorIs(t, err, idem.ErrKeyReused, "a missing fingerprint is a different one")

	same, err := idem.Do(ctx, pool, key, c.fn(key), s.Opt)
	require.NoError(t, err)
	require.True(t, same.Replayed)
	require.EqualValues(t, 1, c.runs.Load())
}

func TestPermanentErrorIsRecordedAndReplayed(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	insufficient := errors.New("insufficient funds")
	var runs atomic.Int64
	fn := func(key idem.Key) func(context.Context, pgx.Tx) (int, error) {
		return func(ctx context.Context, tx pgx.Tx) (int, error) {
			runs.Add(1)
			if err := s.AddEffect(ctx, tx, key, "should be rolled back"); err != nil {
				return 0, err
			}
			return 0, idem.Permanent(fmt.Errorf("charge: %w", insufficient))
		}
	}
	for _, viaDo := range []bool{true, false} {
		key := idem.Key{Scope: "u", ID: fmt.Sprintf("perm-%v", viaDo)}
		call := func() (idem.Result[int], error) {
			if viaDo {
				return idem.Do(ctx, pool, key, fn(key), s.Opt)
			}
			var res idem.Result[int]
			var callErr error
			require.NoError(t, inTx(t, pool, pgx.ReadCommitted, func(tx pgx.Tx) error {
				res, callErr = idem.WithIdempotency(ctx, tx, key, fn(key), s.Opt)
				return nil // commit the recorded failure
			}))
			return res, callErr
		}
		runs.Store(0)
		res, err := call()
		require.ErrorIs(t, err, insufficient)
		require.True(t, idem.IsPermanent(err))
		require.False(t, res.Replayed)
		require.Equal(t, 0, s.CountEffects(t, pool, key), "fn's writes are rolled back")
		rec := s.ReadRecord(t, pool, key)
		require.Equal(t, idem.StatusFailed, rec.Status)

		res, err2 := call()
		require.True(t, res.Replayed)
		require.True(t, idem.IsPermanent(err2))
		require.Equal(t, err.Error(), err2.Error(), "the replay returns the same error")
		var rerr *idem.RecordedError
		require.ErrorAs(t, err2, &rerr)
		require.EqualValues(t, 1, runs.Load())
	}
}

func TestFnErrorLeavesNothing(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	key := newKey(t)
	boom := errors.New("transient")
	failing := func(ctx context.Context, tx pgx.Tx) (string, error) {
		if err := s.AddEffect(ctx, tx, key, "x"); err != nil {
			return "", err
		}
		return "", boom
	}
	_, err := idem.Do(ctx, pool, key, failing, s.Opt)
	require.ErrorIs(t, err, boom)
	require.Nil(t, s.ReadRecord(t, pool, key))

	// Inside a caller's transaction: fn's writes and the claim go, the
	// caller's own writes stay and commit.
	require.NoError(t, inTx(t, pool, pgx.ReadCommitted, func(tx pgx.Tx) error {
		_, err := idem.WithIdempotency(ctx, tx, key, failing, s.Opt)
		require.ErrorIs(t, err, boom)
		return s.AddEffect(ctx, tx, idem.Key{Scope: "caller", ID: "own"}, "kept")
	}))
	require.Nil(t, s.ReadRecord(t, pool, key))
	require.Equal(t, 0, s.CountEffects(t, pool, key))
	require.Equal(t, 1, s.CountEffects(t, pool, idem.Key{Scope: "caller", ID: "own"}))

	c := &counter{s: s}
	res, err := idem.Do(ctx, pool, key, c.fn(key), s.Opt)
	require.NoError(t, err)
	require.False(t, res.Replayed, "a retry runs fn")
	require.Equal(t, 1, s.CountEffects(t, pool, key))
}

func TestPanicIsReraisedAndLeavesNothing(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	key := newKey(t)
	panicky := func(ctx context.Context, tx pgx.Tx) (string, error) {
		if err := s.AddEffect(ctx, tx, key, "x"); err != nil {
			return "", err
		}
		panic("kaboom")
	}
	require.PanicsWithValue(t, "kaboom", func() { _, _ = idem.Do(ctx, pool, key, panicky, s.Opt) })
	require.Nil(t, s.ReadRecord(t, pool, key))

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	require.PanicsWithValue(t, "kaboom", func() { _, _ = idem.WithIdempotency(ctx, tx, key, panicky, s.Opt) })
	// The caller's transaction survived the panic and can commit.
	require.NoError(t, s.AddEffect(ctx, tx, idem.Key{Scope: "caller", ID: "own"}, "kept"))
	require.NoError(t, tx.Commit(ctx))
	require.Nil(t, s.ReadRecord(t, pool, key))
	require.Equal(t, 0, s.CountEffects(t, pool, key))

	c := &counter{s: s}
	res, err := idem.Do(ctx, pool, key, c.fn(key), s.Opt)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, 1, s.CountEffects(t, pool, key))
}

func TestContextCancelledMidFn(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	key := newKey(t)
	for _, viaDo := range []bool{true, false} {
		ctx, cancel := context.WithCancel(context.Background())
		slow := func(ctx context.Context, tx pgx.Tx) (string, error) {
			if err := s.AddEffect(ctx, tx, key, "x"); err != nil {
				return "", err
			}
			marker := "pg_sleep(5) -- " + s.Name
			cancelWhenRunning(t, ctx, marker, cancel)
			_, err := tx.Exec(ctx, "SELECT "+marker)
			return "late", err
		}
		if viaDo {
			_, err := idem.Do(ctx, pool, key, slow, s.Opt)
			require.ErrorIs(t, err, context.Canceled)
		} else {
			tx, err := pool.Begin(context.Background())
			require.NoError(t, err)
			defer tx.Rollback(context.Background()) //nolint:errcheck
			_, err = idem.WithIdempotency(ctx, tx, key, slow, s.Opt)
			require.Error(t, err)
			_ = tx.Commit(context.Background()) // a careless caller: still nothing may commit
		}
		cancel()
		require.Nil(t, s.ReadRecord(t, pool, key))
		require.Equal(t, 0, s.CountEffects(t, pool, key))
	}
	c := &counter{s: s}
	res, err := idem.Do(context.Background(), pool, key, c.fn(key), s.Opt)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, 1, s.CountEffects(t, pool, key))
}

func TestTerminatedBackendMidFn(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	key := newKey(t)
	ctx := context.Background()
	var runs atomic.Int64
	victim := func(ctx context.Context, tx pgx.Tx) (string, error) {
		runs.Add(1)
		if err := s.AddEffect(ctx, tx, key, "doomed"); err != nil {
			return "", err
		}
		var pid int
		if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return "", err
		}
		if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
			return "", err
		}
		_, err := tx.Exec(ctx, "SELECT 1")
		return "unreachable", err
	}
	// With Do's retries of an unavailable database off (the victim would
	// have itself terminated on every attempt): the caller gets the error.
	_, err := idem.Do(ctx, pool, key, victim, s.Opt, idem.WithRetry(idem.RetryPolicy{Outage: -1}))
	require.Error(t, err)
	require.Nil(t, s.ReadRecord(t, pool, key))
	require.Equal(t, 0, s.CountEffects(t, pool, key))

	c := &counter{s: s}
	res, err := idem.Do(ctx, pool, key, c.fn(key), s.Opt)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.EqualValues(t, 1, c.runs.Load(), "the retry runs fn once")
	require.Equal(t, 1, s.CountEffects(t, pool, key))
	require.EqualValues(t, 1, runs.Load())
}

func TestInvalidKeysFailBeforeSQL(t *testing.T) {
	long := make([]byte, idem.MaxKeyLen+1)
	for i := range long {
		long[i] = 'a'
	}
	cases := map[string]idem.Key{
		"empty id":          {Scope: "s", ID: ""},
		"empty scope":       {Scope: "", ID: "k"},
		"long id":           {Scope: "s", ID: string(long)},
		"long scope":        {Scope: string(long), ID: "k"},
		"invalid utf8 id":   {Scope: "s", ID: "k\xff"},
		"invalid utf8 scop": {Scope: "\xc3\x28", ID: "k"},
		"nul":               {Scope: "s", ID: "a\x00b"},
		"control":           {Scope: "s", ID: "a\nb"},
		"control scope":     {Scope: "s\t", ID: "k"},
		"del":               {Scope: "s", ID: "a\x7fb"},
		"format char":       {Scope: "s", ID: "a\u200bb"},
	}
	fn := func(context.Context, pgx.Tx) (int, error) { panic("fn must not run") }
	for name, key := range cases {
		t.Run(name, func(t *testing.T) {
			// A nil transaction and database prove no SQL is attempted.
			_, err := idem.WithIdempotency(context.Background(), nil, key, fn)
			require.ErrorIs(t, err, idem.ErrInvalidKey)
			_, err = idem.Do(context.Background(), nil, key, fn)
			require.ErrorIs(t, err, idem.ErrInvalidKey)
			var ike *idem.InvalidKeyError
			require.ErrorAs(t, err, &ike)
		})
	}
	exact := string(long[:idem.MaxKeyLen])
	require.NoError(t, idem.Key{Scope: exact, ID: "订单-42 ✓"}.Validate())
}

func TestRepeatableReadConflictSurfacesAs40001(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	c := &counter{s: s}
	key := newKey(t)
	ctx := context.Background()
	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		key.ID = string(iso)
		// B takes its snapshot, then A commits the key, then B claims.
		txB, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
		require.NoError(t, err)
		_, err = txB.Exec(ctx, "SELECT 1")
		require.NoError(t, err)
		_, err = idem.Do(ctx, pool, key, c.fn(key), s.Opt)
		require.NoError(t, err)
		_, err = idem.WithIdempotency(ctx, txB, key, c.fn(key), s.Opt)
		require.True(t, idem.IsRetryable(err), "want 40001, got %v", err)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "40001", pgErr.Code)
		require.NoError(t, txB.Rollback(ctx))
		require.Equal(t, 1, s.CountEffects(t, pool, key))
	}
}

func TestCustomCodecAndRawBytes(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	key := newKey(t)
	raw := []byte{0, 1, 2, 255}
	r1, err := idem.Do(ctx, pool, key, func(context.Context, pgx.Tx) ([]byte, error) { return raw, nil }, s.Opt)
	require.NoError(t, err)
	require.Equal(t, raw, r1.Value)
	var stored []byte
	require.NoError(t, pool.QueryRow(ctx, `SELECT response FROM `+s.Records+` WHERE key = $1`, key.ID).Scan(&stored))
	require.Equal(t, raw, stored, "[]byte is stored as it is")
	r2, err := idem.Do(ctx, pool, key, func(context.Context, pgx.Tx) ([]byte, error) { return nil, errors.New("must not run") }, s.Opt)
	require.NoError(t, err)
	require.True(t, r2.Replayed)
	require.Equal(t, raw, r2.Value)

	type order struct {
		ID    int
		Total string
	}
	k2 := idem.Key{Scope: "u", ID: "codec"}
	codec := upperCodec{}
	r3, err := idem.Do(ctx, pool, k2, func(context.Context, pgx.Tx) (order, error) { return order{7, "9.99"}, nil }, s.Opt, idem.WithCodec(codec))
	require.NoError(t, err)
	require.NoError(t, pool.QueryRow(ctx, `SELECT response FROM `+s.Records+` WHERE key = $1`, k2.ID).Scan(&stored))
	require.Equal(t, `CODEC:{"ID":7,"Total":"9.99"}`, string(stored))
	r4, err := idem.Do(ctx, pool, k2, func(context.Context, pgx.Tx) (order, error) { return order{}, errors.New("must not run") }, s.Opt, idem.WithCodec(codec))
	require.NoError(t, err)
	require.True(t, r4.Replayed)
	require.Equal(t, r3.Value, r4.Value)
}

type upperCodec struct{}

func (upperCodec) Marshal(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	return append([]byte("CODEC:"), b...), err
}

func (upperCodec) Unmarshal(data []byte, v any) error {
	if len(data) < 6 || string(data[:6]) != "CODEC:" {
		return errors.New("not written by upperCodec")
	}
	return json.Unmarshal(data[6:], v)
}

// A context cancelled after fn returned but before the result was recorded:
// nothing may commit, even for a caller who commits after the error.
func TestContextCancelledBeforeCompletion(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	key := newKey(t)
	ctx, cancel := context.WithCancel(context.Background())
	tx, err := pool.Begin(context.Background())
	require.NoError(t, err)
	defer tx.Rollback(context.Background()) //nolint:errcheck
	_, err = idem.WithIdempotency(ctx, tx, key, func(ctx context.Context, tx pgx.Tx) (string, error) {
		err := s.AddEffect(ctx, tx, key, "x")
		cancel() // the request is abandoned as fn finishes
		return "done", err
	}, s.Opt)
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, tx.Commit(context.Background()), "a careless caller commits anyway")
	require.Nil(t, s.ReadRecord(t, pool, key))
	require.Equal(t, 0, s.CountEffects(t, pool, key), "fn's writes went with the claim")
}

// An expired record is absent, whatever fingerprint it was made with.
func TestExpiredRecordWithOtherFingerprintIsTakenOver(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	c := &counter{s: s}
	ctx := context.Background()
	ttl := idem.WithTTL(time.Hour)
	first := idem.Key{Scope: "u", ID: "k", Fingerprint: []byte("body A")}
	_, err := idem.Do(ctx, pool, first, c.fn(first), s.Opt, ttl)
	require.NoError(t, err)
	expireRecord(t, pool, s, first)
	second := idem.Key{Scope: "u", ID: "k", Fingerprint: []byte("body B")}
	res, err := idem.Do(ctx, pool, second, c.fn(second), s.Opt, ttl)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	again, err := idem.Do(ctx, pool, second, c.fn(second), s.Opt)
	require.NoError(t, err)
	require.True(t, again.Replayed, "the new record carries the new fingerprint")
	_, err = idem.Do(ctx, pool, first, c.fn(first), s.Opt)
	require.ErrorIs(t, err, idem.ErrKeyReused)
}

// The TTL counts from the claim, not from the start of a long transaction:
// the record expires a TTL after the database clock at the claim, later than
// the transaction's now() plus the TTL, so it is never born expired.
func TestTTLCountsFromTheClaim(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	c := &counter{s: s}
	ctx := context.Background()
	key := newKey(t)
	const ttl = time.Hour
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	var started, claimedAt time.Time
	require.NoError(t, tx.QueryRow(ctx, "SELECT now()").Scan(&started)) // now() is fixed here
	// The transaction ages by the database clock.
	require.NoError(t, tx.QueryRow(ctx, "SELECT clock_timestamp() FROM pg_sleep(0.2)").Scan(&claimedAt))
	require.Greater(t, claimedAt.Sub(started), 100*time.Millisecond)
	_, err = idem.WithIdempotency(ctx, tx, key, c.fn(key), s.Opt, idem.WithTTL(ttl))
	require.NoError(t, err)
	var expiresAt time.Time
	require.NoError(t, tx.QueryRow(ctx, `SELECT expires_at FROM `+s.Records+` WHERE scope = $1 AND key = $2`,
		key.Scope, key.ID).Scan(&expiresAt))
	require.GreaterOrEqual(t, expiresAt.Sub(claimedAt), ttl, "the TTL counts from the claim, not from the transaction's start")
	require.NoError(t, tx.Commit(ctx))
	res, err := idem.Do(ctx, pool, key, c.fn(key), s.Opt, idem.WithTTL(ttl))
	require.NoError(t, err)
	require.True(t, res.Replayed, "a record is never born expired")
	require.Equal(t, 1, s.CountEffects(t, pool, key))
}

// The caller's own lock_timeout can end the wait for a key's holder: that is
// an aborting 55P03, not the non-aborting ErrInProgress of NoWait.
func TestCallerLockTimeoutIsNotInProgress(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	c := &counter{s: s}
	ctx := context.Background()
	key := newKey(t)
	txA, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer txA.Rollback(ctx) //nolint:errcheck
	_, err = idem.WithIdempotency(ctx, txA, key, c.fn(key), s.Opt)
	require.NoError(t, err)

	txB, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer txB.Rollback(ctx) //nolint:errcheck
	_, err = txB.Exec(ctx, "SET LOCAL lock_timeout = '100ms'")
	require.NoError(t, err)
	_, err = idem.WithIdempotency(ctx, txB, key, c.fn(key), s.Opt)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "55P03", pgErr.Code)
	require.NotErrorIs(t, err, idem.ErrInProgress)
}

// Handles fn obtained stop working when fn returns.
func TestFnHandlesDieWithFn(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	var leaked, leakedSP pgx.Tx
	res, err := idem.Do(ctx, pool, newKey(t), func(ctx context.Context, tx pgx.Tx) (int, error) {
		leaked = tx
		sp, err := tx.Begin(ctx)
		if err != nil {
			return 0, err
		}
		leakedSP = sp
		require.ErrorContains(t, tx.Commit(ctx), "must not commit")
		if _, err := sp.Exec(ctx, "SELECT 1"); err != nil {
			return 0, err
		}
		return 1, sp.Commit(ctx)
	}, s.Opt)
	require.NoError(t, err)
	require.Equal(t, 1, res.Value)
	_, err = leaked.Exec(ctx, "SELECT 1")
	require.ErrorIs(t, err, pgx.ErrTxClosed)
	_, err = leakedSP.Exec(ctx, "SELECT 1")
	require.ErrorIs(t, err, pgx.ErrTxClosed)
	_, err = leakedSP.Begin(ctx)
	require.ErrorIs(t, err, pgx.ErrTxClosed)
	// Query's error is in its Rows too, which pgx lets callers rely on.
	rows, _ := leaked.Query(ctx, "SELECT 1")
	require.NotNil(t, rows)
	_, err = pgx.CollectRows(rows, pgx.RowTo[int])
	require.ErrorIs(t, err, pgx.ErrTxClosed)
}

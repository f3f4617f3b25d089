package idemmysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
)

// Both ways of reading the claim's answer: MariaDB's RETURNING, and the
// SELECT ... FOR UPDATE that MySQL 8 needs, run against the same server.
func claimReads(t *testing.T, run func(t *testing.T)) {
	t.Run("returning", run)
	t.Run("select-for-update", func(t *testing.T) {
		t.Cleanup(idemmysql.UseClaimRead())
		run(t)
	})
}

func TestDoRunsOnceAndReplays(t *testing.T) {
	claimReads(t, func(t *testing.T) {
		db := openDB(t)
		ctx := context.Background()
		key := idem.Key{Scope: "signup", ID: "user-1:activity-7"}
		runs := 0
		fn := func(ctx context.Context, tx *sql.Tx) (string, error) {
			runs++
			return "seat-12", insertEffect(ctx, tx, key.ID, runs)
		}
		first, err := idemmysql.Do(ctx, db, key, fn)
		require.NoError(t, err)
		require.False(t, first.Replayed)
		second, err := idemmysql.Do(ctx, db, key, fn)
		require.NoError(t, err)
		require.True(t, second.Replayed)
		require.Equal(t, "seat-12", second.Value)
		require.Equal(t, 1, runs)
		require.Equal(t, 1, effects(t, db, key.ID))

		// WithIdempotency in the caller's transaction replays it too.
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		third, err := idemmysql.WithIdempotency(ctx, tx, key, fn)
		require.NoError(t, err)
		require.True(t, third.Replayed)
		require.NoError(t, tx.Commit())
		require.Equal(t, 1, runs)
	})
}

// A storm on one key: one effect, every caller the same answer.
func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	claimReads(t, func(t *testing.T) {
		db := openDB(t)
		ctx := context.Background()
		key := idem.Key{Scope: "pay", ID: "order-1"}
		var runs atomic.Int32
		const callers = 200
		var wg sync.WaitGroup
		results := make([]int, callers)
		errs := make([]error, callers)
		for i := range callers {
			wg.Go(func() {
				res, err := idemmysql.Do(ctx, db, key, func(ctx context.Context, tx *sql.Tx) (int, error) {
					n := int(runs.Add(1))
					return n, insertEffect(ctx, tx, key.ID, n)
				})
				results[i], errs[i] = res.Value, err
			})
		}
		wg.Wait()
		for i := range callers {
			require.NoError(t, errs[i])
			require.Equal(t, results[0], results[i])
		}
		require.Equal(t, 1, effects(t, db, key.ID))
	})
}

// heldClaim claims key in a transaction of its own and keeps it until the
// returned function is called with the outcome of fn: nil commits, an
// error rolls back.
func heldClaim(t *testing.T, db *sql.DB, key idem.Key) (finish func(error)) {
	t.Helper()
	ctx := context.Background()
	claimed := make(chan struct{})
	outcome := make(chan error)
	done := make(chan error, 1)
	go func() {
		_, err := idemmysql.Do(ctx, db, key, func(ctx context.Context, tx *sql.Tx) (int, error) {
			if err := insertEffect(ctx, tx, key.ID, 0); err != nil {
				return 0, err
			}
			close(claimed)
			return 0, <-outcome
		})
		done <- err
	}()
	select {
	case <-claimed:
	case err := <-done:
		t.Fatalf("the holder failed: %v", err)
	}
	var once sync.Once
	finish = func(err error) {
		once.Do(func() {
			outcome <- err
			<-done
		})
	}
	t.Cleanup(func() { finish(errors.New("test over")) })
	return finish
}

// When the first execution rolls back with duplicates waiting, InnoDB ends
// all but one of them with a deadlock: Do retries those into a replay or a
// single run, so there is one effect and no error.
func TestWinnerRollsBackWithWaiters(t *testing.T) {
	claimReads(t, func(t *testing.T) {
		db := openDB(t)
		ctx := context.Background()
		key := idem.Key{Scope: "pay", ID: "order-2"}
		finish := heldClaim(t, db, key)
		before := deadlocks(t, db)
		var runs atomic.Int32
		var wg sync.WaitGroup
		errs := make([]error, 20)
		for i := range 20 {
			wg.Go(func() {
				_, errs[i] = idemmysql.Do(ctx, db, key, func(ctx context.Context, tx *sql.Tx) (int, error) {
					runs.Add(1)
					return 1, insertEffect(ctx, tx, key.ID, 1)
				})
			})
		}
		waitFor(t, 10*time.Second, "20 waiters", func() bool { return claimsRunning(t, db) >= 20 })
		finish(errors.New("the first execution fails"))
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		require.EqualValues(t, 1, runs.Load())
		require.Equal(t, 1, effects(t, db, key.ID))
		t.Logf("deadlocks the server dealt, all retried: %d", deadlocks(t, db)-before)
	})
}

// In the caller's transaction, a deadlock is a *TxAbortedError that
// idem.IsRetryable reports, and nothing of the transaction survives: not
// the caller's own write before the call, not a record.
func TestDeadlockInCallersTransaction(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	key := idem.Key{Scope: "pay", ID: "order-3"}
	finish := heldClaim(t, db, key)
	type outcome struct {
		res  idem.Result[int]
		err  error
		mine string
	}
	out := make([]outcome, 20)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			mine := fmt.Sprintf("before-%d", i)
			out[i].mine = mine
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				out[i].err = err
				return
			}
			if err := insertEffect(ctx, tx, mine, i); err != nil {
				out[i].err = err
				return
			}
			out[i].res, out[i].err = idemmysql.WithIdempotency(ctx, tx, key, func(ctx context.Context, tx *sql.Tx) (int, error) {
				return i, insertEffect(ctx, tx, key.ID, i)
			})
			if out[i].err == nil {
				out[i].err = tx.Commit()
			} else {
				// database/sql does not know the server rolled tx back:
				// Commit "succeeds", which must commit nothing.
				_ = tx.Commit()
			}
		})
	}
	waitFor(t, 10*time.Second, "20 waiters", func() bool { return claimsRunning(t, db) >= 20 })
	finish(errors.New("the first execution fails"))
	wg.Wait()
	ran, aborted := 0, 0
	for _, o := range out {
		var ta *idemmysql.TxAbortedError
		switch {
		case o.err == nil && !o.res.Replayed:
			ran++
			require.Equal(t, 1, effects(t, db, o.mine))
		case o.err == nil:
			require.Equal(t, 1, effects(t, db, o.mine))
		case errors.As(o.err, &ta):
			aborted++
			require.True(t, idem.IsRetryable(o.err), "%v", o.err)
			require.Zero(t, effects(t, db, o.mine), "the aborted transaction's own write survived")
		default:
			t.Fatalf("unexpected error: %v", o.err)
		}
	}
	require.Equal(t, 1, ran)
	require.Positive(t, aborted, "no waiter met the deadlock this test is about")
	require.Equal(t, 1, effects(t, db, key.ID))
	t.Logf("ran 1, aborted %d, replayed %d", aborted, 20-1-aborted)
}

// Keys are byte-exact: no collation folds case, accents or trailing
// spaces into another key.
func TestKeysAreByteExact(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	ids := []string{"Abc", "abc", "abc ", "é", "e", "ß", "ss"}
	for i, id := range ids {
		res, err := idemmysql.Do(ctx, db, idem.Key{Scope: "s", ID: id}, func(ctx context.Context, tx *sql.Tx) (int, error) {
			return i, insertEffect(ctx, tx, "exact", i)
		})
		require.NoError(t, err)
		require.False(t, res.Replayed, "%q replayed another key's result", id)
		require.Equal(t, i, res.Value)
	}
	require.Equal(t, len(ids), effects(t, db, "exact"))
}

// A key over 255 bytes is refused before any SQL, never cut into another.
func TestLongKeyRefused(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	long := strings.Repeat("k", 256)
	_, err := idemmysql.Do(ctx, db, idem.Key{Scope: "s", ID: long}, func(ctx context.Context, tx *sql.Tx) (int, error) {
		return 0, insertEffect(ctx, tx, "long", 1)
	})
	require.ErrorIs(t, err, idem.ErrInvalidKey)
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM idempotent_record`).Scan(&n))
	require.Zero(t, n)
	require.Zero(t, effects(t, db, "long"))
	_, err = idemmysql.ConsumeOnce(ctx, nil, "c", long, func(context.Context, *sql.Tx) error { return nil })
	require.ErrorIs(t, err, idem.ErrInvalidKey)
}

// The session's time_zone cannot move an expiry: a record written under
// one zone is not expired under another.
func TestTimeZoneCannotMoveExpiry(t *testing.T) {
	west := openDB(t, "time_zone='-05:00'")
	ctx := context.Background()
	var zone string
	require.NoError(t, west.QueryRow(`SELECT @@session.time_zone`).Scan(&zone))
	require.Equal(t, "-05:00", zone)
	key := idem.Key{Scope: "tz", ID: "k"}
	fn := func(ctx context.Context, tx *sql.Tx) (int, error) { return 1, insertEffect(ctx, tx, "tz", 1) }
	_, err := idemmysql.Do(ctx, west, key, fn, idem.WithTTL(time.Hour))
	require.NoError(t, err)
	// The same database through a session ten hours east.
	var name string
	require.NoError(t, west.QueryRow(`SELECT DATABASE()`).Scan(&name))
	conn, err := west.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, `SET time_zone = '+05:00'`)
	require.NoError(t, err)
	tx, err := conn.BeginTx(ctx, nil)
	require.NoError(t, err)
	res, err := idemmysql.WithIdempotency(ctx, tx, key, fn)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	require.True(t, res.Replayed, "the record looked expired under another time_zone")
	require.Equal(t, 1, effects(t, west, "tz"))
}

// With clientFoundRows=true a duplicate's no-op upsert reports 1 row, as an
// insert does: ownership comes from the claim token, so it still replays.
func TestClientFoundRows(t *testing.T) {
	claimReads(t, func(t *testing.T) {
		db := openDB(t, "clientFoundRows=true")
		ctx := context.Background()
		key := idem.Key{Scope: "cfr", ID: "k"}
		var runs atomic.Int32
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				_, err := idemmysql.Do(ctx, db, key, func(ctx context.Context, tx *sql.Tx) (int, error) {
					return int(runs.Add(1)), insertEffect(ctx, tx, key.ID, 1)
				})
				require.NoError(t, err)
			})
		}
		wg.Wait()
		res, err := idemmysql.Do(ctx, db, key, func(context.Context, *sql.Tx) (int, error) { return 0, nil })
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.EqualValues(t, 1, runs.Load())
		require.Equal(t, 1, effects(t, db, key.ID))
	})
}

// Under REPEATABLE READ, a caller whose snapshot predates another
// transaction's commit of the key replays it rather than running fn.
func TestRepeatableReadSnapshotReplays(t *testing.T) {
	claimReads(t, func(t *testing.T) {
		db := openDB(t)
		ctx := context.Background()
		key := idem.Key{Scope: "rr", ID: "k"}
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
		require.NoError(t, err)
		defer tx.Rollback()
		var n int
		require.NoError(t, tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM idempotent_record`).Scan(&n)) // the snapshot
		_, err = idemmysql.Do(ctx, db, key, func(ctx context.Context, tx *sql.Tx) (string, error) {
			return "first", insertEffect(ctx, tx, key.ID, 1)
		})
		require.NoError(t, err)
		res, err := idemmysql.WithIdempotency(ctx, tx, key, func(ctx context.Context, tx *sql.Tx) (string, error) {
			return "second", insertEffect(ctx, tx, key.ID, 2)
		})
		require.NoError(t, err)
		require.True(t, res.Replayed)
		require.Equal(t, "first", res.Value)
		require.NoError(t, tx.Commit())
		require.Equal(t, 1, effects(t, db, key.ID))
	})
}

// A no-wait claim of a key in flight is ErrInProgress at once, and leaves
// the caller's transaction usable and the session's settings as they were.
func TestNoWait(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	key := idem.Key{Scope: "nw", ID: "k"}
	finish := heldClaim(t, db, key)
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	settings := func() string {
		var lwt, mst string
		require.NoError(t, conn.QueryRowContext(ctx, `SELECT @@session.innodb_lock_wait_timeout, @@session.max_statement_time`).Scan(&lwt, &mst))
		return lwt + "/" + mst
	}
	before := settings()
	tx, err := conn.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, insertEffect(ctx, tx, "mine", 1))
	start := time.Now()
	_, err = idemmysql.WithIdempotency(ctx, tx, key, func(context.Context, *sql.Tx) (int, error) { return 0, nil }, idem.NoWait())
	require.ErrorIs(t, err, idem.ErrInProgress)
	t.Logf("no-wait answer in %v", time.Since(start))
	require.NoError(t, insertEffect(ctx, tx, "mine", 2))
	require.NoError(t, tx.Commit())
	require.Equal(t, 2, effects(t, db, "mine"))
	require.Equal(t, before, settings())

	_, err = idemmysql.Do(ctx, db, key, func(context.Context, *sql.Tx) (int, error) { return 0, nil }, idem.NoWait())
	require.ErrorIs(t, err, idem.ErrInProgress)
	finish(nil)
	res, err := idemmysql.Do(ctx, db, key, func(context.Context, *sql.Tx) (int, error) { return 9, nil }, idem.NoWait())
	require.NoError(t, err)
	require.True(t, res.Replayed)
}

// A ctx deadline ends the claim's wait on the server too, not only in the
// client: the server would otherwise wait innodb_lock_wait_timeout (50s).
func TestDeadlineEndsTheServersWait(t *testing.T) {
	db := openDB(t)
	key := idem.Key{Scope: "dl", ID: "k"}
	heldClaim(t, db, key)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := idemmysql.Do(ctx, db, key, func(context.Context, *sql.Tx) (int, error) { return 0, nil })
	require.ErrorIs(t, err, context.DeadlineExceeded)
	waitFor(t, 5*time.Second, "the server's wait to end", func() bool { return claimsRunning(t, db) == 0 })
}

// An expired record is taken over, with a new attempt.
func TestExpiredRecordTakenOver(t *testing.T) {
	claimReads(t, func(t *testing.T) {
		db := openDB(t)
		ctx := context.Background()
		key := idem.Key{Scope: "ttl", ID: "k"}
		fn := func(ctx context.Context, tx *sql.Tx) (int, error) { return 1, insertEffect(ctx, tx, key.ID, 1) }
		_, err := idemmysql.Do(ctx, db, key, fn)
		require.NoError(t, err)
		_, err = db.Exec(`UPDATE idempotent_record SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND`)
		require.NoError(t, err)
		res, err := idemmysql.Do(ctx, db, key, fn)
		require.NoError(t, err)
		require.False(t, res.Replayed)
		var attempt int
		require.NoError(t, db.QueryRow(`SELECT attempt FROM idempotent_record`).Scan(&attempt))
		require.Equal(t, 2, attempt)
		require.Equal(t, 2, effects(t, db, key.ID))
	})
}

// A Permanent failure is recorded without fn's writes, and replayed.
func TestPermanentFailureRecorded(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	key := idem.Key{Scope: "perm", ID: "k"}
	runs := 0
	fn := func(ctx context.Context, tx *sql.Tx) (int, error) {
		runs++
		if err := insertEffect(ctx, tx, key.ID, 1); err != nil {
			return 0, err
		}
		return 0, idem.Permanent(errors.New("card declined"))
	}
	_, err := idemmysql.Do(ctx, db, key, fn)
	require.True(t, idem.IsPermanent(err))
	_, err = idemmysql.Do(ctx, db, key, fn)
	require.ErrorContains(t, err, "card declined")
	require.Equal(t, 1, runs)
	require.Zero(t, effects(t, db, key.ID))

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	inTx := idem.Key{Scope: "perm", ID: "in-tx"}
	_, err = idemmysql.WithIdempotency(ctx, tx, inTx, fn)
	require.True(t, idem.IsPermanent(err))
	require.NoError(t, tx.Commit())
	require.Zero(t, effects(t, db, key.ID))
	var status string
	require.NoError(t, db.QueryRow(`SELECT status FROM idempotent_record WHERE idem_key = 'in-tx'`).Scan(&status))
	require.Equal(t, "failed", status)
}

// fn's error in the caller's transaction removes the claim and fn's
// writes, and leaves the transaction usable.
func TestFnErrorInCallersTransaction(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	key := idem.Key{Scope: "err", ID: "k"}
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = idemmysql.WithIdempotency(ctx, tx, key, func(ctx context.Context, tx *sql.Tx) (int, error) {
		if err := insertEffect(ctx, tx, key.ID, 1); err != nil {
			return 0, err
		}
		return 0, errors.New("boom")
	})
	require.ErrorContains(t, err, "boom")
	require.NoError(t, insertEffect(ctx, tx, "after", 1))
	require.NoError(t, tx.Commit())
	require.Zero(t, effects(t, db, key.ID))
	require.Equal(t, 1, effects(t, db, "after"))
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM idempotent_record`).Scan(&n))
	require.Zero(t, n)
}

func TestConsumeOnce(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	consume := func(id string, fail bool) (bool, error) {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		ran, err := idemmysql.ConsumeOnce(ctx, tx, "billing", id, func(ctx context.Context, tx *sql.Tx) error {
			if err := insertEffect(ctx, tx, id, 1); err != nil {
				return err
			}
			if fail {
				return errors.New("handler failed")
			}
			return nil
		})
		if err != nil {
			require.NoError(t, tx.Rollback())
			return ran, err
		}
		return ran, tx.Commit()
	}
	ran, err := consume("m-1", false)
	require.NoError(t, err)
	require.True(t, ran)
	ran, err = consume("m-1", false)
	require.NoError(t, err)
	require.False(t, ran)
	_, err = consume("m-2", true)
	require.ErrorContains(t, err, "handler failed")
	ran, err = consume("m-2", false)
	require.NoError(t, err)
	require.True(t, ran)
	require.Equal(t, 1, effects(t, db, "m-1"))
	require.Equal(t, 1, effects(t, db, "m-2"))

	// Redeliveries at once: one processes it; a deadlock among the
	// waiters is a retryable error, redelivered.
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			for {
				_, err := consume("m-3", false)
				if err == nil {
					return
				}
				require.True(t, idem.IsRetryable(err), "%v", err)
			}
		})
	}
	wg.Wait()
	require.Equal(t, 1, effects(t, db, "m-3"))
}

// Table names are validated before any SQL: a name that would break out
// of its quotes is refused, never run.
func TestTableNameValidated(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	_, err := idemmysql.Do(ctx, db, idem.Key{Scope: "s", ID: "k"}, func(context.Context, *sql.Tx) (int, error) { return 0, nil },
		idem.WithTable("", "x`; DROP TABLE effects; --"))
	require.ErrorIs(t, err, idem.ErrInvalidOption)
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM effects`).Scan(&n))
}

// A table that does not exist is explained with how to create it; one
// named with its database works.
func TestTables(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	fn := func(context.Context, *sql.Tx) (int, error) { return 1, nil }
	_, err := idemmysql.Do(ctx, db, idem.Key{Scope: "s", ID: "k"}, fn, idem.WithTable("", "nope"))
	require.ErrorContains(t, err, "does not exist: create it")
	var name string
	require.NoError(t, db.QueryRow(`SELECT DATABASE()`).Scan(&name))
	_, err = idemmysql.Do(ctx, db, idem.Key{Scope: "s", ID: "k"}, fn, idem.WithTable(name, "idempotent_record"))
	require.NoError(t, err)
	require.NoError(t, idemmysql.Migrate(ctx, db), "a second Migrate is a no-op")
}

// With innodb_snapshot_isolation (MariaDB's default from 11.6), a claim on
// a record committed after the caller's REPEATABLE READ snapshot fails with
// 1020 and the server rolls the transaction back: a *TxAbortedError, as for
// a deadlock, with nothing of the transaction left.
func TestSnapshotIsolationConflict(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `SET SESSION innodb_snapshot_isolation = ON`); err != nil {
		t.Skipf("the server has no innodb_snapshot_isolation: %v", err)
	}
	key := idem.Key{Scope: "si", ID: "k"}
	tx, err := conn.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	require.NoError(t, err)
	require.NoError(t, insertEffect(ctx, tx, "mine", 1))
	var n int
	require.NoError(t, tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM idempotent_record`).Scan(&n)) // the snapshot
	_, err = idemmysql.Do(ctx, db, key, func(ctx context.Context, tx *sql.Tx) (int, error) { return 1, insertEffect(ctx, tx, key.ID, 1) })
	require.NoError(t, err)
	_, err = idemmysql.WithIdempotency(ctx, tx, key, func(ctx context.Context, tx *sql.Tx) (int, error) {
		return 2, insertEffect(ctx, tx, key.ID, 2)
	})
	var ta *idemmysql.TxAbortedError
	require.ErrorAs(t, err, &ta, "%v", err)
	require.True(t, idem.IsRetryable(err))
	_ = tx.Commit() // database/sql does not know: it must commit nothing
	require.Zero(t, effects(t, db, "mine"))
	require.Equal(t, 1, effects(t, db, key.ID))
}

// A storm on one key in the callers' own transactions, each of which read
// the record table first (under REPEATABLE READ its snapshot predates the
// winner's commit): one effect, every caller the same answer. A caller
// whose transaction the server ended (a retryable error) runs it again, as
// a client must.
func TestConcurrentDuplicatesInCallersTransactions(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	key := idem.Key{Scope: "pay", ID: "order-tx"}
	const callers = 200
	var runs, retries atomic.Int32
	var wg sync.WaitGroup
	results := make([]int, callers)
	errs := make([]error, callers)
	start := make(chan struct{})
	attempt := func() (int, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback()
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM idempotent_record`).Scan(&n); err != nil {
			return 0, err
		}
		<-start
		res, err := idemmysql.WithIdempotency(ctx, tx, key, func(ctx context.Context, tx *sql.Tx) (int, error) {
			n := int(runs.Add(1))
			return n, insertEffect(ctx, tx, key.ID, n)
		})
		if err != nil {
			return 0, err
		}
		return res.Value, tx.Commit()
	}
	for i := range callers {
		wg.Go(func() {
			for range 10 {
				results[i], errs[i] = attempt()
				if !idem.IsRetryable(errs[i]) {
					return
				}
				retries.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	for i := range callers {
		require.NoError(t, errs[i], "caller %d", i)
		require.Equal(t, results[0], results[i])
	}
	require.Equal(t, 1, effects(t, db, key.ID))
	t.Logf("%d callers, transactions the server ended and the callers retried: %d", callers, retries.Load())
}

// The isolation matrix runs this suite with the DSN's tx_isolation set to
// each level; IDEM_EXPECT_MYSQL_ISOLATION names the one the sessions must
// have (e.g. READ-COMMITTED), so that a matrix run cannot pass at the
// server's default by mistake.
func TestSessionIsolation(t *testing.T) {
	want := os.Getenv("IDEM_EXPECT_MYSQL_ISOLATION")
	if want == "" {
		t.Skip("IDEM_EXPECT_MYSQL_ISOLATION is not set")
	}
	db := openDB(t)
	var got string
	require.NoError(t, db.QueryRow(`SELECT @@SESSION.tx_isolation`).Scan(&got))
	require.Equal(t, want, got)
}

package integration_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/integration/internal/pgtest"
)

func TestIssuedTokens(t *testing.T) {
	pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 20 })
	s := pgtest.NewSchema(t, pool)
	c := &counter{s: s}
	ctx := context.Background()
	req := idem.RequireIssued()

	token, err := idem.IssueToken(ctx, pool, "user:1", time.Hour, s.Opt)
	require.NoError(t, err)
	require.Len(t, token, 56)
	other, err := idem.IssueToken(ctx, pool, "user:1", time.Hour, s.Opt)
	require.NoError(t, err)
	require.NotEqual(t, token, other)
	key := idem.Key{Scope: "user:1", ID: token}

	// 20 concurrent submissions with the token: one execution, one answer.
	var wg sync.WaitGroup
	values := sync.Map{}
	var errs atomic.Int64
	for range 20 {
		wg.Go(func() {
			res, err := idem.Do(ctx, pool, key, c.fn(key), s.Opt, req)
			if err != nil {
				errs.Add(1)
				t.Error(err)
				return
			}
			values.Store(res.Value, true)
		})
	}
	wg.Wait()
	require.Zero(t, errs.Load())
	n := 0
	values.Range(func(any, any) bool { n++; return true })
	require.Equal(t, 1, n)
	require.Equal(t, 1, s.CountEffects(t, pool, key))

	// Reused after completion: replayed, not re-run.
	require.NoError(t, inTx(t, pool, pgx.ReadCommitted, func(tx pgx.Tx) error {
		res, err := idem.WithIdempotency(ctx, tx, key, c.fn(key), s.Opt, req)
		require.NoError(t, err)
		require.True(t, res.Replayed)
		return nil
	}))
	require.EqualValues(t, 1, c.runs.Load())

	// Forged: the right shape for the scope, never issued.
	forged := strings.Repeat("A", 43) + token[43:]
	_, err = idem.Do(ctx, pool, idem.Key{Scope: "user:1", ID: forged}, c.fn(key), s.Opt, req)
	require.ErrorIs(t, err, idem.ErrTokenUnknown)
	require.ErrorIs(t, err, idem.ErrTokenRejected)
	var te *idem.TokenError
	require.ErrorAs(t, err, &te)
	_, err = idem.Do(ctx, pool, idem.Key{Scope: "user:1", ID: "made-up"}, c.fn(key), s.Opt, req)
	require.ErrorIs(t, err, idem.ErrTokenUnknown)

	// Another user's token.
	_, err = idem.Do(ctx, pool, idem.Key{Scope: "user:2", ID: other}, c.fn(key), s.Opt, req)
	require.ErrorIs(t, err, idem.ErrTokenOtherScope)
	_, _, err = idem.Claim[string](ctx, pool, idem.Key{Scope: "user:2", ID: other}, time.Minute, s.Opt, req)
	require.ErrorIs(t, err, idem.ErrTokenOtherScope)

	// Expired before use.
	short, err := idem.IssueToken(ctx, pool, "user:1", time.Hour, s.Opt)
	require.NoError(t, err)
	expireRecord(t, pool, s, idem.Key{Scope: "user:1", ID: short})
	_, err = idem.Do(ctx, pool, idem.Key{Scope: "user:1", ID: short}, c.fn(key), s.Opt, req)
	require.ErrorIs(t, err, idem.ErrTokenExpired)
	require.NoError(t, inTx(t, pool, pgx.ReadCommitted, func(tx pgx.Tx) error {
		_, err := idem.WithIdempotency(ctx, tx, idem.Key{Scope: "user:1", ID: short}, c.fn(key), s.Opt, req)
		require.ErrorIs(t, err, idem.ErrTokenExpired)
		return nil
	}))
	_, _, err = idem.Claim[string](ctx, pool, idem.Key{Scope: "user:1", ID: short}, time.Minute, s.Opt, req)
	require.ErrorIs(t, err, idem.ErrTokenExpired)

	// Claim accepts an issued token once, then reports it in progress.
	lt, err := idem.IssueToken(ctx, pool, "user:1", time.Hour, s.Opt)
	require.NoError(t, err)
	l, _, err := idem.Claim[string](ctx, pool, idem.Key{Scope: "user:1", ID: lt}, time.Minute, s.Opt, req)
	require.NoError(t, err)
	require.EqualValues(t, 1, l.Attempt())
	_, _, err = idem.Claim[string](ctx, pool, idem.Key{Scope: "user:1", ID: lt}, time.Minute, s.Opt, req)
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.NoError(t, l.Complete(ctx, pool, "done"))
	_, res, err := idem.Claim[string](ctx, pool, idem.Key{Scope: "user:1", ID: lt}, time.Minute, s.Opt, req)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, "done", res.Value)

	// Without RequireIssued any key works, tokens included.
	res2, err := idem.Do(ctx, pool, idem.Key{Scope: "user:1", ID: "not-a-token"}, c.fn(key), s.Opt)
	require.NoError(t, err)
	require.False(t, res2.Replayed)
	_, err = idem.IssueToken(ctx, pool, "bad\nscope", time.Hour, s.Opt)
	require.ErrorIs(t, err, idem.ErrInvalidKey)
}

// A token in flight in no-wait mode: the claim of a held token gives up at
// once with ErrInProgress and leaves the caller's transaction and its
// lock_timeout as they were; a new token is claimed; once the holder
// commits, the token replays.
func TestIssuedTokenNoWait(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	c := &counter{s: s}
	ctx := context.Background()
	opts := []idem.Option{s.Opt, idem.RequireIssued(), idem.NoWait()}
	issue := func() idem.Key {
		token, err := idem.IssueToken(ctx, pool, "user:1", time.Hour, s.Opt)
		require.NoError(t, err)
		return idem.Key{Scope: "user:1", ID: token}
	}
	held, fresh := issue(), issue()

	txA, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer txA.Rollback(ctx) //nolint:errcheck
	first, err := idem.WithIdempotency(ctx, txA, held, c.fn(held), opts...)
	require.NoError(t, err)

	txB, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer txB.Rollback(ctx) //nolint:errcheck
	_, err = txB.Exec(ctx, "SET LOCAL lock_timeout = '7s'")
	require.NoError(t, err)
	started := time.Now()
	_, err = idem.WithIdempotency(ctx, txB, held, c.fn(held), opts...)
	require.ErrorIs(t, err, idem.ErrInProgress)
	require.Less(t, time.Since(started), 5*time.Second, "no-wait must not wait for the held token")
	require.Equal(t, "7s", show(t, txB, "lock_timeout"))
	res, err := idem.WithIdempotency(ctx, txB, fresh, c.fn(fresh), opts...)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.Equal(t, "7s", show(t, txB, "lock_timeout"))
	require.NoError(t, txB.Commit(ctx))

	require.NoError(t, txA.Commit(ctx))
	res, err = idem.Do(ctx, pool, held, c.fn(held), doOpts(opts)...)
	require.NoError(t, err)
	require.True(t, res.Replayed)
	require.Equal(t, first.Value, res.Value)
	require.Equal(t, 1, s.CountEffects(t, pool, held))
	require.Equal(t, 1, s.CountEffects(t, pool, fresh))
}

func TestPurge(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	// 2,500 expired records, 5 live ones, one expired record under a live
	// lease, and one expired record another transaction holds.
	_, err := pool.Exec(ctx, `INSERT INTO `+s.Records+` (scope, key, fingerprint, status, response, expires_at)
		SELECT 's', 'old-' || g, '', 'succeeded', '1', clock_timestamp() - interval '1 minute' FROM generate_series(1, 2500) g;
		INSERT INTO `+s.Records+` (scope, key, fingerprint, status, response, expires_at)
		SELECT 's', 'new-' || g, '', 'succeeded', '1', clock_timestamp() + interval '1 hour' FROM generate_series(1, 5) g;
		INSERT INTO `+s.Records+` (scope, key, fingerprint, status, locked_until, expires_at)
		VALUES ('s', 'leased', '', 'processing', clock_timestamp() + interval '1 hour', clock_timestamp() - interval '1 minute'),
		       ('s', 'held', '', 'succeeded', NULL, clock_timestamp() - interval '1 minute')`)
	require.NoError(t, err)
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx) //nolint:errcheck
	_, err = holder.Exec(ctx, `SELECT FROM `+s.Records+` WHERE key = 'held' FOR UPDATE`)
	require.NoError(t, err)

	started := time.Now()
	n, err := idem.Purge(ctx, pool, idem.PurgeParams{BatchSize: 1000}, s.Opt)
	require.NoError(t, err)
	require.Less(t, time.Since(started), 5*time.Second, "the purge did not wait for the held row")
	require.EqualValues(t, 2500, n)
	var keys []string
	rows, err := pool.Query(ctx, `SELECT key FROM `+s.Records+` ORDER BY key`)
	require.NoError(t, err)
	keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"held", "leased", "new-1", "new-2", "new-3", "new-4", "new-5"}, keys)
	require.NoError(t, holder.Rollback(ctx))
	n, err = idem.Purge(ctx, pool, idem.PurgeParams{}, s.Opt)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the held row goes once released")

	_, err = pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{s.Name, "idem_inbox"}.Sanitize()+` (consumer, message_id, consumed_at)
		SELECT 'c', 'm' || g, now() - interval '2 days' FROM generate_series(1, 30) g`)
	require.NoError(t, err)
	n, err = idem.Purge(ctx, pool, idem.PurgeParams{InboxRetention: 24 * time.Hour}, s.Opt, s.InboxOpt)
	require.NoError(t, err)
	require.EqualValues(t, 30, n)
	_, err = idem.Purge(ctx, pool, idem.PurgeParams{BatchSize: -1}, s.Opt)
	require.ErrorIs(t, err, idem.ErrInvalidOption)
}

// In a hash-partitioned record or inbox table, one ctid names a row in every
// partition. A purge that met a held row, and so deletes the rows it locked
// by ctid, must delete those rows only: the live records and recent inbox
// rows of the other partition, at the same ctids, stay.
func TestPurgePartitionedTables(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	q := func(name string) string { return pgx.Identifier{s.Name, name}.Sanitize() }
	for _, p := range []struct{ table, like, column, key string }{
		{"parted_records", idem.DefaultTable, "scope", "scope, key"},
		{"parted_inbox", idem.DefaultInboxTable, "consumer", "consumer, message_id"},
	} {
		_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %[1]s (LIKE %[2]s INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY HASH (%[3]s);
			ALTER TABLE %[1]s ADD PRIMARY KEY (%[4]s);
			CREATE TABLE %[5]s PARTITION OF %[1]s FOR VALUES WITH (MODULUS 2, REMAINDER 0);
			CREATE TABLE %[6]s PARTITION OF %[1]s FOR VALUES WITH (MODULUS 2, REMAINDER 1)`,
			q(p.table), q(p.like), p.column, p.key, q(p.table+"_0"), q(p.table+"_1")))
		require.NoError(t, err)
	}
	// Two values of the partition key that land in different partitions.
	byPart := map[string]string{}
	for i := 0; len(byPart) < 2; i++ {
		require.Less(t, i, 64, "no two values in different partitions")
		v := fmt.Sprintf("v%d", i)
		var part string
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+q("parted_records")+` (scope, key, fingerprint, status, expires_at)
			VALUES ($1, 'probe', '', 'succeeded', now()) RETURNING tableoid::regclass::text`, v).Scan(&part))
		if _, ok := byPart[part]; !ok {
			byPart[part] = v
		}
	}
	old, live := byPart[s.Name+".parted_records_0"], byPart[s.Name+".parted_records_1"]
	require.NotEmpty(t, old, "partitions: %v", byPart)
	require.NotEmpty(t, live, "partitions: %v", byPart)
	_, err := pool.Exec(ctx, `TRUNCATE `+q("parted_records"))
	require.NoError(t, err)

	// The first rows of each partition take the same ctids: (0,1), (0,2), ...
	for _, r := range []struct{ scope, prefix, age string }{
		{old, "old-", "- interval '1 minute'"}, {live, "live-", "+ interval '1 hour'"},
	} {
		_, err = pool.Exec(ctx, `INSERT INTO `+q("parted_records")+` (scope, key, fingerprint, status, response, expires_at)
			SELECT $1::text, $2::text || g, '', 'succeeded', '1', clock_timestamp() `+r.age+` FROM generate_series(1, 4) g`, r.scope, r.prefix)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO `+q("parted_inbox")+` (consumer, message_id, consumed_at)
			SELECT $1::text, 'm' || g, now() `+strings.Replace(r.age, "minute", "day", 1)+` FROM generate_series(1, 4) g`, r.scope)
		require.NoError(t, err)
	}
	var sameCtids bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT array_agg(ctid ORDER BY ctid) FROM `+q("parted_records")+` WHERE scope = $1)::text =
		(SELECT array_agg(ctid ORDER BY ctid) FROM `+q("parted_records")+` WHERE scope = $2)::text`, old, live).Scan(&sameCtids))
	require.True(t, sameCtids, "the test needs both partitions' rows at the same ctids")

	// Another transaction holds the first expired record, so the purge
	// deletes by the ctids of the rows it locked.
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx) //nolint:errcheck
	_, err = holder.Exec(ctx, `SELECT FROM `+q("parted_records")+` WHERE scope = $1 AND key = 'old-1' FOR UPDATE`, old)
	require.NoError(t, err)

	n, err := idem.Purge(ctx, pool, idem.PurgeParams{InboxRetention: time.Hour},
		idem.WithTable(s.Name, "parted_records"), idem.WithInboxTable(s.Name, "parted_inbox"))
	require.NoError(t, err)
	require.EqualValues(t, 3+4, n, "three expired records (one is held) and four old inbox rows")
	left := func(table, column string) []string {
		rows, err := pool.Query(ctx, `SELECT `+column+` || '/' || count(*) FROM `+q(table)+` GROUP BY `+column+` ORDER BY 1`)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return got
	}
	wantRecords := []string{old + "/1", live + "/4"}
	slices.Sort(wantRecords)
	require.Equal(t, wantRecords, left("parted_records", "scope"), "records left: the held one and the live ones")
	require.Equal(t, []string{live + "/4"}, left("parted_inbox", "consumer"), "inbox rows left: the recent ones")
}

// RowsPerSecond spreads the batches: every row is still deleted, records and
// inbox rows alike, and the purge takes at least as long as the rate allows
// (a lower bound, which a slow machine cannot break). A cancelled context
// stops it between batches with what it deleted so far.
func TestPurgePaced(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	fill := func() {
		_, err := pool.Exec(ctx, `INSERT INTO `+s.Records+` (scope, key, fingerprint, status, response, expires_at)
			SELECT 's', 'old-' || g, '', 'succeeded', '1', clock_timestamp() - interval '1 minute' FROM generate_series(1, 2000) g`)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{s.Name, "idem_inbox"}.Sanitize()+` (consumer, message_id, consumed_at)
			SELECT 'c', 'm' || g, now() - interval '2 days' FROM generate_series(1, 1000) g`)
		require.NoError(t, err)
	}
	fill()
	var batches []int64
	po := idem.PurgeParams{BatchSize: 500, RowsPerSecond: 10_000, InboxRetention: 24 * time.Hour,
		OnBatch: func(n int64) { batches = append(batches, n) }}
	started := time.Now()
	n, err := idem.Purge(ctx, pool, po, s.Opt, s.InboxOpt)
	require.NoError(t, err)
	took := time.Since(started)
	require.EqualValues(t, 3000, n)
	require.Equal(t, []int64{500, 500, 500, 500, 0}, batches)
	// 2,000 records and 1,000 inbox rows in full batches of 500 wait until
	// 500 rows per 50ms are due: the last full batch is due at 300ms.
	require.GreaterOrEqual(t, took, 300*time.Millisecond, "the purge was not paced")
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+s.Records+`) + (SELECT count(*) FROM `+
		pgx.Identifier{s.Name, "idem_inbox"}.Sanitize()+`)`).Scan(&left))
	require.Zero(t, left)

	fill()
	cctx, cancel := context.WithCancel(ctx)
	po = idem.PurgeParams{BatchSize: 500, RowsPerSecond: 1, OnBatch: func(int64) { cancel() }}
	n, err = idem.Purge(cctx, pool, po, s.Opt)
	require.ErrorIs(t, err, context.Canceled)
	require.EqualValues(t, 500, n, "one batch, then the pause is cut short")

	// Paced, the batches default to 2,000 rows.
	_, err = idem.Purge(ctx, pool, idem.PurgeParams{InboxRetention: 24 * time.Hour}, s.Opt, s.InboxOpt)
	require.NoError(t, err)
	fill()
	batches = nil
	po = idem.PurgeParams{RowsPerSecond: 1_000_000, OnBatch: func(n int64) { batches = append(batches, n) }}
	n, err = idem.Purge(ctx, pool, po, s.Opt)
	require.NoError(t, err)
	require.EqualValues(t, 2000, n)
	require.Equal(t, []int64{2000, 0}, batches)

	_, err = idem.Purge(ctx, pool, idem.PurgeParams{RowsPerSecond: -1}, s.Opt)
	require.ErrorIs(t, err, idem.ErrInvalidOption)
}

// A purge loop runs while 100 goroutines hammer keys that keep expiring:
// no errors, no empty results, and every committed effect is an execution
// somebody was told about (no duplicates).
func TestPurgeLoopUnderLoad(t *testing.T) {
	for _, iso := range []string{"", "repeatable read", "serializable"} {
		name := iso
		if name == "" {
			name = "database default"
		}
		t.Run(name, func(t *testing.T) {
			if iso != "" {
				pgtest.SkipViaPgBouncer(t, "a session's default_transaction_isolation is a startup parameter PgBouncer does not pass on")
			}
			purgeLoopUnderLoad(t, iso)
		})
	}
}

// purgeLoopUnderLoad runs the purge loop against claims, on connections whose
// default isolation is iso ("" for the database's).
func purgeLoopUnderLoad(t *testing.T, iso string) {
	pool := pgtest.Pool(t, func(c *pgxpool.Config) {
		c.MaxConns = 30
		if iso != "" {
			c.ConnConfig.RuntimeParams["default_transaction_isolation"] = iso
		}
	})
	s := pgtest.NewSchema(t, pool)
	// 100 workers on 10 keys conflict often above READ COMMITTED: give Do
	// room to retry them all.
	retries := idem.WithRetry(idem.RetryPolicy{MaxAttempts: 100})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var purged atomic.Int64
	purger := &idem.Purger{DB: pool, Interval: 10 * time.Millisecond, Tables: []idem.TableOption{s.Opt},
		OnPurge: func(n int64, err error) {
			if err != nil && ctx.Err() == nil {
				t.Errorf("purge: %v", err)
			}
			purged.Add(n)
		}}
	purgeDone := make(chan error, 1)
	go func() { purgeDone <- purger.Run(ctx) }()

	var (
		mu         sync.Mutex
		executions = map[string]bool{} // values reported with Replayed=false
		replayed   = map[string]bool{}
		calls      atomic.Int64
	)
	deadline := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for w := range 100 {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				key := idem.Key{Scope: "hammer", ID: fmt.Sprintf("k%d", (w+i)%10)}
				res, err := idem.Do(ctx, pool, key, func(ctx context.Context, tx pgx.Tx) (string, error) {
					v := fmt.Sprintf("%s/w%d/i%d", key.ID, w, i)
					return v, s.AddEffect(ctx, tx, key, v)
				}, s.Opt, idem.WithTTL(30*time.Millisecond), retries)
				calls.Add(1)
				if err != nil {
					t.Errorf("Do: %v", err)
					return
				}
				if res.Value == "" {
					t.Error("an empty result")
					return
				}
				mu.Lock()
				if res.Replayed {
					replayed[res.Value] = true
				} else {
					if executions[res.Value] {
						t.Errorf("%s reported as a first execution twice", res.Value)
					}
					executions[res.Value] = true
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	cancel()
	require.ErrorIs(t, <-purgeDone, context.Canceled)

	rows, err := pool.Query(context.Background(), `SELECT value FROM `+s.Effects)
	require.NoError(t, err)
	effects, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, effects, len(executions), "one committed effect per reported execution")
	for _, v := range effects {
		require.True(t, executions[v], "effect %s was never reported as executed", v)
	}
	for v := range replayed {
		require.True(t, executions[v], "replayed %s was never executed", v)
	}
	require.Positive(t, purged.Load())
	t.Logf("%d calls, %d executions, %d distinct replays, %d records purged", calls.Load(), len(executions), len(replayed), purged.Load())
}

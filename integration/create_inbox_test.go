package integration_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

func signupTable(t *testing.T, pool *pgxpool.Pool, s *pgtest.Schema) string {
	t.Helper()
	name := pgx.Identifier{s.Name, "signups"}.Sanitize()
	_, err := pool.Exec(context.Background(), `CREATE TABLE `+name+` (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		user_id bigint NOT NULL, activity_id bigint NOT NULL,
		CONSTRAINT signups_user_activity UNIQUE (user_id, activity_id))`)
	require.NoError(t, err)
	return name
}

// 100 concurrent creators of one (user_id, activity_id): one row, one id for
// everybody, no error for anybody; both variants.
func TestInsertOrGetConcurrentCreators(t *testing.T) {
	for _, variant := range []string{"on conflict", "savepoint"} {
		t.Run(variant, func(t *testing.T) {
			pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 30 })
			s := pgtest.NewSchema(t, pool)
			table := signupTable(t, pool, s)
			lookup := idem.Query{SQL: `SELECT id FROM ` + table + ` WHERE user_id = $1 AND activity_id = $2`, Args: []any{7, 42}}
			var created atomic.Int64
			ids := make([]int64, 100)
			errs := make([]error, 100)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range 100 {
				wg.Go(func() {
					<-start
					ctx := context.Background()
					tx, err := pool.Begin(ctx)
					if err != nil {
						errs[i] = err
						return
					}
					defer tx.Rollback(ctx) //nolint:errcheck
					var ok bool
					if variant == "on conflict" {
						ok, err = idem.InsertOrGet(ctx, tx, idem.Query{
							SQL:  `INSERT INTO ` + table + ` (user_id, activity_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING id`,
							Args: []any{7, 42}}, lookup, &ids[i])
					} else {
						ok, err = idem.InsertOrGetTx(ctx, tx, idem.Query{
							SQL:  `INSERT INTO ` + table + ` (user_id, activity_id) VALUES ($1, $2) RETURNING id`,
							Args: []any{7, 42}}, lookup, &ids[i])
					}
					if err == nil {
						// The transaction is still usable after a duplicate.
						_, err = tx.Exec(ctx, "SELECT 1")
					}
					if err == nil {
						err = tx.Commit(ctx)
					}
					errs[i] = err
					if ok {
						created.Add(1)
					}
				})
			}
			close(start)
			wg.Wait()
			for _, err := range errs {
				require.NoError(t, err)
			}
			require.EqualValues(t, 1, created.Load())
			for _, id := range ids {
				require.Equal(t, ids[0], id)
			}
			var rows int
			require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&rows))
			require.Equal(t, 1, rows)
		})
	}
}

func TestInsertOrGetTxOtherErrorsKeepTxUsable(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	table := signupTable(t, pool, s)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	var id int64
	_, err = idem.InsertOrGetTx(ctx, tx, idem.Query{SQL: `INSERT INTO ` + table + ` (user_id, activity_id) VALUES (NULL, 1) RETURNING id`},
		idem.Query{SQL: `SELECT id FROM ` + table}, &id)
	require.Error(t, err)
	_, isUnique := idem.UniqueViolation(err)
	require.False(t, isUnique)
	require.False(t, savepointExists(t, tx, "idem_create"))
	_, err = tx.Exec(ctx, `INSERT INTO `+table+` (user_id, activity_id) VALUES (1, 1)`)
	require.NoError(t, err, "the transaction is usable")

	_, err = tx.Exec(ctx, `SAVEPOINT x`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO `+table+` (user_id, activity_id) VALUES (1, 1)`)
	name, ok := idem.UniqueViolation(err)
	require.True(t, ok)
	require.Equal(t, "signups_user_activity", name)
}

func TestConsumeOnceConcurrentDeliveries(t *testing.T) {
	pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 30 })
	s := pgtest.NewSchema(t, pool)
	var ran atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	start := make(chan struct{})
	key := idem.Key{Scope: "payments", ID: "msg-1"}
	for range 50 {
		wg.Go(func() {
			<-start
			ctx := context.Background()
			err := inTx(t, pool, pgx.ReadCommitted, func(tx pgx.Tx) error {
				ok, err := idem.ConsumeOnce(ctx, tx, "payments", "msg-1", func(ctx context.Context, tx pgx.Tx) error {
					return s.AddEffect(ctx, tx, key, "paid")
				}, s.InboxOpt)
				if ok {
					ran.Add(1)
				}
				return err
			})
			if err != nil {
				errs <- err
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, 1, ran.Load())
	require.Equal(t, 1, s.CountEffects(t, pool, key))
}

// 1,000 messages, each delivered 3 times in random order across 8 workers,
// with some handler failures that force a redelivery: every message has
// exactly one effect.
func TestConsumeOnceRedeliveryStorm(t *testing.T) {
	pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 8 })
	s := pgtest.NewSchema(t, pool)
	const messages = 1000
	deliveries := make(chan int, messages*3)
	order := make([]int, 0, messages*3)
	for m := range messages {
		order = append(order, m, m, m)
	}
	rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	for _, m := range order {
		deliveries <- m
	}
	var failures, acked atomic.Int64
	var wg sync.WaitGroup
	boom := errors.New("handler crashed")
	for w := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 99))
			for {
				var m int
				select {
				case m = <-deliveries:
				default:
					return
				}
				ctx := context.Background()
				id := fmt.Sprintf("m-%04d", m)
				fail := r.IntN(20) == 0
				err := inTx(t, pool, pgx.ReadCommitted, func(tx pgx.Tx) error {
					_, err := idem.ConsumeOnce(ctx, tx, "orders", id, func(ctx context.Context, tx pgx.Tx) error {
						if err := s.AddEffect(ctx, tx, idem.Key{Scope: "orders", ID: id}, "done"); err != nil {
							return err
						}
						if fail {
							return boom
						}
						return nil
					}, s.InboxOpt)
					return err
				})
				switch {
				case errors.Is(err, boom):
					failures.Add(1)
					deliveries <- m // the broker redelivers
				case err != nil:
					t.Error(err)
					return
				default:
					acked.Add(1)
				}
			}
		})
	}
	wg.Wait()
	var total, distinct int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT key) FROM `+s.Effects).Scan(&total, &distinct))
	require.Equal(t, messages, distinct, "no message lost")
	require.Equal(t, messages, total, "no message processed twice")
	require.EqualValues(t, messages*3, acked.Load())
	t.Logf("%d deliveries acked, %d handler failures redelivered", acked.Load(), failures.Load())
}

func TestConsumeOnceHandlerErrorLeavesNothing(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	key := idem.Key{Scope: "c", ID: "m1"}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	boom := errors.New("boom")
	ran, err := idem.ConsumeOnce(ctx, tx, "c", "m1", func(ctx context.Context, tx pgx.Tx) error {
		if err := s.AddEffect(ctx, tx, key, "x"); err != nil {
			return err
		}
		_, _ = tx.Exec(ctx, "SELECT 1/0")
		return boom
	}, s.InboxOpt)
	require.ErrorIs(t, err, boom)
	require.False(t, ran)
	require.False(t, savepointExists(t, tx, "idem_inbox"))
	// Still usable: the redelivery in the same transaction processes it.
	ran, err = idem.ConsumeOnce(ctx, tx, "c", "m1", func(ctx context.Context, tx pgx.Tx) error {
		return s.AddEffect(ctx, tx, key, "y")
	}, s.InboxOpt)
	require.NoError(t, err)
	require.True(t, ran)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 1, s.CountEffects(t, pool, key))

	_, err = idem.ConsumeOnce(ctx, tx, "c", "bad\x00id", func(context.Context, pgx.Tx) error { return nil })
	require.ErrorIs(t, err, idem.ErrInvalidKey)
}

func TestPurgeInboxByAge(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	inbox := pgx.Identifier{s.Name, "idem_inbox"}.Sanitize()
	_, err := pool.Exec(ctx, `INSERT INTO `+inbox+` (consumer, message_id, consumed_at)
		SELECT 'c', 'old-' || g, now() - interval '8 days' FROM generate_series(1, 2500) g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+inbox+` (consumer, message_id) SELECT 'c', 'new-' || g FROM generate_series(1, 10) g`)
	require.NoError(t, err)
	// The schema holds no record, so every row Purge counts is an inbox row.
	var records int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+s.Records).Scan(&records))
	require.Zero(t, records)
	var recordBatches, inboxBatches []int64
	n, err := idem.Purge(ctx, pool, idem.PurgeParams{InboxRetention: 7 * 24 * time.Hour, BatchSize: 1000,
		OnBatch:      func(n int64) { recordBatches = append(recordBatches, n) },
		OnInboxBatch: func(n int64) { inboxBatches = append(inboxBatches, n) },
	}, s.Opt, s.InboxOpt)
	require.NoError(t, err)
	require.EqualValues(t, 2500, n)
	require.Equal(t, []int64{0}, recordBatches, "one batch of records, empty")
	require.Equal(t, []int64{1000, 1000, 500}, inboxBatches, "every inbox batch is reported")
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+inbox).Scan(&left))
	require.Equal(t, 10, left)
	// A zero retention leaves the inbox alone; a negative one is refused.
	n, err = idem.Purge(ctx, pool, idem.PurgeParams{}, s.Opt, s.InboxOpt)
	require.NoError(t, err)
	require.Zero(t, n)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+inbox).Scan(&left))
	require.Equal(t, 10, left)
	_, err = idem.Purge(ctx, pool, idem.PurgeParams{InboxRetention: -time.Hour}, s.Opt, s.InboxOpt)
	require.ErrorIs(t, err, idem.ErrInvalidOption)
}

func TestInsertOrGetTxRepeatableRead(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	table := signupTable(t, pool, s)
	ctx := context.Background()
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer tx.Rollback(ctx)            //nolint:errcheck
	_, err = tx.Exec(ctx, "SELECT 1") // the snapshot
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+table+` (user_id, activity_id) VALUES (3, 4)`)
	require.NoError(t, err)
	var id int64
	_, err = idem.InsertOrGetTx(ctx, tx, idem.Query{SQL: `INSERT INTO ` + table + ` (user_id, activity_id) VALUES (3, 4) RETURNING id`},
		idem.Query{SQL: `SELECT id FROM ` + table + ` WHERE user_id = 3 AND activity_id = 4`}, &id)
	require.True(t, idem.IsRetryable(err), "want a retryable error, got %v", err)
}

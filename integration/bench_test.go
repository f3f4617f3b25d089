package integration_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/integration/internal/pgtest"
)

// Benchmarks of one operation on one connection, for allocations
// (go test -run '^$' -bench . -benchmem ./integration/). The side-by-side
// throughput comparison is the bench command (go run ./bench).
func BenchmarkOneInsert(b *testing.B) {
	pool := pgtest.Pool(b)
	s := pgtest.NewSchema(b, pool)
	conn := pgtest.Conn(b)
	ctx := context.Background()
	insert := func(ctx context.Context, tx pgx.Tx) (int64, error) {
		_, err := tx.Exec(ctx, `INSERT INTO `+s.Effects+` (scope, key, value) VALUES ('s', 'k', 'v')`)
		return 1, err
	}
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			tx, err := conn.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := insert(ctx, tx); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	n := 0
	b.Run("Do", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			n++
			if _, err := idem.Do(ctx, conn, idem.Key{Scope: "s", ID: strconv.Itoa(n)}, insert, s.Opt); err != nil {
				b.Fatal(err)
			}
		}
	})
	// Do's own statements by hand on the same connection: what Do's client
	// work adds is the difference.
	claimSQL := `INSERT INTO ` + s.Records + ` (scope, key, fingerprint, status, attempt, created_at, updated_at, expires_at)
	SELECT $1::text, $2::text, $3::bytea, 'processing', 1, now(), now(), clock_timestamp() + $4::bigint * interval '1 microsecond'
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING attempt`
	completeSQL := `WITH done AS (
	UPDATE ` + s.Records + ` SET status = $3, response = $4, updated_at = now()
	WHERE scope = $1 AND key = $2 AND status = 'processing' AND attempt = $5
	RETURNING 1
)
SELECT CASE WHEN count(*) = 1 THEN 1 ELSE ('rows matched: ' || count(*))::int END FROM done`
	b.Run("Do's SQL by hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			n++
			id := strconv.Itoa(n)
			batch := &pgx.Batch{}
			batch.BeginTx(pgx.TxOptions{})
			var attempt int32
			batch.Queue(claimSQL, "s", id, []byte{}, int64(86400e6)).QueryRow(func(r pgx.Row) error { return r.Scan(&attempt) })
			br := conn.SendBatch(ctx, batch)
			tx := br.Tx()
			if err := br.Close(); err != nil {
				b.Fatal(err)
			}
			v, err := insert(ctx, tx)
			if err != nil {
				b.Fatal(err)
			}
			batch = &pgx.Batch{}
			batch.Queue(completeSQL, "s", id, "succeeded", []byte(strconv.FormatInt(v, 10)), attempt)
			batch.Queue("COMMIT")
			if err := tx.SendBatch(ctx, batch).Close(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("WithIdempotency", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			n++
			tx, err := conn.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := idem.WithIdempotency(ctx, tx, idem.Key{Scope: "s", ID: strconv.Itoa(n)}, insert, s.Opt); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Do/replay", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := idem.Do(ctx, conn, idem.Key{Scope: "s", ID: "1"}, insert, s.Opt); err != nil {
				b.Fatal(err)
			}
		}
	})
	// The library's own allocations: the caller's BEGIN and COMMIT happen
	// with the timer stopped, which testing leaves out of allocs/op, and fn
	// runs no statement.
	b.Run("WithIdempotency/own", func(b *testing.B) {
		b.ReportAllocs()
		fn := func(context.Context, pgx.Tx) (int64, error) { return 1, nil }
		for range b.N {
			n++
			key := idem.Key{Scope: "s", ID: strconv.Itoa(n)}
			b.StopTimer()
			tx, err := conn.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if _, err := idem.WithIdempotency(ctx, tx, key, fn, s.Opt); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	})
}

package main

import (
	"context"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
)

// The floor suite adds the record's SQL to a bare transaction one piece at a
// time, hand-written with pgx and no library logic, so that a run shows which
// piece costs what on the machine at hand:
//
//	bare            BEGIN; INSERT; COMMIT
//	+keyed insert   BEGIN and a plain INSERT of a (scope, key) row into a table
//	                shaped like the record's primary key, pipelined; INSERT; COMMIT:
//	                one more row write, no ON CONFLICT, nothing written back
//	+claim          BEGIN and a claim like Do's (INSERT ... ON CONFLICT DO NOTHING
//	                RETURNING into the record table), pipelined; INSERT; COMMIT:
//	                the claim without its completion
//	sql-model, lean the claim, INSERT, the completion UPDATE pipelined with COMMIT,
//	                with a claim of fewer parameters and a completion without
//	                Do's check that it matched one row
//	sql-model       the same with Do's own claim and completion, as Do sends
//	                them: what Do costs the database, without the library
//	Do              idem.Do
//	sql-model/WithIdempotency  the caller's BEGIN; the claim with SAVEPOINT;
//	                INSERT; the completion with RELEASE SAVEPOINT; COMMIT: the
//	                statements WithIdempotency adds to a caller's transaction
//	WithIdempotency idem.WithIdempotency in the caller's transaction
var floorVariants = []variant{
	{"bare", bareInsert},
	{"+keyed insert", func(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error {
		return modelTx(ctx, pool, `INSERT INTO idem_bench.keyed (scope, key) VALUES ($1, $2)`, "", key)
	}},
	{"+claim", func(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error {
		return modelTx(ctx, pool, modelClaim, "", key)
	}},
	{"sql-model, lean", func(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error {
		return modelTx(ctx, pool, modelClaim, modelComplete, key)
	}},
	{"sql-model", sqlModel},
	{"Do", func(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error {
		_, err := idem.Do(ctx, pool, key, insertRow, tableOpt)
		return err
	}},
	{"sql-model/WithIdempotency", sqlModelInTx},
	{"WithIdempotency", withIdempotencyInsert},
}

func setupFloor(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS idem_bench.keyed (scope text NOT NULL, key text NOT NULL, PRIMARY KEY (scope, key))`)
	return err
}

// modelClaim is Do's claim, reduced to the values the bench needs.
const modelClaim = `INSERT INTO idem_bench.idempotent_record (scope, key, fingerprint, status, attempt, created_at, updated_at, expires_at)
	VALUES ($1, $2, '', 'processing', 1, now(), now(), now() + interval '1 day')
	ON CONFLICT (scope, key) DO NOTHING RETURNING attempt`

// modelComplete is Do's completion, without the guard on the row count.
const modelComplete = `UPDATE idem_bench.idempotent_record SET status = 'succeeded', response = $3, updated_at = now()
	WHERE scope = $1 AND key = $2 AND status = 'processing' AND attempt = 1`

// doClaim and doComplete are Do's own claim and completion (record.go), for
// the record table in the bench's schema, with the TTL, status and attempt
// fixed. The completion raises an error unless it matched one row, so that
// the COMMIT that follows it in the same round trip cannot commit a lost
// completion.
const (
	doClaim = `INSERT INTO idem_bench.idempotent_record (scope, key, fingerprint, status, attempt, created_at, updated_at, expires_at)
	SELECT $1::text, $2::text, ''::bytea, 'processing', 1, now(), now(), clock_timestamp() + 86400000000::bigint * interval '1 microsecond'
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING attempt`
	doComplete = `WITH done AS (
	UPDATE idem_bench.idempotent_record SET status = 'succeeded', response = $3, updated_at = now()
	WHERE scope = $1 AND key = $2 AND status = 'processing' AND attempt = 1
	RETURNING 1
)
SELECT CASE WHEN count(*) = 1 THEN 1
	ELSE ('idem: the processing record changed under its owner; rows matched: ' || count(*))::int END
FROM done`
)

// sqlModel sends the statements Do sends, pipelined the same way, with no
// library logic: the floor for this SQL, separating what the record costs the
// database from what idem costs the client.
func sqlModel(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error {
	return modelTx(ctx, pool, doClaim, doComplete, key)
}

// modelTx runs BEGIN pipelined with first (a statement taking the key's
// scope and ID), the business INSERT, and COMMIT, pipelined with complete
// (taking the scope, the ID and the result) unless it is "".
func modelTx(ctx context.Context, pool *pgxpool.Pool, first, complete string, key idem.Key) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	claimed := true
	q := b.Queue(first, key.Scope, key.ID)
	if complete != "" {
		q.QueryRow(func(r pgx.Row) error {
			var attempt int32
			if err := r.Scan(&attempt); errors.Is(err, pgx.ErrNoRows) {
				claimed = false
			} else if err != nil {
				return err
			}
			return nil
		})
	}
	br := conn.SendBatch(ctx, b)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	if !claimed {
		// A duplicate: read the record and end the transaction, in one
		// round trip, as Do replays.
		b = &pgx.Batch{}
		b.Queue(`SELECT status, response FROM idem_bench.idempotent_record WHERE scope = $1 AND key = $2`, key.Scope, key.ID).
			QueryRow(func(r pgx.Row) error {
				var status string
				var response []byte
				return r.Scan(&status, &response)
			})
		b.Queue("ROLLBACK")
		return conn.SendBatch(ctx, b).Close()
	}
	id, err := insertRow(ctx, tx)
	if err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	b = &pgx.Batch{}
	if complete != "" {
		b.Queue(complete, key.Scope, key.ID, []byte(strconv.FormatInt(id, 10)))
	}
	b.Queue("COMMIT")
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	return nil
}

// sqlModelInTx sends the statements WithIdempotency adds to a caller's
// transaction, in its round trips, with no library logic.
func sqlModelInTx(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	b := &pgx.Batch{}
	b.Queue(doClaim, key.Scope, key.ID)
	b.Queue("SAVEPOINT idem_fn")
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	id, err := insertRow(ctx, tx)
	if err != nil {
		return err
	}
	b = &pgx.Batch{}
	b.Queue(doComplete, key.Scope, key.ID, []byte(strconv.FormatInt(id, 10)))
	b.Queue("RELEASE SAVEPOINT idem_fn")
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

package main

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
)

// The floor suite adds the record's SQL to a bare transaction one piece at a
// time, hand-written with pgx and no library logic, so that a run shows which
// piece costs what on the machine at hand, and how far below any of them a
// target lies:
//
//	bare            BEGIN; INSERT; COMMIT
//	+keyed insert   BEGIN and a plain INSERT of a (scope, key) row into a table
//	                shaped like the record's primary key, pipelined; INSERT; COMMIT:
//	                one more row write, no ON CONFLICT, nothing written back
//	+claim          BEGIN and a claim like Do's (INSERT ... ON CONFLICT DO NOTHING
//	                RETURNING into the record table), pipelined; INSERT; COMMIT:
//	                the claim without its completion
//	sql-model       the claim, INSERT, the completion UPDATE pipelined with COMMIT:
//	                the statements Do sends, with a claim of fewer parameters and
//	                columns and a completion without Do's row-count check
//	Do              idem.Do
//	sql-model/WithIdempotency  the caller's BEGIN; the claim with SAVEPOINT;
//	                INSERT; the completion with RELEASE SAVEPOINT; COMMIT: the
//	                statements WithIdempotency adds to a caller's transaction
//	WithIdempotency idem.WithIdempotency in the caller's transaction
var floorVariants = []variant{
	{"bare", bareInsert},
	{"+keyed insert", func(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error {
		return modelTx(ctx, pool, `INSERT INTO idem_bench.keyed (scope, key) VALUES ($1, $2)`, key, false)
	}},
	{"+claim", func(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error {
		return modelTx(ctx, pool, modelClaim, key, false)
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

// sqlModel sends the statements Do sends, pipelined the same way, with no
// library logic: the floor for this SQL, separating what the record costs the
// database from what idem costs the client.
func sqlModel(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error {
	return modelTx(ctx, pool, modelClaim, key, true)
}

// modelTx runs BEGIN pipelined with first (a statement taking the key's
// scope and ID), the business INSERT, and COMMIT, pipelined with the
// completion UPDATE when complete is set.
func modelTx(ctx context.Context, pool *pgxpool.Pool, first string, key idem.Key, complete bool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue(first, key.Scope, key.ID)
	br := conn.SendBatch(ctx, b)
	tx := br.Tx()
	if err := br.Close(); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	id, err := insertRow(ctx, tx)
	if err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	b = &pgx.Batch{}
	if complete {
		b.Queue(modelComplete, key.Scope, key.ID, []byte(strconv.FormatInt(id, 10)))
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
	b.Queue(modelClaim, key.Scope, key.ID)
	b.Queue("SAVEPOINT idem_fn")
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	id, err := insertRow(ctx, tx)
	if err != nil {
		return err
	}
	b = &pgx.Batch{}
	b.Queue(modelComplete, key.Scope, key.ID, []byte(strconv.FormatInt(id, 10)))
	b.Queue("RELEASE SAVEPOINT idem_fn")
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
)

// The shape suite measures whether another shape of the record table would
// cost a transaction less: Do's statements, hand-written as in the floor
// suite's sql-model, against copies of the migrated table that differ in
// one thing each.
//
//	bare             BEGIN; INSERT; COMMIT
//	as migrated      the record table as the migrations create it
//	                 (fillfactor 70, a B-tree on expires_at)
//	fillfactor 100   full pages: the completion UPDATE finds no room for a
//	                 heap-only update more often
//	narrow row       without the columns Do never reads (locked_until,
//	                 recovery_point, created_at, updated_at)
//	BRIN expires_at  a BRIN index on expires_at instead of a B-tree: far
//	                 cheaper to keep up, coarser for the purge to read
//	no expires_at index  the index the purge reads dropped: the most a
//	                 cheaper index could save
var shapeTables = []struct{ name, table, ddl string }{
	{"as migrated", "shape_migrated", `CREATE TABLE %s (LIKE idem_bench.idempotent_record INCLUDING ALL) WITH (fillfactor = 70)`},
	{"fillfactor 100", "shape_ff100", `CREATE TABLE %s (LIKE idem_bench.idempotent_record INCLUDING ALL) WITH (fillfactor = 100)`},
	{"narrow row", "shape_narrow", `CREATE TABLE %s (scope text NOT NULL, key text NOT NULL, fingerprint bytea,
		status text NOT NULL CHECK (status IN ('issued', 'processing', 'succeeded', 'failed')),
		response bytea, attempt integer NOT NULL DEFAULT 1, expires_at timestamptz NOT NULL,
		PRIMARY KEY (scope, key)) WITH (fillfactor = 70);
		CREATE INDEX ON %[1]s (expires_at)`},
	{"BRIN expires_at", "shape_brin", `CREATE TABLE %s (LIKE idem_bench.idempotent_record INCLUDING DEFAULTS INCLUDING CONSTRAINTS) WITH (fillfactor = 70);
		ALTER TABLE %[1]s ADD PRIMARY KEY (scope, key);
		CREATE INDEX ON %[1]s USING brin (expires_at)`},
	{"no expires_at index", "shape_noexp", `CREATE TABLE %s (LIKE idem_bench.idempotent_record INCLUDING DEFAULTS INCLUDING CONSTRAINTS) WITH (fillfactor = 70);
		ALTER TABLE %[1]s ADD PRIMARY KEY (scope, key)`},
}

func setupShape(ctx context.Context, pool *pgxpool.Pool) error {
	for _, s := range shapeTables {
		t := schema + "." + s.table
		if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS `+t+`; `+fmt.Sprintf(s.ddl, t)); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return nil
}

// shapeVariants: bare, then Do's statements against each table shape.
var shapeVariants = func() []variant {
	vs := []variant{{"bare", bareInsert}}
	for _, s := range shapeTables {
		t := schema + "." + s.table
		narrow := s.table == "shape_narrow"
		claim := `INSERT INTO ` + t + ` (scope, key, fingerprint, status, attempt, created_at, updated_at, expires_at)
	VALUES ($1, $2, '', 'processing', 1, now(), now(), now() + interval '1 day')
	ON CONFLICT (scope, key) DO NOTHING RETURNING attempt`
		complete := `UPDATE ` + t + ` SET status = 'succeeded', response = $3, updated_at = now()
	WHERE scope = $1 AND key = $2 AND status = 'processing' AND attempt = 1`
		if narrow {
			claim = `INSERT INTO ` + t + ` (scope, key, fingerprint, status, attempt, expires_at)
	VALUES ($1, $2, '', 'processing', 1, now() + interval '1 day')
	ON CONFLICT (scope, key) DO NOTHING RETURNING attempt`
			complete = `UPDATE ` + t + ` SET status = 'succeeded', response = $3
	WHERE scope = $1 AND key = $2 AND status = 'processing' AND attempt = 1`
		}
		vs = append(vs, variant{s.name, func(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error {
			return modelTx(ctx, pool, claim, complete, key)
		}})
	}
	return vs
}()

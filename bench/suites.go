package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
)

// transitionRows is how many PENDING orders the transition suite prepares
// (-transition-rows); every operation consumes one.
var transitionRows int64 = 2_000_000

var (
	nextOrder atomic.Int64
	payments  *idem.StateMachine
)

func setupTransition(ctx context.Context, pool *pgxpool.Pool) error {
	nextOrder.Store(0) // fresh rows again for each -rtt
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS idem_bench.payments; CREATE TABLE idem_bench.payments (id bigint PRIMARY KEY, status text NOT NULL, paid_at timestamptz);
		INSERT INTO idem_bench.payments (id, status) SELECT g, 'PENDING' FROM generate_series(1, `+strconv.FormatInt(transitionRows, 10)+`) g`); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE idem_bench.payments`); err != nil {
		return err
	}
	m, err := idem.NewStateMachine(idem.StateMachineConfig{
		Schema: schema, Table: "payments", IDColumn: "id", StateColumn: "status",
		States:      []string{"PENDING", "PAID", "CANCELLED"},
		Transitions: map[string][]string{"PENDING": {"PAID", "CANCELLED"}},
	})
	payments = m
	return err
}

func takeOrder() (int64, error) {
	id := nextOrder.Add(1)
	if id > transitionRows {
		return 0, fmt.Errorf("the transition suite ran out of PENDING rows (%d); use fewer rounds or a shorter -duration", transitionRows)
	}
	return id, nil
}

// transitionVariants: a hand-written guarded UPDATE with a row-count check
// (and the read of the current state when it changed nothing, as the
// scenarios do) against StateMachine.Transition, both as single autocommit
// statements.
var transitionVariants = []variant{
	{"hand-written UPDATE", func(ctx context.Context, pool *pgxpool.Pool, _ idem.Key) error {
		id, err := takeOrder()
		if err != nil {
			return err
		}
		tag, err := pool.Exec(ctx, `UPDATE idem_bench.payments SET status = 'PAID' WHERE id = $1 AND status = 'PENDING'`, id)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			var status string
			return pool.QueryRow(ctx, `SELECT status FROM idem_bench.payments WHERE id = $1`, id).Scan(&status)
		}
		return nil
	}},
	{"Transition", func(ctx context.Context, pool *pgxpool.Pool, _ idem.Key) error {
		id, err := takeOrder()
		if err != nil {
			return err
		}
		res, err := payments.Transition(ctx, pool, id, "PAID")
		if err == nil && !res.Applied {
			err = errors.New("transition not applied on a fresh row")
		}
		return err
	}},
}

// inboxVariants: a bare transaction inserting the handler's row, against the
// same inside ConsumeOnce.
var inboxVariants = []variant{
	{"bare", bareInsert},
	{"ConsumeOnce", func(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		ran, err := idem.ConsumeOnce(ctx, tx, "bench", key.ID, func(ctx context.Context, tx pgx.Tx) error {
			_, err := insertRow(ctx, tx)
			return err
		}, inboxOpt)
		if err != nil {
			return err
		}
		if !ran && dupRate == 0 {
			return errors.New("a new message was not processed")
		}
		return tx.Commit(ctx)
	}},
}

var inboxOpt = idem.WithInboxTable(schema, idem.DefaultInboxTable)

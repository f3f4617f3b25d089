package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "github.com/lib/pq"              // database/sql driver "postgres"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsql"
	"github.com/idemkit/idem/integration/internal/pgtest"
)

// State machines through idemsql's native API (idemsql.StateMachine), for
// pgx's stdlib driver and lib/pq, on a *sql.DB and in a caller's *sql.Tx.

// machineEnv is one test's view of one database/sql driver.
type machineEnv struct {
	pool *pgxpool.Pool // pgx, for setup and for counting
	s    *pgtest.Schema
	db   *sql.DB
}

// forEachMachineDriver runs f for each database/sql driver, with a fresh
// schema and a *sql.DB of at most maxConns connections.
func forEachMachineDriver(t *testing.T, maxConns int, f func(t *testing.T, e *machineEnv)) {
	for _, d := range sqlDBDrivers {
		t.Run(d.name, func(t *testing.T) {
			pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 4 })
			f(t, &machineEnv{pool: pool, s: pgtest.NewSchema(t, pool), db: openSQLDB(t, d.driver, pgtest.ClientURL(), maxConns)})
		})
	}
}

// ordersMachine creates the orders table, of state column type stateType,
// and its history table in the test's schema, and returns the machine over
// them (with a version column and history) and the orders table's name.
func (e *machineEnv) ordersMachine(t *testing.T, stateType string) (*idemsql.StateMachine, string) {
	t.Helper()
	ctx := context.Background()
	m, err := idemsql.NewStateMachine(idem.StateMachineConfig{
		Schema: e.s.Name, Table: "orders", IDColumn: "id", StateColumn: "status",
		States: []string{"PENDING", "PAID", "SHIPPED", "CANCELLED", "REFUNDED"},
		Transitions: map[string][]string{
			"PENDING": {"PAID", "CANCELLED"},
			"PAID":    {"SHIPPED", "REFUNDED"},
			"SHIPPED": {"REFUNDED"},
		},
		VersionColumn: "version", HistoryTable: "order_history",
	})
	require.NoError(t, err)
	if stateType == "enum" {
		stateType = pgx.Identifier{e.s.Name, "order_status"}.Sanitize()
		_, err := e.pool.Exec(ctx, `CREATE TYPE `+stateType+` AS ENUM ('PENDING', 'PAID', 'SHIPPED', 'CANCELLED', 'REFUNDED')`)
		require.NoError(t, err)
	}
	orders := pgx.Identifier{e.s.Name, "orders"}.Sanitize()
	_, err = e.pool.Exec(ctx, `CREATE TABLE `+orders+` (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		status `+stateType+` NOT NULL DEFAULT 'PENDING',
		version bigint NOT NULL DEFAULT 0,
		paid_at timestamptz,
		payment_ref text)`)
	require.NoError(t, err)
	_, err = e.pool.Exec(ctx, m.HistoryTableDDL("bigint"))
	require.NoError(t, err)
	return m, orders
}

// newOrder inserts an order in its default state and returns its id.
func (e *machineEnv) newOrder(t *testing.T, orders string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, e.pool.QueryRow(context.Background(), `INSERT INTO `+orders+` DEFAULT VALUES RETURNING id`).Scan(&id))
	return id
}

// order reads an order's state, version and payment reference.
func (e *machineEnv) order(t *testing.T, orders string, id int64) (status string, version int64, ref *string) {
	t.Helper()
	require.NoError(t, e.pool.QueryRow(context.Background(),
		`SELECT status::text, version, payment_ref FROM `+orders+` WHERE id = $1`, id).Scan(&status, &version, &ref))
	return status, version, ref
}

// history counts an order's history rows (a table with no unique key on
// entity_id: one row per applied transition).
func (e *machineEnv) history(t *testing.T, id int64) int {
	t.Helper()
	var n int
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+
		pgx.Identifier{e.s.Name, "order_history"}.Sanitize()+` WHERE entity_id = $1`, id).Scan(&n))
	return n
}

// retryMachineSerialization retries attempt while it fails with 40001 or
// 40P01, as a client of a database whose default isolation is above READ
// COMMITTED must.
func retryMachineSerialization(attempt func() error) error {
	for range 100 {
		err := attempt()
		if err == nil || !idem.IsRetryable(err) {
			return err
		}
		time.Sleep(time.Millisecond)
	}
	return errors.New("still conflicting after 100 attempts")
}

// Twenty concurrent callers per move, on a *sql.DB: one applies, nineteen
// see the repeat. PAID has one source state (a plain guarded UPDATE);
// REFUNDED has two, bound as one text parameter each.
func TestSQLTransitionTwentyPayersAndRefunders(t *testing.T) {
	forEachMachineDriver(t, 20, func(t *testing.T, e *machineEnv) {
		ctx := context.Background()
		m, orders := e.ordersMachine(t, "text")
		id := e.newOrder(t, orders)

		for _, move := range []struct{ to, from string }{{"PAID", "PENDING"}, {"REFUNDED", "PAID"}} {
			var applied, repeats atomic.Int64
			errs := make([]error, 20)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range 20 {
				wg.Go(func() {
					<-start
					var res idem.TransitionResult
					err := retryMachineSerialization(func() (err error) {
						res, err = m.Transition(ctx, e.db, id, move.to,
							idem.Set("paid_at", time.Now()), idem.Set("payment_ref", fmt.Sprintf("pay-%d", i)))
						return err
					})
					switch {
					case err != nil:
						errs[i] = err
					case res.Applied && res.From != move.from:
						errs[i] = fmt.Errorf("applied from %q", res.From)
					case res.Applied:
						applied.Add(1)
					case res.From != move.to:
						errs[i] = fmt.Errorf("repeat saw %q", res.From)
					default:
						repeats.Add(1)
					}
				})
			}
			close(start)
			wg.Wait()
			for _, err := range errs {
				require.NoError(t, err)
			}
			require.EqualValues(t, 1, applied.Load(), move.to)
			require.EqualValues(t, 19, repeats.Load(), move.to)
		}
		_, err := m.Transition(ctx, e.db, id, "PAID")
		var te *idem.TransitionError
		require.ErrorAs(t, err, &te)
		require.ErrorIs(t, err, idem.ErrInvalidTransition)
		require.Equal(t, "REFUNDED", te.Current)
		_, err = m.Transition(ctx, e.db, id+1000, "PAID")
		require.ErrorIs(t, err, idem.ErrNotFound)
		require.Equal(t, 2, e.history(t, id))
		_, version, _ := e.order(t, orders, id)
		require.EqualValues(t, 2, version)
	})
}

// In the caller's *sql.Tx a transition is part of the transaction: rolled
// back with it, committed with it. ExpectVersion and an enum state column
// work as they do on pgx, for single- and multi-source moves.
func TestSQLTransitionInCallerTxAndVersions(t *testing.T) {
	forEachMachineDriver(t, 4, func(t *testing.T, e *machineEnv) {
		ctx := context.Background()
		m, orders := e.ordersMachine(t, "enum")
		id := e.newOrder(t, orders)

		// Rolled back: nothing stays, not even the history row.
		tx, err := e.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		res, err := m.Transition(ctx, tx, id, "PAID", idem.Set("payment_ref", "rolled-back"))
		require.NoError(t, err)
		require.Equal(t, idem.TransitionResult{From: "PENDING", To: "PAID", Applied: true, Version: 1}, res)
		require.NoError(t, tx.Rollback())
		status, version, ref := e.order(t, orders, id)
		require.Equal(t, "PENDING", status)
		require.Zero(t, version)
		require.Nil(t, ref)
		require.Zero(t, e.history(t, id))

		// Committed, with a stale writer refused by its version.
		tx, err = e.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		res, err = m.Transition(ctx, tx, id, "PAID", idem.ExpectVersion(0), idem.Set("payment_ref", "pay-1"))
		require.NoError(t, err)
		require.True(t, res.Applied)
		// The same writer again, in the same transaction: the repeat.
		res, err = m.Transition(ctx, tx, id, "PAID", idem.ExpectVersion(0))
		require.NoError(t, err)
		require.Equal(t, idem.TransitionResult{From: "PAID", To: "PAID", Version: 1}, res)
		require.NoError(t, tx.Commit())
		status, version, ref = e.order(t, orders, id)
		require.Equal(t, "PAID", status)
		require.EqualValues(t, 1, version)
		require.Equal(t, "pay-1", *ref)

		// A multi-source move (REFUNDED) with a stale version: a conflict.
		_, err = m.Transition(ctx, e.db, id, "REFUNDED", idem.ExpectVersion(0))
		require.ErrorIs(t, err, idem.ErrVersionConflict)
		require.ErrorIs(t, err, idem.ErrInvalidTransition)
		var te *idem.TransitionError
		require.ErrorAs(t, err, &te)
		require.Equal(t, id, te.ID)
		require.Equal(t, "PAID", te.Current)
		require.Equal(t, "REFUNDED", te.Wanted)
		require.Zero(t, te.ExpectedVersion)
		require.EqualValues(t, 1, te.CurrentVersion)
		// The right version, on a *sql.Conn.
		conn, err := e.db.Conn(ctx)
		require.NoError(t, err)
		defer conn.Close()
		res, err = m.Transition(ctx, conn, id, "REFUNDED", idem.ExpectVersion(1))
		require.NoError(t, err)
		require.Equal(t, idem.TransitionResult{From: "PAID", To: "REFUNDED", Applied: true, Version: 2}, res)
		// A single-source move the row's state does not allow.
		_, err = m.Transition(ctx, e.db, id, "SHIPPED")
		require.ErrorIs(t, err, idem.ErrInvalidTransition)
		require.NotErrorIs(t, err, idem.ErrVersionConflict)
		require.EqualError(t, err, fmt.Sprintf(`idem: row %d is "REFUNDED", which cannot move to "SHIPPED"`, id))
		require.Equal(t, 2, e.history(t, id))

		require.True(t, m.Allowed("PAID", "REFUNDED"))
		require.False(t, m.Allowed("REFUNDED", "PAID"))
		require.Contains(t, m.Mermaid(), "PAID --> REFUNDED")
	})
}

// States are values sent as parameters: commas, braces, quotes, backslashes
// and the word NULL stay text, as source states of a multi-source move too
// (what a PostgreSQL array literal would have to escape).
func TestSQLTransitionHostileStates(t *testing.T) {
	hostile := []string{`a,b`, `{x}`, `NULL`, `"q"`, `back\slash`, `it's`, ` spaced `}
	forEachMachineDriver(t, 4, func(t *testing.T, e *machineEnv) {
		ctx := context.Background()
		table := pgx.Identifier{e.s.Name, "items"}.Sanitize()
		_, err := e.pool.Exec(ctx, `CREATE TABLE `+table+` (id text PRIMARY KEY, state text NOT NULL)`)
		require.NoError(t, err)
		transitions := map[string][]string{"NEW": hostile}
		for _, h := range hostile {
			transitions[h] = []string{"DONE"}
		}
		m, err := idemsql.NewStateMachine(idem.StateMachineConfig{Schema: e.s.Name, Table: "items", IDColumn: "id", StateColumn: "state",
			States: append([]string{"NEW", "DONE"}, hostile...), Transitions: transitions})
		require.NoError(t, err)
		for _, h := range hostile {
			_, err := e.pool.Exec(ctx, `INSERT INTO `+table+` VALUES ($1, 'NEW')`, h)
			require.NoError(t, err)
			res, err := m.Transition(ctx, e.db, h, h)
			require.NoError(t, err, "%q", h)
			require.Equal(t, idem.TransitionResult{From: "NEW", To: h, Applied: true}, res)
			res, err = m.Transition(ctx, e.db, h, "DONE")
			require.NoError(t, err, "%q", h)
			require.Equal(t, idem.TransitionResult{From: h, To: "DONE", Applied: true}, res)
			res, err = m.Transition(ctx, e.db, h, "DONE")
			require.NoError(t, err, "%q", h)
			require.Equal(t, idem.TransitionResult{From: "DONE", To: "DONE"}, res)
		}
	})
}

// A nil handle or machine is refused before any SQL; a closed *sql.DB and
// an ended *sql.Tx are explained in idem's words.
func TestSQLTransitionHandles(t *testing.T) {
	forEachMachineDriver(t, 4, func(t *testing.T, e *machineEnv) {
		ctx := context.Background()
		m, orders := e.ordersMachine(t, "text")
		id := e.newOrder(t, orders)

		for _, db := range []idemsql.DBTX{nil, (*sql.DB)(nil), (*sql.Tx)(nil), (*sql.Conn)(nil)} {
			_, err := m.Transition(ctx, db, id, "PAID")
			require.ErrorIs(t, err, idem.ErrInvalidOption, "%T", db)
		}
		var none *idemsql.StateMachine
		_, err := none.Transition(ctx, e.db, id, "PAID")
		require.ErrorIs(t, err, idem.ErrInvalidOption)
		require.False(t, none.Allowed("PENDING", "PAID"))
		require.Empty(t, none.HistoryTableDDL("bigint"))
		_, err = m.Transition(ctx, e.db, id, "LOST")
		require.ErrorIs(t, err, idem.ErrInvalidOption)

		tx, err := e.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		_, err = m.Transition(ctx, tx, id, "PAID")
		require.ErrorIs(t, err, idem.ErrInvalidOption)
		require.ErrorContains(t, err, "idem: Transition: the transaction was already committed or rolled back")

		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		_, err = m.Transition(cancelled, e.db, id, "REFUNDED")
		require.ErrorIs(t, err, context.Canceled)

		closed := openSQLDB(t, "pgx", pgtest.ClientURL(), 1)
		require.NoError(t, closed.Close())
		_, err = m.Transition(ctx, closed, id, "PAID")
		require.ErrorContains(t, err, "idem: Transition: the pool was closed")

		status, version, _ := e.order(t, orders, id)
		require.Equal(t, "PENDING", status, "nothing moved the row")
		require.Zero(t, version)
	})
}

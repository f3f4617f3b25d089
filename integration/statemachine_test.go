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

var orderStates = []string{"PENDING", "PAID", "SHIPPED", "CANCELLED", "REFUNDED"}

var orderTransitions = map[string][]string{
	"PENDING": {"PAID", "CANCELLED"},
	"PAID":    {"SHIPPED", "REFUNDED"},
	"SHIPPED": {"REFUNDED"},
}

// orderMachine creates an orders table (and history table) in the test's
// schema and returns the machine over it.
func orderMachine(t *testing.T, pool *pgxpool.Pool, s *pgtest.Schema, stateType string) *idem.StateMachine {
	t.Helper()
	ctx := context.Background()
	m, err := idem.NewStateMachine(idem.StateMachineConfig{
		Schema:        s.Name,
		Table:         "orders",
		IDColumn:      "id",
		StateColumn:   "status",
		States:        orderStates,
		Transitions:   orderTransitions,
		VersionColumn: "version",
		HistoryTable:  "order_history",
	})
	require.NoError(t, err)
	if stateType == "" {
		stateType = "text"
	}
	_, err = pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		status %s NOT NULL DEFAULT 'PENDING',
		version bigint NOT NULL DEFAULT 0,
		paid_at timestamptz,
		payment_ref text)`, pgx.Identifier{s.Name, "orders"}.Sanitize(), stateType))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, m.HistoryTableDDL("bigint"))
	require.NoError(t, err)
	return m
}

func newOrder(t *testing.T, pool *pgxpool.Pool, s *pgtest.Schema) int64 {
	t.Helper()
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(),
		`INSERT INTO `+pgx.Identifier{s.Name, "orders"}.Sanitize()+` DEFAULT VALUES RETURNING id`).Scan(&id))
	return id
}

type orderRow struct {
	Status  string
	Version int64
	PaidAt  *time.Time
	Ref     *string
}

func readOrder(t *testing.T, pool *pgxpool.Pool, s *pgtest.Schema, id int64) orderRow {
	t.Helper()
	var r orderRow
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT status::text, version, paid_at, payment_ref FROM `+pgx.Identifier{s.Name, "orders"}.Sanitize()+` WHERE id = $1`, id).
		Scan(&r.Status, &r.Version, &r.PaidAt, &r.Ref))
	return r
}

func historyCount(t *testing.T, pool *pgxpool.Pool, s *pgtest.Schema, id int64) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM `+pgx.Identifier{s.Name, "order_history"}.Sanitize()+` WHERE entity_id = $1`, id).Scan(&n))
	return n
}

func TestTransitionFiftyPayersOneApplies(t *testing.T) {
	for _, stateType := range []string{"text", "enum"} {
		t.Run(stateType, func(t *testing.T) {
			pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 20 })
			s := pgtest.NewSchema(t, pool)
			if stateType == "enum" {
				_, err := pool.Exec(context.Background(), `CREATE TYPE `+pgx.Identifier{s.Name, "order_status"}.Sanitize()+
					` AS ENUM ('PENDING', 'PAID', 'SHIPPED', 'CANCELLED', 'REFUNDED')`)
				require.NoError(t, err)
				stateType = pgx.Identifier{s.Name, "order_status"}.Sanitize()
			}
			m := orderMachine(t, pool, s, stateType)
			id := newOrder(t, pool, s)
			// Each Transition through the pool is a transaction of the
			// database's default level. Above READ COMMITTED the payers
			// that wait for the winner's row lock get 40001 when it
			// commits, and retry as a client must: the retry is a repeat.
			iso := isolationOf(t, pool)

			var applied, repeats, retries atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 50)
			start := make(chan struct{})
			for i := range 50 {
				wg.Go(func() {
					<-start
					var res idem.TransitionResult
					n, err := asClient(iso, func() (err error) {
						res, err = m.Transition(context.Background(), pool, id, "PAID",
							idem.Set("paid_at", time.Now()), idem.Set("payment_ref", fmt.Sprintf("pay-%d", i)))
						return err
					})
					retries.Add(int64(n))
					if err != nil {
						errs <- err
						return
					}
					if res.Applied {
						applied.Add(1)
						if res.From != "PENDING" {
							errs <- fmt.Errorf("applied from %q", res.From)
						}
					} else {
						repeats.Add(1)
						if res.From != "PAID" {
							errs <- fmt.Errorf("repeat saw %q", res.From)
						}
					}
				})
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			t.Logf("%s: %d transitions retried after 40001/40P01", iso, retries.Load())
			require.EqualValues(t, 1, applied.Load())
			require.EqualValues(t, 49, repeats.Load())
			row := readOrder(t, pool, s, id)
			require.Equal(t, "PAID", row.Status)
			require.EqualValues(t, 1, row.Version)
			require.NotNil(t, row.PaidAt)
			require.NotNil(t, row.Ref)
			require.Equal(t, 1, historyCount(t, pool, s, id))
		})
	}
}

func TestTransitionIllegalAndMissing(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	m := orderMachine(t, pool, s, "")
	ctx := context.Background()
	id := newOrder(t, pool, s)

	_, err := m.Transition(ctx, pool, id, "SHIPPED")
	require.ErrorIs(t, err, idem.ErrInvalidTransition)
	var te *idem.TransitionError
	require.ErrorAs(t, err, &te)
	require.Equal(t, "PENDING", te.Current)
	require.Equal(t, "SHIPPED", te.Wanted)
	require.EqualValues(t, id, te.ID)
	require.NotErrorIs(t, err, idem.ErrVersionConflict)
	row := readOrder(t, pool, s, id)
	require.Equal(t, orderRow{Status: "PENDING", Version: 0}, row, "the row is untouched")
	require.Equal(t, 0, historyCount(t, pool, s, id))

	_, err = m.Transition(ctx, pool, int64(987654), "PAID")
	require.ErrorIs(t, err, idem.ErrNotFound)

	_, err = m.Transition(ctx, pool, id, "LOST")
	require.ErrorIs(t, err, idem.ErrInvalidOption)
	_, err = m.Transition(ctx, pool, id, "PAID", idem.Set("status", "X"))
	require.ErrorIs(t, err, idem.ErrInvalidOption)
	_, err = m.Transition(ctx, pool, id, "PAID", idem.Set(`x"; DROP TABLE orders; --`, 1))
	require.ErrorIs(t, err, idem.ErrInvalidOption)

	// Through a pool, a connection and a transaction alike.
	res, err := m.Transition(ctx, pgtest.Conn(t), id, "PAID")
	require.NoError(t, err)
	require.True(t, res.Applied)
	require.Equal(t, "PENDING", res.From)
	require.EqualValues(t, 1, res.Version)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	res, err = m.Transition(ctx, tx, id, "SHIPPED")
	require.NoError(t, err)
	require.True(t, res.Applied)
	require.NoError(t, tx.Commit(ctx))
	_, err = m.Transition(ctx, pool, id, "PAID")
	require.ErrorAs(t, err, &te)
	require.Equal(t, "SHIPPED", te.Current)
}

func TestTransitionVersionColumn(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{s.Name, "lamps"}.Sanitize()+
		` (id text PRIMARY KEY, state text NOT NULL, version int NOT NULL DEFAULT 0)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{s.Name, "lamps"}.Sanitize()+` (id, state) VALUES ('l1', 'OFF')`)
	require.NoError(t, err)
	m, err := idem.NewStateMachine(idem.StateMachineConfig{
		Schema: s.Name, Table: "lamps", IDColumn: "id", StateColumn: "state", VersionColumn: "version",
		States:      []string{"OFF", "ON"},
		Transitions: map[string][]string{"OFF": {"ON"}, "ON": {"OFF"}},
	})
	require.NoError(t, err)

	// A stale writer read OFF at version 0 and wants ON. Meanwhile the lamp
	// went OFF -> ON -> OFF (version 2): same state, different history.
	for _, to := range []string{"ON", "OFF"} {
		_, err := m.Transition(ctx, pool, "l1", to)
		require.NoError(t, err)
	}
	_, err = m.Transition(ctx, pool, "l1", "ON", idem.ExpectVersion(0))
	require.ErrorIs(t, err, idem.ErrVersionConflict)
	require.ErrorIs(t, err, idem.ErrInvalidTransition)
	var te *idem.TransitionError
	require.ErrorAs(t, err, &te)
	require.EqualValues(t, 2, te.CurrentVersion)
	require.EqualValues(t, 0, te.ExpectedVersion)
	var state string
	var version int
	require.NoError(t, pool.QueryRow(ctx, `SELECT state, version FROM `+pgx.Identifier{s.Name, "lamps"}.Sanitize()).Scan(&state, &version))
	require.Equal(t, "OFF", state, "the stale writer changed nothing")
	require.Equal(t, 2, version)

	// The writer with the right version applies; its retry is a repeat.
	res, err := m.Transition(ctx, pool, "l1", "ON", idem.ExpectVersion(2))
	require.NoError(t, err)
	require.True(t, res.Applied)
	require.EqualValues(t, 3, res.Version)
	res, err = m.Transition(ctx, pool, "l1", "ON", idem.ExpectVersion(2))
	require.NoError(t, err)
	require.False(t, res.Applied, "the same writer's retry")

	// The same through the statement for states reachable from several.
	multi, err := idem.NewStateMachine(idem.StateMachineConfig{
		Schema: s.Name, Table: "lamps", IDColumn: "id", StateColumn: "state", VersionColumn: "version",
		States:      []string{"OFF", "ON", "DIM"},
		Transitions: map[string][]string{"OFF": {"ON", "DIM"}, "DIM": {"ON", "OFF"}, "ON": {"OFF"}},
	})
	require.NoError(t, err)
	_, err = multi.Transition(ctx, pool, "l1", "ON", idem.ExpectVersion(0))
	require.ErrorIs(t, err, idem.ErrVersionConflict)
	res, err = multi.Transition(ctx, pool, "l1", "OFF", idem.ExpectVersion(3))
	require.NoError(t, err)
	require.True(t, res.Applied)
	require.Equal(t, "ON", res.From)
	res, err = multi.Transition(ctx, pool, "l1", "ON", idem.ExpectVersion(4))
	require.NoError(t, err)
	require.True(t, res.Applied)
	require.Equal(t, "OFF", res.From)
	require.EqualValues(t, 5, res.Version)
	res, err = multi.Transition(ctx, pool, "l1", "ON", idem.ExpectVersion(4))
	require.NoError(t, err)
	require.False(t, res.Applied, "the same writer's retry")

	// Without a version column, ExpectVersion is a configuration error.
	noVersion, err := idem.NewStateMachine(idem.StateMachineConfig{
		Schema: s.Name, Table: "lamps", IDColumn: "id", StateColumn: "state",
		States: []string{"OFF", "ON"}, Transitions: map[string][]string{"OFF": {"ON"}, "ON": {"OFF"}},
	})
	require.NoError(t, err)
	_, err = noVersion.Transition(ctx, pool, "l1", "OFF", idem.ExpectVersion(3))
	require.ErrorIs(t, err, idem.ErrInvalidOption)
}

func TestTransitionRepeatableReadConflictIs40001(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	m := orderMachine(t, pool, s, "")
	ctx := context.Background()
	id := newOrder(t, pool, s)
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer tx.Rollback(ctx)            //nolint:errcheck
	_, err = tx.Exec(ctx, "SELECT 1") // take the snapshot
	require.NoError(t, err)
	_, err = m.Transition(ctx, pool, id, "PAID")
	require.NoError(t, err)
	_, err = m.Transition(ctx, tx, id, "CANCELLED")
	require.True(t, idem.IsRetryable(err), "want 40001, got %v", err)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, "PAID", readOrder(t, pool, s, id).Status)
}

// Random concurrent transitions on a few orders: the history holds exactly
// one row per applied transition, and each order's history is a valid path.
func TestTransitionHistoryMatchesAppliedTransitions(t *testing.T) {
	pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 16 })
	s := pgtest.NewSchema(t, pool)
	m := orderMachine(t, pool, s, "")
	ctx := context.Background()
	ids := []int64{newOrder(t, pool, s), newOrder(t, pool, s), newOrder(t, pool, s)}
	// Above READ COMMITTED (the database's default level), a transition
	// racing another on the same order fails with 40001 and changes nothing;
	// the worker retries it as a client must.
	iso := isolationOf(t, pool)
	var applied, retries atomic.Int64
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for range 40 {
				id := ids[r.IntN(len(ids))]
				to := orderStates[1+r.IntN(len(orderStates)-1)]
				var res idem.TransitionResult
				n, err := asClient(iso, func() (err error) {
					res, err = m.Transition(ctx, pool, id, to)
					return err
				})
				retries.Add(int64(n))
				if err != nil && !errors.Is(err, idem.ErrInvalidTransition) {
					t.Error(err)
					return
				}
				if res.Applied {
					applied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%s: %d applied transitions, %d retried after 40001/40P01", iso, applied.Load(), retries.Load())
	var total int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{s.Name, "order_history"}.Sanitize()).Scan(&total))
	require.EqualValues(t, applied.Load(), total)
	for _, id := range ids {
		rows, err := pool.Query(ctx, `SELECT from_state, to_state, version FROM `+pgx.Identifier{s.Name, "order_history"}.Sanitize()+
			` WHERE entity_id = $1 ORDER BY version`, id)
		require.NoError(t, err)
		state, version := "PENDING", int64(0)
		for rows.Next() {
			var from, to string
			var v int64
			require.NoError(t, rows.Scan(&from, &to, &v))
			require.Equal(t, state, from)
			require.True(t, m.Allowed(from, to), "%s -> %s", from, to)
			require.Equal(t, version+1, v)
			state, version = to, v
		}
		require.NoError(t, rows.Err())
		row := readOrder(t, pool, s, id)
		require.Equal(t, state, row.Status)
		require.Equal(t, version, row.Version)
	}
}

func TestNewStateMachineRejectsBadConfig(t *testing.T) {
	good := idem.StateMachineConfig{Table: "orders", IDColumn: "id", StateColumn: "status",
		States: orderStates, Transitions: orderTransitions}
	_, err := idem.NewStateMachine(good)
	require.NoError(t, err)
	for name, mutate := range map[string]func(*idem.StateMachineConfig){
		"unknown to":        func(c *idem.StateMachineConfig) { c.Transitions = map[string][]string{"PENDING": {"LOST"}} },
		"unknown from":      func(c *idem.StateMachineConfig) { c.Transitions = map[string][]string{"NEW": {"PAID"}} },
		"no transitions":    func(c *idem.StateMachineConfig) { c.Transitions = nil },
		"empty transitions": func(c *idem.StateMachineConfig) { c.Transitions = map[string][]string{"PENDING": {}} },
		"no states":         func(c *idem.StateMachineConfig) { c.States = nil },
		"duplicate state":   func(c *idem.StateMachineConfig) { c.States = []string{"PENDING", "PENDING", "PAID"} },
		"self loop":         func(c *idem.StateMachineConfig) { c.Transitions = map[string][]string{"PAID": {"PAID"}} },
		"unsafe table":      func(c *idem.StateMachineConfig) { c.Table = `orders"; DROP TABLE x; --` },
		"unsafe column":     func(c *idem.StateMachineConfig) { c.StateColumn = "status; --" },
		"unsafe schema":     func(c *idem.StateMachineConfig) { c.Schema = "a.b" },
		"unsafe version":    func(c *idem.StateMachineConfig) { c.VersionColumn = "v v" },
		"unsafe history":    func(c *idem.StateMachineConfig) { c.HistoryTable = "h-1" },
		"empty id column":   func(c *idem.StateMachineConfig) { c.IDColumn = "" },
	} {
		cfg := good
		mutate(&cfg)
		_, err := idem.NewStateMachine(cfg)
		require.ErrorIs(t, err, idem.ErrInvalidOption, name)
	}
}

package idemmysql_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
)

func ordersMachine(t *testing.T, db *sql.DB) *idemmysql.StateMachine {
	t.Helper()
	m, err := idemmysql.NewStateMachine(idem.StateMachineConfig{
		Table: "orders", IDColumn: "id", StateColumn: "status",
		States: []string{"PENDING", "PAID", "SHIPPED", "CANCELLED", "REFUNDED"},
		Transitions: map[string][]string{
			"PENDING": {"PAID", "CANCELLED"},
			"PAID":    {"SHIPPED", "REFUNDED"},
			"SHIPPED": {"REFUNDED"},
		},
		VersionColumn: "version", HistoryTable: "order_history",
	})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = db.ExecContext(ctx, `CREATE TABLE orders (id BIGINT PRIMARY KEY, status VARCHAR(20) NOT NULL, version BIGINT NOT NULL, paid_ref VARCHAR(40) NULL) ENGINE = InnoDB`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, m.HistoryTableDDL("BIGINT"))
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO orders (id, status, version) VALUES (1, 'PENDING', 1), (2, 'PENDING', 1), (3, 'PENDING', 1)`)
	require.NoError(t, err)
	return m
}

func history(t *testing.T, db *sql.DB, id int) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM order_history WHERE entity_id = ?`, id).Scan(&n))
	return n
}

func TestStateMachine(t *testing.T) {
	db := openDB(t)
	m := ordersMachine(t, db)
	ctx := context.Background()

	res, err := m.Transition(ctx, db, 1, "PAID", idem.Set("paid_ref", "pay-1"))
	require.NoError(t, err)
	require.Equal(t, idem.TransitionResult{From: "PENDING", To: "PAID", Applied: true, Version: 2}, res)
	var ref string
	require.NoError(t, db.QueryRow(`SELECT paid_ref FROM orders WHERE id = 1`).Scan(&ref))
	require.Equal(t, "pay-1", ref)
	require.Equal(t, 1, history(t, db, 1))

	res, err = m.Transition(ctx, db, 1, "PAID")
	require.NoError(t, err, "a repeat is no error")
	require.False(t, res.Applied)
	require.Equal(t, 1, history(t, db, 1))

	_, err = m.Transition(ctx, db, 1, "CANCELLED")
	var te *idem.TransitionError
	require.ErrorAs(t, err, &te)
	require.Equal(t, "PAID", te.Current)

	// Several states may reach REFUNDED.
	res, err = m.Transition(ctx, db, 1, "REFUNDED")
	require.NoError(t, err)
	require.Equal(t, "PAID", res.From)
	require.True(t, res.Applied)

	_, err = m.Transition(ctx, db, 99, "PAID")
	require.ErrorIs(t, err, idem.ErrNotFound)

	_, err = m.Transition(ctx, db, 2, "PAID", idem.ExpectVersion(5))
	require.ErrorIs(t, err, idem.ErrVersionConflict)
	res, err = m.Transition(ctx, db, 2, "PAID", idem.ExpectVersion(1))
	require.NoError(t, err)
	require.True(t, res.Applied)
	res, err = m.Transition(ctx, db, 2, "PAID", idem.ExpectVersion(1))
	require.NoError(t, err, "this writer's own move, repeated")
	require.False(t, res.Applied)

	_, err = m.Transition(ctx, db, 1, "GONE")
	require.ErrorIs(t, err, idem.ErrInvalidOption)
}

// Under REPEATABLE READ the state the machine decides from is the latest
// committed one, read under a lock, not the caller's snapshot.
func TestStateMachineReadsThroughTheSnapshot(t *testing.T) {
	db := openDB(t)
	m := ordersMachine(t, db)
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	require.NoError(t, err)
	defer tx.Rollback()
	var status string
	require.NoError(t, tx.QueryRowContext(ctx, `SELECT status FROM orders WHERE id = 3`).Scan(&status))
	require.Equal(t, "PENDING", status) // the snapshot
	_, err = m.Transition(ctx, db, 3, "PAID")
	require.NoError(t, err)
	res, err := m.Transition(ctx, tx, 3, "SHIPPED")
	require.NoError(t, err, "decided from the snapshot's PENDING")
	require.Equal(t, idem.TransitionResult{From: "PAID", To: "SHIPPED", Applied: true, Version: 3}, res)
	require.NoError(t, tx.Commit())
	require.Equal(t, 2, history(t, db, 3))
}

// Twenty payments of one order at once: one moves it, the rest see PAID.
func TestStateMachineRace(t *testing.T) {
	db := openDB(t)
	m := ordersMachine(t, db)
	ctx := context.Background()
	var applied atomic.Int32
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			res, err := m.Transition(ctx, db, 2, "PAID")
			if err != nil && !errors.Is(err, idem.ErrInvalidTransition) {
				require.NoError(t, err)
			}
			if res.Applied {
				applied.Add(1)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 1, applied.Load())
	require.Equal(t, 1, history(t, db, 2))
	var version int
	require.NoError(t, db.QueryRow(`SELECT version FROM orders WHERE id = 2`).Scan(&version))
	require.Equal(t, 2, version)
}

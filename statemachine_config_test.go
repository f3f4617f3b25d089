package idem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func ordersConfig() idem.StateMachineConfig {
	return idem.StateMachineConfig{
		Table: "orders", IDColumn: "id", StateColumn: "status",
		States: []string{"PENDING", "PAID", "SHIPPED", "CANCELLED"},
		Transitions: map[string][]string{
			"PENDING": {"PAID", "CANCELLED"},
			"PAID":    {"SHIPPED"},
		},
	}
}

func TestNewStateMachineRejectsBadConfig(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name   string
		change func(*idem.StateMachineConfig)
		msg    string
	}{
		{"no table", func(c *idem.StateMachineConfig) { c.Table = "" }, `Table ""`},
		{"quoted table", func(c *idem.StateMachineConfig) { c.Table = `orders"; DROP TABLE x; --` }, "Table"},
		{"long id column", func(c *idem.StateMachineConfig) { c.IDColumn = strings.Repeat("i", 64) }, "IDColumn"},
		{"state column with a space", func(c *idem.StateMachineConfig) { c.StateColumn = "the status" }, "StateColumn"},
		{"schema with a dot", func(c *idem.StateMachineConfig) { c.Schema = "a.b" }, "Schema"},
		{"bad version column", func(c *idem.StateMachineConfig) { c.VersionColumn = "1v" }, "VersionColumn"},
		{"bad history table", func(c *idem.StateMachineConfig) { c.HistoryTable = "h-h" }, "HistoryTable"},
		{"no states", func(c *idem.StateMachineConfig) { c.States = nil }, "no States"},
		{"no transitions", func(c *idem.StateMachineConfig) { c.Transitions = nil }, "no Transitions"},
		{"only empty transitions", func(c *idem.StateMachineConfig) { c.Transitions = map[string][]string{"PENDING": nil} }, "allow no move"},
		{"empty state", func(c *idem.StateMachineConfig) { c.States = append(c.States, "") }, "empty state"},
		{"duplicate state", func(c *idem.StateMachineConfig) { c.States = append(c.States, "PAID") }, `"PAID" listed twice`},
		{"from an unknown state", func(c *idem.StateMachineConfig) { c.Transitions["LOST"] = []string{"PAID"} }, `unknown state "LOST"`},
		{"to an unknown state", func(c *idem.StateMachineConfig) { c.Transitions["PAID"] = []string{"REFUNDED"} }, `unknown state "REFUNDED"`},
		{"to itself", func(c *idem.StateMachineConfig) { c.Transitions["PAID"] = []string{"PAID"} }, "goes nowhere"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ordersConfig()
			tt.change(&cfg)
			m, err := idem.NewStateMachine(cfg)
			require.Nil(t, m)
			require.ErrorIs(t, err, idem.ErrInvalidOption)
			require.ErrorContains(t, err, tt.msg)
		})
	}
}

func TestStateMachineAllowed(t *testing.T) {
	t.Parallel()

	cfg := ordersConfig()
	cfg.Transitions["PENDING"] = append(cfg.Transitions["PENDING"], "PAID") // listed twice: one move
	m, err := idem.NewStateMachine(cfg)
	require.NoError(t, err)
	for _, move := range [][2]string{{"PENDING", "PAID"}, {"PENDING", "CANCELLED"}, {"PAID", "SHIPPED"}} {
		require.True(t, m.Allowed(move[0], move[1]), "%s -> %s", move[0], move[1])
	}
	for _, move := range [][2]string{{"PAID", "PENDING"}, {"PENDING", "SHIPPED"}, {"SHIPPED", "PAID"}, {"PAID", "PAID"}, {"LOST", "PAID"}, {"PAID", "LOST"}} {
		require.False(t, m.Allowed(move[0], move[1]), "%s -> %s", move[0], move[1])
	}
	require.Equal(t, "stateDiagram-v2\n    PENDING --> CANCELLED\n    PENDING --> PAID\n    PAID --> SHIPPED\n", m.Mermaid())
}

// States that are not Mermaid identifiers are drawn with underscores.
func TestStateMachineMermaidNames(t *testing.T) {
	t.Parallel()

	m, err := idem.NewStateMachine(idem.StateMachineConfig{
		Table: "t", IDColumn: "id", StateColumn: "s",
		States:      []string{"in review", "done-ok"},
		Transitions: map[string][]string{"in review": {"done-ok"}},
	})
	require.NoError(t, err)
	require.Equal(t, "stateDiagram-v2\n    in_review --> done_ok\n", m.Mermaid())
}

func TestHistoryTableDDL(t *testing.T) {
	t.Parallel()

	m, err := idem.NewStateMachine(ordersConfig())
	require.NoError(t, err)
	require.Empty(t, m.HistoryTableDDL("bigint"), "no HistoryTable, no DDL")

	cfg := ordersConfig()
	cfg.Schema, cfg.HistoryTable = "shop", "order_history"
	m, err = idem.NewStateMachine(cfg)
	require.NoError(t, err)
	ddl := m.HistoryTableDDL("uuid")
	require.True(t, strings.HasPrefix(ddl, `CREATE TABLE IF NOT EXISTS "shop"."order_history" (`), ddl)
	require.Contains(t, ddl, "entity_id  uuid NOT NULL")
}

// Transition refuses what it can tell is wrong before any SQL: a nil db
// would be used otherwise.
func TestTransitionChecksItsArguments(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	m, err := idem.NewStateMachine(ordersConfig())
	require.NoError(t, err)
	db := noSQL{t}

	tests := []struct {
		name string
		db   idem.DBTX
		to   string
		opts []idem.TransitionOption
	}{
		{"unknown state", db, "LOST", nil},
		{"nil db", nil, "PAID", nil},
		{"Set of a bad column", db, "PAID", []idem.TransitionOption{idem.Set("paid at", 1)}},
		{"Set of the state column", db, "PAID", []idem.TransitionOption{idem.Set("status", "X")}},
		{"Set of the id column", db, "PAID", []idem.TransitionOption{idem.Set("id", 2)}},
		{"ExpectVersion without a VersionColumn", db, "PAID", []idem.TransitionOption{idem.ExpectVersion(3)}},
	}
	for _, tt := range tests {
		res, err := m.Transition(ctx, tt.db, 1, tt.to, tt.opts...)
		require.ErrorIs(t, err, idem.ErrInvalidOption, tt.name)
		require.False(t, res.Applied, tt.name)
	}
}

func TestTransitionErrorMatches(t *testing.T) {
	t.Parallel()

	var err error = &idem.TransitionError{ID: 7, Current: "PAID", Wanted: "CANCELLED"}
	require.ErrorIs(t, err, idem.ErrInvalidTransition)
	require.NotErrorIs(t, err, idem.ErrVersionConflict)
	require.Equal(t, `idem: row 7 is "PAID", which cannot move to "CANCELLED"`, err.Error())

	wrapped := fmt.Errorf("paying order 7: %w", err)
	var te *idem.TransitionError
	require.True(t, errors.As(wrapped, &te))
	require.Equal(t, "PAID", te.Current)
}

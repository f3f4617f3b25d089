package idemmysql

import (
	"context"
	"database/sql"

	"github.com/idemkit/idem"
	dialects "github.com/idemkit/idem/internal/dialect/mysql"
	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/protocol"
)

// DBTX runs statements: *sql.DB, *sql.Tx and *sql.Conn all satisfy it. The
// calls that take one run in the caller's transaction when it is a *sql.Tx,
// and otherwise in a transaction of their own.
type DBTX interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// StateMachine runs guarded transitions on one MySQL table, as
// idem.StateMachine does on PostgreSQL: the same configuration, outcomes
// and errors (order PENDING → PAID, say). It is safe for concurrent use.
// Create it with NewStateMachine.
type StateMachine struct {
	m *protocol.Machine
}

// machine is m's protocol machine, nil for a nil m.
func (m *StateMachine) machine() *protocol.Machine {
	if m == nil {
		return nil
	}
	return m.m
}

// NewStateMachine validates cfg and returns the machine, as
// idem.NewStateMachine does (idem.ErrInvalidOption for unsafe identifiers,
// an empty transition set, unknown or duplicate states). Schema, when set,
// names the table's database; names are backtick-quoted.
func NewStateMachine(cfg idem.StateMachineConfig) (*StateMachine, error) {
	// The machine's statements are the same on MariaDB and MySQL 8.
	m, err := protocol.NewMachine(dialects.MySQL8, protocol.MachineConfig(cfg))
	if err != nil {
		return nil, err
	}
	return &StateMachine{m: m}, nil
}

// Transition moves row id to state to, if the machine allows it from the
// row's current state. MySQL's UPDATE returns no row, so the transition
// reads the row under its exclusive lock (SELECT ... FOR UPDATE), then
// updates it, guarded by the state read, and writes the history row when
// configured: one transaction, of db's (a *sql.Tx) or of its own (a *sql.DB
// or *sql.Conn). The current state of a refused move comes from that
// locking read, so under REPEATABLE READ it is the latest committed one,
// never the caller's snapshot. Options are idem.Set and idem.ExpectVersion.
//
// Outcomes are idem.StateMachine.Transition's: Applied=true with From the
// previous state; Applied=false and no error when the row is already in to;
// an *idem.TransitionError (idem.ErrInvalidTransition, or
// idem.ErrVersionConflict with ExpectVersion) carrying the current state,
// the row untouched; idem.ErrNotFound; idem.ErrInvalidOption for an unknown
// state, a nil db or machine, or a *sql.Tx already ended; a *TxAbortedError
// when the server rolled the caller's transaction back.
func (m *StateMachine) Transition(ctx context.Context, db DBTX, id any, to string, opts ...idem.TransitionOption) (idem.TransitionResult, error) {
	var q protocol.Querier
	if !handle.Missing(db) {
		q = flavor.Querier(db)
	}
	res, err := m.machine().Transition(ctx, q, mysqlErrors{}.Closed, id, to, protocol.NewTransitionCall(opts))
	return idem.TransitionResult(res), wrap(protocol.WithContextErr(ctx, err))
}

// HistoryTableDDL returns a CREATE TABLE statement for the machine's history
// table, with entity_id of type idType (e.g. "BIGINT"), or "" when the
// machine has none. idType is SQL copied into the statement as it is: it
// must come from the program, never from input. Run it outside any
// transaction: MySQL commits an open one before DDL.
func (m *StateMachine) HistoryTableDDL(idType string) string {
	return m.machine().HistoryTableDDL(idType)
}

// Allowed reports whether the machine lets a row move from one state to
// another. A nil machine allows nothing.
func (m *StateMachine) Allowed(from, to string) bool { return m.machine().Allowed(from, to) }

// Mermaid renders the machine as a Mermaid state diagram.
func (m *StateMachine) Mermaid() string { return m.machine().Mermaid() }

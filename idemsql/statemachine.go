package idemsql

import (
	"context"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/protocol"
)

// StateMachine runs conditional-UPDATE transitions on one table through
// database/sql, as idem.StateMachine does on pgx: the same configuration,
// statements, outcomes and errors. It is safe for concurrent use. Create it
// with NewStateMachine.
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
// idem.NewStateMachine does. It fails (matching idem.ErrInvalidOption) on
// unsafe identifiers, an empty transition set, a transition from or to a
// state not in States, or a duplicate state. Transition's id is a
// parameter, so it may be any value the database/sql driver sends for the
// id column.
func NewStateMachine(cfg idem.StateMachineConfig) (*StateMachine, error) {
	m, err := protocol.NewMachine(dialect, protocol.MachineConfig(cfg))
	if err != nil {
		return nil, err
	}
	return &StateMachine{m: m}, nil
}

// Transition moves row id to state to, if the machine allows it from the
// row's current state, in one conditional UPDATE (with the history row, when
// configured, in the same statement). Options are idem.Set and
// idem.ExpectVersion.
//
// db may be a *sql.DB, a *sql.Conn or a *sql.Tx: in a *sql.Tx the
// transition is part of the caller's transaction, which commits or rolls
// back as usual. The source states are sent one parameter each, so lib/pq
// and pgx's stdlib driver both bind them.
//
// Outcomes are idem.StateMachine.Transition's: Applied=true with From set
// to the previous state; Applied=false and no error when the row is already
// in to (a repeat); an *idem.TransitionError (idem.ErrInvalidTransition, or
// idem.ErrVersionConflict for ExpectVersion) carrying the current state,
// the row left untouched; idem.ErrNotFound when no row has that id;
// idem.ErrInvalidOption for a state the machine does not know, a nil db, a
// nil machine, or a *sql.Tx already committed or rolled back. Under
// REPEATABLE READ or SERIALIZABLE a row changed by a concurrent transaction
// fails with SQLSTATE 40001 (see idem.IsRetryable).
func (m *StateMachine) Transition(ctx context.Context, db DBTX, id any, to string, opts ...idem.TransitionOption) (idem.TransitionResult, error) {
	var q protocol.Querier
	if !handle.Missing(db) {
		q = querierOf(db)
	}
	res, err := m.machine().Transition(ctx, q, sqlErrors{}.Closed, id, to, protocol.NewTransitionCall(opts))
	return idem.TransitionResult(res), protocol.WithContextErr(ctx, err)
}

// HistoryTableDDL returns a CREATE TABLE statement for the machine's history
// table, with entity_id of type idType (e.g. "bigint", "uuid"), or "" when
// the machine has none. The table name is quoted, but idType is SQL copied
// into the statement as it is: it must come from the program, never from
// input.
func (m *StateMachine) HistoryTableDDL(idType string) string {
	return m.machine().HistoryTableDDL(idType)
}

// Allowed reports whether the machine lets a row move from one state to
// another. A nil machine allows nothing.
func (m *StateMachine) Allowed(from, to string) bool {
	return m.machine().Allowed(from, to)
}

// Mermaid renders the machine as a Mermaid state diagram, states and
// transitions in a stable order, for documentation.
func (m *StateMachine) Mermaid() string {
	return m.machine().Mermaid()
}

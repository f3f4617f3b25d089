package idem

import (
	"context"

	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/protocol"
)

// StateMachineConfig describes a business table whose state column moves
// only along allowed transitions. Identifiers must be plain names (letters,
// digits, underscores) and are always quoted in SQL.
type StateMachineConfig struct {
	// Schema of Table (and of HistoryTable). Empty means the search_path.
	Schema string
	// Table holds the rows, e.g. "orders".
	Table string
	// IDColumn identifies a row, e.g. "id". Transition's id is compared with
	// it as a parameter, so any type pgx can encode for the column works.
	IDColumn string
	// StateColumn holds the state, e.g. "status". It may be text, varchar or
	// an enum; it is compared as text.
	StateColumn string
	// States lists every state. A transition that names another state is a
	// configuration error.
	States []string
	// Transitions maps each state to the states it may move to. It must not
	// be empty.
	Transitions map[string][]string
	// VersionColumn, when set, is an integer column incremented by every
	// applied transition. Transition's ExpectVersion then refuses to act on a
	// row that changed since the caller read it (optimistic locking), so a
	// stale writer cannot be fooled by A→B→A. Empty disables it.
	VersionColumn string
	// HistoryTable, when set, receives one row per applied transition, in
	// the same statement: (entity_id, from_state, to_state, version,
	// changed_at). Its entity_id column must accept the id column's type;
	// version may be NULL when VersionColumn is empty. See HistoryTableDDL.
	HistoryTable string
}

// StateMachine runs conditional-UPDATE transitions on one table. It is safe
// for concurrent use. Create it with NewStateMachine.
type StateMachine struct {
	m    *protocol.Machine
	from map[string][]string // the machine's: to → the states that may reach it
}

// machine is m's protocol machine, nil for a nil m.
func (m *StateMachine) machine() *protocol.Machine {
	if m == nil {
		return nil
	}
	return m.m
}

// TransitionResult reports what Transition did.
type TransitionResult struct {
	// From is the row's state before the statement: the state the
	// transition left when Applied, the current state otherwise.
	From string
	// To is the state asked for.
	To string
	// Applied reports that this call changed the row. False with a nil error
	// means the row was already in To: the idempotent repeat.
	Applied bool
	// Version is the row's version after the call (0 without a
	// VersionColumn).
	Version int64
}

// TransitionError reports a transition the row's current state (or version)
// does not allow. It matches ErrInvalidTransition, or ErrVersionConflict when
// ExpectVersion did not match. Its fields: ID is the row's id, Current the
// row's current state, Wanted the state asked for; ExpectedVersion and
// CurrentVersion (int64) are set for version conflicts.
type TransitionError = protocol.TransitionError

// ErrVersionConflict means the row's version was not the one the caller
// expected (see ExpectVersion): another writer changed it first.
var ErrVersionConflict = protocol.ErrVersionConflict

// NewStateMachine validates cfg and returns the machine. It fails (matching
// ErrInvalidOption) on unsafe identifiers, an empty transition set, a
// transition from or to a state not in States, or a duplicate state.
func NewStateMachine(cfg StateMachineConfig) (*StateMachine, error) {
	m, err := protocol.NewMachine(dialect, protocol.MachineConfig(cfg))
	if err != nil {
		return nil, err
	}
	return &StateMachine{m: m, from: m.Sources()}, nil
}

// TransitionOption adjusts one Transition call.
type TransitionOption func(*protocol.TransitionCall)

// Set also sets column to value in the same UPDATE (paid_at, payment_id,
// ...). value is a parameter; column must be a plain identifier and not the
// id, state or version column.
func Set(column string, value any) TransitionOption {
	return func(c *protocol.TransitionCall) { c.Set(column, value) }
}

// ExpectVersion makes the transition apply only if the row's version column
// still holds v. A row already in the wanted state at version v+1 is the
// idempotent repeat; any other version is a *TransitionError matching
// ErrVersionConflict. It needs a VersionColumn.
func ExpectVersion(v int64) TransitionOption {
	return func(c *protocol.TransitionCall) { c.ExpectVersion(v) }
}

// Transition moves row id to state to, if the machine allows it from the
// row's current state, in one conditional UPDATE (with the history row, when
// configured, in the same statement).
//
// Outcomes: Applied=true with From set to the previous state; Applied=false
// and no error when the row is already in to (a repeat); a *TransitionError
// (ErrInvalidTransition) carrying the current state when the machine does not
// allow the move, the row left untouched; ErrNotFound when no row has that
// id; ErrInvalidOption for a state the machine does not know. Under
// REPEATABLE READ or SERIALIZABLE a row changed by a concurrent transaction
// fails with SQLSTATE 40001 (see IsRetryable). db may be a pool, a connection
// or a transaction.
func (m *StateMachine) Transition(ctx context.Context, db DBTX, id any, to string, opts ...TransitionOption) (TransitionResult, error) {
	var q protocol.Querier
	if !handle.Missing(db) {
		q = pgxQuerier{db: db}
	}
	res, err := m.machine().Transition(ctx, q, pgxErrors{}.Closed, id, to, protocol.NewTransitionCall(opts))
	return TransitionResult(res), err
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

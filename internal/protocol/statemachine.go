package protocol

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/idemkit/idem/internal/ident"
)

// The state machine: a business table whose state column moves only along
// allowed transitions, each one conditional UPDATE. The root package
// (idem.StateMachine) and idemsql (idemsql.StateMachine) are fronts on
// Machine.
//
// The statements bind the source states one parameter each ($3, $4, ...),
// never as an array, so that every driver binds them: database/sql's drivers
// cannot send a Go slice.

// The state machine's sentinel errors. The root package exports each under
// its own name.
var (
	ErrInvalidTransition = errors.New("idem: invalid transition")
	ErrVersionConflict   = errors.New("idem: version conflict")
)

// MachineConfig is idem.StateMachineConfig, field for field, so that each
// converts to the other.
type MachineConfig struct {
	Schema        string
	Table         string
	IDColumn      string
	StateColumn   string
	States        []string
	Transitions   map[string][]string
	VersionColumn string
	HistoryTable  string
}

// Machine runs conditional-UPDATE transitions on one table. It is safe for
// concurrent use.
type Machine struct {
	cfg    MachineConfig
	q      MachineQueries      // the dialect's statements
	from   map[string][]string // to → the states that may reach it, sorted
	states map[string]bool
	plain  map[string]string // to → the statement without options
	read   string
}

// TransitionResult is idem.TransitionResult, field for field.
type TransitionResult struct {
	From    string
	To      string
	Applied bool
	Version int64
}

// TransitionError is idem.TransitionError: a transition the row's current
// state (or version) does not allow. It matches ErrInvalidTransition, or
// ErrVersionConflict when ExpectVersion did not match.
type TransitionError struct {
	ID      any    // the row's id
	Current string // the row's current state
	Wanted  string // the state asked for
	// ExpectedVersion and CurrentVersion are set for version conflicts.
	ExpectedVersion, CurrentVersion int64
	versionConflict                 bool
}

// Error describes the row, its current state and the refused move.
func (e *TransitionError) Error() string {
	if e.versionConflict {
		return fmt.Sprintf("idem: row %v is at version %d (state %q), not %d: cannot move it to %q",
			e.ID, e.CurrentVersion, e.Current, e.ExpectedVersion, e.Wanted)
	}
	return fmt.Sprintf("idem: row %v is %q, which cannot move to %q", e.ID, e.Current, e.Wanted)
}

// Is matches ErrInvalidTransition, and ErrVersionConflict for version
// conflicts.
func (e *TransitionError) Is(target error) bool {
	return target == ErrInvalidTransition || (e.versionConflict && target == ErrVersionConflict)
}

// NewMachine validates cfg and returns the machine, whose statements are in
// dialect d. It fails (matching
// ErrInvalidOption) on unsafe identifiers, an empty transition set, a
// transition from or to a state not in States, or a duplicate state.
func NewMachine(d *Dialect, cfg MachineConfig) (*Machine, error) {
	bad := func(format string, args ...any) (*Machine, error) {
		return nil, fmt.Errorf("%w: state machine: "+format, append([]any{ErrInvalidOption}, args...)...)
	}
	if d.Machine == nil {
		return bad("not supported on %s", d.Name)
	}
	for _, n := range []struct{ what, name string }{
		{"Table", cfg.Table}, {"IDColumn", cfg.IDColumn}, {"StateColumn", cfg.StateColumn},
	} {
		if !ident.Plain(n.name, 63) {
			return bad("%s %q is not a plain identifier", n.what, n.name)
		}
	}
	for _, n := range []struct{ what, name string }{
		{"Schema", cfg.Schema}, {"VersionColumn", cfg.VersionColumn}, {"HistoryTable", cfg.HistoryTable},
	} {
		if n.name != "" && !ident.Plain(n.name, 63) {
			return bad("%s %q is not a plain identifier", n.what, n.name)
		}
	}
	if len(cfg.States) == 0 {
		return bad("no States")
	}
	if len(cfg.Transitions) == 0 {
		return bad("no Transitions")
	}
	m := &Machine{
		cfg:    cfg,
		from:   map[string][]string{},
		states: map[string]bool{},
	}
	for _, s := range cfg.States {
		if s == "" {
			return bad("an empty state name")
		}
		if m.states[s] {
			return bad("state %q listed twice", s)
		}
		m.states[s] = true
	}
	total := 0
	for from, tos := range cfg.Transitions {
		if !m.states[from] {
			return bad("transition from unknown state %q", from)
		}
		for _, to := range tos {
			if !m.states[to] {
				return bad("transition %q -> %q: unknown state %q", from, to, to)
			}
			if from == to {
				return bad("transition %q -> %q goes nowhere", from, to)
			}
			if !slices.Contains(m.from[to], from) {
				m.from[to] = append(m.from[to], from)
				total++
			}
		}
	}
	if total == 0 {
		return bad("Transitions allow no move")
	}
	for _, f := range m.from {
		slices.Sort(f)
	}
	names := MachineNames{Table: Table{cfg.Schema, cfg.Table}, ID: cfg.IDColumn, State: cfg.StateColumn, Version: cfg.VersionColumn}
	if cfg.HistoryTable != "" {
		names.History = Table{cfg.Schema, cfg.HistoryTable}
	}
	m.q = d.Machine(names)
	// Build the common statements once.
	m.read = m.q.Read()
	m.plain = map[string]string{}
	for _, to := range cfg.States {
		m.plain[to] = m.transitionSQL(to, &TransitionCall{})
	}
	return m, nil
}

// TransitionCall is what one Transition call's options set. The fronts'
// TransitionOption is a func(*TransitionCall).
type TransitionCall struct {
	sets          []setColumn
	expectVersion *int64
	err           error
}

type setColumn struct {
	column string
	value  any
}

// Set also sets column to value in the same UPDATE (idem.Set).
func (c *TransitionCall) Set(column string, value any) {
	if !ident.Plain(column, 63) {
		if c.err == nil {
			c.err = fmt.Errorf("%w: Set: %q is not a plain identifier", ErrInvalidOption, column)
		}
		return
	}
	c.sets = append(c.sets, setColumn{column, value})
}

// ExpectVersion makes the transition apply only at version v
// (idem.ExpectVersion).
func (c *TransitionCall) ExpectVersion(v int64) { c.expectVersion = &v }

// NewTransitionCall applies opts, skipping nil ones.
func NewTransitionCall[O ~func(*TransitionCall)](opts []O) *TransitionCall {
	c := &TransitionCall{}
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	return c
}

// Transition moves row id to state to, if the machine allows it from the
// row's current state, in one conditional UPDATE (with the history row,
// when configured, in the same statement); see idem.StateMachine.Transition
// for the outcomes. q is nil when the front was given no usable handle;
// closed is the driver's Errors.Closed.
func (m *Machine) Transition(ctx context.Context, q Querier, closed func(error) (string, bool), id any, to string, call *TransitionCall) (TransitionResult, error) {
	res := TransitionResult{To: to}
	if m == nil {
		return res, fmt.Errorf("%w: Transition on a nil *StateMachine (did NewStateMachine fail?)", ErrInvalidOption)
	}
	if !m.states[to] {
		return res, fmt.Errorf("%w: state %q is not one of the machine's states", ErrInvalidOption, to)
	}
	if q == nil {
		return res, fmt.Errorf("%w: Transition needs a database", ErrInvalidOption)
	}
	if call == nil {
		call = &TransitionCall{}
	}
	if call.err != nil {
		return res, call.err
	}
	if call.expectVersion != nil && m.cfg.VersionColumn == "" {
		return res, fmt.Errorf("%w: ExpectVersion needs a VersionColumn", ErrInvalidOption)
	}
	for _, s := range call.sets {
		if s.column == m.cfg.IDColumn || s.column == m.cfg.StateColumn || s.column == m.cfg.VersionColumn {
			return res, fmt.Errorf("%w: Set(%q): the machine owns that column", ErrInvalidOption, s.column)
		}
	}
	if m.q.LockRead() != "" {
		return m.transitionLocked(ctx, q, closed, id, to, call)
	}
	allowed := m.from[to]

	sql := m.plain[to]
	if len(call.sets) > 0 || call.expectVersion != nil {
		sql = m.transitionSQL(to, call)
	}
	args := m.args(id, to, call)
	var (
		found, applied bool
		current, prev  *string
		version        *int64
	)
	if len(allowed) == 1 {
		// One state may reach to, so the previous state is known: a plain
		// guarded UPDATE, and a read only when it changed nothing.
		if err := q.Run(ctx, Stmt{SQL: sql, Args: args, Dest: []any{&version}, Found: &applied}); err != nil {
			return res, ClosedHandle("Transition", err, closed)
		}
		if applied {
			found, prev = true, &allowed[0]
		} else if err := q.Run(ctx, Stmt{SQL: m.read, Args: []any{id}, Dest: []any{&current, &version}, Found: &found}); err != nil {
			return res, ClosedHandle("Transition", err, closed)
		}
	} else {
		// Several states (or none) may reach to: lock the row, read its
		// state, and update it if allowed, in one statement.
		if err := q.Run(ctx, Stmt{SQL: sql, Args: args, Dest: []any{&found, &current, &applied, &prev, &version}}); err != nil {
			return res, ClosedHandle("Transition", err, closed)
		}
	}
	return m.settle(res, id, to, call, found, applied, current, prev, version)
}

// transitionLocked is Transition in a dialect with a LockRead: the row is
// read under its lock, and updated (with its history row) only if the move
// is allowed from the state read, in one group of statements (one
// transaction when q is not the caller's).
func (m *Machine) transitionLocked(ctx context.Context, q Querier, closed func(error) (string, bool), id any, to string, call *TransitionCall) (TransitionResult, error) {
	var (
		found, applied bool
		current        *string
		version        *int64
		changed        int64
	)
	sources := m.from[to]
	allowed := func() bool {
		if !found || current == nil || !slices.Contains(sources, *current) {
			return false
		}
		return call.expectVersion == nil || (version != nil && *version == *call.expectVersion)
	}
	newVersion := func() any {
		if version == nil {
			return nil
		}
		return *version + 1
	}
	sql := m.plain[to]
	if len(call.sets) > 0 || call.expectVersion != nil {
		sql = m.transitionSQL(to, call)
	}
	stmts := []Stmt{
		{SQL: m.q.LockRead(), Args: []any{id}, Dest: []any{&current, &version}, Found: &found},
		{SQL: sql, Affected: &changed, Exactly1: true, Lazy: func(st *Stmt) {
			applied = allowed()
			st.OnlyIf = &applied
			if applied {
				st.Args = m.argsFrom(id, to, *current, call)
			}
		}},
	}
	if m.cfg.HistoryTable != "" {
		stmts = append(stmts, Stmt{SQL: m.q.HistoryInsert(), OnlyIf: &applied, Lazy: func(st *Stmt) {
			if applied {
				st.Args = []any{id, to, *current, newVersion()}
			}
		}})
	}
	if err := q.Run(ctx, stmts...); err != nil {
		return TransitionResult{To: to}, ClosedHandle("Transition", err, closed)
	}
	prev := current
	if applied && version != nil {
		v := *version + 1
		version = &v
	}
	return m.settle(TransitionResult{To: to}, id, to, call, found, applied, current, prev, version)
}

// settle turns what a transition's statements found into its result: the
// row missing (ErrNotFound), moved (from prev), or left in current, which
// is a repeat, this writer's own transition at ExpectVersion, or a refusal.
func (m *Machine) settle(res TransitionResult, id any, to string, call *TransitionCall,
	found, applied bool, current, prev *string, version *int64) (TransitionResult, error) {
	if !found {
		return res, fmt.Errorf("%w: no row of %s with %s = %v", ErrNotFound, m.cfg.Table, m.cfg.IDColumn, id)
	}
	if version != nil {
		res.Version = *version
	}
	if applied {
		res.Applied = true
		res.From = deref(prev)
		return res, nil
	}
	res.From = deref(current)
	if call.expectVersion != nil {
		exp := *call.expectVersion
		if res.From == to && res.Version == exp+1 {
			return res, nil // this writer's transition, already applied
		}
		if res.Version != exp {
			return res, &TransitionError{ID: id, Current: res.From, Wanted: to,
				ExpectedVersion: exp, CurrentVersion: res.Version, versionConflict: true}
		}
	}
	if res.From == to {
		return res, nil
	}
	return res, &TransitionError{ID: id, Current: res.From, Wanted: to}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// args are a transition's parameters, in the order transitionSQL numbers
// them: $1 the id, $2 the state asked for, $3... the states that may reach
// it, then the values of Set, then the expected version.
func (m *Machine) args(id any, to string, call *TransitionCall) []any {
	from := m.from[to]
	args := make([]any, 0, 2+len(from)+len(call.sets)+1)
	args = append(args, id, to)
	for _, f := range from {
		args = append(args, f)
	}
	for _, s := range call.sets {
		args = append(args, s.value)
	}
	if call.expectVersion != nil {
		args = append(args, *call.expectVersion)
	}
	return args
}

// argsFrom are the parameters of a transition to to from the one state
// from (a LockRead dialect's): as args orders them, with from the only
// source.
func (m *Machine) argsFrom(id any, to, from string, call *TransitionCall) []any {
	args := make([]any, 0, 3+len(call.sets)+1)
	args = append(args, id, to, from)
	for _, s := range call.sets {
		args = append(args, s.value)
	}
	if call.expectVersion != nil {
		args = append(args, *call.expectVersion)
	}
	return args
}

// transitionSQL is the dialect's statement of a transition to to, with
// call's options.
func (m *Machine) transitionSQL(to string, call *TransitionCall) string {
	sets := make([]string, len(call.sets))
	for i, s := range call.sets {
		sets[i] = s.column
	}
	n := len(m.from[to])
	if m.q.LockRead() != "" {
		n = 1 // the one state the row is in
	}
	return m.q.Transition(n, sets, call.expectVersion != nil)
}

// Sources maps each state to the states that may reach it, sorted. The
// caller must not modify it.
func (m *Machine) Sources() map[string][]string { return m.from }

// HistoryTableDDL returns a CREATE TABLE statement for the machine's
// history table, with entity_id of type idType, or "" when the machine has
// none (or is nil).
func (m *Machine) HistoryTableDDL(idType string) string {
	if m == nil || m.cfg.HistoryTable == "" {
		return ""
	}
	return m.q.HistoryDDL(idType)
}

// Allowed reports whether the machine lets a row move from one state to
// another. A nil machine allows nothing.
func (m *Machine) Allowed(from, to string) bool {
	return m != nil && slices.Contains(m.from[to], from)
}

// Mermaid renders the machine as a Mermaid state diagram, states and
// transitions in a stable order. A nil machine has no states.
func (m *Machine) Mermaid() string {
	var b strings.Builder
	b.WriteString("stateDiagram-v2\n")
	if m == nil {
		return b.String()
	}
	for _, from := range m.cfg.States {
		tos := slices.Clone(m.cfg.Transitions[from])
		slices.Sort(tos)
		for _, to := range slices.Compact(tos) {
			fmt.Fprintf(&b, "    %s --> %s\n", mermaidName(from), mermaidName(to))
		}
	}
	return b.String()
}

// mermaidName keeps a state usable as a Mermaid identifier.
func mermaidName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			return r
		}
		return '_'
	}, s)
}

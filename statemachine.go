package idem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/ident"
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
	cfg     StateMachineConfig
	table   string // sanitized
	history string // sanitized, or ""
	id      string // sanitized column names
	state   string
	version string
	from    map[string][]string // to → the states that may reach it
	states  map[string]bool
	plain   map[string]string // to → the single-source statement without options
	read    string
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
// ExpectVersion did not match.
type TransitionError struct {
	ID      any    // the row's id
	Current string // the row's current state
	Wanted  string // the state asked for
	// ExpectedVersion and CurrentVersion are set for version conflicts.
	ExpectedVersion, CurrentVersion int64
	versionConflict                 bool
}

// ErrVersionConflict means the row's version was not the one the caller
// expected (see ExpectVersion): another writer changed it first.
var ErrVersionConflict = errors.New("idem: version conflict")

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

// NewStateMachine validates cfg and returns the machine. It fails (matching
// ErrInvalidOption) on unsafe identifiers, an empty transition set, a
// transition from or to a state not in States, or a duplicate state.
func NewStateMachine(cfg StateMachineConfig) (*StateMachine, error) {
	bad := func(format string, args ...any) (*StateMachine, error) {
		return nil, fmt.Errorf("%w: state machine: "+format, append([]any{ErrInvalidOption}, args...)...)
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
	m := &StateMachine{
		cfg:    cfg,
		id:     pgx.Identifier{cfg.IDColumn}.Sanitize(),
		state:  pgx.Identifier{cfg.StateColumn}.Sanitize(),
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
	qualify := func(name string) string {
		if cfg.Schema == "" {
			return pgx.Identifier{name}.Sanitize()
		}
		return pgx.Identifier{cfg.Schema, name}.Sanitize()
	}
	m.table = qualify(cfg.Table)
	if cfg.HistoryTable != "" {
		m.history = qualify(cfg.HistoryTable)
	}
	if cfg.VersionColumn != "" {
		m.version = pgx.Identifier{cfg.VersionColumn}.Sanitize()
	}
	// Build the common statements once.
	m.read = m.readSQL()
	m.plain = map[string]string{}
	for to, froms := range m.from {
		if len(froms) == 1 {
			m.plain[to], _ = m.singleSQL(nil, to, froms[0], &transitionCall{})
		}
	}
	return m, nil
}

// TransitionOption adjusts one Transition call.
type TransitionOption func(*transitionCall)

type transitionCall struct {
	sets          []setColumn
	expectVersion *int64
	err           error
}

type setColumn struct {
	column string
	value  any
}

// Set also sets column to value in the same UPDATE (paid_at, payment_id,
// ...). value is a parameter; column must be a plain identifier and not the
// id, state or version column.
func Set(column string, value any) TransitionOption {
	return func(c *transitionCall) {
		if !ident.Plain(column, 63) {
			c.err = fmt.Errorf("%w: Set: %q is not a plain identifier", ErrInvalidOption, column)
			return
		}
		c.sets = append(c.sets, setColumn{column, value})
	}
}

// ExpectVersion makes the transition apply only if the row's version column
// still holds v. A row already in the wanted state at version v+1 is the
// idempotent repeat; any other version is a *TransitionError matching
// ErrVersionConflict. It needs a VersionColumn.
func ExpectVersion(v int64) TransitionOption {
	return func(c *transitionCall) { c.expectVersion = &v }
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
	res := TransitionResult{To: to}
	if m == nil {
		return res, fmt.Errorf("%w: Transition on a nil *StateMachine (did NewStateMachine fail?)", ErrInvalidOption)
	}
	if !m.states[to] {
		return res, fmt.Errorf("%w: state %q is not one of the machine's states", ErrInvalidOption, to)
	}
	if handle.Missing(db) {
		return res, fmt.Errorf("%w: Transition needs a database", ErrInvalidOption)
	}
	var call transitionCall
	for _, o := range opts {
		if o != nil {
			o(&call)
		}
	}
	if call.err != nil {
		return res, call.err
	}
	if call.expectVersion != nil && m.version == "" {
		return res, fmt.Errorf("%w: ExpectVersion needs a VersionColumn", ErrInvalidOption)
	}
	for _, s := range call.sets {
		if s.column == m.cfg.IDColumn || s.column == m.cfg.StateColumn || s.column == m.cfg.VersionColumn {
			return res, fmt.Errorf("%w: Set(%q): the machine owns that column", ErrInvalidOption, s.column)
		}
	}
	allowed := m.from[to]
	if len(allowed) == 0 {
		// Nothing may reach to; still tell a repeat from an error.
		allowed = []string{}
	}

	var (
		found, applied bool
		current        *string
		prev           *string
		version        *int64
	)
	if len(allowed) == 1 {
		// One state may reach to, so the previous state is known: a plain
		// guarded UPDATE, and a read only when it changed nothing.
		var sql string
		var args []any
		if len(call.sets) == 0 && call.expectVersion == nil {
			sql, args = m.plain[to], []any{id, allowed[0], to}
		} else {
			sql, args = m.singleSQL(id, to, allowed[0], &call)
		}
		err := closedHandle("Transition", db.QueryRow(ctx, sql, args...).Scan(&version))
		switch {
		case err == nil:
			found, applied, prev = true, true, &allowed[0]
		case errors.Is(err, pgx.ErrNoRows):
			err = db.QueryRow(ctx, m.read, id).Scan(&current, &version)
			if errors.Is(err, pgx.ErrNoRows) {
				break
			}
			if err != nil {
				return res, err
			}
			found = true
		default:
			return res, err
		}
	} else {
		sql, args := m.transitionSQL(id, to, allowed, &call)
		if err := db.QueryRow(ctx, sql, args...).Scan(&found, &current, &applied, &prev, &version); err != nil {
			return res, closedHandle("Transition", err)
		}
	}
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

// setClause is the SET list shared by both statements; it appends the values
// of Set columns to args.
func (m *StateMachine) setClause(args []any, call *transitionCall) (string, []any) {
	var set strings.Builder
	set.WriteString(m.state + " = $3")
	if m.version != "" {
		set.WriteString(", " + m.version + " = t." + m.version + " + 1")
	}
	for _, s := range call.sets {
		args = append(args, s.value)
		fmt.Fprintf(&set, ", %s = $%d", pgx.Identifier{s.column}.Sanitize(), len(args))
	}
	return set.String(), args
}

// singleSQL builds the statement for a state reachable from one state only:
// a guarded UPDATE (with the history row in the same statement) that returns
// the new version, or no row when it changed nothing.
func (m *StateMachine) singleSQL(id any, to, from string, call *transitionCall) (string, []any) {
	set, args := m.setClause([]any{id, from, to}, call)
	guard := ""
	versionRet := "NULL::bigint"
	if m.version != "" {
		versionRet = "t." + m.version + "::bigint"
		if call.expectVersion != nil {
			args = append(args, *call.expectVersion)
			guard = fmt.Sprintf(" AND t.%s = $%d", m.version, len(args))
		}
	}
	update := fmt.Sprintf(`UPDATE %s AS t SET %s WHERE t.%s = $1 AND t.%s::text = $2::text%s RETURNING `,
		m.table, set, m.id, m.state, guard)
	if m.history == "" {
		return update + versionRet, args
	}
	update += fmt.Sprintf("t.%s AS id, %s AS version", m.id, versionRet)
	return fmt.Sprintf(`WITH upd AS (%s), hist AS (
	INSERT INTO %s (entity_id, from_state, to_state, version, changed_at)
	SELECT id, $2, $3, version, now() FROM upd
)
SELECT version FROM upd`, update, m.history), args
}

// readSQL reads a row's state and version.
func (m *StateMachine) readSQL() string {
	version := "NULL::bigint"
	if m.version != "" {
		version = m.version + "::bigint"
	}
	return fmt.Sprintf(`SELECT %s::text, %s FROM %s WHERE %s = $1`, m.state, version, m.table, m.id)
}

// transitionSQL builds the statement for a state reachable from several:
// lock the row, read its state, update it if allowed, write history, and
// return the current state either way.
func (m *StateMachine) transitionSQL(id any, to string, allowed []string, call *transitionCall) (string, []any) {
	set, args := m.setClause([]any{id, allowed, to}, call)
	versionSel, versionRet := "NULL::bigint", "NULL::bigint"
	guard := ""
	if m.version != "" {
		versionSel = m.version + "::bigint"
		versionRet = "t." + m.version + "::bigint"
		if call.expectVersion != nil {
			args = append(args, *call.expectVersion)
			guard = fmt.Sprintf(" AND cur.version = $%d", len(args))
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `WITH cur AS (
	SELECT %[2]s AS id, %[3]s::text AS state, %[4]s AS version FROM %[1]s WHERE %[2]s = $1 FOR UPDATE
), upd AS (
	UPDATE %[1]s AS t SET %[5]s FROM cur
	WHERE t.%[2]s = cur.id AND cur.state = ANY($2::text[])%[6]s
	RETURNING cur.state AS prev, %[7]s AS version
)`, m.table, m.id, m.state, versionSel, set, guard, versionRet)
	if m.history != "" {
		fmt.Fprintf(&b, `, hist AS (
	INSERT INTO %s (entity_id, from_state, to_state, version, changed_at)
	SELECT cur.id, upd.prev, $3, upd.version, now() FROM upd, cur
)`, m.history)
	}
	b.WriteString(`
SELECT EXISTS (SELECT FROM cur), (SELECT state FROM cur), EXISTS (SELECT FROM upd),
	(SELECT prev FROM upd), coalesce((SELECT version FROM upd), (SELECT version FROM cur))`)
	return b.String(), args
}

// HistoryTableDDL returns a CREATE TABLE statement for the machine's history
// table, with entity_id of type idType (e.g. "bigint", "uuid"), or "" when
// the machine has none. The table name is quoted, but idType is SQL copied
// into the statement as it is: it must come from the program, never from
// input.
func (m *StateMachine) HistoryTableDDL(idType string) string {
	if m == nil || m.history == "" {
		return ""
	}
	return `CREATE TABLE IF NOT EXISTS ` + m.history + ` (
	id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	entity_id  ` + idType + ` NOT NULL,
	from_state text NOT NULL,
	to_state   text NOT NULL,
	version    bigint,
	changed_at timestamptz NOT NULL DEFAULT now()
)`
}

// Allowed reports whether the machine lets a row move from one state to
// another. A nil machine allows nothing.
func (m *StateMachine) Allowed(from, to string) bool {
	return m != nil && slices.Contains(m.from[to], from)
}

// Mermaid renders the machine as a Mermaid state diagram, states and
// transitions in a stable order, for documentation.
func (m *StateMachine) Mermaid() string {
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

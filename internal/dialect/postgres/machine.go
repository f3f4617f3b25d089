package postgres

import (
	"fmt"
	"strings"

	"github.com/idemkit/idem/internal/ident"
	"github.com/idemkit/idem/internal/protocol"
)

// machineQueries are a state machine's statements: names quoted.
type machineQueries struct {
	table, history     string // history: "" when none
	id, state, version string // version: "" when none
}

func machine(n protocol.MachineNames) protocol.MachineQueries {
	m := &machineQueries{table: Quote(n.Table), id: column(n.ID), state: column(n.State)}
	if n.History.Name != "" {
		m.history = Quote(n.History)
	}
	if n.Version != "" {
		m.version = column(n.Version)
	}
	return m
}

// column quotes a plain identifier (NewMachine and Set check that it is
// one).
func column(name string) string { return ident.Qualified("", name) }

// Transition: a state one state may reach gets a guarded UPDATE that
// returns the new version, or no row when it changed nothing. Any other
// state gets a statement that locks the row, reads its state, updates it if
// allowed, and returns the current state either way. Both write the history
// row, when configured, in the same statement. Parameters: $1 the id, $2
// the state asked for, $3... the states that may reach it, then the values
// of sets, then the expected version.
func (m *machineQueries) Transition(nFrom int, sets []string, expectVersion bool) string {
	n := 2 + nFrom // the last parameter so far
	var set strings.Builder
	set.WriteString(m.state + " = $2")
	if m.version != "" {
		set.WriteString(", " + m.version + " = t." + m.version + " + 1")
	}
	for _, s := range sets {
		n++
		fmt.Fprintf(&set, ", %s = $%d", column(s), n)
	}
	versionRet := "NULL::bigint"
	if m.version != "" {
		versionRet = "t." + m.version + "::bigint"
	}
	if nFrom == 1 {
		guard := ""
		if expectVersion {
			guard = fmt.Sprintf(" AND t.%s = $%d", m.version, n+1)
		}
		update := fmt.Sprintf(`UPDATE %s AS t SET %s WHERE t.%s = $1 AND t.%s::text = $3::text%s RETURNING `,
			m.table, set.String(), m.id, m.state, guard)
		if m.history == "" {
			return update + versionRet
		}
		update += fmt.Sprintf("t.%s AS id, %s AS version", m.id, versionRet)
		return fmt.Sprintf(`WITH upd AS (%s), hist AS (
	INSERT INTO %s (entity_id, from_state, to_state, version, changed_at)
	SELECT id, $3, $2, version, now() FROM upd
)
SELECT version FROM upd`, update, m.history)
	}

	// The states that may reach to, one text parameter each; none: false.
	allowed := "false"
	if nFrom > 0 {
		params := make([]string, nFrom)
		for i := range params {
			params[i] = fmt.Sprintf("$%d::text", 3+i)
		}
		allowed = "cur.state IN (" + strings.Join(params, ", ") + ")"
	}
	versionSel, guard := "NULL::bigint", ""
	if m.version != "" {
		versionSel = m.version + "::bigint"
		if expectVersion {
			guard = fmt.Sprintf(" AND cur.version = $%d", n+1)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `WITH cur AS (
	SELECT %[2]s AS id, %[3]s::text AS state, %[4]s AS version FROM %[1]s WHERE %[2]s = $1 FOR UPDATE
), upd AS (
	UPDATE %[1]s AS t SET %[5]s FROM cur
	WHERE t.%[2]s = cur.id AND %[6]s%[7]s
	RETURNING cur.state AS prev, %[8]s AS version
)`, m.table, m.id, m.state, versionSel, set.String(), allowed, guard, versionRet)
	if m.history != "" {
		fmt.Fprintf(&b, `, hist AS (
	INSERT INTO %s (entity_id, from_state, to_state, version, changed_at)
	SELECT cur.id, upd.prev, $2, upd.version, now() FROM upd, cur
)`, m.history)
	}
	b.WriteString(`
SELECT EXISTS (SELECT FROM cur), (SELECT state FROM cur), EXISTS (SELECT FROM upd),
	(SELECT prev FROM upd), coalesce((SELECT version FROM upd), (SELECT version FROM cur))`)
	return b.String()
}

// Read reads a row's state and version.
func (m *machineQueries) Read() string {
	version := "NULL::bigint"
	if m.version != "" {
		version = m.version + "::bigint"
	}
	return fmt.Sprintf(`SELECT %s::text, %s FROM %s WHERE %s = $1`, m.state, version, m.table, m.id)
}

// HistoryDDL creates the history table.
func (m *machineQueries) HistoryDDL(idType string) string {
	return `CREATE TABLE IF NOT EXISTS ` + m.history + ` (
	id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	entity_id  ` + idType + ` NOT NULL,
	from_state text NOT NULL,
	to_state   text NOT NULL,
	version    bigint,
	changed_at timestamptz NOT NULL DEFAULT now()
)`
}

// LockRead is "": Transition reads and writes in one statement.
func (*machineQueries) LockRead() string { return "" }

// HistoryInsert is "": Transition writes the history row itself.
func (*machineQueries) HistoryInsert() string { return "" }

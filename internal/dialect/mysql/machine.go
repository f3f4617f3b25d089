package mysql

import (
	"fmt"
	"strings"

	"github.com/idemkit/idem/internal/protocol"
)

// machineQueries are a state machine's statements, names quoted. MySQL's
// UPDATE returns no row, so a transition reads the row under its exclusive
// lock first (LockRead), then updates it from the state read: the "current
// state" of a refused move comes from that locking read, never from a
// REPEATABLE READ snapshot that may predate the last commit.
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
func column(name string) string { return "`" + name + "`" }

func (m *machineQueries) versionSel() string {
	if m.version == "" {
		return "NULL"
	}
	return m.version
}

// LockRead reads the row's state and version under an exclusive lock.
func (m *machineQueries) LockRead() string {
	return fmt.Sprintf("SELECT CAST(%s AS CHAR), %s FROM %s WHERE %s = $1 FOR UPDATE", m.state, m.versionSel(), m.table, m.id)
}

// Read reads the row's state and version under a shared lock (MariaDB
// rejects FOR SHARE; LOCK IN SHARE MODE works on both servers).
func (m *machineQueries) Read() string {
	return fmt.Sprintf("SELECT CAST(%s AS CHAR), %s FROM %s WHERE %s = $1 LOCK IN SHARE MODE", m.state, m.versionSel(), m.table, m.id)
}

// Transition updates the row from the one state read ($3) to $2, with the
// values of sets ($4...) and, with expectVersion, at the version that
// follows them. The state always changes (a machine has no move from a
// state to itself), so the row count is 1 whatever clientFoundRows says.
func (m *machineQueries) Transition(nFrom int, sets []string, expectVersion bool) string {
	n := 2 + nFrom
	var set strings.Builder
	// MySQL assigns left to right with the new values: the version first.
	if m.version != "" {
		set.WriteString(m.version + " = " + m.version + " + 1, ")
	}
	set.WriteString(m.state + " = $2")
	for _, s := range sets {
		n++
		fmt.Fprintf(&set, ", %s = $%d", column(s), n)
	}
	guard := ""
	if expectVersion {
		guard = fmt.Sprintf(" AND %s = $%d", m.version, n+1)
	}
	return fmt.Sprintf("UPDATE %s SET %s WHERE %s = $1 AND %s = $3%s", m.table, set.String(), m.id, m.state, guard)
}

// HistoryInsert writes the history row of a move.
func (m *machineQueries) HistoryInsert() string {
	return "INSERT INTO " + m.history + " (entity_id, from_state, to_state, version, changed_at) VALUES ($1, $3, $2, $4, " + now + ")"
}

// HistoryDDL creates the history table.
func (m *machineQueries) HistoryDDL(idType string) string {
	return "CREATE TABLE IF NOT EXISTS " + m.history + ` (
	id         BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
	entity_id  ` + idType + ` NOT NULL,
	from_state VARCHAR(255) NOT NULL,
	to_state   VARCHAR(255) NOT NULL,
	version    BIGINT NULL,
	changed_at DATETIME(6) NOT NULL
) ENGINE = InnoDB`
}

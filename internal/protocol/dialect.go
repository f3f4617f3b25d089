package protocol

import (
	"strings"
	"sync"
	"time"
)

// Table names one of idem's tables: plain identifiers that the option that
// set them validated (ident.ValidateTable). An empty Schema means the
// connection's default (PostgreSQL's search_path, MySQL's current
// database).
type Table struct {
	Schema, Name string
}

// String is the table's name as a message shows it: schema.name.
func (t Table) String() string {
	if t.Schema == "" {
		return t.Name
	}
	return t.Schema + "." + t.Name
}

// The tables a Config names unless an option says otherwise.
var (
	DefaultRecords = Table{Name: DefaultTable}
	DefaultInbox   = Table{Name: DefaultInboxTable}
)

// Dialect is the SQL of one database, which a driver supplies: every
// statement the protocol runs comes from it, with the database's quoting,
// types and clock (PostgreSQL's clock_timestamp(), MySQL's
// UTC_TIMESTAMP(6)). The protocol holds no SQL of its own beyond the
// standard savepoint statements.
//
// Statements number their parameters $1, $2, ... in the order of the
// arguments the protocol passes, and may use one more than once. A driver
// whose database binds parameters by position only (MySQL's ?) rewrites
// them.
//
// A Dialect is built once (a package variable of its implementation) and
// used by every call; RecordsOf and InboxOf build a table's statements on
// first use and keep them.
type Dialect struct {
	// Name names the database in messages ("PostgreSQL").
	Name string
	// Records builds the statements of a record table, and Inbox those of
	// an inbox table.
	Records func(Table) *Queries
	Inbox   func(Table) *InboxQueries
	// Machine builds the statements of a state machine.
	Machine func(MachineNames) MachineQueries
	// Statements are the statements that name no table.
	Statements
	// SQLErrors classifies the database's errors that the protocol acts
	// on.
	SQLErrors

	defaults       sync.Once
	defaultRecords *Queries
	defaultInbox   *InboxQueries
	records        sync.Map // Table -> *Queries
	inbox          sync.Map // Table -> *InboxQueries
}

// Statements are a dialect's statements that name no table.
type Statements struct {
	// ClaimLockTimeout bounds, for the rest of the transaction, how long
	// lease mode's claim waits for a row another transaction holds before
	// answering ErrInProgress; PurgeLockTimeout how long a purge batch
	// waits before it skips held rows instead.
	ClaimLockTimeout, PurgeLockTimeout string
	// ReadCommitted makes the transaction it starts READ COMMITTED.
	ReadCommitted string
	// NoWaitSet and NoWaitRestore go before and after a no-wait claim, in
	// its round trip, after Queries.LockTable: NoWaitSet keeps the
	// transaction's lock wait bound and lowers it so that a key held by
	// an uncommitted transaction is answered at once; NoWaitRestore puts it
	// back. A claim that fails leaves NoWaitRestore unrun; the rollback of
	// the transaction or savepoint that follows undoes NoWaitSet too.
	NoWaitSet, NoWaitRestore string
	// HoldSet bounds, for the rest of the transaction, how long it may sit
	// idle and how long a statement may run, to $1 milliseconds, keeping a
	// lower bound already set. HoldRead reads the two values it replaces
	// (two text columns), so that a call in the caller's transaction can
	// put them back with HoldRestore ($1, $2).
	HoldSet, HoldRead, HoldRestore string
	// HoldSession, when set, says that HoldSet changes the session rather
	// than the transaction (MariaDB), and puts the session back as HoldSet
	// found it. Only Do then applies the hold timeout: its transaction
	// runs on a connection of its own, where the driver runs HoldSession
	// once the transaction has ended, and which it discards if that fails.
	// HoldRead and HoldRestore go unused.
	HoldSession string
	// ReadCommittedNow reads (one boolean column) whether the transaction
	// runs at READ COMMITTED, where every statement sees the latest
	// commits.
	ReadCommittedNow string
	// ClaimPrefix, when set, bounds the wait of a claiming statement on the
	// server, as a prefix of its text: at once for a no-wait claim, else
	// within wait (the time left before ctx's deadline; negative: none).
	// The claim then queues neither NoWaitSet nor LockTable. It returns ""
	// for no bound.
	ClaimPrefix func(noWait bool, wait time.Duration) string
	// OneAtATime reports that the database takes one statement per query:
	// statements the protocol would join with semicolons go one by one.
	OneAtATime bool
}

// SQLErrors classifies a database's errors, whichever driver returned them.
type SQLErrors struct {
	// Unique reports a unique violation.
	Unique func(err error) bool
	// IdleTimeout reports that the server ended a session that sat idle in
	// a transaction past its bound (the hold timeout).
	IdleTimeout func(err error) bool
	// MissingTable reports that err is a statement's failure on table t,
	// which does not exist.
	MissingTable func(err error, t Table) bool
	// Aborted reports an error with which the server rolled the whole
	// transaction back (MySQL's deadlock): nothing is left to undo, and no
	// statement may follow on it. nil where no error does so.
	Aborted func(err error) bool
}

// TxAborted reports that err rolled the whole transaction back on the
// server (SQLErrors.Aborted).
func (e *SQLErrors) TxAborted(err error) bool {
	return e.Aborted != nil && err != nil && e.Aborted(err)
}

// RecordsOf returns the statements of the record table t, built on first
// use.
func (d *Dialect) RecordsOf(t Table) *Queries {
	if t == DefaultRecords {
		d.defaults.Do(d.buildDefaults)
		return d.defaultRecords
	}
	return cached(&d.records, t, d.Records)
}

// InboxOf returns the statements of the inbox table t, built on first use.
func (d *Dialect) InboxOf(t Table) *InboxQueries {
	if t == DefaultInbox {
		d.defaults.Do(d.buildDefaults)
		return d.defaultInbox
	}
	return cached(&d.inbox, t, d.Inbox)
}

// cached returns the value of t in m, storing build(t) there first if it
// has none.
func cached[V any](m *sync.Map, t Table, build func(Table) V) V {
	if v, ok := m.Load(t); ok {
		return v.(V)
	}
	v, _ := m.LoadOrStore(t, build(t))
	return v.(V)
}

// buildDefaults builds the statements of the default tables, which nearly
// every call uses: they are found without a map lookup.
func (d *Dialect) buildDefaults() {
	d.defaultRecords, d.defaultInbox = d.Records(DefaultRecords), d.Inbox(DefaultInbox)
}

// MachineNames are a state machine's tables and columns, plain identifiers
// that NewMachine validated. History.Name and Version are empty when the
// machine has no history table or no version column.
type MachineNames struct {
	Table, History     Table
	ID, State, Version string
}

// MachineQueries are the statements of one state machine.
type MachineQueries interface {
	// Read returns a row's state (text) and version (a bigint, or NULL
	// without a version column), $1 the row's id.
	Read() string
	// Transition is the statement of a move to a state that the n states
	// of its arguments may reach (see Machine.args for the order), also
	// setting the columns sets, and applying only at the expected version
	// when expectVersion. With n == 1 it returns the new version (NULL
	// without a version column), or no row when it changed nothing;
	// otherwise it returns one row: whether the row exists, its state, whether
	// it moved, the state it left, and its version.
	Transition(n int, sets []string, expectVersion bool) string
	// HistoryDDL creates the history table, entity_id of type idType.
	HistoryDDL(idType string) string
	// LockRead, where the database's UPDATE cannot return the row (MySQL),
	// reads a row's state and version under an exclusive lock ($1 the id);
	// the transition is then that read, Transition with one source state
	// (the one read) when the move is allowed, and HistoryInsert ($1 id, $2
	// the new state, $3 the state left, $4 the new version), in one group.
	// "" where Transition reads and writes in one statement.
	LockRead() string
	HistoryInsert() string
}

// RollbackTo rolls back to the savepoints in order, then releases the last:
// one statement of several joined by semicolons where the database allows
// it (PostgreSQL accepts that in an aborted transaction, as a simple-protocol
// message), one statement each where it does not.
func (d *Dialect) RollbackTo(savepoints ...string) []Stmt {
	last := savepoints[len(savepoints)-1]
	if d.OneAtATime {
		stmts := make([]Stmt, 0, len(savepoints)+1)
		for _, sp := range savepoints {
			stmts = append(stmts, Stmt{SQL: "ROLLBACK TO SAVEPOINT " + sp})
		}
		return append(stmts, Stmt{SQL: "RELEASE SAVEPOINT " + last})
	}
	var b strings.Builder
	for _, sp := range savepoints {
		b.WriteString("ROLLBACK TO SAVEPOINT " + sp + "; ")
	}
	b.WriteString("RELEASE SAVEPOINT " + last)
	return []Stmt{{SQL: b.String()}}
}

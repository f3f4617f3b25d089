package protocol

import "context"

// Stmt is one statement of a group a driver runs.
type Stmt struct {
	SQL  string
	Args []any
	// Dest, when not nil, receives the columns of the statement's first
	// row. With Found set, a statement that returns no row sets *Found to
	// false instead of failing; a row sets it to true.
	Dest  []any
	Found *bool
	// Affected, when not nil, receives the number of rows the statement
	// changed.
	Affected *int64
	// Exactly1 requires the statement to change exactly one row: a driver
	// that runs statements one at a time fails the group otherwise, before
	// any later statement (COMMIT among them). Only a dialect whose
	// statements cannot check it themselves sets it (Queries.CompleteRows).
	Exactly1 bool
	// Each, when not nil, is called for every row the statement returns,
	// with what scans that row; an error it returns ends the statement and
	// the group with that error.
	Each func(scan func(dest ...any) error) error
	// OnlyIf, when not nil, makes the statement conditional on *OnlyIf as
	// the statements before it left it: a driver that runs statements one
	// at a time skips it when false. A driver that sends the group at once
	// runs it anyway, so it must be harmless either way.
	OnlyIf *bool
	// Lazy, when not nil, completes the statement from what the statements
	// before it in the group returned: a driver that runs statements one at
	// a time calls it just before the statement (it may set Args, and
	// OnlyIf to skip it). A driver that sends the group at once cannot, and
	// fails the group: only dialects of such drivers' databases use it.
	Lazy func(st *Stmt)
	// Raw marks a statement of the caller's (InsertOrGet's insert and
	// lookup): the driver runs its SQL and arguments as written, never
	// rewritten for the database's placeholders, and never prepares it.
	Raw bool
}

// Exec runs groups of statements in one transaction.
type Exec interface {
	// Run runs stmts in order and stops at the first error. The pgx driver
	// sends them as one batch, in one round trip; database/sql runs them
	// one after the other. A group of one statement without arguments or
	// destination goes by the simple query protocol, so that it may hold
	// several statements separated by semicolons and runs in an aborted
	// transaction (ROLLBACK TO SAVEPOINT).
	Run(ctx context.Context, stmts ...Stmt) error
}

// Querier runs statements on what a call was given: a pool or database, a
// connection, or a transaction.
type Querier interface {
	Exec
	// InTx reports that the statements run in a transaction of the
	// caller's. Otherwise a group of several statements runs as one
	// transaction of its own (pgx: a batch's implicit transaction;
	// database/sql: BEGIN and COMMIT around it), and a lone statement in
	// its own.
	InTx() bool
}

// Tx is a transaction a claimed execution runs in.
type Tx[TTx any] interface {
	Exec
	// Fn returns what fn receives, in the driver's own type, and a function
	// that ends it once fn has returned (a pgx guard stops working).
	Fn() (tx TTx, end func())
}

// Own is a transaction of the protocol's own (Do).
type Own[TTx any] interface {
	Tx[TTx]
	// Commit runs stmts, then commits, in one round trip where the driver
	// can. It reports whether a failure leaves the outcome unknown: the
	// connection failed while COMMIT was in flight. A server error, a
	// COMMIT the server answered with ROLLBACK, or one never sent means
	// that nothing committed.
	Commit(ctx context.Context, stmts ...Stmt) (unknown bool, err error)
	// Rollback runs stmts, then rolls back, in one round trip where the
	// driver can. The transaction is over whatever it returns.
	Rollback(ctx context.Context, stmts ...Stmt) error
	// End rolls the transaction back if it is still open, even when ctx is
	// done. A rollback that fails closes the connection.
	End(ctx context.Context)
}

// Conn begins the transactions of one attempt of Do.
type Conn[TTx any] interface {
	// Begin begins a transaction whose first statements are stmts: the pgx
	// driver sends BEGIN with them in one batch. When one fails, the
	// transaction is ended and the error returned.
	Begin(ctx context.Context, stmts ...Stmt) (Own[TTx], error)
}

// Beginner is what Do works on: a pool, a connection or a database.
type Beginner[TTx any] interface {
	// Acquire returns the Conn of one attempt and release, which gives it
	// back once the attempt ended with err (nil when it succeeded) and
	// returns err, marked with Unavailable when err left the connection
	// unusable and another attempt on a fresh one may succeed: release then
	// drops the connection rather than reuse it. A failure to acquire one
	// is marked the same way when the database was unreachable.
	Acquire(ctx context.Context) (conn Conn[TTx], release func(err error) error, _ error)
}

// Errors classifies a driver's errors for the protocol.
type Errors interface {
	// Retryable reports a serialization failure or a deadlock: the whole
	// transaction may run again.
	Retryable(err error) bool
	// LockTimeout reports that a statement gave up waiting for a lock
	// (PostgreSQL's 55P03): a no-wait claim met a holder.
	LockTimeout(err error) bool
	// Closed recognises the error of a handle that cannot work any more: a
	// closed pool (PoolClosed) or an ended transaction (TxEnded, invalid).
	// It returns "" for any other error.
	Closed(err error) (what string, invalid bool)
}

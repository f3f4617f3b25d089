// Package sqldriver is the database/sql driver of idem's claim protocol
// (internal/protocol), shared by every front on database/sql: idemsql
// (PostgreSQL) and idemmysql (MySQL and MariaDB). Statements run one after
// the other on the *sql.Tx, and fn receives that *sql.Tx itself. What
// differs between the databases is a Flavor.
package sqldriver

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/internal/protocol"
)

// Flavor is what differs between the databases database/sql reaches.
type Flavor struct {
	// Name is the front's package, for messages ("idemsql").
	Name string
	// Errors classifies the driver's errors for the protocol.
	Errors protocol.Errors
	// Bind rewrites a statement for the database's placeholders; nil runs
	// the statements as written ($1, $2, ...).
	Bind func(query string, args []any) (string, []any)
	// CommitUnknown reports that a COMMIT that failed with err may have
	// committed: the connection failed, or the context ended, with COMMIT
	// in flight.
	CommitUnknown func(err error) bool
	// Unavailable, when set, reports that an attempt of Do that failed with
	// err (before any COMMIT whose outcome is unknown) found the database
	// unavailable, so that Do retries it (protocol.Unavailable).
	Unavailable func(err error) bool
	// Aborted reports an error with which the server rolled the whole
	// transaction back (MySQL's deadlock): nil where none does. Once a
	// statement of a transaction failed so, the driver runs no other on it
	// (database/sql would run them outside any transaction).
	Aborted func(err error) bool
	// TxOptions maps Config.TxOptions to database/sql's, with a statement
	// that sets what sql.TxOptions cannot express.
	TxOptions func(opts any) (sql.TxOptions, string, error)
	// Prepare makes the statements with arguments of Do's transactions
	// prepared statements of the database, each prepared once per
	// connection and reused (go-sql-driver/mysql otherwise prepares and
	// closes one for every statement: two round trips instead of one).
	Prepare bool
}

// stmtCache holds one database's prepared statements, by query.
type stmtCache struct {
	db *sql.DB
	m  sync.Map // query -> *sql.Stmt
}

var caches sync.Map // *sql.DB -> *stmtCache

// cacheOf returns db's statement cache.
func cacheOf(db *sql.DB) *stmtCache {
	if c, ok := caches.Load(db); ok {
		return c.(*stmtCache)
	}
	c, _ := caches.LoadOrStore(db, &stmtCache{db: db})
	return c.(*stmtCache)
}

// prepare makes sure the cache holds each query's prepared statement. It
// runs before a transaction begins: preparing takes a connection of the
// pool's, which a transaction waiting for one must never ask for.
func (c *stmtCache) prepare(ctx context.Context, queries []string) error {
	for _, query := range queries {
		if _, ok := c.m.Load(query); ok || query == "" {
			continue
		}
		s, err := c.db.PrepareContext(ctx, query)
		if err != nil {
			return err
		}
		if _, loaded := c.m.LoadOrStore(query, s); loaded {
			_ = s.Close()
		}
	}
	return nil
}

// stmt returns the prepared statement of query, or nil when it has none.
func (c *stmtCache) stmt(query string) *sql.Stmt {
	if s, ok := c.m.Load(query); ok {
		return s.(*sql.Stmt)
	}
	return nil
}

// stmtQuerier runs one prepared statement as a Querier (the query is the
// statement's own).
type stmtQuerier struct{ s *sql.Stmt }

func (q stmtQuerier) ExecContext(ctx context.Context, _ string, args ...any) (sql.Result, error) {
	return q.s.ExecContext(ctx, args...)
}

func (q stmtQuerier) QueryContext(ctx context.Context, _ string, args ...any) (*sql.Rows, error) {
	return q.s.QueryContext(ctx, args...)
}

func (q stmtQuerier) QueryRowContext(ctx context.Context, _ string, args ...any) *sql.Row {
	return q.s.QueryRowContext(ctx, args...)
}

// AbortedError is the error of a statement the driver did not run because
// the server had already rolled the transaction back: the caller must roll
// it back and may run it again (idem.IsRetryable).
type AbortedError struct {
	// Err is the error with which the server ended the transaction.
	Err error
}

func (e *AbortedError) Error() string {
	return "idem: the server rolled the transaction back (" + e.Err.Error() + "); roll it back and run it again"
}

func (e *AbortedError) Unwrap() error { return e.Err }

// Closed recognises database/sql's errors of a handle that cannot work
// any more (protocol.Errors.Closed): a transaction already committed or
// rolled back, and a closed *sql.DB.
func Closed(err error) (string, bool) {
	switch {
	case errors.Is(err, sql.ErrTxDone):
		return protocol.TxEnded, true
	case err != nil && strings.Contains(err.Error(), "sql: database is closed"):
		// database/sql's own error, which it does not export.
		return protocol.PoolClosed, false
	}
	return "", false
}

// Querier is what statements run on: a *sql.Tx, a *sql.DB or a *sql.Conn.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// run runs stmts on q one after the other, stopping at the first error.
func (f *Flavor) run(ctx context.Context, q Querier, stmts []protocol.Stmt) error {
	for i := range stmts {
		if !ready(&stmts[i]) {
			continue
		}
		if err := f.runOne(ctx, q, &stmts[i]); err != nil {
			return err
		}
	}
	return nil
}

func (f *Flavor) runOne(ctx context.Context, q Querier, st *protocol.Stmt) error {
	query, args := st.SQL, st.Args
	if f.Bind != nil && !st.Raw {
		query, args = f.Bind(query, args)
	}
	if st.Each != nil {
		rows, err := q.QueryContext(ctx, query, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := st.Each(rows.Scan); err != nil {
				return err
			}
		}
		return rows.Err()
	}
	if st.Dest != nil {
		err := q.QueryRowContext(ctx, query, args...).Scan(st.Dest...)
		if st.Found != nil {
			if errors.Is(err, sql.ErrNoRows) {
				*st.Found = false
				return nil
			}
			*st.Found = err == nil
		}
		return err
	}
	res, err := q.ExecContext(ctx, query, args...)
	if err != nil || (st.Affected == nil && !st.Exactly1) {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if st.Affected != nil {
		*st.Affected = n
	}
	if st.Exactly1 && n != 1 {
		return fmt.Errorf("idem: the processing record changed under its owner; rows matched: %d", n)
	}
	return nil
}

// ready completes st (Stmt.Lazy) and reports whether it is to run
// (Stmt.OnlyIf).
func ready(st *protocol.Stmt) bool {
	if st.Lazy != nil {
		st.Lazy(st)
	}
	return st.OnlyIf == nil || *st.OnlyIf
}

// Tx is a *sql.Tx to the protocol: the caller's (WithIdempotency) or one of
// Do's.
type Tx struct {
	f  *Flavor
	tx *sql.Tx
	// cache, when set, prepares the statements with arguments (Prepare).
	cache *stmtCache
	// aborted is the error with which the server rolled tx back, if one
	// of the driver's statements met it.
	aborted error
}

// NewTx is tx to the protocol.
func (f *Flavor) NewTx(tx *sql.Tx) *Tx { return &Tx{f: f, tx: tx} }

// Run runs stmts on the transaction, one after the other; none once the
// server rolled it back.
func (t *Tx) Run(ctx context.Context, stmts ...protocol.Stmt) error {
	if t.aborted != nil {
		return &AbortedError{Err: t.aborted}
	}
	var err error
	if t.cache == nil {
		err = t.f.run(ctx, t.tx, stmts)
	} else {
		err = t.runPrepared(ctx, stmts)
	}
	if err != nil && t.f.Aborted != nil && t.f.Aborted(err) {
		t.aborted = err
	}
	return err
}

// runPrepared runs stmts as the cache's prepared statements, those with
// arguments; the others as they are.
func (t *Tx) runPrepared(ctx context.Context, stmts []protocol.Stmt) error {
	for i := range stmts {
		st := &stmts[i]
		if !ready(st) {
			continue
		}
		var q Querier = t.tx
		if len(st.Args) > 0 && !st.Raw {
			query := st.SQL
			if t.f.Bind != nil {
				query, _ = t.f.Bind(query, nil)
			}
			if ps := t.cache.stmt(query); ps != nil {
				// Prepared on the transaction's connection the first
				// time, and reused there after.
				q = stmtQuerier{t.tx.StmtContext(ctx, ps)}
			}
		}
		if err := t.f.runOne(ctx, q, st); err != nil {
			return err
		}
	}
	return nil
}

// InTx reports true: the statements run in the caller's transaction.
func (*Tx) InTx() bool { return true }

// Fn hands fn the *sql.Tx itself. database/sql's transaction is a struct,
// so nothing can refuse its Commit and Rollback: the documentation of Do and
// WithIdempotency says that fn must not call them, and the completion
// reports it if fn did.
func (t *Tx) Fn() (*sql.Tx, func()) { return t.tx, func() {} }

// own is a transaction Do began.
type own struct {
	*Tx
	ctx context.Context // what the transaction was begun with: database/sql ends it with ctx
	// sc is the connection of its own the transaction runs on, where
	// after runs once it has ended (Conn.AfterTx); nil otherwise.
	sc    *sql.Conn
	after string
}

// afterBound bounds the statement that runs after a transaction ended.
const afterBound = 5 * time.Second

// release runs after on the transaction's connection, once, and hands the
// connection back to the pool; a connection where after failed keeps a
// session it must not, and is discarded instead.
func (o *own) release() {
	if o.sc == nil {
		return
	}
	sc := o.sc
	o.sc = nil
	ctx, cancel := context.WithTimeout(context.Background(), afterBound)
	defer cancel()
	if _, err := sc.ExecContext(ctx, o.after); err != nil {
		_ = sc.Raw(func(any) error { return driver.ErrBadConn })
	}
	_ = sc.Close()
}

func (o *own) Commit(ctx context.Context, stmts ...protocol.Stmt) (unknown bool, err error) {
	defer o.release()
	if err := o.Run(ctx, stmts...); err != nil {
		if errors.Is(err, sql.ErrTxDone) && o.ctx.Err() == nil {
			return false, o.fnEndedTx()
		}
		return false, err
	}
	if cerr := o.ctx.Err(); cerr != nil {
		// database/sql rolls back a transaction whose context ended and
		// sends no COMMIT.
		_ = o.tx.Rollback()
		return false, &protocol.NotSentError{Err: fmt.Errorf("%s: commit not sent: %w", o.f.Name, cerr)}
	}
	err = o.tx.Commit()
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, sql.ErrTxDone):
		// database/sql rolled the transaction back already, its context
		// having ended since the check above: no COMMIT went out.
		return false, err
	}
	return o.f.CommitUnknown(err), err
}

// fnEndedTx is the completion's error when fn committed or rolled back the
// *sql.Tx it was given.
func (o *own) fnEndedTx() error {
	return fmt.Errorf("%s: fn committed or rolled back the *sql.Tx it was given, so its writes (if committed) have no record of the key; fn must return instead", o.f.Name)
}

func (o *own) Rollback(ctx context.Context, stmts ...protocol.Stmt) error {
	defer o.release()
	err := o.Run(ctx, stmts...)
	if rerr := o.tx.Rollback(); err == nil && !errors.Is(rerr, sql.ErrTxDone) {
		err = rerr
	}
	return err
}

func (o *own) End(context.Context) {
	_ = o.tx.Rollback()
	o.release()
}

// Conn begins Do's transactions on a database.
type Conn struct {
	f    *Flavor
	db   *sql.DB
	opts any // Config.TxOptions
	// prepare are the statements the transactions may run, prepared
	// before the first begins (Flavor.Prepare).
	prepare []string
	after   string // AfterTx
}

// Prepared adds queries to the statements c keeps prepared (with
// Flavor.Prepare; otherwise it changes nothing).
func (c Conn) Prepared(queries ...string) Conn {
	if !c.f.Prepare {
		return c
	}
	c.prepare = append([]string(nil), c.prepare...)
	for _, query := range queries {
		if query != "" && c.f.Bind != nil {
			query, _ = c.f.Bind(query, nil)
		}
		c.prepare = append(c.prepare, query)
	}
	return c
}

// AfterTx makes c's transactions run each on a connection of its own,
// where stmt runs once the transaction has ended, whatever ended it (the
// dialect's HoldSession: settings of the session's that the transaction
// changed). A connection where stmt fails is discarded, never handed back
// to the pool.
func (c Conn) AfterTx(stmt string) Conn {
	c.after = stmt
	return c
}

// NewConn is db to Do, its transactions begun with opts (Config.TxOptions).
// With Flavor.Prepare, the statements of q that take arguments are
// prepared statements of db.
func (f *Flavor) NewConn(db *sql.DB, opts any, q *protocol.Queries) Conn {
	c := Conn{f: f, db: db, opts: opts}
	if f.Prepare && q != nil {
		for _, query := range []string{q.Claim, q.ClaimRead, q.ClaimIssued, q.Takeover, q.Complete, q.Release} {
			if query != "" && f.Bind != nil {
				query, _ = f.Bind(query, nil)
			}
			c.prepare = append(c.prepare, query)
		}
	}
	return c
}

// Begin begins a transaction and runs stmts in it.
func (c Conn) Begin(ctx context.Context, stmts ...protocol.Stmt) (protocol.Own[*sql.Tx], error) {
	sopts, setTx, err := c.f.TxOptions(c.opts)
	if err != nil {
		return nil, err
	}
	var cache *stmtCache
	if len(c.prepare) > 0 {
		cache = cacheOf(c.db)
		if err := cache.prepare(ctx, c.prepare); err != nil {
			return nil, err
		}
	}
	o := &own{ctx: ctx, after: c.after}
	var stx *sql.Tx
	if c.after != "" {
		if o.sc, err = c.db.Conn(ctx); err != nil {
			return nil, err
		}
		stx, err = o.sc.BeginTx(ctx, &sopts)
	} else {
		stx, err = c.db.BeginTx(ctx, &sopts)
	}
	if err != nil {
		o.release()
		return nil, err
	}
	if setTx != "" {
		stmts = append([]protocol.Stmt{{SQL: setTx}}, stmts...)
	}
	o.Tx = c.f.NewTx(stx)
	o.Tx.cache = cache
	if err := o.Run(ctx, stmts...); err != nil {
		_ = stx.Rollback()
		o.release()
		return nil, err
	}
	return o, nil
}

// Acquire returns the database itself: database/sql picks a connection for
// each transaction.
// An attempt's error is marked unavailable when the flavor's Unavailable
// says so; database/sql drops a connection its driver reported bad.
func (c Conn) Acquire(context.Context) (protocol.Conn[*sql.Tx], func(error) error, error) {
	return c, func(err error) error {
		if err != nil && c.f.Unavailable != nil && c.f.Unavailable(err) {
			return protocol.Unavailable(err)
		}
		return err
	}, nil
}

// Querier is db to the protocol: the caller's transaction when db is a
// *sql.Tx (or cannot begin one), otherwise a database or connection on
// which a group of statements runs in a transaction of its own.
func (f *Flavor) Querier(db Querier) protocol.Querier {
	switch d := db.(type) {
	case *sql.Tx:
		return f.NewTx(d)
	case txBeginner:
		return beginQuerier{f: f, db: d}
	}
	return dbtxQuerier{f: f, db: db}
}

// txBeginner is a Querier that begins transactions: *sql.DB, *sql.Conn, and
// wrappers of them that keep database/sql's BeginTx.
type txBeginner interface {
	Querier
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// beginQuerier runs statements on a database or a connection: a lone one
// on its own, a group of several in a transaction of its own, committed
// when none failed.
type beginQuerier struct {
	f  *Flavor
	db txBeginner
}

func (q beginQuerier) Run(ctx context.Context, stmts ...protocol.Stmt) error {
	if len(stmts) == 1 {
		if !ready(&stmts[0]) {
			return nil
		}
		return q.f.runOne(ctx, q.db, &stmts[0])
	}
	stx, err := q.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := q.f.NewTx(stx).Run(ctx, stmts...); err != nil {
		_ = stx.Rollback()
		return err
	}
	if err := stx.Commit(); err != nil {
		if cerr := ctx.Err(); cerr != nil {
			// database/sql ended the transaction when ctx ended: the
			// context is the cause, not a transaction of the caller's.
			return fmt.Errorf("%s: %w: %w", q.f.Name, cerr, err)
		}
		return err
	}
	return nil
}

func (beginQuerier) InTx() bool { return false }

// dbtxQuerier runs statements on a Querier that cannot begin a transaction
// (a wrapper of a *sql.Tx, say), one after the other, as the caller's.
type dbtxQuerier struct {
	f  *Flavor
	db Querier
}

func (q dbtxQuerier) Run(ctx context.Context, stmts ...protocol.Stmt) error {
	return q.f.run(ctx, q.db, stmts)
}

func (dbtxQuerier) InTx() bool { return true }

package idemsql_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// fakeDriver is a database/sql driver that answers idem's claim as a first
// execution and fails COMMIT (or any statement containing failOn) as told,
// so that error mapping can be tested without a server.
type fakeDriver struct {
	mu        sync.Mutex
	commitErr error  // what Commit returns
	failOn    string // statements containing it fail with failErr
	failErr   error
	commits   atomic.Int64
	rollbacks atomic.Int64
	log       []string
}

func (d *fakeDriver) logged() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.log...)
}

var fakeSeq atomic.Int64

// openFake registers d under a fresh name and opens it.
func openFake(t *testing.T, d *fakeDriver) *sql.DB {
	t.Helper()
	name := "idemsql-fake-" + strconv.FormatInt(fakeSeq.Add(1), 10)
	sql.Register(name, d)
	db, err := sql.Open(name, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func (d *fakeDriver) Open(string) (driver.Conn, error) { return &fakeConn{d: d}, nil }

type fakeConn struct{ d *fakeDriver }

func (c *fakeConn) Prepare(string) (driver.Stmt, error) {
	return nil, errors.New("fake: Prepare is not used")
}
func (c *fakeConn) Close() error              { return nil }
func (c *fakeConn) Begin() (driver.Tx, error) { return &fakeTx{d: c.d}, nil }

func (c *fakeConn) BeginTx(ctx context.Context, _ driver.TxOptions) (driver.Tx, error) {
	c.d.mu.Lock()
	c.d.log = append(c.d.log, "BEGIN")
	c.d.mu.Unlock()
	return &fakeTx{d: c.d}, nil
}

func (c *fakeConn) record(query string) error {
	c.d.mu.Lock()
	defer c.d.mu.Unlock()
	c.d.log = append(c.d.log, query)
	if c.d.failOn != "" && strings.Contains(query, c.d.failOn) {
		return c.d.failErr
	}
	return nil
}

func (c *fakeConn) ExecContext(_ context.Context, query string, _ []driver.NamedValue) (driver.Result, error) {
	if err := c.record(query); err != nil {
		return nil, err
	}
	if strings.HasPrefix(query, "SAVEPOINT") || strings.HasPrefix(query, "RELEASE") || strings.HasPrefix(query, "ROLLBACK") {
		return driver.ResultNoRows, nil
	}
	return driver.RowsAffected(1), nil
}

func (c *fakeConn) QueryContext(_ context.Context, query string, _ []driver.NamedValue) (driver.Rows, error) {
	if err := c.record(query); err != nil {
		return nil, err
	}
	if strings.Contains(query, "ON CONFLICT (scope, key) DO NOTHING") {
		// The claim: inserted, a first execution at attempt 1.
		return &fakeRows{cols: []string{"attempt"}, rows: [][]driver.Value{{int64(1)}}}, nil
	}
	return &fakeRows{cols: []string{"v"}, rows: [][]driver.Value{{int64(1)}}}, nil
}

type fakeTx struct{ d *fakeDriver }

func (tx *fakeTx) Commit() error {
	tx.d.commits.Add(1)
	return tx.d.commitErr
}

func (tx *fakeTx) Rollback() error {
	tx.d.rollbacks.Add(1)
	return nil
}

type fakeRows struct {
	cols []string
	rows [][]driver.Value
}

func (r *fakeRows) Columns() []string { return r.cols }
func (r *fakeRows) Close() error      { return nil }

func (r *fakeRows) Next(dest []driver.Value) error {
	if len(r.rows) == 0 {
		return io.EOF
	}
	copy(dest, r.rows[0])
	r.rows = r.rows[1:]
	return nil
}

// sqlStateError is a driver error with a SQLSTATE, as lib/pq's *pq.Error.
type sqlStateError struct{ code string }

func (e *sqlStateError) Error() string    { return "fake: SQLSTATE " + e.code }
func (e *sqlStateError) SQLState() string { return e.code }

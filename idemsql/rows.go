package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// querier is what *sql.DB and *sql.Tx have in common.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func execOn(ctx context.Context, q querier, query string, args []any) (pgconn.CommandTag, error) {
	res, err := q.ExecContext(ctx, query, convertArgs(args)...)
	if err != nil {
		return pgconn.CommandTag{}, mapErr(err)
	}
	verb := commandVerb(query)
	n, err := res.RowsAffected()
	if err != nil {
		// A statement that affects no rows (SAVEPOINT, SET, DDL).
		return pgconn.NewCommandTag(verb), nil
	}
	return commandTag(verb, n), nil
}

func queryOn(ctx context.Context, q querier, query string, args []any) (pgx.Rows, error) {
	r, err := q.QueryContext(ctx, query, convertArgs(args)...)
	if err != nil {
		err = mapErr(err)
		return &rows{err: err, stmtErr: err, closed: true}, err
	}
	return &rows{r: r, verb: commandVerb(query)}, nil
}

func queryRowOn(ctx context.Context, q querier, query string, args []any) pgx.Row {
	rs, _ := queryOn(ctx, q, query, args)
	return &row{rows: rs.(*rows)}
}

// commandTag builds the tag PostgreSQL would have sent, as far as
// RowsAffected and the verb go.
func commandTag(verb string, n int64) pgconn.CommandTag {
	if verb == "INSERT" {
		return pgconn.NewCommandTag("INSERT 0 " + strconv.FormatInt(n, 10))
	}
	return pgconn.NewCommandTag(verb + " " + strconv.FormatInt(n, 10))
}

// commandVerb returns the statement's first keyword, upper-cased, after
// white space and comments: "UPDATE", "INSERT", "WITH" ...
func commandVerb(query string) string {
	s := query
	for {
		s = strings.TrimLeft(s, " \t\r\n\f")
		switch {
		case strings.HasPrefix(s, "--"):
			i := strings.IndexByte(s, '\n')
			if i < 0 {
				return ""
			}
			s = s[i+1:]
		case strings.HasPrefix(s, "/*"):
			i := strings.Index(s, "*/")
			if i < 0 {
				return ""
			}
			s = s[i+2:]
		default:
			end := strings.IndexFunc(s, func(r rune) bool {
				return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z')
			})
			if end < 0 {
				end = len(s)
			}
			return strings.ToUpper(s[:end])
		}
	}
}

// rows is a *sql.Rows as pgx.Rows. Like pgx's rows, it closes itself when
// Next reports false or Scan fails.
type rows struct {
	r       *sql.Rows
	verb    string
	n       int64
	err     error // the first error: the statement's or a Scan's
	stmtErr error // the statement's own error, from the driver
	closed  bool
}

var _ pgx.Rows = (*rows)(nil)

func errorRows(err error) *rows {
	return &rows{err: err, stmtErr: err, closed: true}
}

// Close closes the rows. It is safe to call more than once.
func (r *rows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	if err := r.r.Err(); err != nil {
		r.setStmtErr(err)
	}
	if err := r.r.Close(); err != nil {
		r.setStmtErr(err)
	}
}

func (r *rows) setStmtErr(err error) {
	err = mapErr(err)
	if r.stmtErr == nil {
		r.stmtErr = err
	}
	if r.err == nil {
		r.err = err
	}
}

// Err returns the first error met, once the rows are closed.
func (r *rows) Err() error { return r.err }

// CommandTag returns a tag with the statement's verb and the number of rows
// read so far.
func (r *rows) CommandTag() pgconn.CommandTag {
	if r.verb == "" || r.verb == "WITH" || r.verb == "VALUES" || r.verb == "TABLE" {
		return commandTag("SELECT", r.n)
	}
	return commandTag(r.verb, r.n)
}

// FieldDescriptions returns the columns' names; the other fields are zero.
func (r *rows) FieldDescriptions() []pgconn.FieldDescription {
	if r.r == nil {
		return nil
	}
	cols, err := r.r.Columns()
	if err != nil {
		return nil
	}
	fds := make([]pgconn.FieldDescription, len(cols))
	for i, c := range cols {
		fds[i].Name = c
	}
	return fds
}

// Next advances to the next row, and closes the rows after the last one.
func (r *rows) Next() bool {
	if r.closed {
		return false
	}
	if r.r.Next() {
		r.n++
		return true
	}
	r.Close()
	return false
}

// Scan copies the row's values into dest, as database/sql's Scan does; a nil
// destination skips its column, as in pgx. A failed Scan closes the rows.
func (r *rows) Scan(dest ...any) error {
	if r.closed {
		if r.err != nil {
			return r.err
		}
		return errors.New("idemsql: Scan on closed rows")
	}
	if slices.Contains(dest, nil) {
		dest = slices.Clone(dest) // the caller's slice stays as it was
		for i, d := range dest {
			if d == nil {
				dest[i] = new(any)
			}
		}
	}
	if err := r.r.Scan(dest...); err != nil {
		if r.err == nil {
			r.err = mapErr(err)
		}
		r.Close()
		return r.err
	}
	return nil
}

// Values returns the row's values as the driver decoded them.
func (r *rows) Values() ([]any, error) {
	if r.closed {
		return nil, errors.New("idemsql: Values on closed rows")
	}
	cols, err := r.r.Columns()
	if err != nil {
		return nil, mapErr(err)
	}
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := r.r.Scan(ptrs...); err != nil {
		return nil, mapErr(err)
	}
	return vals, nil
}

// RawValues returns the row's values as text, as database/sql's RawBytes
// renders them; they are valid until the next call to Next. It returns nil
// when the row cannot be read.
func (r *rows) RawValues() [][]byte {
	if r.closed {
		return nil
	}
	cols, err := r.r.Columns()
	if err != nil {
		return nil
	}
	raw := make([]sql.RawBytes, len(cols))
	ptrs := make([]any, len(cols))
	for i := range raw {
		ptrs[i] = &raw[i]
	}
	if err := r.r.Scan(ptrs...); err != nil {
		return nil
	}
	out := make([][]byte, len(raw))
	for i, b := range raw {
		out[i] = b
	}
	return out
}

// Conn returns nil: there is no *pgx.Conn behind database/sql.
func (r *rows) Conn() *pgx.Conn { return nil }

// TypeMap returns a shared default pgtype.Map. The drivers decode values
// themselves; the map only serves code that asks for one.
func (r *rows) TypeMap() *pgtype.Map { return defaultTypeMap() }

var defaultTypeMap = sync.OnceValue(pgtype.NewMap)

// row is the first row of a query, as pgx.Row.
type row struct {
	rows *rows
}

// Scan scans the first row into dest and closes the rows. It returns
// pgx.ErrNoRows (which also matches sql.ErrNoRows) when there is none.
func (r *row) Scan(dest ...any) error {
	rs := r.rows
	defer rs.Close()
	if rs.err != nil {
		return rs.err
	}
	if !rs.Next() {
		if rs.err != nil {
			return rs.err
		}
		return pgx.ErrNoRows
	}
	if err := rs.Scan(dest...); err != nil {
		return err
	}
	rs.Close()
	return rs.err
}

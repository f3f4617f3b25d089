package idemsql

import (
	"io"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// sqlStateError is a driver's error with a SQLSTATE, as lib/pq's is.
type sqlStateError struct{ code string }

func (e *sqlStateError) Error() string    { return "pq: " + e.code }
func (e *sqlStateError) SQLState() string { return e.code }

// A failed COMMIT through database/sql, as through pgx: a server's ERROR
// committed nothing; the server ending the session (57P01, 57P02) or a
// connection lost in flight leaves the outcome unknown, from any driver.
func TestCommitUnknown(t *testing.T) {
	for _, c := range []struct {
		name    string
		err     error
		unknown bool
	}{
		{"a unique violation (pgx)", &pgconn.PgError{Code: "23505"}, false},
		{"a unique violation (lib/pq)", &sqlStateError{"23505"}, false},
		{"COMMIT answered ROLLBACK", pgx.ErrTxCommitRollback, false},
		{"a switchover ending the session (pgx)", &pgconn.PgError{Severity: "FATAL", Code: "57P01"}, true},
		{"a switchover ending the session (lib/pq)", &sqlStateError{"57P01"}, true},
		{"the postmaster's death", &sqlStateError{"57P02"}, true},
		{"a connection lost in flight", io.ErrUnexpectedEOF, true},
	} {
		if got := commitUnknown(c.err); got != c.unknown {
			t.Errorf("%s (%v): unknown = %v, want %v", c.name, c.err, got, c.unknown)
		}
	}
}

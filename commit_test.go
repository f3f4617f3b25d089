package idem

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// What a failed COMMIT means: a server's ERROR, a COMMIT answered with
// ROLLBACK, or a request that never left, committed nothing; the server
// ending the session (a switchover's or a shutdown's FATAL 57P01, the
// postmaster's death, 57P02) may have come after the COMMIT ran, as may a
// connection lost with COMMIT in flight.
func TestCommitUnknown(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		err     error
		unknown bool
	}{
		{"a unique violation", &pgconn.PgError{Severity: "ERROR", Code: "23505"}, false},
		{"a serialization failure", &pgconn.PgError{Severity: "ERROR", Code: "40001"}, false},
		{"the hold timeout's idle bound", &pgconn.PgError{Severity: "FATAL", Code: "25P03"}, false},
		{"COMMIT answered ROLLBACK", pgx.ErrTxCommitRollback, false},
		{"a switchover ending the session", &pgconn.PgError{Severity: "FATAL", Code: "57P01"}, true},
		{"the same, wrapped", fmt.Errorf("batch: %w", &pgconn.PgError{Severity: "FATAL", Code: "57P01"}), true},
		{"the postmaster's death", &pgconn.PgError{Severity: "FATAL", Code: "57P02"}, true},
		{"a connection lost in flight", io.ErrUnexpectedEOF, true},
		{"conn closed mid-batch", pgconn.ErrConnClosed, true},
		{"a context ended in flight", context.Canceled, true},
		{"some other failure", errors.New("read: connection reset by peer"), true},
	} {
		if got := commitUnknown(c.err); got != c.unknown {
			t.Errorf("%s (%v): unknown = %v, want %v", c.name, c.err, got, c.unknown)
		}
	}
}

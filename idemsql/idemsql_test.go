package idemsql_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsql"
)

var key = idem.Key{Scope: "unit", ID: "k-1"}

func noRetry() idem.DoOption {
	return idem.WithRetry(idem.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Microsecond, MaxDelay: time.Microsecond})
}

// A COMMIT that may have reached the server is ErrOutcomeUnknown; one that
// failed with a SQLSTATE did not commit, whichever driver reported it.
func TestDoClassifiesCommitErrors(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err       error
		unknown   bool
		retryable bool
	}{
		{name: "bad connection", err: driver.ErrBadConn, unknown: true},
		{name: "network", err: &net.OpError{Op: "read", Net: "tcp", Err: io.ErrUnexpectedEOF}, unknown: true},
		{name: "EOF", err: io.ErrUnexpectedEOF, unknown: true},
		{name: "unique violation", err: &sqlStateError{code: "23505"}},
		{name: "serialization failure", err: &sqlStateError{code: "40001"}, retryable: true},
		{name: "pgx commit turned rollback", err: pgx.ErrTxCommitRollback},
		// pgx's stdlib driver runs COMMIT under the transaction's context:
		// a context that ends while COMMIT is in flight may have committed.
		{name: "context ended in flight", err: context.DeadlineExceeded, unknown: true},
		{name: "pgx conn closed in flight", err: pgconn.ErrConnClosed, unknown: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &fakeDriver{commitErr: tc.err}
			db := openFake(t, d)
			_, err := idemsql.Do(context.Background(), db, key, func(context.Context, *sql.Tx) (string, error) {
				return "v", nil
			}, noRetry())
			require.ErrorIs(t, err, tc.err)
			require.Equal(t, tc.unknown, errors.Is(err, idem.ErrOutcomeUnknown), "%v", err)
			require.Equal(t, tc.retryable, idem.IsRetryable(err))
			if tc.retryable {
				require.EqualValues(t, 2, d.commits.Load(), "Do retries a 40001")
			} else {
				require.EqualValues(t, 1, d.commits.Load())
			}
			_, unique := idem.UniqueViolation(err)
			require.Equal(t, tc.name == "unique violation", unique)
		})
	}
}

// A transaction whose context ended is rolled back by database/sql: Do's
// COMMIT never reaches the server, and the error says that nothing
// committed (not ErrOutcomeUnknown).
func TestCommitAfterContextEndedIsNotSent(t *testing.T) {
	d := &fakeDriver{}
	db := openFake(t, d)
	ctx, cancel := context.WithCancel(context.Background())
	_, err := idemsql.Do(ctx, db, key, func(context.Context, *sql.Tx) (string, error) {
		cancel()
		return "v", nil
	}, noRetry())
	require.Error(t, err)
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.Zero(t, d.commits.Load(), "COMMIT was not sent")
}

package idemsql

import (
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
)

// mapErr turns database/sql's own errors into pgx's: sql.ErrNoRows into
// pgx.ErrNoRows (which matches both), sql.ErrTxDone into an error matching
// both sql.ErrTxDone and pgx.ErrTxClosed. Driver errors pass unchanged.
func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sql.ErrNoRows):
		return pgx.ErrNoRows
	case errors.Is(err, sql.ErrTxDone):
		return errTxDone(err)
	default:
		return err
	}
}

// txDoneError is sql.ErrTxDone as pgx.ErrTxClosed.
type txDoneError struct{ err error }

func errTxDone(err error) error { return &txDoneError{err: err} }

func (e *txDoneError) Error() string { return e.err.Error() }

func (e *txDoneError) Unwrap() []error { return []error{e.err, pgx.ErrTxClosed} }

// notSentError is a COMMIT that never reached the server. SafeToRetry is
// what pgconn.SafeToRetry, and so idem's commit classification, looks for.
type notSentError struct{ err error }

func (e *notSentError) Error() string { return "idemsql: commit not sent: " + e.err.Error() }

func (e *notSentError) Unwrap() error { return e.err }

// SafeToRetry reports true: nothing was sent, so nothing committed.
func (e *notSentError) SafeToRetry() bool { return true }

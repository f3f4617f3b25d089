// Package pgerr names the SQLSTATEs idem reacts to and reads them from any
// driver's errors.
package pgerr

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATE codes.
const (
	UniqueViolation      = "23505"
	IdleInTxTimeout      = "25P03"
	InFailedTx           = "25P02"
	SerializationFailure = "40001"
	DeadlockDetected     = "40P01"
	DuplicateSchema      = "42P06"
	LockNotAvailable     = "55P03"
	QueryCanceled        = "57014"
	UndefinedTable       = "42P01"
	AdminShutdown        = "57P01" // a shutdown, a switchover, pg_terminate_backend
	CrashShutdown        = "57P02" // the postmaster died, or another backend crashed
	CannotConnectNow     = "57P03" // the server is starting up, shutting down or recovering
	ReadOnlyTransaction  = "25006" // a write on a standby, or on a primary set read-only
)

// Code returns err's SQLSTATE, or "" when err carries none. It accepts any
// error in err's chain with a SQLState method: pgx's *pgconn.PgError and,
// through database/sql, lib/pq's *pq.Error.
func Code(err error) string {
	var e interface{ SQLState() string }
	if errors.As(err, &e) {
		return e.SQLState()
	}
	return ""
}

// SessionEnded reports that err is the server ending the session
// (SQLSTATE 57P01 or 57P02, with severity FATAL): a shutdown or switchover
// stopping its backends, a terminated backend, or the postmaster's death.
// Unlike an ERROR, it does not say the statement in flight failed: a
// COMMIT may have committed before the backend went, as a switchover was
// measured to do.
func SessionEnded(err error) bool {
	c := Code(err)
	return c == AdminShutdown || c == CrashShutdown
}

// Unavailable reports that err is the server saying it cannot serve this
// session's writes: it ended the session (SessionEnded), it is not
// accepting connections yet or any more (57P03), it is read-only (25006: a
// standby, or a primary being demoted), or the connection failed (class 08).
// Another connection, to the same address or another host of the DSN, may
// succeed once a failover or restart is over.
func Unavailable(err error) bool {
	c := Code(err)
	return c == AdminShutdown || c == CrashShutdown || c == CannotConnectNow ||
		c == ReadOnlyTransaction || (len(c) == 5 && c[:2] == "08")
}

// CannotServe reports that an attempt failed because the database could not
// serve it: the server said so (Unavailable), or, where err carries no
// SQLSTATE, no connection could be made for a reason other than the server
// refusing this client (a wrong password or an unknown database has one):
// the address refused or timed out, or no host of the DSN was a primary
// (target_session_attrs=read-write). An error of a context that ended is
// never one.
func CannotServe(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if Code(err) != "" {
		return Unavailable(err)
	}
	var ce *pgconn.ConnectError
	return errors.As(err, &ce)
}

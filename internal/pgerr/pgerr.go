// Package pgerr names the SQLSTATEs idem reacts to and reads them from any
// driver's errors.
package pgerr

import "errors"

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
